"""The read-only reader: it opens only an existing store, never writes a byte of it, reads what
a live writer committed, and names a damaged file; ``rows`` pages through the store."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest

from store import (
    Append,
    Database,
    Reader,
    StoreDamaged,
    StoreError,
    connect,
    connect_read_only,
    db_path,
)
from tests.store.conftest import record

# SQLite's own: its file opened read-only (PostgreSQL's read-only reader: test_postgres.py).
pytestmark = pytest.mark.sqlite_only


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fill(path: Path, n: int, **kwargs: object) -> list[str]:
    records = [record(f"text {i}", **kwargs) for i in range(n)]  # type: ignore[arg-type]
    with Database(path) as db:
        db.apply([Append(records=(r,)) for r in records])
    return [r.id for r in records]


def test_a_missing_store_is_not_made(tmp_path: Path) -> None:
    path = db_path(tmp_path / "none")
    with pytest.raises(StoreError, match="no store at"):
        Reader(path, read_only=True)
    assert not path.parent.exists()


def test_reading_changes_no_byte_and_sees_what_a_live_writer_committed(path: Path) -> None:
    fill(path, 3)
    before = digest(path)
    with Database(path) as live:  # a running host: its last writes are still in the WAL
        live.apply([Append(records=(record("fresh"),))])
        with Reader(path, read_only=True) as reader:
            texts = [m["blocks"][0]["text"] for m in reader.history()]
            assert texts == ["text 0", "text 1", "text 2", "fresh"]
            assert reader.count() == 4
        assert digest(path) == before  # the main file is the writer's, at checkpoints only
    with Reader(path, read_only=True) as reader:
        assert reader.count() == 4


def test_a_database_that_is_not_a_store_is_named_damaged_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (text)")
    conn.commit()
    conn.close()
    before = digest(path)
    with pytest.raises(StoreDamaged) as info:
        Reader(path, read_only=True)
    assert info.value.path == path and "no schema version" in info.value.detail
    with pytest.raises(StoreDamaged, match="tables but no store schema"):
        connect(path)
    assert digest(path) == before


def test_a_newer_store_is_refused(path: Path) -> None:
    fill(path, 1)
    conn = connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(StoreError, match="schema version 99, this program reads up to"):
        connect_read_only(path)


def test_damage_found_while_reading_names_the_file(path: Path) -> None:
    fill(path, 300, metadata={"pad": "x" * 500})
    with Reader(path, read_only=True) as reader:
        data = bytearray(path.read_bytes())
        data[4096 * 3 :] = b"\xa5" * (len(data) - 4096 * 3)
        path.write_bytes(bytes(data))
        with pytest.raises(StoreDamaged) as info:
            reader.history()
    assert info.value.path == path


def test_rows_page_through_the_store_in_order(path: Path) -> None:
    ada = fill(path, 7, agent="ada")
    bob = fill(path, 3, agent="bob", role="system")
    with Reader(path, read_only=True) as reader:
        every = reader.rows(limit=100)
        assert [r.message["id"] for r in every] == ada + bob
        assert [r.message for r in every] == reader.history()
        assert all(r.created_at == 1.5 for r in every)
        seqs = [r.seq for r in every]
        assert seqs == sorted(seqs)
        paged, after = [], 0
        while page := reader.rows(after_seq=after, limit=3):
            paged.extend(r.message["id"] for r in page)
            after = page[-1].seq
        assert paged == ada + bob
        newest = reader.rows(agent="ada", newest_first=True, limit=2)
        assert [r.message["id"] for r in newest] == [ada[6], ada[5]]
        third = reader.rows(agent="ada", newest_first=True, offset=2, limit=1)
        assert [r.message["id"] for r in third] == [ada[4]]
        assert [r.message["id"] for r in reader.rows(roles=("system",))] == bob
        middle = reader.rows(after_seq=seqs[1], before_seq=seqs[4])
        assert [r.message["id"] for r in middle] == ada[2:4]
        assert reader.rows(since=2.0) == []
        assert reader.last_message_seq() == seqs[-1]


def test_a_wal_that_cannot_be_indexed_is_refused_not_skipped(tmp_path: Path) -> None:
    # A copy taken while a writer had committed writes only in its WAL: reading the main file
    # alone would miss them. (The folder is writable here, so SQLite can index the WAL.)
    source = db_path(tmp_path / "live")
    fill(source, 2)
    copy = tmp_path / "copy"
    copy.mkdir()
    with Database(source) as live:
        live.apply([Append(records=(record("only in the wal"),))])
        for name in ("store.sqlite3", "store.sqlite3-wal"):
            shutil.copy(source.parent / name, copy / name)
    with Reader(copy / "store.sqlite3", read_only=True) as reader:
        assert reader.count() == 3
