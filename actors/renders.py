"""Renderings of stored messages shared between the agents of a host.

The copies of one channel item read for several agents share their blocks and metadata objects
(the reader's and the feeds' decoded-body caches give the same objects out for the same body),
so the item needs rendering only once: :class:`SharedRenders` keeps each rendering under the
identity of the objects it was made from. An entry holds those objects, so the identity it is
found by cannot be given to another object while the entry is kept. A message decoded on its own
finds nothing and is rendered as usual.

The rows of recent commits (:mod:`actors.fresh_feed`) are rendered through :meth:`SharedRenders.
render_row`, kept under the identity of the row's body: the copies of one item share that
bytes object, so an agent's turn gets each of them with one look-up, its decoding and rendering
done once for every agent. It keeps only what every reader shows as it is (see ``plain``).

Bound: at most ``cap`` renderings and ``cap`` rendered rows (the oldest dropped first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from store.items import WrittenRow

#: Renderings kept; at 1,000 messages a second this covers the last two seconds.
SHARED_RENDERS = 2048

Render = Callable[[Mapping[str, Any]], dict[str, Any]]
Decode = Callable[[WrittenRow], dict[str, Any]]
Plain = Callable[[Mapping[str, Any]], bool]


class SharedRenders:
    def __init__(self, cap: int = SHARED_RENDERS) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        # ordered dicts: dropping the oldest entry of a plain dict means skipping every slot
        # freed before it, so at the cap each drop would cost a walk over the whole table
        self._kept: OrderedDict[tuple[int, int, str], tuple[Any, Any, dict[str, Any]]] = (
            OrderedDict()
        )
        # by the identity of a row's body: (body, role, rendering or None when not plain)
        self._rows: OrderedDict[int, tuple[bytes, str, dict[str, Any] | None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept) + len(self._rows)

    def render(self, message: Mapping[str, Any], make: Render) -> dict[str, Any]:
        """``make(message)``, made once for the role, blocks and metadata objects of
        ``message``; each caller gets its own copy of the top-level mapping (what it holds is
        shared and must not be changed)."""
        blocks, metadata, role = message.get("blocks"), message.get("metadata"), message["role"]
        key = (id(blocks), id(metadata), role)
        kept = self._kept.get(key)
        if kept is None or kept[0] is not blocks or kept[1] is not metadata:
            if len(self._kept) >= self.cap:
                self._kept.popitem(last=False)
            kept = self._kept[key] = (blocks, metadata, make(message))
        return dict(kept[2])

    def render_row(
        self, row: WrittenRow, decode: Decode, plain: Plain, make: Render
    ) -> dict[str, Any] | None:
        """``make`` of the message of ``row`` (from ``decode``) under the row's own id, made
        once for the row's body and role; ``None`` when ``plain`` says the message needs more
        than rendering (the caller then reads it in full). ``decode``'s errors pass through."""
        _seq, message_id, _agent, role, body = row
        kept = self._rows.get(id(body))
        if kept is None or kept[0] is not body or kept[1] != role:
            message = decode(row)
            if len(self._rows) >= self.cap:
                self._rows.popitem(last=False)
            kept = self._rows[id(body)] = (body, role, make(message) if plain(message) else None)
        if kept[2] is None:
            return None
        shown = dict(kept[2])
        shown["id"] = message_id
        return shown
