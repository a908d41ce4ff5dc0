"""An agent's daily budget: the UTC day, the 80 % warning and the 100 % pause.

A :class:`DailyBudget` counts what an agent used on one UTC day: tokens (every kind a model
call is billed for: input, output, cache read and cache write), or US dollars. Adding a turn's
count says what the agent does next: nothing, warn once a day when the total first reaches
:data:`WARN_AT` of the budget, or pause when it reaches the budget. A new UTC day starts the
count again at 0.

Pure: time is a parameter (POSIX seconds); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The share of the budget at which one warning is given (once a day).
WARN_AT = 0.8
DAY = 86_400

Step = Literal["ok", "warn", "pause"]


def day_start(now: float) -> float:
    """The start (00:00 UTC) of the UTC day holding ``now``."""
    return float(now - now % DAY)


def next_day(now: float) -> float:
    """The start (00:00 UTC) of the UTC day after the one holding ``now``."""
    return day_start(now) + DAY


@dataclass
class DailyBudget:
    """The tokens used on the UTC day starting at ``day`` against ``limit``."""

    limit: float
    day: float
    used: float = 0
    warned: bool = False

    @classmethod
    def starting(cls, limit: float, used: float, now: float) -> DailyBudget:
        """The budget at a start: ``used`` tokens already recorded today (``now``'s UTC day);
        a start at or past the warning share is not warned again."""
        return cls(limit=limit, day=day_start(now), used=used, warned=used >= WARN_AT * limit)

    def roll(self, now: float) -> None:
        """Count from 0 again when ``now`` is on a later UTC day."""
        start = day_start(now)
        if start > self.day:
            self.day, self.used, self.warned = start, 0, False

    def exceeded(self, now: float) -> bool:
        """The day's tokens have reached the budget (on ``now``'s UTC day)."""
        self.roll(now)
        return self.used >= self.limit

    def add(self, tokens: float, now: float) -> Step:
        """Count a turn's ``tokens`` (it ended at ``now``): ``"pause"`` when the day's total
        has reached the budget, ``"warn"`` the first time it reaches the warning share that
        day, else ``"ok"``."""
        self.roll(now)
        self.used += max(0, tokens)
        if self.used >= self.limit:
            self.warned = True
            return "pause"
        if not self.warned and self.used >= WARN_AT * self.limit:
            self.warned = True
            return "warn"
        return "ok"
