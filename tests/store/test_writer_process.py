"""The store's write connection in a child process (:mod:`store.writer_process`): the same
outcomes as in the host's own interpreter, a child killed between or during batches replaced
without losing what was committed, and no child left behind by a host that was killed."""

from __future__ import annotations

import os
import pickle
import signal
import textwrap
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import (
    Append,
    AppendResult,
    Database,
    GroupCommitWriter,
    JournalEntry,
    MessageRecord,
    PutState,
    Reader,
    StoreError,
    writer_process,
)
from store.writer_process import DatabaseProcess

from .conftest import GUARD, kill_host_with_stopped_store, record, wait_gone


def _ops(*ids: str) -> list[Append]:
    return [Append(records=(record(i, id=i),)) for i in ids]


def test_a_batch_in_the_child_has_the_outcomes_it_has_in_the_host(tmp_path: Path) -> None:
    ops = _ops("a", "b", "a", "c")  # the second "a" is a duplicate: it fails alone
    here = Database(tmp_path / "here.db")
    there = DatabaseProcess(tmp_path / "there.db")
    try:
        expected = [type(o) for o in here.apply(ops)]
        got = there.apply(ops)
        assert (
            [type(o) for o in got]
            == expected
            == [
                AppendResult,
                AppendResult,
                StoreError,
                AppendResult,
            ]
        )
        committed = there.items.take_committed()
        assert committed == here.items.take_committed()
        assert there.items.take_committed() == ([], False)
    finally:
        here.close()
        there.close()
    with Reader(tmp_path / "there.db") as reader:
        assert [m["id"] for m in reader.history("alice")] == ["a", "b", "c"]


def test_a_child_killed_between_batches_is_replaced(tmp_path: Path) -> None:
    there = DatabaseProcess(tmp_path / "s.db")
    try:
        there.apply(_ops("a"))
        first = there.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_gone(first)
        assert [type(o) for o in there.apply(_ops("b"))] == [AppendResult]
        assert there.pid not in (None, first)
    finally:
        there.close()
    with Reader(tmp_path / "s.db") as reader:
        assert [m["id"] for m in reader.history("alice")] == ["a", "b"]


def test_a_batch_whose_child_dies_fails_and_the_next_one_goes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    there = DatabaseProcess(tmp_path / "s.db")
    try:
        there.apply(_ops("a"))
        assert [r[1] for r in there.items.take_committed()[0]] == ["a"]
        pid = there.pid
        assert pid is not None
        real_send = writer_process.send

        def send_then_kill(stream: IO[bytes], value: object) -> None:
            # Stopped first, it cannot answer before it dies holding the batch it was sent.
            os.kill(pid, signal.SIGSTOP)
            real_send(stream, value)
            os.kill(pid, signal.SIGKILL)

        monkeypatch.setattr(writer_process, "send", send_then_kill)
        with pytest.raises(StoreError, match="ended"):
            there.apply(_ops("b"))
        monkeypatch.undo()
        assert there.items.take_committed() == ([], True)  # the feeds start over
        assert [type(o) for o in there.apply(_ops("c"))] == [AppendResult]
        assert there.pid not in (None, pid)
    finally:
        there.close()
    with Reader(tmp_path / "s.db") as reader:
        assert "c" in [m["id"] for m in reader.history("alice")]


def test_the_child_ignores_interrupts_sent_to_the_process_group(tmp_path: Path) -> None:
    there = DatabaseProcess(tmp_path / "s.db")
    try:
        pid = there.pid
        assert pid is not None
        os.kill(pid, signal.SIGINT)
        os.kill(pid, signal.SIGTERM)
        assert [type(o) for o in there.apply(_ops("a"))] == [AppendResult]
        assert there.pid == pid
    finally:
        there.close()


def test_a_store_that_cannot_be_opened_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    writer = GroupCommitWriter(tmp_path / "file" / "s.db")
    with pytest.raises(StoreError, match="file"):
        writer.start()
    assert writer.close(GUARD)


_HOST = textwrap.dedent(
    """
    import sys, threading
    from store import Append, GroupCommitWriter
    from tests.store.conftest import record
    writer = GroupCommitWriter(sys.argv[1])
    writer.start()
    done = threading.Event()
    writer.submit(Append(records=(record("a", id="a"),)), lambda _o: done.set())
    done.wait(60)
    print(writer.store_pid, flush=True)
    threading.Event().wait()
    """
)


def test_a_killed_host_leaves_no_child_behind(tmp_path: Path) -> None:
    kill_host_with_stopped_store(_HOST, tmp_path / "s.db")
    with Reader(tmp_path / "s.db") as reader:
        assert [m["id"] for m in reader.history("alice")] == ["a"]


_texts = st.text(min_size=1, max_size=8)


@given(
    agents=st.lists(_texts, min_size=1, max_size=4, unique=True),
    text=st.text(max_size=20),
    dedupe=st.none() | st.tuples(_texts, _texts, _texts),
    journal=st.lists(st.tuples(_texts, st.dictionaries(_texts, st.integers())), max_size=3),
)
def test_an_op_crosses_the_pipe_as_it_was_with_its_copies_sharing_one_body(
    agents: list[str],
    text: str,
    dedupe: tuple[str, str, str] | None,
    journal: list[tuple[str, dict[str, int]]],
) -> None:
    first = MessageRecord(
        id="m0",
        agent=agents[0],
        role="user",
        blocks=({"type": "text", "text": text},),
        metadata={"lane": "incoming"},
        created_at=1.5,
    )
    copies = (first, *(first.for_agent(a, f"m{n}") for n, a in enumerate(agents[1:], 1)))
    op = Append(
        records=copies,
        dedupe=dedupe,
        journal=tuple(JournalEntry(stream, record) for stream, record in journal),
    )
    again = pickle.loads(pickle.dumps([op, PutState(namespace="n", key="k", value=[1])]))
    assert again == [op, PutState(namespace="n", key="k", value=[1])]
    assert all(r.blocks is again[0].records[0].blocks for r in again[0].records)
