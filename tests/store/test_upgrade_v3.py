"""A store written by schema version 3 (one row, and one encoded body, per agent's copy) opens,
upgrades in place to version 4 in one transaction, and reads as it did; a read-only reader reads
it as it is, without upgrading it."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import store.items
import store.schema
from store import (
    HEADER_FACT,
    NOTICE_FACT,
    NOTICE_KIND,
    SCHEMA_VERSION,
    Append,
    Database,
    MessageRecord,
    Reader,
    StoreError,
)
from tests.store.conftest import item_copies
from tests.store.old_schema import read_v3_history, schema_version, write_v3_store

AGENTS = ["ada", "bo", "cy", "dee"]

# SQLite's own: its stores of older schema versions.
pytestmark = pytest.mark.sqlite_only


def _notice(agent: str) -> MessageRecord:
    return MessageRecord(
        id=f"notice-{agent}",
        agent=agent,
        role="system",
        blocks=({"type": "text", "text": "headers say where an item came from"},),
        metadata={"system": True, "kind": NOTICE_KIND},
        created_at=1.0,
    )


def _reply(agent: str, n: int) -> MessageRecord:
    return MessageRecord(
        id=f"reply-{agent}-{n}",
        agent=agent,
        role="assistant",
        blocks=({"type": "text", "text": f"Réponse {n} de {agent}"},),
        metadata={},
        created_at=3.0 + n,
    )


def _history() -> list[list[MessageRecord]]:
    """What a host of version 3 stored: notices, items heard by every agent (some with an
    invitation copy between the others), and replies."""
    appends: list[list[MessageRecord]] = [[_notice("bo")]]
    for n in range(40):
        invited = frozenset({AGENTS[n % 4]}) if n % 5 == 0 else frozenset()
        appends.append(list(item_copies(n, AGENTS, invited=invited).records))
        if n % 7 == 0:
            appends.append([_reply(AGENTS[n % 4], n)])
    return appends


_JOURNAL = [("co", {"v": 1, "op": "admit", "n": n}) for n in range(3)]
_DAMAGED = ("damaged", "dee", b"\xff\x00")


def _store(path: Path) -> None:
    write_v3_store(path, _history(), journal=_JOURNAL, raw=[_DAMAGED])
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO dedupe VALUES ('incoming', 's', 'k1')")
    conn.commit()
    conn.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _schema(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("opener", [Database, Reader])
def test_a_version_3_store_upgrades_and_reads_as_it_did(path: Path, opener: Any) -> None:
    _store(path)
    before = {agent: read_v3_history(path, agent) for agent in AGENTS}
    every = read_v3_history(path)
    assert sum(map(len, before.values())) == len(every) == 40 * 4 + 1 + 6
    opener(path).close()
    assert schema_version(path) == str(SCHEMA_VERSION) == "6"
    with Reader(path) as reader:
        for agent in AGENTS:
            assert reader.history(agent) == before[agent]
        assert reader.history() == every
        assert [r.message for r in reader.rows(limit=1000)] == every
        assert [s.key for s in reader.take_skipped()] == ["damaged"]
        assert reader.agents() == [*AGENTS]
        assert reader.count() == len(every) + 1 and reader.last_message_seq() == len(every) + 1
        assert reader.agent_facts("bo") == {HEADER_FACT, NOTICE_FACT}
        assert reader.agent_facts("ada") == {HEADER_FACT}
        assert [rec for _, rec in reader.journal("co")] == [rec for _, rec in _JOURNAL]
        assert reader.has_dedupe("incoming", "s", "k1")
        # the text index was filled: search finds through it what a scan finds
        assert [m["id"] for m in reader.search("HI 12")] == [f"{a}-12" for a in AGENTS]
        assert [m["id"] for m in reader.search("réponse 3", agent="ada")] == []
        assert [m["id"] for m in reader.search("réponse 35")] == ["reply-dee-35"]
    conn = sqlite3.connect(path)
    items = conn.execute("SELECT COUNT(*) FROM items").fetchone()[0]
    conn.close()
    # each item once (its invitation copy apart), each reply and notice, the damaged row
    assert items == 40 + 8 + 6 + 1 + 1
    schema = _schema(path)
    Database(path).close()  # a second open is a no-op
    assert _schema(path) == schema and schema_version(path) == "6"
    with Database(path) as db:  # and the writer numbers on past every seq given before
        db.apply([item_copies(99, ["ada", "eve"])])
    with Reader(path) as reader:
        assert [r.seq for r in reader.rows(agent="eve")] == [len(every) + 3]
        assert reader.history("ada")[:-1] == before["ada"]


def test_a_failed_upgrade_leaves_version_3_as_it_was(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(path)
    schema = _schema(path)
    cy = read_v3_history(path, "cy")

    def broken(conn: sqlite3.Connection) -> None:
        store.schema._bodies_once(conn)  # all of it, then a failure
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setitem(store.schema.UPGRADES, 3, (broken,))
    with pytest.raises(StoreError, match="disk I/O error"):
        Database(path)
    assert schema_version(path) == "3" and _schema(path) == schema
    monkeypatch.undo()
    with Reader(path) as reader:
        assert reader.history("cy") == cy


def test_a_read_only_reader_reads_a_version_3_store_as_it_is(path: Path) -> None:
    _store(path)
    digest = _digest(path)
    every = read_v3_history(path)
    with Reader(path, read_only=True) as reader:
        assert reader.history() == every
        assert reader.history("ada") == read_v3_history(path, "ada")
        assert reader.history_after("cy", 0, 3)[0] == read_v3_history(path, "cy")[-3:]
        assert reader.agents() == AGENTS
        assert reader.count() == len(every) + 1
        assert reader.agent_facts("bo") == {HEADER_FACT, NOTICE_FACT}
        # no text index there: substring search and the rows filter scan, with the same result
        assert [m["id"] for m in reader.search("hi 12")] == [f"{a}-12" for a in AGENTS]
        assert [m["id"] for m in reader.search("Hi 3", agent="bo", limit=2)] == ["bo-38", "bo-39"]
        found = reader.rows(contains="RÉPONSE", limit=100)
        assert [r.message["id"] for r in found] == [
            m["id"] for m in every if m["id"].startswith("reply-")
        ]
    assert _digest(path) == digest and schema_version(path) == "3"


def test_a_read_only_reader_of_a_version_4_store_sees_new_writes(path: Path) -> None:
    with Database(path) as db:
        db.apply([Append(records=item_copies(0, AGENTS).records)])
        with Reader(path, read_only=True) as reader:
            assert [m["id"] for m in reader.search("hi 0")] == [f"{a}-0" for a in AGENTS]
            db.apply([Append(records=item_copies(1, AGENTS[:1]).records)])
            assert [m["id"] for m in reader.search("hi 1")] == ["ada-1"]


def test_the_upgrade_looks_back_over_at_most_its_cap_of_bodies(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.items, "CONVERT_OPEN", 1)
    _store(path)
    before = {agent: read_v3_history(path, agent) for agent in AGENTS}
    Database(path).close()
    with Reader(path) as reader:
        for agent in AGENTS:
            assert reader.history(agent) == before[agent]
        assert [m["id"] for m in reader.search("hi 10")] == [f"{a}-10" for a in AGENTS]
    conn = sqlite3.connect(path)
    items = conn.execute("SELECT COUNT(*) FROM items").fetchone()[0]
    conn.close()
    # the copies after an invitation copy between two others no longer find the item's body:
    # one more item for each of those (items 5, 10, 25 and 30)
    assert items == 40 + 8 + 4 + 6 + 1 + 1
