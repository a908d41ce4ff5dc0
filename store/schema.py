"""The store's schema: the statements of a new store, and the in-place upgrades from older ones.

Versions: 1 had ``meta``, ``messages``, ``dedupe`` and ``state``; 2 adds ``journal`` (see
:mod:`store.records`); 3 adds ``agent_facts`` (see :mod:`store.facts`), filled from the messages
already stored; 4 stores each body once (see :mod:`store.items`) and indexes its text for search
(see :mod:`store.textindex`); 5 adds ``usage``, the usage ledger (one row per turn that called a
model, see :class:`store.records.RecordUsage`); 6 adds ``audit``, the record of the operator's
actions (one row per pause, resume, reconnect, …, see :class:`store.records.RecordAudit`).

Version 4 keeps messages in three tables:

``items (num, role, created_at, first_seq, last_seq, body)``
    one row per stored body: the copies of one channel item for every agent hearing it share
    one row. ``first_seq``/``last_seq`` bound the seqs of its copies (they are stored in a row).
``names (num, name)``
    each agent name once, numbered.
``message_refs (seq, id, agent, item)``
    one small row per stored message: its seq, its id, its agent's number, its item's number.

``messages`` is a view joining them, with the columns version 3's table had (``seq``, ``id``,
``agent``, ``role``, ``created_at``, ``body``); inserting into it stores a message as its own
item, and updating its ``body``, ``role`` or ``created_at`` changes the item (every copy).

Opening a store of an older version upgrades it in place, in one transaction; a newer version is
refused.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from store.errors import StoreError
from store.facts import FACTS_SCHEMA, backfill
from store.textindex import TEXT_INDEX_SCHEMA

#: Version of the schema below, kept in the ``meta`` table.
SCHEMA_VERSION = 6

_BASE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS dedupe ("
    " kind TEXT NOT NULL, server TEXT NOT NULL, key TEXT NOT NULL,"
    " PRIMARY KEY (kind, server, key)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS state ("
    " namespace TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (namespace, key)) WITHOUT ROWID",
)
#: Version 1 to 2: the journal. AUTOINCREMENT: a seq is never reused, even after a trim.
JOURNAL_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS journal ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS journal_stream_seq ON journal (stream, seq)",
)
#: Version 4's message tables, before the index and view (the upgrade fills them in between).
_ITEM_TABLES = (
    "CREATE TABLE items ("
    " num INTEGER PRIMARY KEY, role TEXT NOT NULL, created_at REAL NOT NULL,"
    " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, body BLOB NOT NULL)",
    "CREATE TABLE names (num INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)",
    # AUTOINCREMENT: a seq is never reused.
    "CREATE TABLE message_refs ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
    " agent INTEGER NOT NULL, item INTEGER NOT NULL)",
    *TEXT_INDEX_SCHEMA,
)
#: The per-agent index and the ``messages`` view with the shape version 3's table had.
_ITEM_VIEWS = (
    "CREATE INDEX messages_agent_seq ON message_refs (agent, seq)",
    "CREATE VIEW messages (seq, id, agent, role, created_at, body) AS"
    " SELECT r.seq, r.id, n.name, i.role, i.created_at, i.body FROM message_refs r"
    " JOIN names n ON n.num = r.agent JOIN items i ON i.num = r.item",
    # A message inserted through the view is an item of its own.
    "CREATE TRIGGER messages_insert INSTEAD OF INSERT ON messages BEGIN"
    " INSERT OR IGNORE INTO names (name) VALUES (NEW.agent);"
    " INSERT INTO items (role, created_at, first_seq, last_seq, body)"
    "  VALUES (NEW.role, NEW.created_at, 0, 0, NEW.body);"
    " INSERT INTO message_refs (seq, id, agent, item) VALUES (NEW.seq, NEW.id,"
    "  (SELECT num FROM names WHERE name = NEW.agent), (SELECT MAX(num) FROM items));"
    " UPDATE items SET first_seq = last_insert_rowid(), last_seq = last_insert_rowid()"
    "  WHERE num = (SELECT MAX(num) FROM items);"
    " END",
    "CREATE TRIGGER messages_update INSTEAD OF UPDATE ON messages BEGIN"
    " UPDATE items SET role = NEW.role, created_at = NEW.created_at, body = NEW.body"
    "  WHERE num = (SELECT item FROM message_refs WHERE seq = OLD.seq);"
    " END",
    "CREATE TRIGGER messages_delete INSTEAD OF DELETE ON messages BEGIN"
    " DELETE FROM message_refs WHERE seq = OLD.seq;"
    " END",
)
#: Version 4 to 5: the usage ledger, one row per turn (times in seconds since the epoch).
USAGE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS usage ("
    " num INTEGER PRIMARY KEY, at REAL NOT NULL, agent TEXT NOT NULL, model TEXT NOT NULL,"
    " turn INTEGER NOT NULL, turn_id TEXT NOT NULL, server TEXT, channel TEXT,"
    " phase TEXT NOT NULL, silent INTEGER NOT NULL, calls INTEGER NOT NULL,"
    " input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,"
    " cache_read_tokens INTEGER NOT NULL, cache_write_tokens INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS usage_at ON usage (at)",
)
#: Version 5 to 6: the audit record of the operator's actions, one row per action (times in
#: seconds since the epoch). AUTOINCREMENT: a num is never reused, even after the oldest rows go
#: (see :data:`store.records.AUDIT_KEEP`).
AUDIT_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS audit ("
    " num INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, action TEXT NOT NULL,"
    " target TEXT NOT NULL, source TEXT NOT NULL, changed INTEGER NOT NULL,"
    " detail TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS audit_at ON audit (at)",
)
#: Every statement of a new store.
SCHEMA = (
    *_BASE_SCHEMA,
    *JOURNAL_SCHEMA,
    *FACTS_SCHEMA,
    *_ITEM_TABLES,
    *_ITEM_VIEWS,
    *USAGE_SCHEMA,
    *AUDIT_SCHEMA,
)


def _bodies_once(conn: sqlite3.Connection) -> None:
    """Version 3 to 4: move the messages into items, names and refs (see
    :func:`store.items.convert`), then replace the table by the view."""
    from store.items import convert  # store.items reads this module's tables

    for statement in _ITEM_TABLES:
        conn.execute(statement)
    convert(conn)
    conn.execute("DROP TABLE messages")
    for statement in _ITEM_VIEWS:
        conn.execute(statement)


def _audit_table(conn: sqlite3.Connection) -> None:
    """Version 5 to 6: the audit table, empty (nothing before it was recorded)."""
    for statement in AUDIT_SCHEMA:
        conn.execute(statement)


#: The steps that bring a store of version ``v`` to ``v + 1``: statements, or functions given the
#: connection (inside the upgrade's transaction).
UPGRADES: dict[int, tuple[str | Callable[[sqlite3.Connection], None], ...]] = {
    1: JOURNAL_SCHEMA,
    2: (backfill,),
    3: (_bodies_once,),
    4: USAGE_SCHEMA,
    5: (_audit_table,),
}


def schema_version(conn: sqlite3.Connection) -> int | None:
    """The version in the store's ``meta`` table; None when there is none."""
    has_meta = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    if has_meta is None:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return None if row is None else int(row[0])


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the schema of a new store, or upgrade an older one, in one transaction; refuse a
    version this program does not read."""
    version = schema_version(conn)
    if version is None or version in UPGRADES:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another connection may have got here first.
            version = schema_version(conn)
            if version is None:
                for statement in SCHEMA:
                    conn.execute(statement)
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif version in UPGRADES:
                while version in UPGRADES:
                    for step in UPGRADES[version]:
                        if isinstance(step, str):
                            conn.execute(step)
                        else:
                            step(conn)
                    version += 1
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(version),)
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        version = schema_version(conn)
    if version != SCHEMA_VERSION:
        raise StoreError(f"store schema version {version}, this program reads {SCHEMA_VERSION}")
