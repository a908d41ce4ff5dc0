"""The host's store writer (:mod:`actors.store_writer`) against a real store process: the
group-commit writer's rules (order, grouping, ``max_batch``, the ``max_queue`` cap, bulk
gathering, rows filed before acknowledgements, draining on close) held by a trio task, and a
store process that dies between or during batches replaced without losing what was committed."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import storage, store_writer
from actors.kernel import Work
from actors.storage import StoreClient
from actors.store_writer import StoreWriter
from store import (
    Append,
    AppendResult,
    Done,
    Op,
    Reader,
    StaleFence,
    StoreClosed,
    StoreError,
    StoreFull,
)
from store.items import WrittenRow
from tests.store.conftest import GUARD, kill_host_with_stopped_store, record, wait_gone
from tests.store.fences import ADA, STALE_DEDUPE, STALE_TAGS, Fleet, message, mixed_batch

#: Far longer than any test: bulk ops gather until something else ends their wait.
FOREVER = 3600.0


def _append(text: str) -> Append:
    return Append(records=(record(text, id=text),))


class Log:
    """What the writer told, in order: ``("rows", ids, gap)`` per commit and ``(tag, outcome)``
    per op."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []
        self._changed = trio.Event()

    def _add(self, event: tuple[object, ...]) -> None:
        self.events.append(event)
        self._changed.set()

    def done(self, tag: str) -> Done:
        return lambda outcome: self._add((tag, outcome))

    def commit(self, rows: list[WrittenRow], gap: bool) -> None:
        self._add(("rows", [row[1] for row in rows], gap))

    async def until(self, count: int) -> None:
        """Wait until ``count`` ops are done."""
        while len(self.tags()) < count:
            self._changed = trio.Event()
            await self._changed.wait()

    def outcomes(self) -> dict[object, object]:
        return {e[0]: e[1] for e in self.events if e[0] != "rows"}

    def tags(self) -> list[object]:
        return [e[0] for e in self.events if e[0] != "rows"]


class _Database:
    """A PostgreSQL store where a test names a file in its folder: every name is the DSN."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def __truediv__(self, _name: str) -> str:
        return self.dsn


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The test's folder, whose ``s.db`` is its SQLite store; or a PostgreSQL database."""
    if request.param == "postgresql":
        return _Database(request.getfixturevalue("pg_dsn"))
    return tmp_path


def _writer(path: Path, log: Log, **kwargs: float) -> StoreWriter:
    writer = StoreWriter(path / "s.db", **kwargs)  # type: ignore[arg-type]
    writer.on_commit = log.commit
    return writer


def _submit(writer: StoreWriter, log: Log, *texts: str, bulk: bool = False) -> None:
    writer.submit_many([(_append(t), log.done(t)) for t in texts], bulk=bulk)


def _stored(path: Path, name: str = "s.db") -> list[str]:
    with Reader(path / name) as reader:
        return [m["id"] for m in reader.history("alice")]


async def test_ops_waiting_behind_a_batch_commit_together_in_order(where: Path) -> None:
    log = Log()
    writer = _writer(where, log)
    writer.start()
    with trio.fail_after(GUARD):
        _submit(writer, log, "a")
        await trio.testing.wait_all_tasks_blocked()  # the task has taken "a"
        _submit(writer, log, "b")
        _submit(writer, log, "c", "d")
        await writer.aclose()
    assert log.tags() == ["a", "b", "c", "d"]
    assert all(isinstance(o, AppendResult) and o.stored for o in log.outcomes().values())
    stats = writer.stats()
    assert (stats.ops, stats.batches, stats.largest_batch) == (4, 2, 3)
    assert _stored(where) == ["a", "b", "c", "d"]


async def test_each_batchs_rows_are_told_before_its_ops_are_done(where: Path) -> None:
    log = Log()
    writer = _writer(where, log, max_batch=2)
    _submit(writer, log, "a", "b", "c")  # before the start: batches of at most 2
    writer.start()
    with trio.fail_after(GUARD):
        await writer.aclose()
    assert log.events == [
        ("rows", ["a", "b"], False),
        ("a", AppendResult(stored=True)),
        ("b", AppendResult(stored=True)),
        ("rows", ["c"], False),
        ("c", AppendResult(stored=True)),
    ]


async def test_the_queue_refuses_past_max_queue_and_keeps_what_it_took(where: Path) -> None:
    log = Log()
    writer = _writer(where, log, max_queue=3)
    _submit(writer, log, "a", "b")
    with pytest.raises(StoreFull):
        _submit(writer, log, "c", "d")  # all or none: 4 do not fit
    _submit(writer, log, "c")  # exactly at the cap
    with pytest.raises(StoreFull):
        _submit(writer, log, "d")
    writer.start()
    with trio.fail_after(GUARD):
        await writer.aclose()
    assert log.tags() == ["a", "b", "c"]
    assert _stored(where) == ["a", "b", "c"]
    with pytest.raises(StoreClosed):
        _submit(writer, log, "e")


async def test_bulk_ops_gather_until_a_prompt_op_takes_them_with_it(where: Path) -> None:
    log = Log()
    writer = _writer(where, log, bulk_gap=FOREVER)
    writer.start()
    with trio.fail_after(GUARD):
        _submit(writer, log, "x", "y", bulk=True)
        await trio.testing.wait_all_tasks_blocked()
        assert writer.stats().batches == 0  # gathering
        _submit(writer, log, "p")
        await log.until(3)
        assert writer.stats().batches == 1  # one commit for all three
        _submit(writer, log, "z", bulk=True)
        await trio.testing.wait_all_tasks_blocked()
        assert log.tags() == ["x", "y", "p"]  # "z" gathers
        await writer.aclose()  # closing commits it at once
    assert log.tags() == ["x", "y", "p", "z"]
    assert writer.stats().batches == 2
    assert _stored(where) == ["x", "y", "p", "z"]


async def test_a_full_batch_of_bulk_ops_does_not_wait(where: Path) -> None:
    log = Log()
    writer = _writer(where, log, bulk_gap=FOREVER, max_batch=2)
    writer.start()
    with trio.fail_after(GUARD):
        await trio.testing.wait_all_tasks_blocked()  # the task waits for ops
        _submit(writer, log, "x", "y", "z", bulk=True)
        await log.until(2)
        await trio.testing.wait_all_tasks_blocked()
        assert log.tags() == ["x", "y"]  # "z" alone is short of a batch: it gathers
        await writer.aclose()
    assert log.tags() == ["x", "y", "z"]


async def test_bulk_ops_alone_are_committed_after_the_gap(where: Path) -> None:
    log = Log()
    writer = _writer(where, log, bulk_gap=0.01)
    writer.start()
    with trio.fail_after(GUARD):
        await trio.testing.wait_all_tasks_blocked()  # the task waits for ops
        _submit(writer, log, "x", bulk=True)
        await log.until(1)  # nothing else comes: the gap ends the wait
        await writer.aclose()
    assert log.outcomes() == {"x": AppendResult(stored=True)}


async def test_a_failing_op_fails_alone(where: Path) -> None:
    log = Log()
    writer = _writer(where, log)
    _submit(writer, log, "a")
    writer.submit_many([(_append("a"), log.done("again")), (_append("b"), log.done("b"))])
    writer.start()
    with trio.fail_after(GUARD):
        await writer.aclose()
    outcomes = log.outcomes()
    assert isinstance(outcomes["again"], StoreError)  # the same id twice
    assert outcomes["a"] == outcomes["b"] == AppendResult(stored=True)


async def test_a_raising_callback_does_not_stop_the_writer(where: Path) -> None:
    log = Log()
    writer = _writer(where, log)
    writer.start()

    def boom(_outcome: object) -> None:
        raise RuntimeError("callback bug")

    with trio.fail_after(GUARD):
        writer.submit_many([(_append("a"), boom)])
        _submit(writer, log, "b")
        await writer.aclose()
    assert log.outcomes() == {"b": AppendResult(stored=True)}
    assert _stored(where) == ["a", "b"]


async def test_a_process_killed_between_batches_is_replaced_with_no_gap(where: Path) -> None:
    log = Log()
    writer = _writer(where, log)
    writer.start()
    with trio.fail_after(GUARD):
        first = writer.store_pid
        assert first is not None
        _submit(writer, log, "a")
        await log.until(1)
        os.kill(first, signal.SIGKILL)
        wait_gone(first)
        _submit(writer, log, "b")
        await log.until(2)
        second = writer.store_pid
        await writer.aclose()
    assert second not in (None, first)
    assert log.events == [
        ("rows", ["a"], False),
        ("a", AppendResult(stored=True)),
        ("rows", ["b"], False),  # every batch of the killed one was answered
        ("b", AppendResult(stored=True)),
    ]
    assert _stored(where) == ["a", "b"]


async def test_a_batch_whose_process_dies_fails_and_the_next_one_goes_through(
    where: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Log()
    writer = _writer(where, log)
    writer.start()
    pid = writer.store_pid
    assert pid is not None
    real_receive = store_writer._Process.receive

    async def kill_then_receive(self: store_writer._Process) -> object:
        os.kill(pid, signal.SIGKILL)  # stopped, it has the batch in its pipe and never reads it
        wait_gone(pid)
        return await real_receive(self)

    with trio.fail_after(GUARD):
        await trio.testing.wait_all_tasks_blocked()  # the task waits for ops
        os.kill(pid, signal.SIGSTOP)
        monkeypatch.setattr(store_writer._Process, "receive", kill_then_receive)
        _submit(writer, log, "a")
        await log.until(1)
        monkeypatch.undo()
        _submit(writer, log, "b")
        await writer.aclose()
    assert log.events[:2] == [("rows", [], True), ("a", log.outcomes()["a"])]
    assert isinstance(log.outcomes()["a"], StoreError)  # never acknowledged
    assert log.events[2:] == [("rows", ["b"], False), ("b", AppendResult(stored=True))]
    assert _stored(where) == ["b"]


async def test_close_drains_the_queue_and_ends_the_process(where: Path) -> None:
    log = Log()
    writer = _writer(where, log, max_batch=16)
    writer.start()
    pid = writer.store_pid
    assert pid is not None
    texts = [f"m{i:03}" for i in range(100)]
    with trio.fail_after(GUARD):
        _submit(writer, log, *texts)
        await writer.aclose()
        await writer.aclose()  # a second close finds it closed
    assert log.tags() == texts
    assert writer.store_pid is None
    wait_gone(pid)
    assert _stored(where) == texts


async def test_closing_a_writer_never_started_commits_what_waits(where: Path) -> None:
    log = Log()
    writer = _writer(where, log)
    _submit(writer, log, "a")
    with trio.fail_after(GUARD):
        await writer.aclose()
    assert log.outcomes() == {"a": AppendResult(stored=True)}
    idle = _writer(where, Log())
    await idle.aclose()  # nothing waits: no process is started
    assert idle.store_pid is None


async def test_a_store_that_cannot_be_opened_fails_the_start_and_the_close(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_text("not a folder")
    writer = StoreWriter(tmp_path / "file" / "s.db")
    with pytest.raises(StoreError, match="file"):
        writer.start()
    log = Log()
    writer.submit_many([(_append("a"), log.done("a"))])
    with pytest.raises(StoreError):
        await writer.aclose()
    assert isinstance(log.outcomes()["a"], StoreError)  # nothing waits forever


def test_a_run_that_ends_without_close_fails_what_waits_and_ends_the_process(
    where: Path,
) -> None:
    log = Log()
    pids: list[int] = []

    async def main() -> None:
        writer = _writer(where, log, bulk_gap=FOREVER)
        writer.start()
        assert writer.store_pid is not None
        pids.append(writer.store_pid)
        _submit(writer, log, "a")
        await log.until(1)
        _submit(writer, log, "x", bulk=True)  # gathering when the run ends

    trio.run(main)
    assert log.tags() == ["a", "x"]
    assert isinstance(log.outcomes()["x"], StoreClosed)
    wait_gone(pids[0])
    assert _stored(where) == ["a"]


_HOST = textwrap.dedent(
    """
    import sys, trio
    from actors.store_writer import StoreWriter
    from store import Append
    from tests.store.conftest import record

    async def main():
        writer = StoreWriter(sys.argv[1])
        writer.start()
        done = trio.Event()
        writer.submit(Append(records=(record("a", id="a"),)), lambda _o: done.set())
        await done.wait()
        print(writer.store_pid, flush=True)
        await trio.sleep_forever()

    trio.run(main)
    """
)


def test_a_killed_host_leaves_no_store_process_behind(tmp_path: Path) -> None:
    kill_host_with_stopped_store(_HOST, tmp_path / "s.db")
    assert _stored(tmp_path) == ["a"]


def test_ops_that_are_not_store_ops_are_refused(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path / "s.db")
    op: Op = "not an op"  # type: ignore[assignment]
    with pytest.raises(TypeError):
        writer.submit(op, lambda _o: None)
    with pytest.raises(ValueError):
        StoreWriter(tmp_path / "s.db", max_queue=0)


async def test_a_close_the_store_process_never_answers_gives_up_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "CLOSE_WAIT_S", 0.5)
    client = StoreClient(tmp_path / "data", Work())
    client.start()
    pid = client.writer.store_pid
    assert pid is not None
    with trio.fail_after(GUARD):
        (kept,) = await client.submit_many([_append("a")])
        await kept.wait()
        os.kill(pid, signal.SIGSTOP)  # a store stuck on its disk
        (held,) = await client.submit_many([_append("b")])
        await trio.testing.wait_all_tasks_blocked()  # "b" is with the process
        (queued,) = await client.submit_many([_append("c")])
        await client.aclose()
    wait_gone(pid)
    with pytest.raises(StoreError):
        held.result()  # never acknowledged
    with pytest.raises(StoreClosed):
        queued.result()
    assert _stored(tmp_path / "data", "store.sqlite3") == ["a"]


async def test_a_close_on_a_clock_that_jumps_ahead_still_commits_everything(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    client = StoreClient(tmp_path / "data", Work())
    client.start()
    futures = await client.submit_many([_append(f"m{i:02}") for i in range(50)])
    await client.aclose()  # while the process commits, trio's clock jumps past 10 s
    assert [type(f.result()) for f in futures] == [AppendResult] * 50
    assert len(_stored(tmp_path / "data", "store.sqlite3")) == 50


async def test_a_write_under_a_stale_lease_is_refused_alone(pg_dsn: str) -> None:
    """On a fleet's store: h1 writes for Ada under epoch 2; h2 takes Ada (epoch 3); a batch
    mixing writes under epoch 2, under epoch 3 and under none lands all but the stale ones."""
    fleet = Fleet(pg_dsn)
    try:
        old = fleet.h1_holds_epoch_2()
        log = Log()
        writer = StoreWriter(pg_dsn)
        writer.start()
        with trio.fail_after(GUARD):
            writer.submit(Append(records=(message("before"),), fence=old), log.done("before"))
            await log.until(1)
            new = fleet.h2_takes_over()
            writer.submit_many([(op, log.done(tag)) for tag, op in mixed_batch(old, new)])
            await writer.aclose()
    finally:
        fleet.close()
    outcomes = log.outcomes()
    for tag in STALE_TAGS:
        refused = outcomes.pop(tag)
        assert isinstance(refused, StaleFence) and (refused.resource, refused.epoch) == (ADA, 2)
    assert outcomes == {
        "before": AppendResult(stored=True),
        "plain": AppendResult(stored=True),
        "current-append": AppendResult(stored=True),
        "current-state": None,
        "current-usage": None,
    }
    with Reader(pg_dsn) as reader:
        assert [m["id"] for m in reader.history("Ada")] == ["before", "plain", "current"]
        assert not reader.has_dedupe(*STALE_DEDUPE)
        assert reader.journal("Ada") == [] and reader.state(ADA) == {"new": "current"}
        assert [u.turns for u in reader.usage()] == [1]
