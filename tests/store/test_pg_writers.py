"""Several writers on one PostgreSQL store at once (a fleet's hosts): every number the write side
gives comes from the database, so none is given twice and no batch is lost to another's."""

from __future__ import annotations

import threading
from typing import Any

from store import Append, AppendResult, Database, MessageRecord, Reader
from store.postgres import PgConnection
from store.records import RecordAudit, RecordUsage

from .conftest import run_sql

#: Messages each writer stores (copies included), appends per batch.
PER_WRITER = 2000
BATCH = 25
#: Items both writers try to store, under the same dedupe key (every ``SHARED_EVERY``-th).
SHARED_EVERY = 4


def _appends(writer: int) -> list[Append]:
    """``writer``'s appends: items heard by the agent both writers serve and by the writer's own
    agent (one body, two copies), every ``SHARED_EVERY``-th under a dedupe key the other writer
    uses too."""
    appends = []
    for i in range(PER_WRITER // 2):
        blocks = ({"type": "text", "text": f"w{writer} item {i}"},)
        meta: dict[str, Any] = {"writer": writer, "i": i}
        records = tuple(
            MessageRecord(
                id=f"w{writer}-{i}-{agent}",
                agent=agent,
                role="user",
                blocks=blocks,
                metadata=meta,
                created_at=float(i),
            )
            for agent in ("shared", f"own{writer}")
        )
        dedupe = ("channel", "srv", f"k{i}") if i % SHARED_EVERY == 0 else None
        appends.append(Append(records=records, dedupe=dedupe))
    return appends


def _usage(writer: int, turn: int) -> RecordUsage:
    return RecordUsage(
        at=1.0,
        agent=f"own{writer}",
        model="m",
        turn=turn,
        turn_id=f"t{writer}-{turn}",
        server=None,
        channel=None,
        phase="completed",
        silent=False,
        calls=1,
        input_tokens=1,
        output_tokens=1,
        cache_read_tokens=0,
        cache_write_tokens=0,
    )


def test_two_writers_on_one_database_give_every_seq_once_and_store_every_message_once(
    pg_dsn: str,
) -> None:
    Database(pg_dsn).close()  # the schema, made once
    outcomes: dict[int, list[object]] = {0: [], 1: []}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def write(writer: int) -> None:
        try:
            ops = _appends(writer)
            with Database(pg_dsn) as db:
                start.wait()
                for at in range(0, len(ops), BATCH):
                    batch: list[Any] = list(ops[at : at + BATCH])
                    batch.append(_usage(writer, at))
                    batch.append(
                        RecordAudit(
                            at=1.0,
                            action="pause",
                            target=f"own{writer}",
                            source="test",
                            changed=True,
                            detail=str(at),
                        )
                    )
                    outcomes[writer].extend(db.apply(batch)[: len(batch) - 2])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for writer in (0, 1):
        failed = [o for o in outcomes[writer] if not isinstance(o, AppendResult)]
        assert failed == [], f"writer {writer}: {failed[:3]}"

    # an item both tried to store under one key is stored once, by one of them
    stored = {w: [o.stored for o in outcomes[w] if isinstance(o, AppendResult)] for w in (0, 1)}
    for i in range(PER_WRITER // 2):
        if i % SHARED_EVERY == 0:
            assert stored[0][i] != stored[1][i], f"item {i}"
        else:
            assert stored[0][i] and stored[1][i]
    expected = {
        f"w{w}-{i}-{agent}"
        for w in (0, 1)
        for i in range(PER_WRITER // 2)
        if stored[w][i]
        for agent in ("shared", f"own{w}")
    }
    rows = run_sql(pg_dsn, "SELECT seq, id, agent FROM messages ORDER BY seq")
    seqs = [int(r[0]) for r in rows]
    assert len(set(seqs)) == len(seqs) and min(seqs) >= 1
    assert [r[1] for r in rows if r[1] in expected] == [r[1] for r in rows]
    assert {r[1] for r in rows} == expected and len(rows) == len(expected)
    # each writer's messages, per agent, in the order it stored them
    for agent in ("shared", "own0", "own1"):
        for w in (0, 1):
            order = [int(r[1].split("-")[1]) for r in rows if r[2] == agent and r[1][1] == str(w)]
            assert order == sorted(order)
    # the copies of one item share its body: two refs per item
    (items,) = run_sql(pg_dsn, "SELECT count(*) FROM items")[0]
    assert int(items) == len(expected) // 2
    # the other numbers: usage, audit, journal-free batches all kept
    (usage,) = run_sql(pg_dsn, "SELECT count(*) FROM usage")[0]
    assert int(usage) == 2 * len(range(0, PER_WRITER // 2, BATCH))

    with Reader(pg_dsn) as reader:
        assert reader.count() == len(expected)
        assert reader.last_message_seq() == max(seqs)
        history = reader.history("shared")
        assert [m["id"] for m in history] == [r[1] for r in rows if r[2] == "shared"]
        texts = {m["id"]: m["blocks"][0]["text"] for m in history}
        for message_id, text in texts.items():
            w, i, _agent = message_id.split("-")
            assert text == f"{w} item {i}"


def test_a_version_3_store_takes_seqs_and_item_numbers_past_those_its_one_writer_gave(
    pg_dsn: str,
) -> None:
    from store.postgres import PG_SCHEMA_VERSION

    with Database(pg_dsn) as db:
        db.apply(_appends(0)[:3])
    # as version 3 left it: items numbered by the writer, message_seq set to the highest seq
    run_sql(pg_dsn, "ALTER TABLE items ALTER COLUMN num DROP IDENTITY")
    run_sql(pg_dsn, "SELECT setval('message_seq', 10)")  # a seq given, its message rolled back
    run_sql(pg_dsn, "DROP TABLE outbox")  # made by version 5
    run_sql(pg_dsn, "UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    with Database(pg_dsn) as db:
        assert db.apply(_appends(1)[1:3]) == [AppendResult(stored=True)] * 2
    (version,) = run_sql(pg_dsn, "SELECT value FROM meta WHERE key = 'schema_version'")[0]
    assert int(version) == PG_SCHEMA_VERSION == 5
    rows = run_sql(pg_dsn, "SELECT seq, item FROM message_refs ORDER BY seq")
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5, 6, 11, 12, 13, 14]
    assert [int(r[1]) for r in rows] == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


def test_a_new_store_gives_seq_1_first(pg_dsn: str) -> None:
    with Database(pg_dsn) as db:
        db.apply(_appends(0)[:1])
    assert [int(r[0]) for r in run_sql(pg_dsn, "SELECT seq FROM message_refs ORDER BY seq")] == [
        1,
        2,
    ]


def test_write_transactions_of_two_hosts_take_turns(pg_dsn: str) -> None:
    """A write transaction (``BEGIN IMMEDIATE``) holds the store's write lock to its end, as an
    SQLite writer does: a second host's write waits for the first one's commit, so seqs rise in
    commit order and a read after a seq never misses a row committed later."""
    first, second, watcher = PgConnection(pg_dsn), PgConnection(pg_dsn), PgConnection(pg_dsn)
    order: list[str] = []
    try:
        first.execute("BEGIN IMMEDIATE")
        order.append("first began")

        def later() -> None:
            second.execute("BEGIN IMMEDIATE")
            order.append("second began")
            second.execute("COMMIT")

        thread = threading.Thread(target=later)
        thread.start()
        for _ in range(2_000):  # until the second waits on the lock (bounded)
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            if waiting is not None and waiting[0] > 0:
                break
            threading.Event().wait(0.01)
        order.append("first commits")
        first.execute("COMMIT")
        thread.join(timeout=60)
    finally:
        for conn in (first, second, watcher):
            conn.close()
    assert order == ["first began", "first commits", "second began"]
