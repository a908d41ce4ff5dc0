"""The outbox's claiming rule (:func:`protocol.outbox.claimable`): over any history of holders
taking a server's lease (epochs growing) and claiming, a row is claimed at most once per epoch,
never after it is done, and a stale holder takes no row from the current one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.outbox import STATES, claimable

HOSTS = ("h1", "h2", "h3")

leases = st.tuples(st.sampled_from(HOSTS), st.integers(0, 5))
rows = st.one_of(
    st.just(("queued", None, None)),
    st.tuples(st.sampled_from(STATES[1:]), st.sampled_from(HOSTS), st.integers(0, 5)),
)


@given(rows, leases)
def test_queued_rows_are_claimable_and_done_rows_never(
    row: tuple[str, str | None, int | None], lease: tuple[str, int]
) -> None:
    state, by, at = row
    holder, epoch = lease
    if state == "queued":
        assert claimable(state, by, at, holder, epoch)
    if state == "done":
        assert not claimable(state, by, at, holder, epoch)


@given(leases, leases)
def test_a_claim_is_taken_again_only_by_a_newer_epoch_or_another_holder_of_the_same(
    claimer: tuple[str, int], other: tuple[str, int]
) -> None:
    by, at = claimer
    holder, epoch = other
    assert not claimable("claimed", by, at, by, at)  # its own claim: it is publishing it
    expected = epoch > at or (epoch == at and holder != by)
    assert claimable("claimed", by, at, holder, epoch) == expected


@given(leases, st.integers(1, 5))
def test_whoever_may_claim_a_row_under_an_epoch_may_under_a_later_one(
    claimer: tuple[str, int], later: int
) -> None:
    by, at = claimer
    for holder in HOSTS:
        for epoch in range(0, 6):
            if claimable("claimed", by, at, holder, epoch):
                assert claimable("claimed", by, at, holder, epoch + later)


@given(st.lists(st.tuples(st.sampled_from(("take", "claim", "stale", "finish")), leases)))
def test_over_any_history_a_row_is_claimed_at_most_once_per_epoch(
    history: list[tuple[str, tuple[str, int]]],
) -> None:
    """A server's lease passes from holder to holder (each take a newer epoch); the current
    holder claims, a stale one tries to (its fence would refuse it: the rule alone must too,
    for any claim made under a newer epoch), and a finish ends the row."""
    current = ("h1", 1)
    state, by, at = "queued", None, None
    claims: list[tuple[str, int]] = []
    for action, (host, bump) in history:
        holder, epoch = current
        if action == "take":
            current = (host, epoch + 1 + bump)
        elif action == "claim":
            if claimable(state, by, at, holder, epoch):
                state, by, at = "claimed", holder, epoch
                claims.append(current)
        elif action == "stale" and at is not None and host != holder:
            older = at - 1 - bump
            assert not claimable(state, by, at, host, older)
        elif action == "finish" and state == "claimed":
            state = "done"
    assert len(set(claims)) == len(claims)  # at most once per (holder, epoch)
    assert [e for _, e in claims] == sorted({e for _, e in claims})  # epochs only grow
