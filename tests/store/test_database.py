from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from store import (
    SCHEMA_VERSION,
    Append,
    AppendResult,
    Database,
    MessageRecord,
    PutState,
    Reader,
    StoreClosed,
    StoreError,
)

from .conftest import record, run_sql

#: A body or value that does not decode.
BAD = b"\xff\x00"


@pytest.mark.sqlite_only
def test_creates_folder_schema_and_wal(path: Path) -> None:
    assert not path.parent.exists()
    with Database(path):
        pass
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert int(version[0]) == SCHEMA_VERSION
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"messages", "dedupe", "state", "messages_agent_seq"} <= tables
    finally:
        conn.close()


def test_other_schema_version_is_refused(path: Path) -> None:
    Database(path).close()
    run_sql(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="99"):
        Database(path)


def test_append_history_round_trip(path: Path) -> None:
    metadata: dict[str, Any] = {
        "server_id": "lobby",
        "inbound_source": {"lane": "channel", "thread": None, "tags": ["a", {"b": [1, 2.5]}]},
        "émoji": "🦜 naïve 中文",
    }
    blocks = (
        {"type": "text", "text": "héllo wörld 👋\nzweite Zeile"},
        {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
        {"type": "tool_use", "id": "t1", "name": "lobby--x", "input": {"q": ["ü", None, True]}},
    )
    first = MessageRecord(
        id="m1", agent="alice", role="user", blocks=blocks, metadata=metadata, created_at=1.0
    )
    second = record("reply", agent="alice", role="assistant", id="m2")
    other = record("elsewhere", agent="bob", id="m3")
    with Database(path) as db:
        assert db.apply([Append(records=(first, second)), Append(records=(other,))]) == [
            AppendResult(stored=True),
            AppendResult(stored=True),
        ]
    with Reader(path) as reader:
        assert reader.history("alice") == [first.as_message(), second.as_message()]
        assert reader.history() == [first.as_message(), second.as_message(), other.as_message()]
        assert reader.history("alice", limit=1) == [second.as_message()]
        assert [m["id"] for m in reader.history(limit=2)] == ["m2", "m3"]
        assert reader.history(limit=0) == []
        assert reader.history("nobody") == []
        assert reader.agents() == ["alice", "bob"]
        assert reader.count() == 3
        with pytest.raises(ValueError):
            reader.history(limit=-1)


def test_dedupe_skips_second_append_and_survives_reopen(path: Path) -> None:
    key = ("incoming", "lobby", "c1\x00msg1")
    with Database(path) as db:
        assert db.apply([Append(records=(record("one"),), dedupe=key)]) == [
            AppendResult(stored=True)
        ]
        assert db.apply([Append(records=(record("two"),), dedupe=key)]) == [
            AppendResult(stored=False)
        ]
    with Reader(path) as reader:
        assert reader.count() == 1
        assert reader.has_dedupe(*key)
        assert not reader.has_dedupe("incoming", "lobby", "c1\x00msg2")
        assert not reader.has_dedupe("event", "lobby", "c1\x00msg1")
    with Database(path) as db:
        again = db.apply([Append(records=(record("three"),), dedupe=key)])
        assert again == [AppendResult(stored=False)]
        # Within one batch, the second op with the same key is a duplicate too.
        fresh = ("event", "lobby", "e9")
        outcomes = db.apply(
            [
                Append(records=(record("a"),), dedupe=fresh),
                Append(records=(record("b"),), dedupe=fresh),
            ]
        )
        assert outcomes == [AppendResult(stored=True), AppendResult(stored=False)]
    with Reader(path) as reader:
        assert [m["blocks"][0]["text"] for m in reader.history()] == ["one", "a"]


def test_put_state_and_delete(path: Path) -> None:
    with Database(path) as db:
        outcomes = db.apply(
            [
                PutState(namespace="channels", key="lobby/c1", value={"open": True, "n": [1]}),
                PutState(namespace="channels", key="lobby/c2", value="closed"),
                PutState(namespace="other", key="lobby/c1", value=0),
                PutState(namespace="channels", key="lobby/c2", value=None),
                PutState(namespace="channels", key="missing", value=None),
            ]
        )
        assert outcomes == [None] * 5
    with Reader(path) as reader:
        assert reader.state("channels") == {"lobby/c1": {"open": True, "n": [1]}}
        assert reader.state("other") == {"lobby/c1": 0}
        assert reader.state("none") == {}
    with Database(path) as db:
        db.apply([PutState(namespace="channels", key="lobby/c1", value=False)])
    with Reader(path) as reader:
        assert reader.state("channels") == {"lobby/c1": False}


def test_failing_op_fails_alone(path: Path) -> None:
    with Database(path) as db:
        db.apply([Append(records=(record("old", id="dup"),))])
        outcomes = db.apply(
            [
                Append(records=(record("before"),), dedupe=("event", "s", "1")),
                # Its first record is new, its second is a duplicate: the whole op is undone,
                # including its dedupe key.
                Append(records=(record("lost"), record("x", id="dup")), dedupe=("event", "s", "2")),
                PutState(namespace="n", key="k", value={"bad": object()}),
                Append(records=(record("after"),)),
                PutState(namespace="n", key="ok", value=1),
            ]
        )
    assert outcomes[0] == AppendResult(stored=True)
    assert isinstance(outcomes[1], StoreError) and "dup" in str(outcomes[1])
    assert isinstance(outcomes[2], StoreError)
    assert outcomes[3] == AppendResult(stored=True)
    assert outcomes[4] is None
    with Reader(path) as reader:
        assert [m["blocks"][0]["text"] for m in reader.history()] == ["old", "before", "after"]
        assert not reader.has_dedupe("event", "s", "2")
        assert reader.state("n") == {"ok": 1}


def test_duplicate_id_within_one_op(path: Path) -> None:
    with Database(path) as db:
        outcomes = db.apply([Append(records=(record(id="x"), record(id="x")))])
    assert isinstance(outcomes[0], StoreError)
    with Reader(path) as reader:
        assert reader.count() == 0


@pytest.mark.sqlite_only
def test_transaction_failure_falls_back_to_one_op_per_transaction(path: Path) -> None:
    # A second connection holding the write lock with a zero busy timeout makes BEGIN fail in
    # the batch; the fallback then retries op by op, each failing on its own.
    with Database(path, busy_timeout=0) as db:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            outcomes = db.apply(
                [Append(records=(record(),)), PutState(namespace="a", key="b", value=1)]
            )
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert all(isinstance(o, StoreError) for o in outcomes)
        assert db.apply([Append(records=(record(),))]) == [AppendResult(stored=True)]


def test_closed_database_and_reader(path: Path) -> None:
    db = Database(path)
    db.close()
    with pytest.raises(StoreClosed):
        db.apply([PutState(namespace="a", key="b", value=1)])
    reader = Reader(path)
    reader.close()
    with pytest.raises(StoreClosed):
        reader.history()
    with pytest.raises(StoreClosed):
        reader.search("x")


def test_reader_sees_later_commits(path: Path) -> None:
    with Reader(path) as reader, Database(path) as db:
        assert reader.count() == 0
        db.apply([Append(records=(record(),))])
        assert reader.count() == 1


def test_corrupt_body_is_skipped_by_every_read(path: Path) -> None:
    with Database(path) as db:
        db.apply([Append(records=(record(id="a"), record(id="bad"), record(id="c")))])
    run_sql(
        path,
        "UPDATE items SET body = ? WHERE num IN (SELECT item FROM message_refs WHERE id = 'bad')",
        (BAD,),
    )
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["a", "c"]
        (skipped,) = reader.take_skipped()
        assert (skipped.what, skipped.key, skipped.seq) == ("message", "bad", 2)
        assert "bad" in skipped.reason
        assert [m["id"] for m in reader.history_after("alice", 0, 10)[0]] == ["a", "c"]
        assert reader.history_after("alice", 0, 10)[1] == 3
        assert [r.message["id"] for r in reader.rows()] == ["a", "c"]
        assert [m["id"] for m in reader.search("hello")] == ["a", "c"]
        assert reader.take_skipped() == []  # reported once per reader
        assert reader.skipped_total == 1


def test_rows_reads_on_past_skipped_records(path: Path) -> None:
    """A page stays full while more decodable rows exist, so paging never stops early."""
    with Database(path) as db:
        db.apply([Append(records=tuple(record(id=f"m{n}") for n in range(1, 8)))])
    run_sql(
        path,
        "UPDATE items SET body = ? WHERE num IN"
        " (SELECT item FROM message_refs WHERE id IN ('m2', 'm3', 'm6'))",
        (BAD,),
    )
    with Reader(path) as reader:
        assert [r.seq for r in reader.rows(limit=3)] == [1, 4, 5]
        assert [r.seq for r in reader.rows(limit=3, after_seq=4)] == [5, 7]
        assert [r.seq for r in reader.rows(limit=3, newest_first=True)] == [7, 5, 4]
        assert [r.seq for r in reader.rows(limit=2, newest_first=True, before_seq=7)] == [5, 4]
        assert [r.seq for r in reader.rows(limit=1, newest_first=True, offset=1)] == [5]
        assert reader.rows(limit=0) == []
        assert {s.key for s in reader.take_skipped()} == {"m2", "m3", "m6"}


def test_skipped_reports_are_bounded(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import store.reader

    monkeypatch.setattr(store.reader, "MAX_SKIPPED", 2)
    with Database(path) as db:
        db.apply([Append(records=tuple(record(id=f"m{n}") for n in range(5)))])
    run_sql(
        path,
        "UPDATE items SET body = ? WHERE num IN (SELECT item FROM message_refs WHERE id <> 'm0')",
        (BAD,),
    )
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["m0"]
        skipped = reader.take_skipped()
        # two listed, then one report that the rest are not listed
        assert [s.key for s in skipped] == ["m1", "m2", ""]
        assert "not listed" in skipped[2].reason
        reader.history()
        assert reader.take_skipped() == []


def test_corrupt_state_value_is_skipped(path: Path) -> None:
    with Database(path) as db:
        db.apply(
            [PutState(namespace="ns", key="a", value=1), PutState(namespace="ns", key="b", value=2)]
        )
    run_sql(path, "UPDATE state SET value = ? WHERE key = 'a'", (BAD,))
    with Reader(path) as reader:
        assert reader.state("ns") == {"b": 2}
        assert [s.key for s in reader.take_skipped()] == ["ns/a"]


def _search_ids(reader: Reader, text: str, **kw: Any) -> list[str]:
    return [m["id"] for m in reader.search(text, **kw)]


def test_search(path: Path) -> None:
    header = "[source: lobby / lobby:general · #general]"
    with Database(path) as db:
        db.apply(
            [
                Append(records=(record("Hello general", id="h1", header=header),)),
                Append(records=(record("hello again", id="h2", agent="bob"),)),
                Append(records=(record("nothing here", id="h3", header=header),)),
                Append(records=(record("see #general", id="h4"),)),
                Append(records=(record(header, id="h5"),)),  # a sender quoting a header
            ]
        )
    with Reader(path) as reader:
        assert _search_ids(reader, "HELLO") == ["h1", "h2"]
        assert _search_ids(reader, "hello", agent="alice") == ["h1"]
        # The stored header never matches; the same words written by a sender do.
        assert _search_ids(reader, "lobby") == ["h5"]
        assert _search_ids(reader, "#general") == ["h4", "h5"]
        assert _search_ids(reader, "source:") == ["h5"]
        # ^ anchors at the body's start, after the header.
        assert _search_ids(reader, r"^hello", regex=True) == ["h2"]
        assert _search_ids(reader, r"^Hello", regex=True) == ["h1"]
        assert _search_ids(reader, r"^\[source", regex=True) == ["h5"]
        assert _search_ids(reader, r"(?i)^h", regex=True) == ["h1", "h2"]
        assert _search_ids(reader, r"general$", regex=True) == ["h1", "h4"]
        assert _search_ids(reader, "hello", limit=1) == ["h2"]
        assert _search_ids(reader, "zzz") == []
        with pytest.raises(re.error):
            reader.search("(", regex=True)


def test_reader_recovers_after_corrupt_row_in_search(path: Path) -> None:
    with Database(path) as db:
        db.apply([Append(records=(record(id="bad"), record(id="good")))])
    run_sql(
        path,
        "UPDATE items SET body = ? WHERE num IN (SELECT item FROM message_refs WHERE id = 'bad')",
        (BAD,),
    )
    with Reader(path) as reader, Database(path) as db:
        assert [m["id"] for m in reader.search("hello")] == ["good"]
        db.apply([Append(records=(record(id="later"),))])
        assert reader.count() == 3
