"""Daily budgets: the budget's day, the 80 % warning and the 100 % pause.

A :class:`DailyBudget` counts what was used on one day: tokens (every kind a model call is
billed for: input, output, cache read and cache write), or US dollars. Its day is a calendar
day in a time zone (UTC unless the host's ``timezone`` names another), so a day in a zone with
daylight saving can last 23 or 25 hours. A budget without a limit only counts (what ``mcplive
status`` shows as today's usage). Adding a turn's count says what comes next: nothing, warn once
a day when the total first reaches :data:`WARN_AT` of the limit, or pause when it reaches the
limit. A new day starts the count again at 0.

Pure: time is a parameter (POSIX seconds) and the zone a ready ``tzinfo``; nothing here reads
a clock or a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Literal

#: The share of the budget at which one warning is given (once a day).
WARN_AT = 0.8
DAY = 86_400

Step = Literal["ok", "warn", "pause"]


def _midnight(year: int, month: int, day: int, tz: tzinfo) -> float:
    """00:00 of a date in ``tz``, in POSIX seconds. Where the clocks skip midnight, 00:00 read
    with the offset in force before the change is the change itself: the day's first instant."""
    return float(datetime(year, month, day, tzinfo=tz).timestamp())


def day_start(now: float, tz: tzinfo = UTC) -> float:
    """The start (00:00 in ``tz``) of the day holding ``now``."""
    if tz is UTC:
        return float(now - now % DAY)
    today = datetime.fromtimestamp(now, tz)
    return min(now, _midnight(today.year, today.month, today.day, tz))


def next_day(now: float, tz: tzinfo = UTC) -> float:
    """The start (00:00 in ``tz``) of the day after the one holding ``now``."""
    if tz is UTC:
        return day_start(now) + DAY
    today = datetime.fromtimestamp(now, tz).date()
    tomorrow = today + timedelta(days=1)
    return max(_midnight(tomorrow.year, tomorrow.month, tomorrow.day, tz), now + 1)


@dataclass
class DailyBudget:
    """What was used on the day starting at ``day`` (in ``tz``) against ``limit`` (None: no
    limit, only a count)."""

    limit: float | None
    day: float
    used: float = 0
    warned: bool = False
    tz: tzinfo = field(default=UTC, compare=False)

    @classmethod
    def starting(
        cls, limit: float | None, used: float, now: float, tz: tzinfo = UTC
    ) -> DailyBudget:
        """The budget at a start: ``used`` already recorded today (``now``'s day in ``tz``);
        a start at or past the warning share is not warned again."""
        warned = limit is not None and used >= WARN_AT * limit
        return cls(limit=limit, day=day_start(now, tz), used=used, warned=warned, tz=tz)

    def roll(self, now: float) -> None:
        """Count from 0 again when ``now`` is on a later day."""
        start = day_start(now, self.tz)
        if start > self.day:
            self.day, self.used, self.warned = start, 0, False

    def exceeded(self, now: float) -> bool:
        """The day's count has reached the limit (on ``now``'s day)."""
        self.roll(now)
        return self.limit is not None and self.used >= self.limit

    def left(self, now: float) -> float | None:
        """What is left of the limit today (never below 0); None with no limit."""
        self.roll(now)
        return None if self.limit is None else max(0.0, self.limit - self.used)

    def add(self, count: float, now: float) -> Step:
        """Count a turn's ``count`` (it ended at ``now``): ``"pause"`` when the day's total
        has reached the limit, ``"warn"`` the first time it reaches the warning share that
        day, else ``"ok"``."""
        self.roll(now)
        self.used += max(0, count)
        if self.limit is None:
            return "ok"
        if self.used >= self.limit:
            self.warned = True
            return "pause"
        if not self.warned and self.used >= WARN_AT * self.limit:
            self.warned = True
            return "warn"
        return "ok"
