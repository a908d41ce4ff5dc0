"""A bounded buffer that is fair per source: a flooding source loses its own items, never a
quiet source's.

:class:`FairBuffer` holds at most ``cap`` items, each put with its source, and gives them back
in the order they were put. When it is full and an item arrives:

* if the item's source holds at least as many buffered items as any other source, the new item
  is dropped;
* otherwise the newest buffered item of the source holding the most is dropped, and the new
  item is kept.

So a source holding fewer items than the largest never loses one: with two sources, one that
never has more than ``cap // 2`` items waiting keeps all of them, however fast the other sends.

Drops are counted per source. The first drop of a source opens a :class:`Dropped` notice for
it, given back by :meth:`FairBuffer.get` in the place of that moment (after what was buffered
before it); drops of the same source until the notice is taken add to its count, so each
source has at most one notice waiting. Notices do not take room from items.

At most ``max_sources`` sources are told apart at a time (a source counts while it has items or
a notice waiting); items from further sources share the source :data:`OTHER_SOURCES`.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

import attrs

T = TypeVar("T")


class _OtherSources:
    def __repr__(self) -> str:
        return "OTHER_SOURCES"


#: The source of items from sources past ``max_sources``.
OTHER_SOURCES: Hashable = _OtherSources()


@attrs.frozen
class Dropped:
    """``count`` items of ``source`` were dropped, the first at time ``since``."""

    source: Hashable
    count: int
    since: float = 0.0


class FairBuffer(Generic[T]):
    def __init__(self, cap: int, max_sources: int) -> None:
        if cap < 1 or max_sources < 1:
            raise ValueError("cap and max_sources must be at least 1")
        self.cap = cap
        self.max_sources = max_sources
        self._seq = 0
        self._size = 0
        # a source is here while it has items or a notice waiting (then maybe an empty queue)
        self._queues: dict[Hashable, deque[tuple[int, T]]] = {}
        # (seq of a queue's first item, source): every non-empty queue's head is here; entries
        # whose queue moved on or emptied are skipped when they come up
        self._heads: list[tuple[int, Hashable]] = []
        # source -> (seq, time of the first drop, count), in seq order
        self._notices: dict[Hashable, list[Any]] = {}
        self.dropped_total = 0

    def __len__(self) -> int:
        """Items buffered (notices not counted)."""
        return self._size

    def buffered(self, source: Hashable) -> int:
        queue = self._queues.get(source)
        return len(queue) if queue else 0

    def sources(self) -> int:
        """Sources told apart now (:data:`OTHER_SOURCES` included)."""
        return len(self._queues)

    def pending_notices(self) -> int:
        return len(self._notices)

    def put(self, source: Hashable, item: T, now: float = 0.0) -> None:
        """Buffer ``item``, or drop it or an older one (see the module docstring); ``now`` is
        only recorded, as the time of a drop."""
        queues = self._queues
        queue = queues.get(source)
        if queue is None:
            if len(queues) - (OTHER_SOURCES in queues) >= self.max_sources:
                source = OTHER_SOURCES
                queue = queues.get(source)
            if queue is None:
                queue = queues[source] = deque()
        if self._size >= self.cap:
            biggest = max(queues, key=lambda s: len(queues[s]))
            if len(queue) >= len(queues[biggest]):
                self._drop(source, now)
                return
            # its newest item goes; its head (and heap entry) stay unless it empties
            queues[biggest].pop()
            self._size -= 1
            self._drop(biggest, now)
        seq = self._seq
        self._seq += 1
        if not queue:
            heapq.heappush(self._heads, (seq, source))
        queue.append((seq, item))
        self._size += 1

    def get(self) -> T | Dropped | None:
        """The oldest item or notice; None when there is neither."""
        heads = self._heads
        while heads:
            seq, source = heads[0]
            queue = self._queues.get(source)
            if queue and queue[0][0] == seq:
                break
            heapq.heappop(heads)  # stale: that queue was emptied by a drop
        notice = next(iter(self._notices.items()), None)
        if notice is not None and (not heads or notice[1][0] < heads[0][0]):
            source, (_, since, count) = notice
            del self._notices[source]
            self._tidy(source)
            return Dropped(source, count, since)
        if not heads:
            return None
        _, source = heapq.heappop(heads)
        queue = self._queues[source]
        _, item = queue.popleft()
        self._size -= 1
        if queue:
            heapq.heappush(heads, (queue[0][0], source))
        else:
            self._tidy(source)
        return item

    def clear(self) -> None:
        self._queues.clear()
        self._heads.clear()
        self._notices.clear()
        self._size = 0

    def _drop(self, source: Hashable, now: float) -> None:
        self.dropped_total += 1
        notice = self._notices.get(source)
        if notice is None:
            self._notices[source] = [self._seq, now, 1]
            self._seq += 1
        else:
            notice[2] += 1

    def _tidy(self, source: Hashable) -> None:
        """Forget a source with no items and no notice waiting."""
        if source not in self._notices and not self._queues.get(source):
            self._queues.pop(source, None)
