"""The SQLite store: schema, the batch-applying write side and the reader.

One file, ``<data_dir>/store.sqlite3``, in WAL mode with ``synchronous=FULL``: a committed
transaction is on disk when the commit returns. Only the writer thread (see
:mod:`store.writer`) uses :class:`Database`; :class:`Reader` has its own connection and may be
used from any thread.

Schema versions: 1 had ``meta``, ``messages``, ``dedupe`` and ``state``; 2 adds ``journal`` (see
:mod:`store.records` for what it holds and how it is kept bounded); 3 adds ``agent_facts`` (see
:mod:`store.facts`), filled from the messages already stored when a version-2 store is upgraded.
Opening a store of an older version upgrades it in place, in one transaction; a newer version is
refused.

A file SQLite reports as damaged (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``), or a database holding
tables but no store schema, raises :class:`~store.errors.StoreDamaged` naming the file, whether
found on opening or on reading. :func:`connect_read_only` (``Reader(path, read_only=True)``) never
writes to the file: not its schema, not its journal mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from store.bodytext import body_text, text_matcher
from store.codec import decode_body, decode_value, encode_body, encode_value
from store.errors import CorruptRecord, StoreClosed, StoreDamaged, StoreError
from store.facts import FACTS_SCHEMA, FactWriter, backfill, read_facts
from store.records import (
    Append,
    AppendResult,
    JournalEntry,
    MessageRecord,
    Op,
    OpResult,
    Outcome,
    PutState,
    TrimJournal,
)

#: File name of the store inside the data directory.
DB_FILENAME = "store.sqlite3"
#: Version of the schema below, kept in the ``meta`` table.
SCHEMA_VERSION = 3
#: Decoded bodies a reader keeps for ``rows(shared=True)`` (the copies of one item for every
#: agent hearing it decode once).
MAX_SHARED_BODIES = 1024
#: How long a connection waits for another connection's lock, in seconds.
BUSY_TIMEOUT = 30.0

_SCHEMA = (
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
#: Version 1 to 2: the journal. AUTOINCREMENT: a seq is never reused, even after a trim.
_JOURNAL_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS journal ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS journal_stream_seq ON journal (stream, seq)",
)
#: The steps that bring a store of version ``v`` to ``v + 1``: statements, or functions given the
#: connection (inside the upgrade's transaction).
_UPGRADES: dict[int, tuple[str | Callable[[sqlite3.Connection], None], ...]] = {
    1: _JOURNAL_SCHEMA,
    2: (backfill,),
}


def db_path(data_dir: str | os.PathLike[str]) -> Path:
    """Where the store lives inside ``data_dir``."""
    return Path(data_dir) / DB_FILENAME


def _schema_version(conn: sqlite3.Connection) -> int | None:
    has_meta = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).fetchone()
    if has_meta is None:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return None if row is None else int(row[0])


def _is_damage(exc: sqlite3.Error) -> bool:
    """Whether SQLite says the file itself is bad (rather than busy, read-only or full)."""
    name = getattr(exc, "sqlite_errorname", "")
    return isinstance(name, str) and name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def _read_error(path: Path, what: str, exc: sqlite3.Error) -> StoreError:
    """The store error for an SQLite failure while ``what`` on the store at ``path``."""
    if _is_damage(exc):
        return StoreDamaged(path, str(exc))
    return StoreError(f"{what} {path}: {exc}")


def _has_tables(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table'").fetchone() is not None


def _refuse_other_databases(conn: sqlite3.Connection, path: Path) -> None:
    """Read (and write nothing) to make sure ``path`` is a store or a new, empty database."""
    if _schema_version(conn) is None and _has_tables(conn):
        raise StoreDamaged(path, "an SQLite database with tables but no store schema")


def _ensure_schema(conn: sqlite3.Connection) -> None:
    version = _schema_version(conn)
    if version is None or version in _UPGRADES:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Read again under the write lock: another connection may have got here first.
            version = _schema_version(conn)
            if version is None:
                for statement in (*_SCHEMA, *_JOURNAL_SCHEMA, *FACTS_SCHEMA):
                    conn.execute(statement)
                conn.execute(
                    "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
            elif version in _UPGRADES:
                while version in _UPGRADES:
                    for step in _UPGRADES[version]:
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
        version = _schema_version(conn)
    if version != SCHEMA_VERSION:
        raise StoreError(f"store schema version {version}, this program reads {SCHEMA_VERSION}")


def connect(
    path: str | os.PathLike[str], *, busy_timeout: float = BUSY_TIMEOUT
) -> sqlite3.Connection:
    """Open (creating folder, file and schema when missing) a connection to the store at ``path``.

    ``busy_timeout`` is how long, in seconds, a statement waits for another connection's lock.

    The connection is in autocommit mode; callers issue ``BEGIN``/``COMMIT`` themselves. It is
    not bound to the opening thread: its owner must serialize its use.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            target, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open store at {target}: {exc}") from exc
    try:
        _refuse_other_databases(conn, target)  # before anything is written to the file
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"store at {target} cannot use WAL (journal mode {mode})")
        conn.execute("PRAGMA synchronous=FULL")
        _ensure_schema(conn)
    except sqlite3.Error as exc:
        conn.close()
        raise _read_error(target, "cannot open store at", exc) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def connect_read_only(
    path: str | os.PathLike[str], *, busy_timeout: float = BUSY_TIMEOUT
) -> sqlite3.Connection:
    """Open the existing store at ``path`` for reading only: nothing is created or upgraded, and
    the file's bytes are never written (SQLite's ``mode=ro``).

    A reader of a WAL database needs its ``-shm`` index beside it. When the folder is read-only
    and no ``-wal`` file is there, nothing can be writing, so the file is read as immutable (no
    locks, no index). A ``-wal`` file that cannot be indexed is refused with a
    :class:`StoreError`: reading without it would miss committed writes.
    """
    target = Path(path).absolute()
    if not target.is_file():
        raise StoreError(f"no store at {target}")
    conn = _open_uri(target, "mode=ro", busy_timeout)
    try:
        version = _schema_version(conn)
    except sqlite3.Error as exc:
        conn.close()
        if _is_damage(exc) or not _needs_immutable(target, exc):
            raise _read_error(target, "cannot read store", exc) from exc
        if Path(f"{target}-wal").exists():
            raise StoreError(
                f"cannot read store {target}: its write-ahead log {target.name}-wal is there "
                "but the folder is read-only; copy the data dir somewhere writable and read "
                "the copy"
            ) from exc
        conn = _open_uri(target, "immutable=1", busy_timeout)
        try:
            version = _schema_version(conn)
        except sqlite3.Error as exc2:
            conn.close()
            raise _read_error(target, "cannot read store", exc2) from exc2
    try:
        if version is None:
            raise StoreDamaged(target, "not a store (no schema version)")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {target} has schema version {version}, this program reads up to "
                f"{SCHEMA_VERSION}; use a newer mcplive"
            )
    except BaseException:
        conn.close()
        raise
    return conn


def _open_uri(target: Path, query: str, busy_timeout: float) -> sqlite3.Connection:
    try:
        return sqlite3.connect(
            f"{target.as_uri()}?{query}",
            uri=True,
            timeout=busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
    except sqlite3.Error as exc:
        raise _read_error(target, "cannot open store", exc) from exc


def _is_indexed(conn: sqlite3.Connection) -> bool:
    """Whether the store on ``conn`` has the facts index (schema version 3 and later)."""
    version = _schema_version(conn)
    return version is not None and version >= 3


def _needs_immutable(target: Path, exc: sqlite3.Error) -> bool:
    """Whether a read-only open failed only because the store's folder is read-only (SQLite
    could not create the WAL index beside the file)."""
    name = getattr(exc, "sqlite_errorname", "")
    return name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) and not os.access(
        target.parent, os.W_OK, effective_ids=os.access in os.supports_effective_ids
    )


class Database:
    """The write side. Not thread-safe: one thread (the writer's) uses it."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = BUSY_TIMEOUT) -> None:
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = connect(self.path, busy_timeout=busy_timeout)
        self.facts = FactWriter()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreClosed("database is closed")
        return self._conn

    def apply(self, ops: Sequence[Op]) -> list[Outcome]:
        """Apply ``ops`` in order in one transaction and commit; one outcome per op.

        The batch first runs as it is. If an op fails (a duplicate message id, a value that
        cannot be encoded), the batch is rolled back and run again with each op inside a
        savepoint, so the failing op is undone alone and its outcome is the
        :class:`StoreError`. If the transaction itself fails, it is rolled back and the ops are
        applied one transaction each, so a bad op never fails the others. Never raises for an
        op's failure.
        """
        if not ops:
            return []
        conn = self._connection()
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
                outcomes = _apply_bulk(conn, ops)
                self.facts.write(conn, _stored_appends(ops, outcomes))
                self._commit(conn)
                return outcomes
            except StoreError:
                self._rollback(conn)
            return self._apply_one_by_one(conn, ops)
        except Exception:
            self._rollback(conn)
        return [self._apply_alone(conn, op) for op in ops]

    def _commit(self, conn: sqlite3.Connection) -> None:
        conn.execute("COMMIT")
        self.facts.committed()

    def _rollback(self, conn: sqlite3.Connection) -> None:
        self.facts.rolled_back()
        _rollback(conn)

    def _apply_one_by_one(self, conn: sqlite3.Connection, ops: Sequence[Op]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        conn.execute("BEGIN IMMEDIATE")
        for op in ops:
            conn.execute("SAVEPOINT op")
            try:
                outcome: Outcome = _apply_op(conn, op)
                self.facts.write(conn, _stored_appends([op], [outcome]))
            except StoreError as exc:
                conn.execute("ROLLBACK TO op")
                self.facts.rolled_back()
                outcome = exc
            conn.execute("RELEASE op")
            outcomes.append(outcome)
        self._commit(conn)
        return outcomes

    def _apply_alone(self, conn: sqlite3.Connection, op: Op) -> Outcome:
        try:
            conn.execute("BEGIN IMMEDIATE")
            result = _apply_op(conn, op)
            self.facts.write(conn, _stored_appends([op], [result]))
            self._commit(conn)
            return result
        except StoreError as exc:
            self._rollback(conn)
            return exc
        except Exception as exc:
            self._rollback(conn)
            if isinstance(exc, sqlite3.Error) and _is_damage(exc):
                return StoreDamaged(self.path, str(exc))
            return StoreError(f"write failed: {exc}")


def _stored_appends(ops: Sequence[Op], outcomes: Sequence[Outcome]) -> list[Append]:
    """The appends of ``ops`` whose outcome says they were stored."""
    return [
        op
        for op, outcome in zip(ops, outcomes, strict=True)
        if isinstance(op, Append) and isinstance(outcome, AppendResult) and outcome.stored
    ]


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


#: Rows per multi-row INSERT: 5 parameters each stays far below SQLite's parameter limit.
_ROWS_PER_STATEMENT = 256


def _apply_bulk(conn: sqlite3.Connection, ops: Sequence[Op]) -> list[Outcome]:
    """Apply ``ops`` inside the current transaction with a few multi-row statements.

    The outcome is the same as applying each op in turn; any op-level failure raises
    :class:`StoreError` and leaves the transaction to be rolled back. Few statements mean few
    trips into SQLite, each of which lets other threads take the interpreter lock.
    """
    present = _present_keys(conn, [op.dedupe for op in ops if isinstance(op, Append)])
    outcomes: list[Outcome] = []
    new_keys: list[tuple[str, str, str]] = []
    rows: list[tuple[str, str, str, float, bytes]] = []
    entries: list[tuple[str, bytes]] = []
    for op in ops:
        if isinstance(op, PutState):
            _put_state(conn, op)
            outcomes.append(None)
            continue
        if isinstance(op, TrimJournal):
            # The entries of earlier ops in the batch must exist before they can be trimmed.
            _insert_rows(conn, _JOURNAL_TARGET, 2, entries)
            entries.clear()
            _trim_journal(conn, op)
            outcomes.append(None)
            continue
        if not isinstance(op, Append):
            raise StoreError(f"not a store op: {op!r}")
        if op.dedupe is not None:
            if op.dedupe in present:
                outcomes.append(_NOT_STORED)
                continue
            present.add(op.dedupe)
            new_keys.append(op.dedupe)
        for r, body in _encoded(op.records):
            rows.append((r.id, r.agent, r.role, float(r.created_at), body))
        entries.extend(_journal_row(entry) for entry in op.journal)
        outcomes.append(_STORED)
    _insert_rows(conn, _JOURNAL_TARGET, 2, entries)
    try:
        _insert_rows(conn, "dedupe (kind, server, key)", 3, new_keys)
        _insert_rows(conn, "messages (id, agent, role, created_at, body)", 5, rows)
    except sqlite3.IntegrityError as exc:
        raise StoreError(f"a message id in this batch is already stored: {exc}") from exc
    return outcomes


_JOURNAL_TARGET = "journal (stream, record)"

_STORED = AppendResult(stored=True)
_NOT_STORED = AppendResult(stored=False)


def _present_keys(
    conn: sqlite3.Connection, keys: Iterable[tuple[str, str, str] | None]
) -> set[tuple[str, str, str]]:
    """Those of ``keys`` already recorded in the dedupe table."""
    wanted: dict[tuple[str, str], list[str]] = {}
    for key in keys:
        if key is not None:
            wanted.setdefault((key[0], key[1]), []).append(key[2])
    present: set[tuple[str, str, str]] = set()
    for (kind, server), names in wanted.items():
        for start in range(0, len(names), _ROWS_PER_STATEMENT):
            chunk = names[start : start + _ROWS_PER_STATEMENT]
            marks = ", ".join("?" * len(chunk))
            cur = conn.execute(
                f"SELECT key FROM dedupe WHERE kind = ? AND server = ? AND key IN ({marks})",
                (kind, server, *chunk),
            )
            present.update((kind, server, name) for (name,) in cur)
    return present


def _insert_rows(
    conn: sqlite3.Connection, target: str, width: int, rows: Sequence[tuple[Any, ...]]
) -> None:
    """INSERT ``rows`` (each ``width`` values) into ``target`` a chunk per statement."""
    one = "(" + ", ".join("?" * width) + ")"
    for start in range(0, len(rows), _ROWS_PER_STATEMENT):
        chunk = rows[start : start + _ROWS_PER_STATEMENT]
        values = ", ".join([one] * len(chunk))
        conn.execute(f"INSERT INTO {target} VALUES {values}", [v for row in chunk for v in row])


def _apply_op(conn: sqlite3.Connection, op: Op) -> OpResult:
    """Apply one op inside the current transaction; op-level failures raise :class:`StoreError`."""
    if isinstance(op, Append):
        return _append(conn, op)
    if isinstance(op, PutState):
        _put_state(conn, op)
        return None
    if isinstance(op, TrimJournal):
        _trim_journal(conn, op)
        return None
    raise StoreError(f"not a store op: {op!r}")


def _append(conn: sqlite3.Connection, op: Append) -> AppendResult:
    if op.dedupe is not None:
        cur = conn.execute(
            "INSERT OR IGNORE INTO dedupe (kind, server, key) VALUES (?, ?, ?)", op.dedupe
        )
        if cur.rowcount == 0:
            return AppendResult(stored=False)
    for record, body in _encoded(op.records):
        try:
            conn.execute(
                "INSERT INTO messages (id, agent, role, created_at, body) VALUES (?, ?, ?, ?, ?)",
                (record.id, record.agent, record.role, float(record.created_at), body),
            )
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"message id {record.id!r} is already stored") from exc
    for entry in op.journal:
        conn.execute("INSERT INTO journal (stream, record) VALUES (?, ?)", _journal_row(entry))
    return AppendResult(stored=True)


def _encoded(records: Iterable[MessageRecord]) -> Iterator[tuple[MessageRecord, bytes]]:
    """Each record with its encoded body. The copies of one item for each agent hearing it
    share their blocks and metadata objects: their body is encoded once."""
    last: tuple[object, object, bytes] | None = None
    for r in records:
        if last is None or last[0] is not r.blocks or last[1] is not r.metadata:
            last = (r.blocks, r.metadata, encode_body(r.blocks, r.metadata))
        yield r, last[2]


def _journal_row(entry: JournalEntry) -> tuple[str, bytes]:
    return entry.stream, encode_value(entry.record)


def _trim_journal(conn: sqlite3.Connection, op: TrimJournal) -> None:
    conn.execute("DELETE FROM journal WHERE stream = ? AND seq < ?", (op.stream, op.before_seq))


def _put_state(conn: sqlite3.Connection, op: PutState) -> None:
    if op.value is None:
        conn.execute("DELETE FROM state WHERE namespace = ? AND key = ?", (op.namespace, op.key))
        return
    conn.execute(
        "INSERT OR REPLACE INTO state (namespace, key, value) VALUES (?, ?, ?)",
        (op.namespace, op.key, encode_value(op.value)),
    )


_MESSAGE_COLUMNS = "seq, id, agent, role, body"
_NO_BOUND = 2**63 - 1  # above every seq (``rows`` newest first without ``before_seq``)

#: Undecodable records one reader reports one by one; past this many, further ones are skipped
#: all the same and counted, with one last report saying so.
MAX_SKIPPED = 1024


@attrs.frozen(kw_only=True)
class SkippedRecord:
    """A stored record a reader left out because it does not decode (a value an older host
    stored that the codec refuses, or a damaged blob): ``what`` is ``message``, ``journal`` or
    ``state``, ``key`` the message id, ``stream#seq`` or ``namespace/key``."""

    what: str
    key: str
    seq: int | None
    reason: str


class _SkipLog:
    """Which undecodable records a reader has met, each listed once (thread-safe). Bounded: past
    :data:`MAX_SKIPPED` records one last entry says the rest are not listed, and further ones
    are skipped without a report; ``total`` counts the listed ones."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self._new: list[SkippedRecord] = []
        self.total = 0

    def add(self, record: SkippedRecord) -> None:
        ident = (record.what, record.key)
        with self._lock:
            if ident in self._seen or len(self._seen) > MAX_SKIPPED:
                return
            self._seen.add(ident)
            if len(self._seen) <= MAX_SKIPPED:
                self.total += 1
                self._new.append(record)
                return
            reason = f"more than {MAX_SKIPPED} undecodable records; the rest are not listed"
            self._new.append(SkippedRecord(what="", key="", seq=None, reason=reason))

    def take(self) -> list[SkippedRecord]:
        with self._lock:
            new, self._new = self._new, []
        return new


def _message(
    row: tuple[Any, ...], shared: dict[bytes, tuple[Any, Any]] | None = None
) -> dict[str, Any]:
    """The message of a row; with ``shared``, a body already decoded there is not decoded again
    (its blocks and metadata are then the same objects as in other results)."""
    seq, message_id, agent, role, body = row
    decoded = shared.get(body) if shared is not None else None
    if decoded is None:
        try:
            decoded = decode_body(body)
        except CorruptRecord as exc:
            raise CorruptRecord(f"message {message_id!r} (seq {seq}): {exc}") from exc
        if shared is not None:
            if len(shared) >= MAX_SHARED_BODIES:
                del shared[next(iter(shared))]  # the oldest goes first
            shared[body] = decoded
    blocks, metadata = decoded
    return {"id": message_id, "agent": agent, "role": role, "blocks": blocks, "metadata": metadata}


@attrs.frozen(kw_only=True)
class StoredRow:
    """A stored message (DESIGN section 5) with where and when it was stored: ``seq`` orders
    the store (a later write has a higher seq), ``created_at`` is the writer's wall-clock time
    in seconds since the epoch."""

    seq: int
    created_at: float
    message: dict[str, Any]


class Reader:
    """Read access to the store; safe to share between threads (calls are serialized).

    ``read_only=True`` opens an existing store with :func:`connect_read_only`: a missing,
    damaged or newer store raises at once, and nothing is ever written. Otherwise the store is
    opened as the writer opens it (created or upgraded when needed).

    A record that does not decode is left out of every answer, never raised: each is reported
    once through :meth:`take_skipped`, so one bad record cannot stop any reader.
    """

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._skips = _SkipLog()
        self._shared: dict[bytes, tuple[Any, Any]] = {}  # body -> (blocks, metadata), see rows
        self._conn: sqlite3.Connection | None = (
            connect_read_only(self.path) if read_only else connect(self.path)
        )
        # A store of an older version, opened read-only, has no facts index.
        self._indexed = read_only is False or _is_indexed(self._conn)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            if self._conn is None:
                raise StoreClosed("reader is closed")
            try:
                return self._conn.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise self._failure(exc) from exc

    def take_skipped(self) -> list[SkippedRecord]:
        """The undecodable records met since the last call, each listed once per reader."""
        return self._skips.take()

    @property
    def skipped_total(self) -> int:
        """How many distinct undecodable records this reader has left out."""
        return self._skips.total

    def _decoded(self, row: tuple[Any, ...], shared: bool = False) -> dict[str, Any] | None:
        """The message of a ``_MESSAGE_COLUMNS`` row, or None (reported) when it does not decode;
        ``shared``: see :meth:`rows`."""
        try:
            return _message(row, self._shared if shared else None)
        except CorruptRecord as exc:
            seq, message_id = row[0], row[1]
            self._skips.add(
                SkippedRecord(what="message", key=str(message_id), seq=int(seq), reason=str(exc))
            )
            return None

    def _messages(self, rows: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
        return [m for m in map(self._decoded, rows) if m is not None]

    def _failure(self, exc: sqlite3.Error) -> StoreError:
        if _is_damage(exc):
            return StoreDamaged(self.path, str(exc))
        return StoreError(f"store read failed: {exc}")

    def history(self, agent: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Stored messages, oldest first; ``limit`` keeps the newest N; ``agent=None``: all."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        params: list[Any] = []
        where = ""
        if agent is not None:
            where = "WHERE agent = ?"
            params.append(agent)
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages {where} ORDER BY seq DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows = self._query(sql, params)
        rows.reverse()
        return self._messages(rows)

    def history_after(
        self, agent: str, after_seq: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The agent's messages stored after ``after_seq``, oldest first (at most the newest
        ``limit``), and the newest seq among them (``after_seq`` when there are none). A caller
        that keeps what it read can ask again from that seq and read only what is new."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        rows = self._query(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE agent = ? AND seq > ? "
            "ORDER BY seq DESC LIMIT ?",
            (agent, after_seq, limit),
        )
        rows.reverse()
        newest = rows[-1][0] if rows else after_seq
        return self._messages(rows), int(newest)

    def rows(
        self,
        *,
        agent: str | None = None,
        after_seq: int = 0,
        before_seq: int | None = None,
        since: float | None = None,
        roles: Iterable[str] | None = None,
        newest_first: bool = False,
        limit: int = 256,
        offset: int = 0,
        shared: bool = False,
    ) -> list[StoredRow]:
        """One page of stored messages with their seq and time: those with a seq above
        ``after_seq`` and below ``before_seq``, stored at ``since`` or later, of ``agent`` (None:
        every agent) and of ``roles`` (None: every role); oldest first, or newest first, skipping
        ``offset`` and at most ``limit`` of them. Page on with the last row's seq.

        With ``shared``, a body this reader decoded lately (the copies of one item stored for
        each agent hearing it have the same body) is not decoded again: the messages' blocks and
        metadata may be the same objects as in other shared results, so the caller must not
        change them. At most ``MAX_SHARED_BODIES`` bodies are kept; the oldest go first."""
        if limit < 0 or offset < 0:
            raise ValueError(f"limit and offset must be >= 0, got {limit}, {offset}")
        clauses = ["seq > ?"]
        params: list[Any] = [after_seq]
        if before_seq is not None:
            clauses.append("seq < ?")
            params.append(before_seq)
        if agent is not None:
            clauses.append("agent = ?")
            params.append(agent)
        if since is not None:
            clauses.append("created_at >= ?")
            params.append(since)
        if roles is not None:
            wanted = sorted(set(roles))
            clauses.append(f"role IN ({', '.join('?' * len(wanted))})")
            params.extend(wanted)
        order = "DESC" if newest_first else "ASC"
        sql = (
            f"SELECT seq, created_at, id, agent, role, body FROM messages "
            f"WHERE {' AND '.join(clauses)} AND seq {'<' if newest_first else '>'} ? "
            f"ORDER BY seq {order} LIMIT ? OFFSET ?"
        )
        # A skipped record is made up for by reading on, so a page shorter than ``limit``
        # still means there is no more.
        bound = before_seq if newest_first else after_seq
        page: list[StoredRow] = []
        while len(page) < limit:
            want = limit - len(page)
            edge = bound if bound is not None else _NO_BOUND
            rows = self._query(sql, (*params, edge, want, offset))
            for seq, at, *rest in rows:
                message = self._decoded((seq, *rest), shared)
                if message is not None:
                    page.append(StoredRow(seq=int(seq), created_at=float(at), message=message))
            if len(rows) < want:
                break
            bound, offset = int(rows[-1][0]), 0
        return page

    def last_message_seq(self) -> int:
        """The seq of the newest stored message (0 when there is none)."""
        return int(self._query("SELECT COALESCE(MAX(seq), 0) FROM messages")[0][0])

    def agents(self) -> list[str]:
        """Every agent with at least one stored message, sorted by name."""
        return [row[0] for row in self._query("SELECT DISTINCT agent FROM messages ORDER BY agent")]

    def search(
        self,
        text: str,
        *,
        agent: str | None = None,
        regex: bool = False,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Messages whose body text (:func:`~store.bodytext.body_text`) matches, oldest first.

        Matching reads the body without its stored source header
        (:func:`~store.bodytext.without_header`), so a channel's label or id matches only where a
        sender wrote it; the messages come back whole, header included. Substring matching is
        case-insensitive; ``regex=True`` is a :mod:`re` search where ``^`` anchors at the body's
        start (a bad pattern raises :class:`re.error`). ``limit`` keeps the newest N matches.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        matches = text_matcher(text, regex=regex)
        where, params = ("WHERE agent = ?", (agent,)) if agent is not None else ("", ())
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages {where} ORDER BY seq"
        # With a limit only the newest matches are kept while scanning.
        found: deque[dict[str, Any]] = deque(maxlen=limit)
        with self._lock:
            if self._conn is None:
                raise StoreClosed("reader is closed")
            cursor = self._conn.cursor()
            try:
                for row in cursor.execute(sql, params):
                    message = self._decoded(row)
                    if message is not None and matches(body_text(message)):
                        found.append(message)
            except sqlite3.Error as exc:
                raise self._failure(exc) from exc
            finally:
                # Ends the read transaction even when a corrupt row stops the scan early.
                cursor.close()
        return list(found)

    def state(self, namespace: str) -> dict[str, Any]:
        """Every key of ``namespace`` with its value."""
        rows = self._query(
            "SELECT key, value FROM state WHERE namespace = ? ORDER BY key", (namespace,)
        )
        values: dict[str, Any] = {}
        for key, blob in rows:
            try:
                values[key] = decode_value(blob)
            except CorruptRecord as exc:
                what = SkippedRecord(
                    what="state", key=f"{namespace}/{key}", seq=None, reason=str(exc)
                )
                self._skips.add(what)
        return values

    def journal(
        self, stream: str, after_seq: int = 0, limit: int | None = None
    ) -> list[tuple[int, dict[str, Any]]]:
        """``(seq, record)`` of the entries of ``stream`` with a seq above ``after_seq``, oldest
        first; ``limit`` keeps the oldest N (read on from the last seq for the rest)."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        sql = "SELECT seq, record FROM journal WHERE stream = ? AND seq > ? ORDER BY seq"
        params: list[Any] = [stream, after_seq]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        entries: list[tuple[int, dict[str, Any]]] = []
        for seq, blob in self._query(sql, params):
            try:
                record = decode_value(blob)
            except CorruptRecord as exc:
                reason = str(exc)
            else:
                if isinstance(record, dict):
                    entries.append((int(seq), record))
                    continue
                reason = f"journal entry is {type(record).__name__}, not a map"
            key = f"{stream}#{seq}"
            self._skips.add(SkippedRecord(what="journal", key=key, seq=int(seq), reason=reason))
        return entries

    def last_seq(self, stream: str) -> int | None:
        """The seq of the newest entry of ``stream`` (None when it has none): read right after
        an append is acknowledged by the stream's only writer, the seq that append was given."""
        rows = self._query("SELECT MAX(seq) FROM journal WHERE stream = ?", (stream,))
        return None if rows[0][0] is None else int(rows[0][0])

    def has_dedupe(self, kind: str, server: str, key: str) -> bool:
        rows = self._query(
            "SELECT 1 FROM dedupe WHERE kind = ? AND server = ? AND key = ?", (kind, server, key)
        )
        return bool(rows)

    def agent_facts(self, agent: str) -> frozenset[str]:
        """The facts (:mod:`store.facts`) the stored messages of ``agent`` make, read from the
        index without decoding the history."""
        with self._lock:
            if self._conn is None:
                raise StoreClosed("reader is closed")
            try:
                return read_facts(self._conn, agent, indexed=self._indexed)
            except sqlite3.Error as exc:
                raise self._failure(exc) from exc

    def count(self) -> int:
        """Number of stored messages."""
        return int(self._query("SELECT COUNT(*) FROM messages")[0][0])
