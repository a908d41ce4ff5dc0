"""Daily budgets: what each agent, and all agents together, used today, against the limits.

Every agent counts its day: the tokens of every kind its model calls were billed for, and what
they cost at :mod:`protocol.prices` (a model with no price costs nothing here, and says so once).
The host counts the same for all its agents together in one :class:`DayLedger` the agents share
on the host's loop (``ctx.day``): each agent adds its turn to its own ledger and to the host's as
the turn ends, in one step with no wait, so no two adds interleave.

Limits: an agent's ``budget_daily_tokens`` / ``budget_daily_usd`` and the same keys under
``[host]`` for the total. A day is a calendar day in ``[host] timezone`` (UTC by default).

- At 80 % of a limit, one warning line a day (``budget-warning``).
- At 100 %, the agent is paused (``budget-paused``) until the next day or ``Host.resume``. A
  turn already running finishes, so an agent's own budget is never passed by more than its one
  turn. The host's total is checked when each turn ends and before each turn starts: it is
  never passed by more than the turns already running when it was reached (at most one per
  agent).
- A resume by the operator lets the next turn run; a limit still reached pauses the agent again
  when that turn ends.

The ledger read at a start (today's rows of the usage ledger) runs in the store's reader thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime, tzinfo
from typing import Any

from actors.models.base import Usage
from actors.models.usage import cost_of, tokens_of
from protocol.budget import DailyBudget, Step, day_start, next_day
from protocol.prices import Price, cost, price_of, prices
from store import Reader

UNITS = ("tokens", "usd")


def wall_clock() -> float:
    """Now, in POSIX seconds: the clock the budgets' days are read from."""
    return time.time()


def counts_of(used: Usage, price: Price | None) -> dict[str, float]:
    """What a turn counts against each unit: its tokens (every kind a call is billed for) and
    its cost (0 with no price)."""
    spent = cost(
        price,
        input_tokens=used.input_tokens,
        output_tokens=used.output_tokens,
        cache_read_tokens=used.cache_read_input_tokens,
        cache_write_tokens=used.cache_creation_input_tokens,
    )
    return {"tokens": float(sum(used.as_dict().values())), "usd": float(spent or 0)}


def used_since(
    reader: Reader, since: float, table: Mapping[str, Price], agent: str | None = None
) -> dict[str, float]:
    """The tokens and the cost (of the priced models) the usage ledger holds since ``since``,
    for ``agent`` or for every agent (blocking: run in the store's reader)."""
    out = dict.fromkeys(UNITS, 0.0)
    for t in reader.usage(since=since, agent=agent):
        out["tokens"] += tokens_of(t)
        out["usd"] += float(cost_of(t, price_of(t.model, table)) or 0)
    return out


def limits_of(cfg: Any) -> dict[str, float | None]:
    """The daily limits an agent's or the host's config sets, by unit (None: no limit)."""
    return {"tokens": cfg.budget_daily_tokens, "usd": cfg.budget_daily_usd}


def show(unit: str, amount: float | None) -> str:
    if amount is None:
        return "no limit"
    return f"${amount:,.2f}" if unit == "usd" else f"{amount:,.0f} tokens"


def local_time(when: float, tz: tzinfo) -> str:
    """``when`` in the budgets' zone, to the minute, with its offset (2026-12-07T00:00+01:00)."""
    return datetime.fromtimestamp(when, tz).isoformat(timespec="minutes")


class DayLedger:
    """Today's count and limit in each unit, for one agent or for the host."""

    def __init__(self, limits: Mapping[str, float | None], tz: tzinfo, now: float) -> None:
        self.tz = tz
        self.units = {u: DailyBudget.starting(limits.get(u), 0, now, tz) for u in UNITS}

    def start(self, used: Mapping[str, float], now: float) -> None:
        """Start the day with what the ledger already holds for it."""
        self.units = {
            u: DailyBudget.starting(b.limit, used.get(u, 0), now, self.tz)
            for u, b in self.units.items()
        }

    def relimit(self, limits: Mapping[str, float | None], tz: tzinfo, now: float) -> None:
        """New limits (a reload); a new zone starts the day again from what was counted."""
        if tz != self.tz:
            self.tz = tz
            for budget in self.units.values():
                budget.tz, budget.day = tz, day_start(now, tz)
        for unit, budget in self.units.items():
            budget.limit = limits.get(unit)
            budget.warned = budget.limit is not None and budget.used >= 0.8 * budget.limit

    @property
    def limited(self) -> bool:
        return any(b.limit is not None for b in self.units.values())

    def add(self, counts: Mapping[str, float], now: float) -> list[tuple[str, Step]]:
        """Count a turn; the units whose warning or pause it reached."""
        steps = [(u, b.add(counts.get(u, 0), now)) for u, b in self.units.items()]
        return [(u, step) for u, step in steps if step != "ok"]

    def reached(self, now: float) -> str | None:
        """A unit whose limit today's count has reached, or None."""
        return next((u for u, b in self.units.items() if b.exceeded(now)), None)

    def next_day(self, now: float) -> float:
        return next_day(now, self.tz)

    def snapshot(self, now: float) -> dict[str, Any]:
        """Today's counts, limits and what is left, for ``mcplive status`` and the console."""
        out: dict[str, Any] = {"day": local_time(day_start(now, self.tz), self.tz)[:10]}
        for unit, budget in self.units.items():
            budget.roll(now)
            out[unit] = {
                "used": round(budget.used, 6),
                "limit": budget.limit,
                "left": None if budget.limit is None else round(budget.left(now) or 0, 6),
            }
        return out


class AgentBudget:
    """One agent's side of the budgets: its own ledger, the host's shared one, and the words
    of each warning and pause. ``trace`` is the agent's trace function."""

    def __init__(self, agent: str, host_day: DayLedger, trace: Callable[..., None]) -> None:
        self.agent = agent
        self.host = host_day
        self.own = DayLedger({}, host_day.tz, wall_clock())
        self.trace = trace
        self.grace = False  # the operator resumed the agent: its next turn may start

    @property
    def watched(self) -> bool:
        """A limit applies to this agent (its own or the host's): it keeps a day timer."""
        return self.own.limited or self.host.limited

    def start(self, limits: Mapping[str, float | None], used: Mapping[str, float]) -> None:
        now = wall_clock()
        self.own = DayLedger(limits, self.host.tz, now)
        self.own.start(used, now)

    def unpriced(self, model: str) -> None:
        """Say once that a model with no price counts nothing against a cost budget."""
        if self.own.units["usd"].limit is not None or self.host.units["usd"].limit is not None:
            self.trace(
                "budget-unpriced",
                model=model,
                line=f"{model} has no price: budget_daily_usd counts nothing for it "
                f'(add [prices."{model}"])',
            )

    def count(self, used: Usage, price: Price | None, waiting: int) -> str | None:
        """Count an ended turn in both ledgers; the pause reason when a limit is reached."""
        now = wall_clock()
        counts = counts_of(used, price)
        reason = None
        for scope, ledger in (("agent", self.own), ("host", self.host)):
            for unit, step in ledger.add(counts, now):
                budget = ledger.units[unit]
                if step == "warn":
                    self.trace(
                        "budget-warning",
                        unit=unit,
                        scope=scope,
                        used=budget.used,
                        budget=budget.limit,
                    )
                elif reason is None:
                    reason = self.pause(scope, unit, now, waiting)
        return reason

    def before_turn(self, waiting: int) -> str | None:
        """The pause reason when the host's total is reached (checked before a turn starts,
        unless the operator resumed this agent since)."""
        if self.grace:
            self.grace = False
            return None
        now = wall_clock()
        unit = self.host.reached(now)
        return None if unit is None else self.pause("host", unit, now, waiting)

    def reached(self, now: float) -> tuple[str, str] | None:
        """The scope and unit of a limit reached today, or None."""
        for scope, ledger in (("agent", self.own), ("host", self.host)):
            unit = ledger.reached(now)
            if unit is not None:
                return scope, unit
        return None

    def pause_if_reached(self, waiting: int) -> str | None:
        """The pause reason when a limit is reached today (traced), or None."""
        now = wall_clock()
        reached = self.reached(now)
        return None if reached is None else self.pause(*reached, now, waiting)

    def clear(self) -> bool:
        """No limit is reached today (a new day has started, or a limit was raised)."""
        return self.reached(wall_clock()) is None

    def pause(self, scope: str, unit: str, now: float, waiting: int) -> str:
        """Trace the pause and return its reason (what the agent's status shows)."""
        ledger = self.own if scope == "agent" else self.host
        budget = ledger.units[unit]
        resumes_at = local_time(ledger.next_day(now), ledger.tz)
        whose = "daily" if scope == "agent" else "host-wide daily"
        kind = "token" if unit == "tokens" else "cost"
        self.trace(
            "budget-paused",
            unit=unit,
            scope=scope,
            used=budget.used,
            budget=budget.limit,
            resumes_at=resumes_at,
            waiting=waiting,
        )
        return (
            f"{whose} {kind} budget reached ({show(unit, budget.used)} of "
            f"{show(unit, budget.limit)}); resumes at {resumes_at}"
        )

    def seconds_to_next_day(self) -> float:
        now = wall_clock()
        return max(min(self.own.next_day(now), self.host.next_day(now)) - now, 1.0)

    def snapshot(self) -> dict[str, Any]:
        return self.own.snapshot(wall_clock())


def host_ledger(config: Any) -> DayLedger:
    """A host ledger for ``config``'s ``[host]`` limits, counting from 0."""
    return DayLedger(limits_of(config), config.tz, wall_clock())


async def host_day(ctx: Any, ledger: DayLedger | None, config: Any) -> DayLedger:
    """The host's ledger for ``config`` (``ledger`` given new limits and zone on a reload),
    started with what the usage ledger holds for today when a host-wide limit is set."""
    now = wall_clock()
    if ledger is None:
        ledger = host_ledger(config)
    else:
        ledger.relimit(limits_of(config), config.tz, now)
    if ledger.limited:
        store = ctx.store
        since = day_start(now, config.tz)
        used = await store.read(used_since, store.reader, since, prices(config.prices))
        ledger.start(used, now)
    return ledger


def today_since(config: Any) -> float:
    """The start of today in the config's budget zone."""
    return day_start(wall_clock(), config.tz)
