"""Trace events: what the host did, for the CLI transcript and for tests.

Each event carries the wall-clock time it was emitted (``ts``, seconds since the epoch), for
people reading the transcript; the host's own timing uses trio's clock.

``TraceBus.emit`` never blocks: each subscriber has a bounded buffer (``SUBSCRIBER_CAP`` events),
fair per *source* (the server an event concerns, else its agent, else the host; see
:func:`source_of`). When a subscriber falls behind, the source holding most of its buffer loses
events, never a quieter one (``protocol.fairness.FairBuffer``), and the subscriber receives one
``trace-dropped`` event per source that lost some, naming it (``server_id`` or ``agent``) with
the ``count``. At most ``MAX_SOURCES`` sources are told apart per subscriber; events of further
ones share a slot reported as ``other_sources``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from protocol.fairness import OTHER_SOURCES, Dropped, FairBuffer

SUBSCRIBER_CAP = 4096
MAX_SUBSCRIBERS = 64
MAX_SOURCES = 64  # sources told apart in one subscriber's buffer
REPLAY_CAP = 1024  # recent events replayed to a new subscriber; oldest forgotten first

#: The source of events that name neither a server nor an agent.
HOST_SOURCE: Hashable = ("host", "")


@attrs.frozen(kw_only=True)
class TraceEvent:
    """One thing the host did: ``kind`` (``incoming``, ``push``, ``published``, ``tool-call``,
    ``tool-result``, ``ready``, ``disconnected``, ``diagnostic``, ``error``, …), the ``agent``,
    ``server_id`` and ``channel_id`` it concerns (each a plain string or None), the kind's own
    ``data``, and ``ts``, when it was emitted (``time.time()``; not part of its identity)."""

    kind: str
    agent: str | None = None
    server_id: str | None = None
    channel_id: str | None = attrs.field(default=None)
    data: Mapping[str, Any] = attrs.field(factory=dict)
    # when it was emitted (time.time()); not part of the event's identity
    ts: float = attrs.field(factory=time.time, eq=False)

    @channel_id.validator
    def _plain(self, _: Any, value: Any) -> None:
        if value is not None and not isinstance(value, str):
            raise TypeError("channel_id must be a string or None")


#: Kinds that speak of an agent's model, whichever server's message woke the agent.
MODEL_KINDS = frozenset({"model-retry"})


def source_of(event: TraceEvent) -> Hashable:
    """The source an event is counted against: its server, else its agent, else the host. What
    an agent's model did (a retry, a failed call) is the agent's, never the waking server's."""
    of_the_model = event.kind in MODEL_KINDS or (
        event.kind == "error" and event.data.get("where") == "model"
    )
    if event.agent is not None and of_the_model:
        return ("agent", event.agent)
    if event.server_id is not None:
        return ("server", event.server_id)
    if event.agent is not None:
        return ("agent", event.agent)
    return HOST_SOURCE


def dropped_event(notice: Dropped) -> TraceEvent:
    """The ``trace-dropped`` event reporting a :class:`~protocol.fairness.Dropped` notice."""
    data: dict[str, Any] = {"count": notice.count}
    server_id = agent = None
    if notice.source is OTHER_SOURCES:
        data["other_sources"] = True
    elif isinstance(notice.source, tuple) and notice.source[0] == "server":
        server_id = notice.source[1]
    elif isinstance(notice.source, tuple) and notice.source[0] == "agent":
        agent = notice.source[1]
    return TraceEvent(
        kind="trace-dropped", server_id=server_id, agent=agent, data=data, ts=notice.since
    )


@attrs.frozen
class ReceiverStatistics:
    current_buffer_used: int
    max_buffer_size: int
    pending_notices: int


class TraceReceiver:
    """The reading end of one subscription, with the parts of a trio memory receive channel
    the host uses: ``receive_nowait``/``receive`` (``trio.WouldBlock``, ``trio.EndOfChannel``
    once the bus closed and the buffer is empty, ``trio.ClosedResourceError`` after
    :meth:`close`), ``close`` and async iteration."""

    def __init__(self, sub: _Subscriber) -> None:
        self._sub = sub

    def receive_nowait(self) -> TraceEvent:
        sub = self._sub
        if sub.receiver_closed:
            raise trio.ClosedResourceError
        got = sub.buffer.get()
        if got is None:
            if sub.sender_closed:
                raise trio.EndOfChannel
            raise trio.WouldBlock
        if type(got) is Dropped:
            return dropped_event(got)
        assert isinstance(got, TraceEvent)
        return got

    async def receive(self) -> TraceEvent:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            event = self.receive_nowait()
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return event
        while True:
            await self._sub.lot.park()
            try:
                return self.receive_nowait()
            except trio.WouldBlock:
                continue

    def close(self) -> None:
        sub = self._sub
        sub.receiver_closed = True
        sub.buffer.clear()
        sub.lot.unpark_all()

    def statistics(self) -> ReceiverStatistics:
        buffer = self._sub.buffer
        return ReceiverStatistics(len(buffer), buffer.cap, buffer.pending_notices())

    def __aiter__(self) -> TraceReceiver:
        return self

    async def __anext__(self) -> TraceEvent:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


class _Subscriber:
    def __init__(self, kinds: frozenset[str] | None) -> None:
        self.buffer: FairBuffer[TraceEvent] = FairBuffer(SUBSCRIBER_CAP, MAX_SOURCES)
        self.lot = trio.lowlevel.ParkingLot()
        self.kinds = kinds  # None: every kind
        self.sender_closed = False
        self.receiver_closed = False
        self.recv = TraceReceiver(self)

    def wants(self, event: TraceEvent) -> bool:
        return self.kinds is None or event.kind in self.kinds or event.kind == "trace-dropped"

    def put(self, source: Hashable, event: TraceEvent) -> None:
        if self.sender_closed:
            return  # the bus closed: nothing more is delivered
        self.buffer.put(source, event, event.ts)
        if self.lot:
            self.lot.unpark_all()

    def close_sender(self) -> None:
        self.sender_closed = True
        self.lot.unpark_all()


#: An event kept for replay only, not built yet: (kind, server_id, channel_id, data, ts).
_Fields = tuple[str, str | None, str | None, Mapping[str, Any], float]


class TraceBus:
    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now  # the wall clock stamped on events
        self._subs: list[_Subscriber] = []
        self._recent: deque[TraceEvent | _Fields] = deque(maxlen=REPLAY_CAP)
        # the kinds some subscriber takes (None: every kind); recomputed whenever one is
        # added or pruned, so it never misses a subscriber (it may keep one that left)
        self._wanted: frozenset[str] | None = frozenset()

    def emit(self, kind: str, **fields: Any) -> TraceEvent:
        if "ts" not in fields:
            fields["ts"] = self._now()
        return self.publish(TraceEvent(kind=kind, **fields))

    def publish(self, event: TraceEvent) -> TraceEvent:
        """Hand a built event to every subscriber (never blocks)."""
        kind = event.kind
        self._recent.append(event)
        source = source_of(event)
        gone = False
        for sub in self._subs:
            if sub.kinds is not None and kind not in sub.kinds:
                continue
            if sub.receiver_closed:
                gone = True
                continue
            sub.put(source, event)
        if gone:
            self._prune()
        return event

    def publish_fields(
        self, kind: str, server_id: str | None, channel_id: str | None, data: Mapping[str, Any]
    ) -> None:
        """``publish(TraceEvent(kind=kind, server_id=server_id, channel_id=channel_id,
        data=data))``, except that the event is built only when a subscriber takes its kind
        now; otherwise its fields (and the time) wait in the replay buffer and it is built if
        it is replayed (the hot lanes publish one event per item, and often nobody listens to
        them)."""
        wanted = self._wanted
        ts = self._now()
        if wanted is None or kind in wanted:
            self.publish(
                TraceEvent(kind=kind, server_id=server_id, channel_id=channel_id, data=data, ts=ts)
            )
            return
        if channel_id is not None and not isinstance(channel_id, str):
            raise TypeError("channel_id must be a string or None")
        self._recent.append((kind, server_id, channel_id, data, ts))

    def _prune(self) -> None:
        self._subs = [s for s in self._subs if not s.receiver_closed]
        self._refresh()

    def _refresh(self) -> None:
        kinds: set[str] = set()
        for sub in self._subs:
            if sub.kinds is None:
                self._wanted = None
                return
            kinds |= sub.kinds
        self._wanted = frozenset(kinds)

    def subscribe_nowait(
        self, *, replay: bool = False, kinds: frozenset[str] | None = None
    ) -> TraceReceiver:
        """Subscribe now; close the returned receiver to unsubscribe. With ``kinds``, only
        events of those kinds (and ``trace-dropped``) are delivered."""
        return self._add(replay, kinds).recv

    def _add(self, replay: bool, kinds: frozenset[str] | None = None) -> _Subscriber:
        self._prune()
        if len(self._subs) >= MAX_SUBSCRIBERS:
            raise RuntimeError(f"at most {MAX_SUBSCRIBERS} trace subscribers")
        sub = _Subscriber(kinds)
        if replay:
            recent = [e for e in map(_built, self._recent) if sub.wants(e)]
            for event in recent[-SUBSCRIBER_CAP // 2 :]:
                sub.put(source_of(event), event)
        self._subs.append(sub)
        self._refresh()
        return sub

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[TraceReceiver]:
        sub = self._add(replay=False)
        try:
            yield sub.recv
        finally:
            sub.close_sender()  # the reader sees the end of the stream
            if sub in self._subs:
                self._subs.remove(sub)
                self._refresh()

    def close(self) -> None:
        for sub in self._subs:
            sub.close_sender()


def _built(entry: TraceEvent | _Fields) -> TraceEvent:
    if isinstance(entry, TraceEvent):
        return entry
    kind, server_id, channel_id, data, ts = entry
    return TraceEvent(kind=kind, server_id=server_id, channel_id=channel_id, data=data, ts=ts)
