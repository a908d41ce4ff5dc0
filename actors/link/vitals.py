"""What a 24/7 console shows of one server: how long its link has been up, why it went down
before, its traffic per minute, how fast it answers, and what it wrote to stderr.

A :class:`LinkVitals` belongs to one ``ConnectionActor`` and lives as long as it (across its
links); only that actor's tasks touch it. Readers (the status file, the console's
``/api/servers`` and ``/metrics``) take its :meth:`~LinkVitals.snapshot` from
``HostContext.vitals`` without an ask, as they read ``ConnStatus`` from ``ctx.statuses``: an
immutable :class:`ServerVitals`, rebuilt only after something changed. Counting a message
costs an addition; the snapshot is built when someone reads it.

Bounds (each with its policy):

- ``DISCONNECTS`` disconnects are kept, the oldest forgotten first;
- traffic is counted per minute of trio's clock for the last ``TRAFFIC_MINUTES`` minutes
  (:class:`protocol.vitals.MinuteCounts`: older minutes are dropped as time moves on);
- the newest ``LATENCY_SAMPLES`` answered requests' latencies are kept (the oldest dropped);
- messages stored are counted per channel for the first ``CHANNEL_LABELS`` channels that get
  one (sticky: a channel counted keeps its count for the life of the connection); messages of
  every later channel are summed in ``stored_other``, so ``/metrics`` carries at most that many
  channel series per server and every one of them only grows;
- the stderr tail keeps ``actors.link.end.TAIL_LINES`` lines, each with the wall-clock time it
  was read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from protocol.display import one_line
from protocol.vitals import Bucket, MinuteCounts, latency_summary

from .end import StderrTail

DISCONNECTS = 20
TRAFFIC_MINUTES = 60
LATENCY_SAMPLES = 200
REASON_CHARS = 400
CHANNEL_LABELS = 20


@attrs.frozen(kw_only=True)
class Disconnect:
    """One link that ended: when (wall clock), why (one line, never a credential) and how long
    it had been ready (None: never)."""

    at: float
    reason: str
    ready_for_s: float | None


@attrs.frozen(kw_only=True)
class ServerVitals:
    """One server's vitals at one moment (see the module)."""

    server_id: str
    started_at: float  # wall clock: when the host began connecting to it
    connected_since: float | None  # wall clock: when its link turned ready (None: not ready)
    connects: int  # links opened so far
    disconnects: tuple[Disconnect, ...]  # the newest last, at most DISCONNECTS
    traffic: tuple[Bucket, ...]  # (minute on trio's clock, messages in, out), oldest first
    latency: Mapping[str, Any]  # protocol.vitals.latency_summary of the newest requests
    stderr: tuple[tuple[float, str], ...]  # (wall clock, line), oldest first
    # messages stored per channel (None: outside any channel), at most CHANNEL_LABELS, and
    # those of every other channel
    stored: Mapping[str | None, int] = attrs.field(factory=dict)
    stored_other: int = 0


class LinkVitals:
    """The live figures of one server's connection (see the module)."""

    def __init__(
        self, server_id: str, tail: StderrTail, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.server_id = server_id
        self.tail = tail
        self.clock = wall_clock
        self.started_at = wall_clock()
        self.connected_since: float | None = None
        self.connects = 0
        self.disconnects: deque[Disconnect] = deque(maxlen=DISCONNECTS)
        self.traffic = MinuteCounts(minutes=TRAFFIC_MINUTES)
        self.latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._snapshot: ServerVitals | None = None
        self._changes = 0  # answers and stored messages counted: what a snapshot saw
        self.stored_counts: dict[str | None, int] = {}  # at most CHANNEL_LABELS keys
        self.stored_other = 0
        self._dirty_at = (-1, -1)  # what the cached snapshot saw: (changes, traffic changes)

    # -- what the connection tells ----------------------------------------------------------
    def connecting(self) -> None:
        self.connects += 1
        self._snapshot = None

    def ready(self) -> None:
        self.connected_since = self.clock()
        self._snapshot = None

    def ended(self, reason: str, ready_for: float | None) -> None:
        self.disconnects.append(
            Disconnect(
                at=self.clock(),
                reason=one_line(reason, REASON_CHARS),
                ready_for_s=None if ready_for is None else round(ready_for, 3),
            )
        )
        self.connected_since = None
        self._snapshot = None

    def stderr_line(self) -> None:
        """The tail took a line."""
        self._snapshot = None

    def answered(self, seconds: float) -> None:
        """One of our requests was answered after ``seconds``."""
        self.latencies.append(seconds)
        self._changes += 1

    def stored(self, channel_id: str | None, n: int = 1) -> None:
        """``n`` new messages of ``channel_id`` were stored (see the module for the cap)."""
        counts = self.stored_counts
        if channel_id in counts or len(counts) < CHANNEL_LABELS:
            counts[channel_id] = counts.get(channel_id, 0) + n
        else:
            self.stored_other += n
        self._changes += 1

    # -- what readers take ------------------------------------------------------------------
    def snapshot(self) -> ServerVitals:
        marks = (self._changes, self.traffic.changes)
        if self._snapshot is None or self._dirty_at != marks:
            self._snapshot = ServerVitals(
                server_id=self.server_id,
                started_at=self.started_at,
                connected_since=self.connected_since,
                connects=self.connects,
                disconnects=tuple(self.disconnects),
                traffic=self.traffic.buckets(),
                latency=latency_summary(tuple(self.latencies)),
                stderr=self.tail.timed(),
                stored=dict(self.stored_counts),
                stored_other=self.stored_other,
            )
            self._dirty_at = marks
        return self._snapshot
