"""The audit record of the operator's actions: written through the store's own writer, read back
by time and count, bounded, and added to a version-5 store by the upgrade."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import store.sqlite
from store import SCHEMA_VERSION, Database, Reader, RecordAudit, db_path
from store.schema import AUDIT_SCHEMA
from tests.store.old_schema import schema_version


def act(at: float, action: str = "pause", **kw: Any) -> RecordAudit:
    fields: dict[str, Any] = {"target": "Ada", "source": "console 127.0.0.1", "changed": True}
    fields.update(kw)
    return RecordAudit(at=at, action=action, **fields)


def _schema(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()


def test_actions_are_read_back_oldest_first_by_time_and_count(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    with Database(path) as db:
        ops = [
            act(10.0),
            act(20.0, "reconnect", target="lobby", source="api", detail="dialling now"),
            act(30.0, "resume", source="SIGHUP", changed=False, detail="not paused"),
        ]
        assert db.apply(ops) == [None, None, None]
    with Reader(path, read_only=True) as reader:
        every = reader.audit()
        assert [(e.action, e.target, e.source, e.changed, e.detail) for e in every] == [
            ("pause", "Ada", "console 127.0.0.1", True, ""),
            ("reconnect", "lobby", "api", True, "dialling now"),
            ("resume", "Ada", "SIGHUP", False, "not paused"),
        ]
        assert [e.at for e in every] == [10.0, 20.0, 30.0]
        assert [e.num for e in every] == sorted(e.num for e in every)
        assert [e.at for e in reader.audit(since=20.0)] == [20.0, 30.0]
        assert [e.at for e in reader.audit(limit=1)] == [30.0]  # the newest
        assert reader.audit(limit=0) == []
        assert every[0].as_json()["source"] == "console 127.0.0.1"
        with pytest.raises(ValueError):
            reader.audit(limit=-1)


def test_a_bad_record_is_refused_where_it_is_made() -> None:
    with pytest.raises(ValueError):
        act(1.0, action="")
    with pytest.raises(ValueError):
        act(float("nan"))
    with pytest.raises(TypeError):
        act(1.0, changed=1)


def test_the_record_keeps_the_newest_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store.sqlite, "AUDIT_KEEP", 3)
    path = db_path(tmp_path)
    with Database(path) as db:
        db.apply([act(float(i)) for i in range(4)])  # one batch
        for i in range(4, 6):  # and one by one
            db.apply([act(float(i))])
    with Reader(path) as reader:
        kept = reader.audit()
    assert [e.at for e in kept] == [3.0, 4.0, 5.0]
    assert [e.num for e in kept] == [4, 5, 6]  # nums are never reused


def test_a_version_5_store_gains_the_record(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    Database(path).close()
    fresh = _schema(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE audit")  # the store as version 5 made it: no audit table
    conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    assert all(name != "audit" for _, name, _ in _schema(path))
    before = path.read_bytes()
    with Reader(path, read_only=True) as reader:
        assert reader.audit() == []  # read as it is, and left so
    assert path.read_bytes() == before and schema_version(path) == "5"
    with Database(path) as db:  # the writer upgrades it in place
        assert db.apply([act(1.0)]) == [None]
    assert schema_version(path) == str(SCHEMA_VERSION) == "6"
    assert _schema(path) == fresh  # as a new store has it
    with Reader(path, read_only=True) as reader:
        assert [e.action for e in reader.audit()] == ["pause"]
    assert len(AUDIT_SCHEMA) == 2  # the table and its index on time
