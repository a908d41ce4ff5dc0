"""The journal: entries committed atomically with their append's messages, read back in order,
skipped with a dedupe hit, trimmed per stream, and added to a store of the previous schema."""

from __future__ import annotations

import os
import random
import sqlite3
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from store import (
    SCHEMA_VERSION,
    Append,
    AppendResult,
    Database,
    GroupCommitWriter,
    JournalEntry,
    PutState,
    Reader,
    StoreError,
    TrimJournal,
    decode_value,
)
from store.dbapi import is_dsn
from tests.store.conftest import open_at_once

from .conftest import kill_child_after, record, run_sql
from .durability_child import OTHER_STREAM, STREAM, journal_op
from .old_schema import SCHEMA_V1


def entry(stream: str, n: int, **extra: Any) -> JournalEntry:
    return JournalEntry(stream, {"v": 1, "op": "admit", "n": n, **extra})


def records_of(reader: Reader, stream: str, **kwargs: Any) -> list[dict[str, Any]]:
    return [rec for _seq, rec in reader.journal(stream, **kwargs)]


def all_rows(path: Path) -> list[tuple[int, str, bytes]]:
    return run_sql(path, "SELECT seq, stream, record FROM journal ORDER BY seq")


# ------------------------------------------------------------------------------ ops


def test_journal_entry_and_ops_validate() -> None:
    JournalEntry("coalesce", {"v": 1})
    Append(records=(), journal=(entry("s", 1),))
    assert Append(records=(record(),)).journal == ()
    with pytest.raises(ValueError):
        JournalEntry("", {"v": 1})
    with pytest.raises(ValueError):
        JournalEntry(3, {"v": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        JournalEntry("s", [("v", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Append(records=(), journal=[entry("s", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Append(records=(), journal=({"v": 1},))  # type: ignore[arg-type]
    TrimJournal(stream="s", before_seq=0)
    good: dict[str, Any] = {"stream": "s", "before_seq": 1}
    bads: list[dict[str, Any]] = [
        {"stream": ""},
        {"before_seq": -1},
        {"before_seq": True},
        {"before_seq": 1.0},
    ]
    for bad in bads:
        with pytest.raises(ValueError):
            TrimJournal(**(good | bad))


# ------------------------------------------------------------------------------ writing


def test_entries_are_committed_with_their_messages_in_order(path: Path) -> None:
    first, second = record("one", id="a1"), record("two", id="a2")
    with Database(path) as db:
        outcomes = db.apply(
            [
                Append(records=(first,), journal=(entry("co", 1), entry("other", 1))),
                Append(records=(second,), journal=(entry("co", 2), entry("co", 3))),
                PutState(namespace="n", key="k", value=1),
                Append(records=(), journal=(entry("co", 4),)),  # a transition with no message
                Append(records=(record("three", id="a3"),)),  # a message with no entry
            ]
        )
        assert (
            outcomes == [AppendResult(stored=True)] * 2 + [None] + [AppendResult(stored=True)] * 2
        )
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["a1", "a2", "a3"]
        co = reader.journal("co")
        assert [rec["n"] for _, rec in co] == [1, 2, 3, 4]
        assert co[0][1] == {"v": 1, "op": "admit", "n": 1}
        seqs = [seq for seq, _ in co]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4
        assert records_of(reader, "other") == [{"v": 1, "op": "admit", "n": 1}]
        assert reader.journal("nobody") == []
        # after_seq and limit page through a stream, oldest first.
        assert records_of(reader, "co", after_seq=seqs[1]) == [r for _, r in co[2:]]
        assert records_of(reader, "co", limit=2) == [r for _, r in co[:2]]
        assert records_of(reader, "co", after_seq=seqs[0], limit=1) == [co[1][1]]
        assert reader.journal("co", limit=0) == []
        assert reader.journal("co", after_seq=seqs[-1]) == []
        with pytest.raises(ValueError):
            reader.journal("co", limit=-1)
    # Every entry is in the table, in the order the ops and their entries came.
    assert [(stream, decode_value(rec)["n"]) for _seq, stream, rec in all_rows(path)] == [
        ("co", 1),
        ("other", 1),
        ("co", 2),
        ("co", 3),
        ("co", 4),
    ]


def test_records_round_trip_as_plain_values(path: Path) -> None:
    from types import MappingProxyType

    value = {"v": 1, "t": (1, "é\ud800"), "m": MappingProxyType({"x": None}), "f": 2.5}
    with Database(path) as db:
        db.apply([Append(records=(), journal=(JournalEntry("s", MappingProxyType(value)),))])
    with Reader(path) as reader:
        ((_, stored),) = reader.journal("s")
    assert stored == {"v": 1, "t": [1, "é\ufffd"], "m": {"x": None}, "f": 2.5}


def test_dedupe_hit_writes_no_entries(path: Path) -> None:
    key = ("event", "lobby", "e1")
    with Database(path) as db:
        assert db.apply([Append(records=(record(),), dedupe=key, journal=(entry("s", 1),))]) == [
            AppendResult(stored=True)
        ]
        # The same retry, alone, in a batch (bulk path) and in a batch that falls back to one op
        # at a time (a failing op in it).
        again = Append(records=(record(),), dedupe=key, journal=(entry("s", 2),))
        journal_only = Append(records=(), dedupe=key, journal=(entry("s", 3),))
        failing = Append(records=(record(id="dup"), record(id="dup")))
        assert db.apply([again]) == [AppendResult(stored=False)]
        assert db.apply([journal_only, again]) == [AppendResult(stored=False)] * 2
        outcomes = db.apply([again, failing, journal_only])
        assert outcomes[0] == outcomes[2] == AppendResult(stored=False)
        assert isinstance(outcomes[1], StoreError)
        # Within one batch, the second op with a new key is the duplicate.
        fresh = ("event", "lobby", "e2")
        assert db.apply(
            [
                Append(records=(), dedupe=fresh, journal=(entry("s", 4),)),
                Append(records=(), dedupe=fresh, journal=(entry("s", 5),)),
            ]
        ) == [AppendResult(stored=True), AppendResult(stored=False)]
    with Database(path) as db:  # and after a reopen
        assert db.apply([again]) == [AppendResult(stored=False)]
    with Reader(path) as reader:
        assert [rec["n"] for rec in records_of(reader, "s")] == [1, 4]
        assert reader.count() == 1


def test_a_failing_append_writes_none_of_its_entries(path: Path) -> None:
    with Database(path) as db:
        db.apply([Append(records=(record(id="taken"),))])
        outcomes = db.apply(
            [
                Append(records=(record(id="ok1"),), journal=(entry("s", 1),)),
                Append(records=(record(id="taken"),), journal=(entry("s", 2),)),
                Append(records=(record(id="bad"),), journal=(entry("s", 3, x=object()),)),
                Append(records=(record(id="ok2"),), journal=(entry("s", 4),)),
            ]
        )
    assert outcomes[0] == outcomes[3] == AppendResult(stored=True)
    assert isinstance(outcomes[1], StoreError) and isinstance(outcomes[2], StoreError)
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["taken", "ok1", "ok2"]
        assert [rec["n"] for rec in records_of(reader, "s")] == [1, 4]


@pytest.mark.parametrize("with_failing_op", [False, True])
def test_an_entry_that_cannot_be_written_takes_its_messages_with_it(
    path: Path, with_failing_op: bool
) -> None:
    """Atomicity without a crash: SQLite refuses the entries of one stream, and the append that
    carries one stores none of its messages (the other ops are not affected)."""
    with Database(path) as db:
        db.apply([Append(records=(record(id="taken"),))])
    if is_dsn(path):
        run_sql(
            path,
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " IF NEW.stream = 'refused' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW;"
            " END $$",
        )
        run_sql(
            path,
            "CREATE TRIGGER refuse BEFORE INSERT ON journal FOR EACH ROW EXECUTE FUNCTION refuse()",
        )
    else:
        run_sql(
            path,
            "CREATE TRIGGER refuse BEFORE INSERT ON journal WHEN NEW.stream = 'refused'"
            " BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
    ops = [
        Append(records=(record(id="ok1"),), journal=(entry("s", 1),)),
        Append(records=(record(id="bad1"), record(id="bad2")), journal=(entry("refused", 2),)),
        Append(records=(record(id="ok2"),), journal=(entry("s", 3),)),
    ]
    if with_failing_op:  # the batch starts on the savepoint path
        ops.insert(1, Append(records=(record(id="taken"),), journal=(entry("s", 9),)))
    with Database(path) as db:
        outcomes = db.apply(ops)
    assert [isinstance(o, StoreError) for o in outcomes] == [
        o.journal[0].stream == "refused" or o.records[0].id == "taken" for o in ops
    ]
    assert [o for o in outcomes if not isinstance(o, StoreError)] == [AppendResult(stored=True)] * 2
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["taken", "ok1", "ok2"]
        assert [rec["n"] for rec in records_of(reader, "s")] == [1, 3]
        assert reader.journal("refused") == []


def test_writer_acknowledges_entries_once_durable(path: Path) -> None:
    seen: list[list[int]] = []
    outcomes: list[object] = []
    done_all = threading.Event()

    def done(outcome: object) -> None:
        outcomes.append(outcome)
        with Reader(path) as reader:  # what another connection sees when the ack runs
            seen.append([rec["n"] for rec in records_of(reader, "w")])
        if len(seen) == 3:
            done_all.set()

    with GroupCommitWriter(path) as writer:
        writer.submit(Append(records=(record(),), journal=(entry("w", 1), entry("w", 2))), done)
        writer.submit(Append(records=(), journal=(entry("w", 3),)), done)
        writer.submit(TrimJournal(stream="w", before_seq=2), done)
        assert done_all.wait(10)
    assert outcomes == [AppendResult(stored=True), AppendResult(stored=True), None]
    # Group commit may put the ops in one batch: each ack comes after its whole batch commits.
    assert seen[0] in ([1, 2], [1, 2, 3], [2, 3])
    assert seen[-1] == [2, 3]


def test_corrupt_entry_is_skipped_and_reported_once(path: Path) -> None:
    with Database(path) as db:
        db.apply([Append(records=(), journal=(entry("s", 1), entry("s", 2)))])
    run_sql(path, "UPDATE journal SET record = ? WHERE seq = 1", (b"\xff\x00",))
    run_sql(path, "INSERT INTO journal (stream, record) VALUES ('t', ?)", (b"\x01",))  # no map
    with Reader(path) as reader:
        assert records_of(reader, "s") == [{"v": 1, "op": "admit", "n": 2}]
        assert reader.journal("t") == []
        skipped = reader.take_skipped()
        assert [(s.what, s.key, s.seq) for s in skipped] == [
            ("journal", "s#1", 1),
            ("journal", "t#3", 3),
        ]
        assert "not a map" in skipped[1].reason
        reader.journal("s")
        assert reader.take_skipped() == []  # once per record
        assert reader.skipped_total == 2


# ------------------------------------------------------------------------------ trimming


def _trim_fixture(path: Path) -> list[int]:
    """Five entries in stream "a", interleaved with entries in "b"; the seqs of "a"."""
    with Database(path) as db:
        for n in range(5):
            db.apply([Append(records=(), journal=(entry("a", n), entry("b", n)))])
    with Reader(path) as reader:
        seqs = [seq for seq, _ in reader.journal("a")]
    assert len(seqs) == 5
    return seqs


@pytest.mark.parametrize(
    ("where", "kept"),
    [
        ("zero", [0, 1, 2, 3, 4]),
        ("before_first", [0, 1, 2, 3, 4]),
        ("at_first", [0, 1, 2, 3, 4]),
        ("after_first", [1, 2, 3, 4]),
        ("before_last", [4]),  # seqs of "a" are odd: the one before is in "b"
        ("at_last", [4]),
        ("after_last", []),
        ("far_after_last", []),
    ],
)
def test_trim_at_the_edges(path: Path, where: str, kept: list[int]) -> None:
    seqs = _trim_fixture(path)
    before_seq = {
        "zero": 0,
        "before_first": seqs[0] - 1,
        "at_first": seqs[0],
        "after_first": seqs[0] + 1,
        "before_last": seqs[-1] - 1,
        "at_last": seqs[-1],
        "after_last": seqs[-1] + 1,
        "far_after_last": 10**12,
    }[where]
    with Database(path) as db:
        assert db.apply([TrimJournal(stream="a", before_seq=before_seq)]) == [None]
    with Reader(path) as reader:
        assert [rec["n"] for rec in records_of(reader, "a")] == kept
        assert all(seq >= before_seq for seq, _ in reader.journal("a"))
        assert [rec["n"] for rec in records_of(reader, "b")] == [0, 1, 2, 3, 4]  # untouched


def test_seqs_are_not_reused_after_trimming_everything(path: Path) -> None:
    seqs = _trim_fixture(path)
    with Database(path) as db:
        db.apply([TrimJournal(stream="a", before_seq=10**12)])
        db.apply([TrimJournal(stream="b", before_seq=10**12)])
        assert all_rows(path) == []
        db.apply([Append(records=(), journal=(entry("a", 9),))])
    with Database(path) as db:  # nor after a reopen
        db.apply([Append(records=(), journal=(entry("a", 10),))])
    with Reader(path) as reader:
        new = reader.journal("a")
    assert [rec["n"] for _, rec in new] == [9, 10]
    assert new[0][0] > seqs[-1] + 1  # "b" had the seq after the last of "a"
    assert new[1][0] > new[0][0]


def test_trim_of_an_empty_or_unknown_stream_is_a_no_op(path: Path) -> None:
    with Database(path) as db:
        assert db.apply([TrimJournal(stream="none", before_seq=5)]) == [None]
        db.apply([Append(records=(), journal=(entry("a", 1),))])
        assert db.apply([TrimJournal(stream="none", before_seq=5)]) == [None]
    with Reader(path) as reader:
        assert records_of(reader, "a") == [{"v": 1, "op": "admit", "n": 1}]


def test_trim_in_a_batch_sees_the_entries_before_it(path: Path) -> None:
    seqs = _trim_fixture(path)
    with Database(path) as db:
        outcomes = db.apply(
            [
                Append(records=(record(id="x1"),), journal=(entry("a", 5),)),  # seq last + 2
                TrimJournal(stream="a", before_seq=seqs[-1] + 3),  # trims it, with all older
                Append(records=(record(id="x2"),), journal=(entry("a", 6),)),  # seq last + 3
            ]
        )
    assert outcomes == [AppendResult(stored=True), None, AppendResult(stored=True)]
    with Reader(path) as reader:
        assert reader.journal("a") == [(seqs[-1] + 3, {"v": 1, "op": "admit", "n": 6})]
        assert reader.count() == 2


def test_compaction_with_a_snapshot_replays_to_the_same_records(path: Path) -> None:
    """The compaction the module describes: append a snapshot, find its seq, trim before it."""
    with Database(path) as db:
        for n in range(4):
            db.apply([Append(records=(record(),), journal=(entry("co", n),))])
        snapshot = {"v": 1, "op": "snapshot", "state": {"upto": 3}}
        db.apply([Append(records=(), journal=(JournalEntry("co", snapshot),))])
        db.apply([Append(records=(record(),), journal=(entry("co", 4),))])  # a later transition
        with Reader(path) as reader:
            snap_seq = next(seq for seq, rec in reader.journal("co") if rec["op"] == "snapshot")
        db.apply([TrimJournal(stream="co", before_seq=snap_seq)])
    with Reader(path) as reader:
        assert records_of(reader, "co") == [snapshot, {"v": 1, "op": "admit", "n": 4}]


# ------------------------------------------------------------------------------ schema


def _make_v1_store(path: Path) -> None:
    from store import encode_body, encode_value

    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in SCHEMA_V1:
            conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '1')")
        conn.execute(
            "INSERT INTO messages (id, agent, role, created_at, body) VALUES (?, ?, ?, ?, ?)",
            ("old", "alice", "user", 1.0, encode_body([{"type": "text", "text": "hi"}], {})),
        )
        conn.execute("INSERT INTO dedupe VALUES ('event', 'lobby', 'e1')")
        conn.execute("INSERT INTO state VALUES ('n', 'k', ?)", (encode_value([1, 2]),))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _schema_of(path: Path) -> tuple[str, set[str]]:
    conn = sqlite3.connect(path)
    try:
        version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    return version[0], names


@pytest.mark.sqlite_only
@pytest.mark.parametrize("opener", [Database, Reader])
def test_a_version_1_store_opens_and_gains_the_journal(path: Path, opener: Any) -> None:
    _make_v1_store(path)
    version, names = _schema_of(path)
    assert version == "1" and "journal" not in names
    opener(path).close()
    version, names = _schema_of(path)
    assert version == str(SCHEMA_VERSION)  # every upgrade since, in the one transaction
    assert {"journal", "journal_stream_seq", "messages", "dedupe", "state", "agent_facts"} <= names
    with Database(path) as db:  # opening again changes nothing
        assert _schema_of(path) == (version, names)
        assert db.apply(
            [
                Append(
                    records=(record(),), dedupe=("event", "lobby", "e1"), journal=(entry("s", 0),)
                ),
                Append(records=(record(id="new"),), journal=(entry("s", 1),)),
            ]
        ) == [AppendResult(stored=False), AppendResult(stored=True)]
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == ["old", "new"]
        assert reader.state("n") == {"k": [1, 2]}
        assert records_of(reader, "s") == [{"v": 1, "op": "admit", "n": 1}]


@pytest.mark.sqlite_only
def test_a_failed_upgrade_leaves_version_1(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import store.schema

    _make_v1_store(path)
    broken = (*store.schema.JOURNAL_SCHEMA, "CREATE TABLE messages (x)")  # fails: exists
    monkeypatch.setitem(store.schema.UPGRADES, 1, broken)
    with pytest.raises(StoreError):
        Database(path)
    version, names = _schema_of(path)
    assert version == "1" and "journal" not in names
    monkeypatch.undo()
    Database(path).close()
    assert _schema_of(path)[0] == str(SCHEMA_VERSION)


@pytest.mark.sqlite_only
def test_concurrent_openers_upgrade_once(path: Path) -> None:
    _make_v1_store(path)
    assert open_at_once(path) == []
    assert _schema_of(path)[0] == str(SCHEMA_VERSION)


# ------------------------------------------------------------------------------ kill -9


#: Kill rounds on one store; each restarted child resends the last RESEND appends it had stored.
ROUNDS = 3
RESEND = 50


def _run_child_and_kill(path: Path, start: int, acks_before_kill: int, delay: float) -> list[int]:
    """Run the child from append ``start``, SIGKILL it ``delay`` seconds after its
    ``acks_before_kill``-th ack, and return the indexes of every append it acknowledged."""
    acked = kill_child_after(path, "--journal", str(start), acks=acks_before_kill, delay=delay)
    return [int(line[1:]) for line in acked]


def _check_after_kill(path: Path, acked: list[int], context: str) -> int:
    """Assert that messages and entries are all there or all missing, op by op; the number of
    appends stored (they are a prefix of the submission order)."""
    with Reader(path) as reader:
        message_ids = [m["id"] for m in reader.history("alice")]
        entries = reader.journal(STREAM) + reader.journal(OTHER_STREAM)
        streams = {
            (rec["i"], rec["k"]): stream
            for stream in (STREAM, OTHER_STREAM)
            for _seq, rec in reader.journal(stream)
        }
    entries.sort()
    messages_of: dict[int, list[str]] = defaultdict(list)
    for message_id in message_ids:
        messages_of[int(message_id[1:].split(".")[0])].append(message_id)
    entries_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for _seq, rec in entries:
        entries_of[rec["i"]].append(rec)

    stored = sorted(messages_of)
    assert stored == list(range(len(stored))), context  # a prefix of the submission order
    assert set(acked) <= set(stored), context  # every acknowledged append is there
    assert set(entries_of) == set(stored), context  # no entry without its messages, nor back
    ops = [journal_op(i) for i in stored]
    for i, op in enumerate(ops):  # each op whole, each once, its entries in order
        assert messages_of[i] == [r.id for r in op.records], (context, i)
        assert entries_of[i] == [dict(e.record) for e in op.journal], (context, i)
    # Seqs follow submission order across both streams, and each entry is in its stream.
    assert [(rec["i"], rec["k"]) for _seq, rec in entries] == [
        (i, k) for i, op in enumerate(ops) for k in range(len(op.journal))
    ], context
    assert streams == {
        (i, k): e.stream for i, op in enumerate(ops) for k, e in enumerate(op.journal)
    }, context
    return len(stored)


@pytest.mark.slow
def test_entries_and_messages_survive_sigkill_together(path: Path) -> None:
    """Rounds of: run the child, kill it at a random point, check every append is whole or
    absent, and restart it a little before where it stopped (resent appends are dedupe hits)."""
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    acked: list[int] = []
    start = 0
    for round_ in range(ROUNDS):
        acks_before_kill = rng.randint(20, 1500)
        # An ack is printed just after a commit: waiting a random part of a batch's time (a few
        # ms) more spreads the kill over the whole write, between the commits too.
        delay = rng.uniform(0, 0.005)
        acked += _run_child_and_kill(path, start, acks_before_kill, delay)
        context = f"seed {seed}, round {round_}: killed {delay * 1000:.1f} ms after "
        context += f"{acks_before_kill} acks from {start}"
        stored = _check_after_kill(path, acked, context)
        start = max(0, stored - RESEND)
    assert len(set(acked)) == len(acked)  # a resent append was never stored (acked) again

    # A retry after the restart writes neither messages nor entries again.
    rows_before = all_rows(path)
    with Database(path) as db:
        outcomes = db.apply([journal_op(i) for i in acked])
    assert outcomes == [AppendResult(stored=False)] * len(acked)
    assert all_rows(path) == rows_before
    with Reader(path) as reader:
        assert reader.count() == sum(len(journal_op(i).records) for i in range(stored))
