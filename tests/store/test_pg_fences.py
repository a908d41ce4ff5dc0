"""Fenced writes (:class:`store.Fence`) on a real PostgreSQL store: a host that holds
``agent:Ada`` at epoch 2 writes under it; once another host has taken the lease (epoch 3) a
write under epoch 2 is refused in the writer's own transaction and nothing of it lands (no
message, no dedupe key, no journal entry, no state, no usage row), while the ops of the same
batch that are unfenced or under the current epoch land. Through :meth:`Database.apply`, its
one-op-at-a-time fallback, and the group-commit writer with its store process. On SQLite a
fence is checked against nothing and passes."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from store import (
    Append,
    AppendResult,
    Database,
    Done,
    Fence,
    GroupCommitWriter,
    PutState,
    Reader,
    StaleFence,
    StoreError,
    TrimJournal,
    db_path,
)

from .conftest import run_sql
from .fences import (
    ADA,
    STALE_DEDUPE,
    STALE_TAGS,
    Fleet,
    message,
    mixed_batch,
    usage,
)


@pytest.fixture
def fleet(pg_dsn: str) -> Iterator[Fleet]:
    hosts = Fleet(pg_dsn)
    try:
        yield hosts
    finally:
        hosts.close()


def _check_refused(outcomes: dict[str, object], old: Fence) -> None:
    for tag in STALE_TAGS:
        refused = outcomes[tag]
        assert isinstance(refused, StaleFence), (tag, refused)
        assert (refused.resource, refused.holder, refused.epoch) == (ADA, "h1", 2)
        assert "agent:Ada" in str(refused) and "epoch 2" in str(refused)
    landed = {tag: o for tag, o in outcomes.items() if tag not in STALE_TAGS}
    assert landed == {
        "plain": AppendResult(stored=True),
        "current-append": AppendResult(stored=True),
        "current-state": None,
        "current-usage": None,
    }


def _check_store(dsn: str, before: Sequence[str]) -> None:
    """Nothing of the stale ops is stored; the others are."""
    with Reader(dsn) as reader:
        assert [m["id"] for m in reader.history("Ada")] == [*before, "plain", "current"]
        assert not reader.has_dedupe(*STALE_DEDUPE)
        assert reader.journal("Ada") == []
        assert reader.state(ADA) == {"new": "current"}
    turns = run_sql(dsn, "SELECT turn_id FROM usage ORDER BY turn_id")
    assert turns == [("t-current",)]
    # the key was not taken: an unfenced append under it is stored
    with Database(dsn) as db:
        again = Append(records=(message("retried"),), dedupe=STALE_DEDUPE)
        assert db.apply([again]) == [AppendResult(stored=True)]


def test_a_stale_epoch_lands_nothing_and_sinks_nothing_in_its_batch(
    pg_dsn: str, fleet: Fleet
) -> None:
    old = fleet.h1_holds_epoch_2()
    with Database(pg_dsn) as db:
        first = Append(records=(message("before"),), fence=old)
        assert db.apply([first, usage("t-before", old)]) == [AppendResult(stored=True), None]
        run_sql(pg_dsn, "DELETE FROM usage")  # (only the batch below's rows are counted)
        new = fleet.h2_takes_over()
        batch = mixed_batch(old, new)
        outcomes = db.apply([op for _, op in batch])
    _check_refused(dict(zip([tag for tag, _ in batch], outcomes, strict=True)), old)
    _check_store(pg_dsn, ["before"])


def test_a_fence_is_the_holder_and_its_epoch_together(pg_dsn: str, fleet: Fleet) -> None:
    fleet.h1_holds_epoch_2()
    fleet.h2_takes_over()
    with Database(pg_dsn) as db:
        outcomes = db.apply(
            [
                PutState(namespace=ADA, key="a", value=1, fence=Fence(ADA, "h1", 3)),  # not h1's
                PutState(namespace=ADA, key="b", value=1, fence=Fence(ADA, "h2", 2)),  # old epoch
                PutState(namespace=ADA, key="c", value=1, fence=Fence("agent:Bo", "h2", 3)),
                TrimJournal(stream="Ada", before_seq=10, fence=Fence(ADA, "h2", 3)),
            ]
        )
    assert [type(o) for o in outcomes] == [StaleFence, StaleFence, StaleFence, type(None)]
    with Reader(pg_dsn) as reader:
        assert reader.state(ADA) == {}


def test_the_one_op_at_a_time_fallback_checks_fences_too(pg_dsn: str, fleet: Fleet) -> None:
    old = fleet.h1_holds_epoch_2()
    new = fleet.h2_takes_over()
    with Database(pg_dsn) as db:
        assert db.apply([Append(records=(message("taken"),))]) == [AppendResult(stored=True)]
        # a message id already stored fails the bulk try: the batch is applied op by op
        batch = [*mixed_batch(old, new), ("duplicate", Append(records=(message("taken"),)))]
        outcomes = dict(zip([t for t, _ in batch], db.apply([op for _, op in batch]), strict=True))
    duplicate = outcomes.pop("duplicate")
    assert isinstance(duplicate, StoreError) and not isinstance(duplicate, StaleFence)
    _check_refused(outcomes, old)
    _check_store(pg_dsn, ["taken"])


class _Outcomes:
    def __init__(self) -> None:
        self.items: dict[str, object] = {}

    def done(self, tag: str) -> Done:
        return lambda outcome: self.items.__setitem__(tag, outcome)


@pytest.mark.parametrize("process", [True, False], ids=["store-process", "thread"])
def test_the_group_commit_writer_refuses_a_stale_op_alone(
    pg_dsn: str, fleet: Fleet, process: bool
) -> None:
    old = fleet.h1_holds_epoch_2()
    out = _Outcomes()
    with GroupCommitWriter(pg_dsn, process=process) as writer:
        writer.submit(Append(records=(message("before"),), fence=old), out.done("before"))
    assert out.items == {"before": AppendResult(stored=True)}
    new = fleet.h2_takes_over()
    out = _Outcomes()
    writer = GroupCommitWriter(pg_dsn, process=process)
    batch = mixed_batch(old, new)
    for tag, op in batch:  # before the start: one batch
        writer.submit(op, out.done(tag))
    writer.start()
    assert writer.close()
    assert writer.stats().batches == 1
    _check_refused(out.items, old)  # the refusal crossed the store process's pipe intact
    _check_store(pg_dsn, ["before"])


def test_on_sqlite_a_fence_is_checked_against_nothing(tmp_path: Path) -> None:
    path = db_path(tmp_path / "data")
    anyone = Fence(ADA, "nobody", 99)
    with Database(path) as db:
        outcomes = db.apply([Append(records=(message("m"),), fence=anyone), usage("t", anyone)])
    assert outcomes == [AppendResult(stored=True), None]
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history("Ada")] == ["m"]


def test_fences_and_their_refusals_cross_a_pipe() -> None:
    fence = Fence(ADA, "h1", 2)
    ops: list[Any] = [
        Append(records=(message("x"),), fence=fence),
        PutState(namespace="n", key="k", value=1, fence=fence),
        TrimJournal(stream="s", before_seq=1, fence=fence),
        usage("t", fence),
        Append(records=()),
    ]
    assert pickle.loads(pickle.dumps(ops)) == ops
    refused = pickle.loads(pickle.dumps(StaleFence(ADA, "h1", 2)))
    assert isinstance(refused, StaleFence) and str(refused) == str(StaleFence(ADA, "h1", 2))
    assert (refused.resource, refused.holder, refused.epoch) == (ADA, "h1", 2)


@pytest.mark.parametrize(
    "args",
    [("", "h1", 1), (ADA, "", 1), (ADA, "h1", 0), (ADA, "h1", True), (ADA, "h1", "2")],
)
def test_a_fence_names_a_resource_a_holder_and_an_epoch(args: tuple[Any, ...]) -> None:
    with pytest.raises((ValueError, TypeError)):
        Fence(*args)
    with pytest.raises(TypeError, match="fence"):
        Append(records=(), fence=ADA)  # type: ignore[arg-type]
