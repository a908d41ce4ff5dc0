"""The daily budget's rule: the day (UTC or a time zone's), a warning at 80 %, a pause at 100 %."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from hypothesis import given
from hypothesis import strategies as st

from protocol.budget import DAY, WARN_AT, DailyBudget, day_start, next_day

times = st.floats(min_value=0, max_value=4e9, allow_nan=False)
turns = st.lists(st.integers(0, 3000), max_size=30)


@given(times)
def test_the_next_day_is_the_next_utc_midnight(now: float) -> None:
    start, then = day_start(now), next_day(now)
    assert start <= now < then == start + DAY
    midnight = datetime.fromtimestamp(then, UTC)
    assert (midnight.hour, midnight.minute, midnight.second) == (0, 0, 0)
    assert datetime.fromtimestamp(start, UTC).date() == datetime.fromtimestamp(now, UTC).date()


@given(st.integers(1, 10_000), turns, times)
def test_one_warning_then_a_pause_at_most_one_turn_past_the_budget(
    limit: int, used: list[int], now: float
) -> None:
    budget = DailyBudget.starting(limit, 0, now)
    steps = []
    for tokens in used:
        before = budget.used
        step = budget.add(tokens, now)
        steps.append(step)
        if step == "pause":
            assert before < limit
            assert budget.used >= limit
            break
        assert budget.used < limit
        assert (step == "warn") == (before < WARN_AT * limit <= budget.used)
    assert steps.count("warn") <= 1
    assert steps.count("pause") <= 1
    if "pause" not in steps:
        assert sum(used) < limit


@given(st.integers(1, 10_000), st.integers(0, 20_000), times, st.integers(0, 3000))
def test_a_new_day_counts_from_zero(limit: int, used: int, now: float, tokens: int) -> None:
    budget = DailyBudget.starting(limit, used, now)
    assert budget.exceeded(now) == (used >= limit)
    assert budget.warned == (used >= WARN_AT * limit)
    tomorrow = next_day(now)
    assert not budget.exceeded(tomorrow)
    assert budget.used == 0 and not budget.warned
    step = budget.add(tokens, tomorrow + 1)
    assert budget.used == tokens
    assert step == ("pause" if tokens >= limit else "warn" if tokens >= WARN_AT * limit else "ok")


def test_a_start_past_the_budget_is_exceeded_and_not_warned_again() -> None:
    budget = DailyBudget.starting(2000, 2100, 1_000_000.0)
    assert budget.exceeded(1_000_000.0)
    assert budget.add(10, 1_000_001.0) == "pause"


ZONES = [
    "Europe/Berlin",  # summer time: days of 23 and 25 hours
    "America/Sao_Paulo",  # its clocks once skipped midnight itself
    "Asia/Tehran",
    "Pacific/Apia",  # skipped 30 December 2011 whole
    "Pacific/Kiritimati",
    "America/St_Johns",
    "Australia/Lord_Howe",  # half-hour summer time
]


@given(times, st.sampled_from(ZONES))
def test_a_day_in_a_time_zone_runs_from_its_midnight_to_the_next(now: float, name: str) -> None:
    tz = ZoneInfo(name)
    start, then = day_start(now, tz), next_day(now, tz)
    assert start <= now < then
    assert 0 < then - start <= 26 * 3600
    assert day_start(then, tz) == then  # the next day starts where this one ends
    local = datetime.fromtimestamp(start, tz)
    assert local.date() == datetime.fromtimestamp(now, tz).date()
    # midnight, unless the clocks skipped it: then the day's first instant (before 02:00)
    assert (local.hour, local.minute) == (0, 0) or local.hour < 2
    assert datetime.fromtimestamp(start - 1, tz).date() < local.date()


@given(st.integers(1, 10_000), st.integers(0, 20_000), times, st.sampled_from(ZONES))
def test_a_budget_in_a_time_zone_counts_from_zero_at_its_next_day(
    limit: int, used: int, now: float, name: str
) -> None:
    tz = ZoneInfo(name)
    budget = DailyBudget.starting(limit, used, now, tz)
    assert budget.exceeded(now) == (used >= limit)
    assert not budget.exceeded(next_day(now, tz))
    assert budget.used == 0


@given(st.integers(0, 20_000), times)
def test_without_a_limit_a_budget_only_counts(used: int, now: float) -> None:
    budget = DailyBudget.starting(None, used, now)
    assert budget.add(10**9, now) == "ok" and not budget.exceeded(now)
    assert budget.used == used + 10**9 and budget.left(now) is None
