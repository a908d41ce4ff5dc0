from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import (
    Append,
    AppendResult,
    Done,
    GroupCommitWriter,
    PutState,
    Reader,
    StoreClosed,
    StoreError,
    StoreFull,
    WriterStats,
)
from store.writer import bulk_wait

from .conftest import record

#: Hang guard for waits on events set by the writer thread; never reached in a passing run.
GUARD = 60.0


class Outcomes:
    """Collects ``done`` outcomes in call order, with the thread that delivered them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, object]] = []
        self.threads: set[str] = set()

    def done(self, tag: str) -> Done:
        def callback(outcome: object) -> None:
            self.items.append((tag, outcome))
            self.threads.add(threading.current_thread().name)

        return callback


class Gate:
    """A ``done`` callback that holds the writer thread until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, _outcome: object) -> None:
        self.entered.set()
        assert self.release.wait(GUARD)


def _append(text: str) -> Append:
    return Append(records=(record(text, id=text),))


def test_ops_submitted_before_start_commit_as_one_batch(path: Path) -> None:
    writer = GroupCommitWriter(path)
    out = Outcomes()
    tags = [f"m{i}" for i in range(100)]
    for tag in tags:
        writer.submit(_append(tag), out.done(tag))
    writer.start()
    assert writer.close()
    assert writer.stats() == WriterStats(ops=100, batches=1, largest_batch=100)
    assert out.items == [(tag, AppendResult(stored=True)) for tag in tags]
    assert out.threads == {"mcplive-store-writer"}
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == tags


def test_ops_waiting_behind_a_running_batch_are_grouped(path: Path) -> None:
    out = Outcomes()
    gate = Gate()
    with GroupCommitWriter(path) as writer:
        writer.submit(_append("first"), gate)
        assert gate.entered.wait(GUARD)
        # The writer thread is inside the first batch's callback; these all wait together.
        tags = [f"m{i}" for i in range(50)]
        for tag in tags:
            writer.submit(_append(tag), out.done(tag))
        gate.release.set()
    stats = writer.stats()
    assert stats == WriterStats(ops=51, batches=2, largest_batch=50)
    assert stats.batches < stats.ops
    assert [tag for tag, _ in out.items] == tags


def test_max_batch_splits_batches_in_order(path: Path) -> None:
    writer = GroupCommitWriter(path, max_batch=3)
    out = Outcomes()
    tags = [f"m{i}" for i in range(10)]
    for tag in tags:
        writer.submit(_append(tag), out.done(tag))
    writer.start()
    writer.close()
    assert writer.stats() == WriterStats(ops=10, batches=4, largest_batch=3)
    assert [tag for tag, _ in out.items] == tags


def test_fifo_order_while_running(path: Path) -> None:
    out = Outcomes()
    tags = [f"m{i:03}" for i in range(300)]
    with GroupCommitWriter(path, max_batch=7) as writer:
        for tag in tags:
            while True:
                try:
                    writer.submit(_append(tag), out.done(tag))
                    break
                except StoreFull:  # pragma: no cover - the default cap is far away
                    continue
    assert [tag for tag, _ in out.items] == tags
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == tags


def test_store_full_at_exactly_max_queue_before_start(path: Path) -> None:
    writer = GroupCommitWriter(path, max_queue=5)
    out = Outcomes()
    for i in range(5):
        writer.submit(_append(f"m{i}"), out.done(f"m{i}"))
    rejected = Outcomes()
    with pytest.raises(StoreFull):
        writer.submit(_append("m5"), rejected.done("m5"))
    writer.start()
    assert writer.close()
    assert len(out.items) == 5 and rejected.items == []
    with pytest.raises(StoreClosed):
        writer.submit(_append("late"), rejected.done("late"))
    assert rejected.items == []
    with Reader(path) as reader:
        assert reader.count() == 5


def test_store_full_while_thread_busy_counts_only_waiting_ops(path: Path) -> None:
    gate = Gate()
    out = Outcomes()
    writer = GroupCommitWriter(path, max_queue=3)
    writer.start()
    writer.submit(_append("held"), gate)
    assert gate.entered.wait(GUARD)
    # The held op is no longer waiting: three more fit, the fourth does not.
    for i in range(3):
        writer.submit(_append(f"m{i}"), out.done(f"m{i}"))
    with pytest.raises(StoreFull):
        writer.submit(_append("m3"), out.done("m3"))
    gate.release.set()
    assert writer.close()
    assert [tag for tag, _ in out.items] == ["m0", "m1", "m2"]
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["held", "m0", "m1", "m2"]


def test_close_drains_everything_queued(path: Path) -> None:
    gate = Gate()
    out = Outcomes()
    writer = GroupCommitWriter(path, max_batch=4)
    writer.start()
    writer.submit(_append("held"), gate)
    assert gate.entered.wait(GUARD)
    for i in range(20):
        writer.submit(_append(f"m{i}"), out.done(f"m{i}"))
    closer = threading.Thread(target=writer.close)
    closer.start()
    gate.release.set()
    closer.join(GUARD)
    assert not closer.is_alive()
    assert len(out.items) == 20
    with Reader(path) as reader:
        assert reader.count() == 21


def test_close_of_unstarted_writer_commits_waiting_ops(path: Path) -> None:
    writer = GroupCommitWriter(path)
    out = Outcomes()
    writer.submit(PutState(namespace="n", key="k", value=1), out.done("put"))
    assert writer.close()
    assert out.items == [("put", None)]
    with Reader(path) as reader:
        assert reader.state("n") == {"k": 1}


def test_failing_op_fails_alone_in_batch(path: Path) -> None:
    writer = GroupCommitWriter(path)
    out = Outcomes()
    writer.submit(_append("a"), out.done("a"))
    writer.submit(Append(records=(record(id="a"),)), out.done("dup"))
    writer.submit(_append("b"), out.done("b"))
    writer.start()
    writer.close()
    assert writer.stats().batches == 1
    outcomes = dict(out.items)
    assert outcomes["a"] == outcomes["b"] == AppendResult(stored=True)
    assert isinstance(outcomes["dup"], StoreError)
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["a", "b"]


def test_dedupe_through_writer(path: Path) -> None:
    out = Outcomes()
    key = ("event", "lobby", "e1")
    with GroupCommitWriter(path) as writer:
        writer.submit(Append(records=(record(),), dedupe=key), out.done("1"))
        writer.submit(Append(records=(record(),), dedupe=key), out.done("2"))
    assert out.items == [("1", AppendResult(stored=True)), ("2", AppendResult(stored=False))]


def test_raising_callback_does_not_stop_the_writer(path: Path) -> None:
    def boom(_outcome: object) -> None:
        raise RuntimeError("callback bug")

    out = Outcomes()
    with GroupCommitWriter(path) as writer:
        writer.submit(_append("a"), boom)
        writer.submit(_append("b"), out.done("b"))
    assert out.items == [("b", AppendResult(stored=True))]


def test_close_from_a_callback_does_not_deadlock(path: Path) -> None:
    results: list[bool] = []
    out = Outcomes()
    writer = GroupCommitWriter(path)
    writer.start()
    writer.submit(_append("a"), lambda _o: results.append(writer.close()))
    assert writer.close()
    assert results == [False]
    with pytest.raises(StoreClosed):
        writer.submit(_append("b"), out.done("b"))


def test_lifecycle_errors(path: Path) -> None:
    writer = GroupCommitWriter(path)
    with pytest.raises(TypeError):
        writer.submit("not an op", lambda _o: None)  # type: ignore[arg-type]
    writer.start()
    with pytest.raises(RuntimeError):
        writer.start()
    assert writer.close(timeout=GUARD)
    assert writer.close()
    with pytest.raises(StoreClosed):
        writer.start()
    with pytest.raises(ValueError):
        GroupCommitWriter(path, max_queue=0)
    assert GroupCommitWriter(path).close()


def test_start_on_unopenable_path_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = GroupCommitWriter(blocker / "store.sqlite3")
    with pytest.raises(StoreError):
        writer.start()
    out = Outcomes()
    writer.submit(_append("a"), out.done("a"))
    with pytest.raises(StoreError):
        writer.close()
    assert len(out.items) == 1 and isinstance(out.items[0][1], StoreError)


@given(
    queued=st.integers(1, 1_000),
    prompt=st.integers(0, 1_000),
    max_batch=st.integers(1, 1_000),
    since=st.floats(0, 10, allow_nan=False),
    gap=st.floats(0, 10, allow_nan=False),
)
def test_bulk_ops_wait_only_while_all_bulk_and_short_of_a_batch_within_the_gap(
    queued: int, prompt: int, max_batch: int, since: float, gap: float
) -> None:
    prompt = min(prompt, queued)
    wait = bulk_wait(queued=queued, prompt=prompt, max_batch=max_batch, since_commit=since, gap=gap)
    if prompt or queued >= max_batch or since >= gap:
        assert wait == 0
    else:
        assert 0 < wait <= gap
        assert wait == pytest.approx(gap - since)


def test_a_prompt_op_takes_the_gathering_bulk_ops_with_it_in_order(path: Path) -> None:
    out = Outcomes()
    gate = Gate()
    prompt_done = threading.Event()
    with GroupCommitWriter(path, bulk_gap=3_600) as writer:
        writer.submit(_append("first"), gate)
        assert gate.entered.wait(GUARD)
        bulk = [f"b{i}" for i in range(5)]
        writer.submit_many([(_append(t), out.done(t)) for t in bulk], bulk=True)
        gate.release.set()  # the bulk ops now gather: the gap is an hour

        def prompt(outcome: object) -> None:
            out.done("p")(outcome)
            prompt_done.set()

        writer.submit(_append("p"), prompt)
        assert prompt_done.wait(GUARD)  # not held: it ended the gathering at once
    assert [tag for tag, _ in out.items] == [*bulk, "p"]
    assert writer.stats() == WriterStats(ops=7, batches=2, largest_batch=6)
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["first", *bulk, "p"]


def test_close_commits_gathering_bulk_ops_at_once(path: Path) -> None:
    out = Outcomes()
    writer = GroupCommitWriter(path, bulk_gap=3_600)
    writer.start()
    writer.submit_many([(_append(t), out.done(t)) for t in ("b0", "b1")], bulk=True)
    assert writer.close(GUARD)
    assert [tag for tag, _ in out.items] == ["b0", "b1"]
