"""The figures a 24/7 console shows of one server, as pure functions of injected times.

- :class:`MinuteCounts` counts messages in and out per whole minute of a clock the caller
  gives, keeping the last ``minutes`` minutes (older ones are forgotten as time moves on:
  memory is ``minutes`` buckets whatever the rate); :func:`per_minute` reads them back as one
  figure per minute, oldest first, zero for a minute without traffic.
- :func:`percentile` is the nearest-rank percentile of a sample (the request latencies a link
  keeps: a bounded window of the newest ones).
- :func:`latency_summary` is what the console shows of such a window: its p50, p95, its
  largest value and how many samples it holds.

No clock, no I/O: every time is a parameter.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

#: A window bucket: (minute number, messages in, messages out).
Bucket = tuple[int, int, int]


def minute_of(now: float, width: float = 60.0) -> int:
    """The number of the minute ``now`` falls in (minutes of ``width`` seconds)."""
    return math.floor(now / width)


class MinuteCounts:
    """Messages in and out per minute, the newest ``minutes`` minutes (see the module)."""

    __slots__ = ("_buckets", "changes", "minutes", "width")

    def __init__(self, minutes: int = 60, width: float = 60.0) -> None:
        if minutes < 1 or not width > 0:
            raise ValueError("minutes must be at least 1 and width positive")
        self.minutes = minutes
        self.width = width
        # [minute, in, out], oldest first; at most ``minutes`` of them
        self._buckets: deque[list[int]] = deque(maxlen=minutes)
        self.changes = 0  # how many adds counted something: a reader's mark of what it saw

    def add(self, now: float, *, sent: int = 0, received: int = 0) -> None:
        """Count ``received`` messages in and ``sent`` out at ``now`` (a time earlier than the
        newest bucket counts in the newest: a clock is not expected to go back)."""
        if sent <= 0 and received <= 0:
            return
        minute = minute_of(now, self.width)
        buckets = self._buckets
        if not buckets or buckets[-1][0] < minute:
            buckets.append([minute, 0, 0])  # the oldest goes past ``minutes`` buckets
        bucket = buckets[-1]
        self.changes += 1
        bucket[1] += max(received, 0)
        bucket[2] += max(sent, 0)

    def buckets(self) -> tuple[Bucket, ...]:
        """The buckets kept, oldest first, as an immutable value."""
        return tuple((m, i, o) for m, i, o in self._buckets)


def per_minute(
    buckets: Sequence[Bucket], now: float, minutes: int, width: float = 60.0
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Messages (in, out) in each of the ``minutes`` whole minutes before the one ``now`` falls
    in, oldest first, zero where none was counted. The minute in progress is not included: its
    figure would still grow."""
    current = minute_of(now, width)
    first = current - minutes
    got_in = [0] * minutes
    got_out = [0] * minutes
    for minute, n_in, n_out in buckets:
        if first <= minute < current:
            got_in[minute - first] += n_in
            got_out[minute - first] += n_out
    return tuple(got_in), tuple(got_out)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; None when empty."""
    if not 0 < q <= 100:
        raise ValueError("q must be in (0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50, p95 and the largest of ``values`` (seconds, rounded to the microsecond), and how
    many there are."""

    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 6)

    return {
        "count": len(values),
        "p50_s": rounded(percentile(values, 50)),
        "p95_s": rounded(percentile(values, 95)),
        "max_s": rounded(max(values)) if values else None,
    }
