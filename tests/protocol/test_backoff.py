"""How a connection backs off (``protocol.backoff``): every link that was not ready for long
counts one more failed attempt, whatever it lasted; only a link ready long enough starts the
count again; the longest wait doubles per attempt up to the cap."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.backoff import ceiling, next_attempt

HEALTHY = 30.0
bases = st.floats(min_value=0.001, max_value=100.0)
caps = st.floats(min_value=0.001, max_value=1e6)
#: how long a link that ended was ready: None (never) or a duration
readiness = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e9))


def run(ends: list[float | None], healthy: float = HEALTHY) -> list[int]:
    """The retry numbers a row of ended links gets (each given how long it was ready)."""
    attempt, out = 0, []
    for ready_for in ends:
        attempt = next_attempt(attempt, ready_for, healthy)
        out.append(attempt)
    return out


@given(st.integers(min_value=1, max_value=200), bases, caps)
def test_a_server_that_is_never_ready_backs_off_further_each_time_up_to_the_cap(
    n: int, base: float, cap: float
) -> None:
    attempts = run([None] * n)
    assert attempts == list(range(1, n + 1))
    tops = [ceiling(a, base, cap) for a in attempts]
    assert tops == sorted(tops)
    assert all(0 < top <= cap for top in tops)
    for before, after in itertools.pairwise(tops):
        assert after == min(cap, 2 * before)  # doubles until it is held at the cap
    assert ceiling(n + 64, base, cap) == cap  # and it reaches the cap


@given(st.lists(readiness, max_size=50))
def test_only_a_link_ready_long_enough_starts_the_count_again(
    ends: list[float | None],
) -> None:
    attempts = run(ends)
    for i, (ready_for, attempt) in enumerate(zip(ends, attempts, strict=True)):
        before = attempts[i - 1] if i else 0
        if ready_for is not None and ready_for >= HEALTHY:
            assert attempt == 1
        else:  # never ready, or not for long: one more failure, however long the link lasted
            assert attempt == before + 1


@given(st.integers(min_value=0, max_value=10_000), st.floats(min_value=0.0, max_value=HEALTHY))
def test_a_link_ready_for_less_than_the_threshold_counts_as_a_failure(
    previous: int, ready_for: float
) -> None:
    expected = 1 if ready_for >= HEALTHY else previous + 1
    assert next_attempt(previous, ready_for, HEALTHY) == expected
    assert next_attempt(previous, None, HEALTHY) == previous + 1


def test_counts_start_from_zero_and_one() -> None:
    with pytest.raises(ValueError):
        next_attempt(-1, None, HEALTHY)
    with pytest.raises(ValueError):
        ceiling(0, 1.0, 2.0)
