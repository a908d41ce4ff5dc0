"""Fairness between sources: a bounded buffer where a flooding source loses its own items,
never a quiet source's (:class:`FairBuffer`), and how long a flooding connection gives way to
the rest of the host (:func:`ingest_pause`).

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
a notice waiting); items from further sources share the source :data:`OTHER_SOURCES`. The order
keeps the place of an evicted item until it is read or, once there are more than ``cap`` such
places, until the order is compacted; so the buffer holds at most ``2 * cap + max_sources + 1``
entries.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
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


_DEAD: Any = object()  # an evicted item's place in the order
_NOTICE: Any = object()  # a drop notice's place in the order


class FairBuffer(Generic[T]):
    def __init__(self, cap: int, max_sources: int) -> None:
        if cap < 1 or max_sources < 1:
            raise ValueError("cap and max_sources must be at least 1")
        self.cap = cap
        self.max_sources = max_sources
        self._size = 0
        # every entry in the order it was put: [source, item], [source, _DEAD] once evicted,
        # or [source, _NOTICE, count, since] for a drop notice
        self._order: deque[list[Any]] = deque()
        self._dead = 0
        # each source's live entries, oldest first; a source stays (maybe empty) until room
        # for a new one is needed
        self._queues: dict[Hashable, deque[list[Any]]] = {}
        self._notices: dict[Hashable, list[Any]] = {}  # source -> its notice entry
        self.dropped_total = 0

    def __len__(self) -> int:
        """Items buffered (notices not counted)."""
        return self._size

    def buffered(self, source: Hashable) -> int:
        queue = self._queues.get(source)
        return len(queue) if queue else 0

    def sources(self) -> int:
        """Sources told apart now: those with items or a notice waiting (:data:`OTHER_SOURCES`
        included)."""
        return sum(1 for s, q in self._queues.items() if q or s in self._notices)

    def pending_notices(self) -> int:
        return len(self._notices)

    def put(self, source: Hashable, item: T, now: float = 0.0) -> None:
        """Buffer ``item``, or drop it or an older one (see the module docstring); ``now`` is
        only recorded, as the time of a drop."""
        queues = self._queues
        queue = queues.get(source)
        if queue is None:
            if len(queues) - (OTHER_SOURCES in queues) >= self.max_sources:
                self._forget_idle()
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
            evicted = queues[biggest].pop()  # the biggest holder's newest item
            evicted[1] = _DEAD
            self._dead += 1
            self._size -= 1
            self._drop(biggest, now)
            if self._dead > self.cap:
                self._compact()
        entry = [source, item]
        queue.append(entry)
        self._order.append(entry)
        self._size += 1

    def get(self) -> T | Dropped | None:
        """The oldest item or notice; None when there is neither."""
        order = self._order
        while order:
            entry = order.popleft()
            item = entry[1]
            if item is _DEAD:
                self._dead -= 1
                continue
            if item is _NOTICE:
                del self._notices[entry[0]]
                return Dropped(entry[0], entry[2], entry[3])
            self._queues[entry[0]].popleft()
            self._size -= 1
            kept: T = item
            return kept
        return None

    def clear(self) -> None:
        self._order.clear()
        self._queues.clear()
        self._notices.clear()
        self._size = self._dead = 0

    def _drop(self, source: Hashable, now: float) -> None:
        self.dropped_total += 1
        notice = self._notices.get(source)
        if notice is None:
            notice = self._notices[source] = [source, _NOTICE, 1, now]
            self._order.append(notice)
        else:
            notice[2] += 1

    def _forget_idle(self) -> None:
        """Forget the sources with no items and no notice waiting."""
        for source in [s for s, q in self._queues.items() if not q and s not in self._notices]:
            del self._queues[source]

    def _compact(self) -> None:
        """Drop the places of evicted items (they only pile up while nobody reads)."""
        self._order = deque(e for e in self._order if e[1] is not _DEAD)
        self._dead = 0


# -- a connection's share of ingest ------------------------------------------------------------

#: A connection's slice (messages per scheduling step) while another server has delivered
#: within ``RECENT_S`` or an agent that does not hear it is in a turn: smaller steps, so the
#: other's message waits behind less of a flood at each of its hops through the host.
SHARED_SLICE = 4
#: How recent another server's delivery must be for a connection to take the shared slice.
RECENT_S = 0.25


def contended(
    *, server: str, now: float, last_read: Mapping[str, float], others_turning: bool
) -> bool:
    """Whether others need the host beside ``server``: an agent that does not hear it is in a
    turn (``others_turning``), or another server read something within ``RECENT_S`` of
    ``now`` (``last_read``: the time of each server's latest read)."""
    return others_turning or any(
        other != server and now - at < RECENT_S for other, at in last_read.items()
    )


def ingest_slice(
    *,
    full: int,
    server: str,
    now: float,
    last_read: Mapping[str, float],
    others_turning: bool,
) -> int:
    """A connection's slice: ``full`` while it has the host to itself, ``SHARED_SLICE`` (at
    most ``full``) while it is :func:`contended`."""
    shared = contended(server=server, now=now, last_read=last_read, others_turning=others_turning)
    return min(full, SHARED_SLICE) if shared else full


#: A flooding connection's pause after a slice, in multiples of the time the slice took.
GIVE_WAY = 20.0
#: The longest such pause, in seconds (a slice that took long, or a clock that jumped, never
#: stops a connection for longer).
MAX_PAUSE_S = 0.05


def ingest_pause(
    *,
    waiting: int,
    in_hand: int,
    slice_size: int,
    others_turning: bool,
    others_in_hand: Iterable[int],
    spent: float,
) -> float:
    """How long a connection pauses its ingest after a slice that took ``spent`` seconds.

    Only a connection with at least ``slice_size`` requests ``waiting`` pauses (one with less is
    keeping up), and only while something else needs the host: an agent that does not hear it is
    in a turn (``others_turning``), or another connection has fewer requests in hand than its
    load (``waiting`` + ``in_hand``) and more than none (so of two flooding servers, only the
    heavier gives way). The pause is ``GIVE_WAY`` times ``spent``, at most ``MAX_PAUSE_S``; 0
    means go on at once. Nothing is refused: the paused connection's reader waits in its own
    transport."""
    if waiting < slice_size or spent <= 0:
        return 0.0
    load = waiting + in_hand
    if not (others_turning or any(0 < n < load for n in others_in_hand)):
        return 0.0
    return min(GIVE_WAY * spent, MAX_PAUSE_S)
