"""Renderings of stored messages shared between the agents of a host.

The copies of one channel item read for several agents share their blocks and metadata objects
(the reader's and the feeds' decoded-body caches give the same objects out for the same body),
so the item needs rendering only once: :class:`SharedRenders` keeps each rendering under the
identity of the objects it was made from. An entry holds those objects, so the identity it is
found by cannot be given to another object while the entry is kept. A message decoded on its own
finds nothing and is rendered as usual.

Bound: at most ``cap`` renderings (the oldest dropped first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: Renderings kept; at 1,000 messages a second this covers the last two seconds.
SHARED_RENDERS = 2048

Render = Callable[[Mapping[str, Any]], dict[str, Any]]


class SharedRenders:
    def __init__(self, cap: int = SHARED_RENDERS) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        self._kept: dict[tuple[int, int, str], tuple[Any, Any, dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def render(self, message: Mapping[str, Any], make: Render) -> dict[str, Any]:
        """``make(message)``, made once for the role, blocks and metadata objects of
        ``message``; each caller gets its own copy of the top-level mapping (what it holds is
        shared and must not be changed)."""
        blocks, metadata, role = message.get("blocks"), message.get("metadata"), message["role"]
        key = (id(blocks), id(metadata), role)
        kept = self._kept.get(key)
        if kept is None or kept[0] is not blocks or kept[1] is not metadata:
            if len(self._kept) >= self.cap:
                del self._kept[next(iter(self._kept))]
            kept = self._kept[key] = (blocks, metadata, make(message))
        return dict(kept[2])
