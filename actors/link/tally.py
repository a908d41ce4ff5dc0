"""When to say that items were skipped as already stored.

A server that replays what the host already has (a restart, a reconnect, an example that starts
its ids over) gets every such item answered as accepted and nothing stored: the transcript must
say so, without a line per item for a trickle nor a line per batch for a burst.

``SkipTally`` is the decision alone (time is a parameter): the first skip after a quiet
``interval`` is reported at once; skips that follow within the interval are summed and reported
together when it ends (``due_at``/``take``), so at most one line per interval; ``flush`` hands
over what is still pending when the link ends. Memory is one counter, whatever the rate.
"""

from __future__ import annotations


class SkipTally:
    def __init__(self, interval: float) -> None:
        if not interval > 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self.pending = 0  # counted, not reported yet
        self.last: float | None = None  # when the last report went out

    def add(self, n: int, now: float) -> int:
        """Count ``n`` skips at ``now``; returns how many to report now (0: later or none)."""
        if n <= 0:
            return 0
        if self.pending == 0 and (self.last is None or now - self.last >= self.interval):
            self.last = now
            return n
        self.pending += n
        return 0

    def due_at(self) -> float | None:
        """When the pending sum is to be reported; None when nothing is pending."""
        if not self.pending or self.last is None:
            return None
        return self.last + self.interval

    def take(self, now: float) -> int:
        """The pending sum, if it is due at ``now`` (0 otherwise)."""
        due = self.due_at()
        if due is None or now < due:
            return 0
        return self.flush(now)

    def flush(self, now: float) -> int:
        """Whatever is pending, due or not (the link ended)."""
        n, self.pending = self.pending, 0
        if n:
            self.last = now
        return n
