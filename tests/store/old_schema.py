"""Stores as the previous schema versions (2 and 3) wrote them, built with their own statements,
for the tests of the upgrade."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from store import CorruptRecord, MessageRecord, decode_body, encode_body, encode_value, facts_of

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


#: The statements of schema version 3, as that release created a new store.
SCHEMA_V3 = (
    *SCHEMA_V2,
    "CREATE TABLE IF NOT EXISTS agent_facts ("
    " agent TEXT NOT NULL, fact TEXT NOT NULL, PRIMARY KEY (agent, fact)) WITHOUT ROWID",
)


def write_v3_store(
    path: Path,
    appends: Iterable[Iterable[MessageRecord]],
    *,
    journal: Iterable[tuple[str, dict[str, Any]]] = (),
    raw: Iterable[tuple[str, str, bytes]] = (),
) -> None:
    """A version-3 store at ``path`` as its writer left it: the records of each append (the
    copies of one item with the same body bytes, each encoded once as that writer did), their
    facts, the ``journal`` entries (stream, record), then ``raw`` rows (id, agent, body bytes
    stored as they are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN")
        for statement in SCHEMA_V3:
            conn.execute(statement)
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '3')")
        insert = "INSERT INTO messages (id, agent, role, created_at, body) VALUES (?, ?, ?, ?, ?)"
        for records in appends:
            bodies: dict[tuple[int, int], bytes] = {}
            for r in records:
                key = (id(r.blocks), id(r.metadata))
                body = bodies.setdefault(key, encode_body(r.blocks, r.metadata))
                conn.execute(insert, (r.id, r.agent, r.role, r.created_at, body))
                for fact in facts_of(r.metadata):
                    conn.execute(
                        "INSERT OR IGNORE INTO agent_facts (agent, fact) VALUES (?, ?)",
                        (r.agent, fact),
                    )
        for stream, record in journal:
            conn.execute(
                "INSERT INTO journal (stream, record) VALUES (?, ?)", (stream, encode_value(record))
            )
        conn.executemany(insert, ((mid, agent, "user", 1.0, body) for mid, agent, body in raw))
        conn.execute("COMMIT")
    finally:
        conn.close()


def read_v3_history(path: Path, agent: str | None = None) -> list[dict[str, Any]]:
    """The messages of a version-3 store as that release's reader gave them (``history``):
    every decodable row of ``agent`` (None: all), oldest first."""
    conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        where, params = ("WHERE agent = ?", (agent,)) if agent is not None else ("", ())
        rows = conn.execute(
            f"SELECT id, agent, role, body FROM messages {where} ORDER BY seq", params
        ).fetchall()
    finally:
        conn.close()
    out = []
    for message_id, name, role, body in rows:
        try:
            blocks, metadata = decode_body(body)
        except CorruptRecord:
            continue
        out.append(
            {"id": message_id, "agent": name, "role": role, "blocks": blocks, "metadata": metadata}
        )
    return out


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
