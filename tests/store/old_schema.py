"""Stores as the previous schema version (2) wrote them, built with its own statements, for
the tests of the upgrade."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from store import MessageRecord, encode_body

#: The statements of schema version 1, as that release created a new store.
SCHEMA_V1 = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS messages ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, agent TEXT NOT NULL,"
    " role TEXT NOT NULL, created_at REAL NOT NULL, body BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS messages_agent_seq ON messages (agent, seq)",
    "CREATE TABLE IF NOT EXISTS dedupe ("
    " kind TEXT NOT NULL, server TEXT NOT NULL, key TEXT NOT NULL,"
    " PRIMARY KEY (kind, server, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS state ("
    " namespace TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (namespace, key)) WITHOUT ROWID",
)
#: The statements of schema version 2, as that release created a new store.
SCHEMA_V2 = (
    *SCHEMA_V1,
    "CREATE TABLE IF NOT EXISTS journal ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS journal_stream_seq ON journal (stream, seq)",
)


def write_v2_store(
    path: Path, records: Iterable[MessageRecord], raw: Iterable[tuple[str, str, bytes]] = ()
) -> None:
    """A version-2 store at ``path`` holding ``records``, then ``raw`` rows (id, agent, body
    bytes stored as they are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in SCHEMA_V2:
            conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '2')")
        insert = "INSERT INTO messages (id, agent, role, created_at, body) VALUES (?, ?, ?, ?, ?)"
        conn.executemany(
            insert,
            (
                (r.id, r.agent, r.role, r.created_at, encode_body(r.blocks, r.metadata))
                for r in records
            ),
        )
        conn.executemany(insert, ((mid, agent, "user", 1.0, body) for mid, agent, body in raw))
        conn.execute("COMMIT")
    finally:
        conn.close()


def schema_version(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    finally:
        conn.close()
    return str(row[0])
