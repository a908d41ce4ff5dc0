"""``SkipTally``: the first skip at once, later ones summed per interval, nothing lost."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.link.tally import SkipTally

INTERVAL = 10.0

#: One step: either ``n`` skips after ``dt`` seconds, or a timer check after ``dt`` seconds.
steps = st.lists(
    st.tuples(
        st.sampled_from(["add", "tick"]),
        st.floats(min_value=0, max_value=30, allow_nan=False),
        st.integers(min_value=0, max_value=1000),
    ),
    max_size=60,
)


def replay(script: list[tuple[str, float, int]]) -> tuple[list[tuple[float, int]], int, float]:
    """Run a script; the reports (time, count), the total added, and the end time."""
    tally = SkipTally(INTERVAL)
    now, added, reports = 0.0, 0, []
    for op, dt, n in script:
        now += dt
        due = tally.due_at()
        if due is not None and due <= now:  # the timer fires at its due time, never late
            got = tally.take(due)
            assert got > 0
            reports.append((due, got))
        if op == "add":
            added += max(n, 0)
            got = tally.add(n, now)
            if got:
                reports.append((now, got))
    end = now + 1
    last = tally.flush(end)
    if last:
        reports.append((end, last))
    return reports, added, end


@given(steps)
def test_every_skip_is_reported_exactly_once(script: list[tuple[str, float, int]]) -> None:
    reports, added, _ = replay(script)
    assert sum(n for _, n in reports) == added


@given(steps)
def test_reports_are_an_interval_apart_until_the_final_flush(
    script: list[tuple[str, float, int]],
) -> None:
    reports, _, end = replay(script)
    timed = [t for t, _ in reports if t != end]
    assert all(b >= a + INTERVAL for a, b in itertools.pairwise(timed))


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.integers(1, 10_000))
def test_the_first_skip_after_a_quiet_interval_is_reported_at_once(now: float, n: int) -> None:
    tally = SkipTally(INTERVAL)
    assert tally.add(n, now) == n
    assert tally.add(3, now + INTERVAL) == 3  # quiet for a whole interval since


def test_a_trickle_is_summed_into_one_report_per_interval() -> None:
    tally = SkipTally(INTERVAL)
    assert tally.add(1, 0.0) == 1
    for t in (2.0, 4.0, 6.0, 8.0):
        assert tally.add(1, t) == 0
    assert tally.due_at() == INTERVAL
    assert tally.take(9.9) == 0
    assert tally.take(INTERVAL) == 4
    assert tally.due_at() is None


def test_a_burst_is_one_report_however_many_batches() -> None:
    tally = SkipTally(INTERVAL)
    assert tally.add(256, 0.0) == 256
    for _ in range(100):
        assert tally.add(256, 0.5) == 0
    assert tally.flush(1.0) == 25_600
    assert tally.flush(1.0) == 0


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SkipTally(0)
