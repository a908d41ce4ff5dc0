"""Trace events: what the host did, for the CLI transcript and for tests.

``TraceBus.emit`` never blocks: each subscriber has a bounded buffer (``SUBSCRIBER_CAP``); when a
subscriber falls behind, new events for it are counted and dropped, and it receives one
``trace-dropped`` event with the count, just before the next event, as soon as it has room for
both again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

log = logging.getLogger("mcplive.trace")

SUBSCRIBER_CAP = 4096
MAX_SUBSCRIBERS = 64
REPLAY_CAP = 1024  # recent events replayed to a new subscriber; oldest forgotten first


@attrs.frozen(kw_only=True)
class TraceEvent:
    kind: str
    agent: str | None = None
    server_id: str | None = None
    channel_id: str | None = attrs.field(default=None)
    data: Mapping[str, Any] = attrs.field(factory=dict)

    @channel_id.validator
    def _plain(self, _: Any, value: Any) -> None:
        if value is not None and not isinstance(value, str):
            raise TypeError("channel_id must be a string or None")


class _Subscriber:
    def __init__(self, kinds: frozenset[str] | None) -> None:
        self.send, self.recv = trio.open_memory_channel[TraceEvent](SUBSCRIBER_CAP)
        self.dropped = 0
        self.kinds = kinds  # None: every kind

    def wants(self, event: TraceEvent) -> bool:
        return self.kinds is None or event.kind in self.kinds or event.kind == "trace-dropped"

    @property
    def closed(self) -> bool:
        return self.send.statistics().open_receive_channels == 0  # the reader went away

    def room(self) -> int:
        stats = self.send.statistics()
        return int(stats.max_buffer_size) - stats.current_buffer_used


#: An event kept for replay only, not built yet: (kind, server_id, channel_id, data).
_Fields = tuple[str, str | None, str | None, Mapping[str, Any]]


class TraceBus:
    def __init__(self) -> None:
        self._subs: list[_Subscriber] = []
        self._recent: deque[TraceEvent | _Fields] = deque(maxlen=REPLAY_CAP)
        # the kinds some subscriber takes (None: every kind); recomputed whenever one is
        # added or pruned, so it never misses a subscriber (it may keep one that left)
        self._wanted: frozenset[str] | None = frozenset()

    def emit(self, kind: str, **fields: Any) -> TraceEvent:
        return self.publish(TraceEvent(kind=kind, **fields))

    def publish(self, event: TraceEvent) -> TraceEvent:
        """Hand a built event to every subscriber (never blocks)."""
        kind = event.kind
        self._recent.append(event)
        if kind in ("diagnostic", "error"):
            log.info("%s %s %s", event.server_id or event.agent or "", kind, dict(event.data))
        gone = False
        for sub in self._subs:
            if sub.kinds is not None and kind not in sub.kinds:
                continue
            try:
                if sub.dropped:
                    if sub.room() < 2:
                        # The count goes out with this event, or both wait: a count sent alone
                        # would take the last slot and be followed by another count at once.
                        sub.dropped += 1
                        continue
                    note = TraceEvent(kind="trace-dropped", data={"count": sub.dropped})
                    sub.send.send_nowait(note)
                    sub.dropped = 0
                sub.send.send_nowait(event)
            except trio.WouldBlock:
                sub.dropped += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone = True
        if gone:
            self._prune()
        return event

    def publish_fields(
        self, kind: str, server_id: str | None, channel_id: str | None, data: Mapping[str, Any]
    ) -> None:
        """``publish(TraceEvent(kind=kind, server_id=server_id, channel_id=channel_id,
        data=data))``, except that the event is built only when a subscriber takes its kind
        now; otherwise its fields wait in the replay buffer and it is built if it is replayed
        (the hot lanes publish one event per item, and often nobody listens to them)."""
        wanted = self._wanted
        if wanted is None or kind in wanted or kind in ("diagnostic", "error"):
            self.publish(
                TraceEvent(kind=kind, server_id=server_id, channel_id=channel_id, data=data)
            )
            return
        if channel_id is not None and not isinstance(channel_id, str):
            raise TypeError("channel_id must be a string or None")
        self._recent.append((kind, server_id, channel_id, data))

    def _prune(self) -> None:
        self._subs = [s for s in self._subs if not s.closed]
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
    ) -> trio.MemoryReceiveChannel[TraceEvent]:
        """Subscribe now; close the returned channel to unsubscribe. With ``kinds``, only
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
                sub.send.send_nowait(event)
        self._subs.append(sub)
        self._refresh()
        return sub

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[trio.MemoryReceiveChannel[TraceEvent]]:
        sub = self._add(replay=False)
        try:
            yield sub.recv
        finally:
            sub.send.close()  # the reader sees the end of the channel
            if sub in self._subs:
                self._subs.remove(sub)
                self._refresh()

    def close(self) -> None:
        for sub in self._subs:
            sub.send.close()


def _built(entry: TraceEvent | _Fields) -> TraceEvent:
    if isinstance(entry, TraceEvent):
        return entry
    kind, server_id, channel_id, data = entry
    return TraceEvent(kind=kind, server_id=server_id, channel_id=channel_id, data=data)
