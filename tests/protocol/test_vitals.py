"""``protocol.vitals``: messages per minute over a bounded window, and latency percentiles, from
injected times only."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.vitals import MinuteCounts, latency_summary, per_minute, percentile

times = st.lists(st.tuples(st.floats(0, 10_000), st.integers(0, 5), st.integers(0, 5)), max_size=60)


@given(times, st.integers(1, 30))
def test_the_window_never_holds_more_than_its_minutes(
    events: list[tuple[float, int, int]], minutes: int
) -> None:
    counts = MinuteCounts(minutes=minutes)
    for now, n_in, n_out in sorted(events):
        counts.add(now, received=n_in, sent=n_out)
        assert len(counts.buckets()) <= minutes


@given(times, st.integers(1, 30), st.floats(0, 20_000))
def test_per_minute_counts_exactly_the_whole_minutes_before_now(
    events: list[tuple[float, int, int]], minutes: int, now: float
) -> None:
    events = sorted(events)
    counts = MinuteCounts(minutes=minutes)
    for at, n_in, n_out in events:
        counts.add(at, received=n_in, sent=n_out)
    got_in, got_out = per_minute(counts.buckets(), now, minutes)
    assert len(got_in) == len(got_out) == minutes
    current = int(now // 60)
    for k in range(minutes):
        minute = current - minutes + k
        # what the window still holds of that minute: everything, unless it was forgotten
        # because a later minute pushed it out (then it is older than the window itself)
        expected_in = sum(i for at, i, _ in events if int(at // 60) == minute)
        expected_out = sum(o for at, _, o in events if int(at // 60) == minute)
        newest = int(events[-1][0] // 60) if events else minute
        if minute > newest - minutes:
            assert (got_in[k], got_out[k]) == (expected_in, expected_out)
        else:
            assert got_in[k] <= expected_in and got_out[k] <= expected_out


def test_the_minute_in_progress_is_not_shown_and_a_quiet_minute_is_zero() -> None:
    counts = MinuteCounts(minutes=3)
    counts.add(0.0, received=2)
    counts.add(59.9, sent=1)
    counts.add(125.0, received=7)  # minute 2, in progress at 130
    assert per_minute(counts.buckets(), 130.0, 3) == ((0, 2, 0), (0, 1, 0))
    assert per_minute(counts.buckets(), 180.0, 3) == ((2, 0, 7), (1, 0, 0))
    assert per_minute(counts.buckets(), 10_000.0, 3) == ((0, 0, 0), (0, 0, 0))


def test_the_window_at_its_cap_forgets_the_oldest_minute() -> None:
    counts = MinuteCounts(minutes=2)
    for minute in range(5):
        counts.add(minute * 60.0, received=minute + 1)
    assert counts.buckets() == ((3, 4, 0), (4, 5, 0))


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=200), st.floats(0.01, 100))
def test_a_percentile_is_one_of_the_values_and_grows_with_q(values: list[float], q: float) -> None:
    p = percentile(values, q)
    assert p in values
    assert min(values) <= p <= max(values)
    assert percentile(values, 100) == max(values)
    higher = percentile(values, min(100.0, q + 10))
    assert higher is not None and higher >= p
    # at least q percent of the values are at or below it
    assert sum(v <= p for v in values) >= q / 100 * len(values)


def test_percentiles_of_nothing_and_of_a_known_sample() -> None:
    assert percentile([], 50) is None
    assert latency_summary([]) == {"count": 0, "p50_s": None, "p95_s": None, "max_s": None}
    sample = [float(n) for n in range(1, 101)]
    assert latency_summary(sample) == {"count": 100, "p50_s": 50.0, "p95_s": 95.0, "max_s": 100.0}
    with pytest.raises(ValueError):
        percentile(sample, 0)
