"""The SQLite store: schema, connections and the batch-applying write side.

One file, ``<data_dir>/store.sqlite3``, in WAL mode with ``synchronous=FULL``: a committed
transaction is on disk when the commit returns. Only the one writer of a store (the
store process of :mod:`store.writer_process`, or the thread of :mod:`store.writer`) uses
:class:`Database`; a :class:`~store.reader.Reader` has its own
connection and may be used from any thread.

The schema and its upgrades are in :mod:`store.schema`; how messages are kept (each body
once) in :mod:`store.items`.

A file SQLite reports as damaged (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``), or a database holding
tables but no store schema, raises :class:`~store.errors.StoreDamaged` naming the file, whether
found on opening or on reading. :func:`connect_read_only` (``Reader(path, read_only=True)``) never
writes to the file: not its schema, not its journal mode.

**Fences.** An op may carry the lease it is made for (:class:`~store.records.Fence`). Every
transaction :meth:`Database.apply` opens first checks each distinct fence of the ops it holds,
once, with :func:`store.leases.fenced_write` (which share-locks the lease row until the commit, so
no other host can take it meanwhile); the ops whose fence is stale are left out of that
transaction, with :class:`~store.errors.StaleFence` as their outcome, and the others are applied
as if those ops had never been submitted. That is per op, so a stale op never sinks another. On
SQLite a fence is checked against nothing and passes: one host owns an SQLite store.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from store.codec import encode_value
from store.dbapi import INTEGRITY_ERRORS, Connection, Location, describe, dialect_of, is_dsn
from store.errors import StaleFence, StoreClosed, StoreDamaged, StoreError
from store.facts import FactWriter
from store.items import ROWS_PER_STATEMENT, ItemWriter, insert_rows
from store.records import (
    AUDIT_COLUMNS,
    AUDIT_KEEP,
    USAGE_COLUMNS,
    Append,
    AppendResult,
    Fence,
    JournalEntry,
    MessageRecord,
    Op,
    OpResult,
    Outcome,
    PutState,
    RecordAudit,
    RecordUsage,
    TrimJournal,
    fence_of,
)
from store.schema import (
    SCHEMA_VERSION,
    ensure_schema,
    schema_version,
)

#: File name of the store inside the data directory.
DB_FILENAME = "store.sqlite3"
#: How long a connection waits for another connection's lock, in seconds.
BUSY_TIMEOUT = 30.0


def db_path(data_dir: str | os.PathLike[str]) -> Path:
    """Where the store lives inside ``data_dir``."""
    return Path(data_dir) / DB_FILENAME


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
    if schema_version(conn) is None and _has_tables(conn):
        raise StoreDamaged(path, "an SQLite database with tables but no store schema")


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
        ensure_schema(conn)
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
        version = schema_version(conn)
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
            version = schema_version(conn)
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
    version = schema_version(conn)
    return version is not None and version >= 3


def _needs_immutable(target: Path, exc: sqlite3.Error) -> bool:
    """Whether a read-only open failed only because the store's folder is read-only (SQLite
    could not create the WAL index beside the file)."""
    name = getattr(exc, "sqlite_errorname", "")
    return name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")) and not os.access(
        target.parent, os.W_OK, effective_ids=os.access in os.supports_effective_ids
    )


def connect_location(location: Location, *, busy_timeout: float = BUSY_TIMEOUT) -> Connection:
    """A write connection to the store at ``location``: an SQLite file (:func:`connect`) or a
    PostgreSQL DSN (:func:`store.postgres.connect`; psycopg is then imported)."""
    if is_dsn(location):
        from store import postgres  # psycopg only for a store that needs it

        assert isinstance(location, str)
        return postgres.connect(location)
    return connect(location, busy_timeout=busy_timeout)


class Database:
    """The write side, on either engine (``location``: a path or a PostgreSQL DSN, see
    :mod:`store.dbapi`). Not thread-safe: one thread (the writer's) uses it.

    On SQLite one writer holds a store. On PostgreSQL several (a fleet's hosts, each with its
    own :class:`Database`) may write one database at once: every number a write gives (message
    seqs, item, name, journal, usage and audit numbers) is taken from the database inside the
    writing transaction, and a dedupe key two of them record at once is stored by one only (the
    other's op is ``stored=False``). One writer's seqs increase from commit to commit; across
    writers they are unique but need not follow commit order (see
    :meth:`store.items.ItemWriter.write`)."""

    def __init__(self, path: Location, *, busy_timeout: float = BUSY_TIMEOUT) -> None:
        #: How the store is named in messages (a DSN without its password).
        self.label = describe(path)
        #: The SQLite file; for a PostgreSQL store, its DSN without the password.
        self.path: Path | str = self.label if is_dsn(path) else Path(path)
        self._conn: Connection | None = connect_location(path, busy_timeout=busy_timeout)
        self.facts = FactWriter()
        self.items = ItemWriter()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # type: ignore[attr-defined]

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _connection(self) -> Connection:
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

        Each transaction first checks the distinct fences of its ops, once each (PostgreSQL
        only; see the module's docstring): an op whose fence is stale is not applied and its
        outcome is :class:`~store.errors.StaleFence`.
        """
        if not ops:
            return []
        conn = self._connection()
        try:
            try:
                conn.execute("BEGIN IMMEDIATE")
                stale = _stale_fences(conn, ops)
                landing = [op for op in ops if fence_of(op) not in stale] if stale else ops
                outcomes = _apply_bulk(conn, landing, self.items)
                self.facts.write(conn, _stored_appends(landing, outcomes))
                self._commit(conn)
                return _with_refused(ops, stale, outcomes)
            except StoreError:
                self._rollback(conn)
            return self._apply_one_by_one(conn, ops)
        except Exception:
            self._rollback(conn)
        return [self._apply_alone(conn, op) for op in ops]

    def _commit(self, conn: Connection) -> None:
        conn.execute("COMMIT")
        self.facts.committed()
        self.items.committed()

    def _rollback(self, conn: Connection) -> None:
        self.facts.rolled_back()
        self.items.rolled_back()
        _rollback(conn)

    def _apply_one_by_one(self, conn: Connection, ops: Sequence[Op]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        conn.execute("BEGIN IMMEDIATE")
        stale = _stale_fences(conn, ops)
        for op in ops:
            fence = fence_of(op)
            if fence is not None and fence in stale:
                outcomes.append(_refusal(fence))
                continue
            conn.execute("SAVEPOINT op")
            try:
                outcome: Outcome = _apply_op(conn, op, self.items)
                self.facts.write(conn, _stored_appends([op], [outcome]))
            except StoreError as exc:
                conn.execute("ROLLBACK TO op")
                self.facts.rolled_back()
                self.items.rolled_back(partly=True)
                outcome = exc
            conn.execute("RELEASE op")
            outcomes.append(outcome)
        self._commit(conn)
        return outcomes

    def _apply_alone(self, conn: Connection, op: Op) -> Outcome:
        try:
            conn.execute("BEGIN IMMEDIATE")
            fence = fence_of(op)
            if fence is not None and _stale_fences(conn, [op]):
                self._rollback(conn)
                return _refusal(fence)
            result = _apply_op(conn, op, self.items)
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
            if isinstance(exc, INTEGRITY_ERRORS):
                return StoreError(f"write failed: {exc}")
            return StoreError(f"write failed: {exc}")


def _stale_fences(conn: Connection, ops: Sequence[Op]) -> set[Fence]:
    """The distinct fences of ``ops`` that are stale, each checked once in the open transaction
    (in order, so that writers lock lease rows alike). On SQLite: none (one host owns the file,
    and there is no lease table to check against)."""
    fences = {fence for op in ops if (fence := fence_of(op)) is not None}
    if not fences or dialect_of(conn) == "sqlite":
        return set()
    from store.leases import fenced_write  # psycopg only for a store that needs it

    ordered = sorted(fences, key=lambda f: (f.resource, f.holder, f.epoch))
    return {f for f in ordered if not fenced_write(conn, f.resource, f.holder, f.epoch)}


def _refusal(fence: Fence) -> StaleFence:
    return StaleFence(fence.resource, fence.holder, fence.epoch)


def _with_refused(ops: Sequence[Op], stale: set[Fence], outcomes: list[Outcome]) -> list[Outcome]:
    """The outcome of each of ``ops``: the refusal of those whose fence is in ``stale``, and
    ``outcomes`` (those of the others, in order) for the rest."""
    if not stale:
        return outcomes
    landed = iter(outcomes)
    merged: list[Outcome] = []
    for op in ops:
        fence = fence_of(op)
        merged.append(_refusal(fence) if fence is not None and fence in stale else next(landed))
    return merged


def _stored_appends(ops: Sequence[Op], outcomes: Sequence[Outcome]) -> list[Append]:
    """The appends of ``ops`` whose outcome says they were stored."""
    return [
        op
        for op, outcome in zip(ops, outcomes, strict=True)
        if isinstance(op, Append) and isinstance(outcome, AppendResult) and outcome.stored
    ]


def _rollback(conn: Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except (sqlite3.Error, StoreError):
            pass


def _apply_bulk(conn: Connection, ops: Sequence[Op], item_writer: ItemWriter) -> list[Outcome]:
    """Apply ``ops`` inside the current transaction with a few multi-row statements.

    The outcome is the same as applying each op in turn; any op-level failure raises
    :class:`StoreError` and leaves the transaction to be rolled back. Few statements mean few
    trips into SQLite, each of which lets other threads take the interpreter lock.
    """
    claimed = _claim_keys(conn, [op.dedupe for op in ops if isinstance(op, Append)])
    outcomes: list[Outcome] = []
    appends: list[tuple[MessageRecord, ...]] = []
    entries: list[tuple[str, bytes]] = []
    for op in ops:
        if isinstance(op, PutState):
            _put_state(conn, op)
            outcomes.append(None)
            continue
        if isinstance(op, RecordUsage):
            _record_usage(conn, op)
            outcomes.append(None)
            continue
        if isinstance(op, RecordAudit):
            _record_audit(conn, op)
            outcomes.append(None)
            continue
        if isinstance(op, TrimJournal):
            # The entries of earlier ops in the batch must exist before they can be trimmed.
            insert_rows(conn, _JOURNAL_TARGET, 2, entries)
            entries.clear()
            _trim_journal(conn, op)
            outcomes.append(None)
            continue
        if not isinstance(op, Append):
            raise StoreError(f"not a store op: {op!r}")
        if op.dedupe is not None:
            if op.dedupe not in claimed:  # already stored, or by an earlier op of the batch
                outcomes.append(_NOT_STORED)
                continue
            claimed.discard(op.dedupe)
        appends.append(op.records)
        entries.extend(_journal_row(entry) for entry in op.journal)
        outcomes.append(_STORED)
    insert_rows(conn, _JOURNAL_TARGET, 2, entries)
    try:
        item_writer.write(conn, appends)
    except INTEGRITY_ERRORS as exc:
        raise StoreError(f"a message id in this batch is already stored: {exc}") from exc
    return outcomes


_JOURNAL_TARGET = "journal (stream, record)"

_STORED = AppendResult(stored=True)
_NOT_STORED = AppendResult(stored=False)


def _claim_keys(
    conn: Connection, keys: Iterable[tuple[str, str, str] | None]
) -> set[tuple[str, str, str]]:
    """Record those of ``keys`` not yet in the dedupe table; the ones this did record.

    ``INSERT … ON CONFLICT DO NOTHING``: a key another writer of the database (a fleet's host on
    PostgreSQL) records at the same time is waited for, and is this batch's only if that
    writer's transaction is rolled back; otherwise the insert does nothing for it (never an
    error that fails the batch). The keys go in sorted, so two writers recording some of the
    same keys wait on each other in one order, never in a cycle."""
    wanted = sorted({key for key in keys if key is not None})
    claimed: set[tuple[str, str, str]] = set()
    for start in range(0, len(wanted), ROWS_PER_STATEMENT):
        chunk = wanted[start : start + ROWS_PER_STATEMENT]
        values = ", ".join(["(?, ?, ?)"] * len(chunk))
        cur = conn.execute(
            f"INSERT INTO dedupe (kind, server, key) VALUES {values} "
            "ON CONFLICT DO NOTHING RETURNING kind, server, key",
            [part for key in chunk for part in key],
        )
        claimed.update((str(kind), str(server), str(key)) for kind, server, key in cur)
    return claimed


def _apply_op(conn: Connection, op: Op, item_writer: ItemWriter) -> OpResult:
    """Apply one op inside the current transaction; op-level failures raise :class:`StoreError`."""
    if isinstance(op, Append):
        return _append(conn, op, item_writer)
    if isinstance(op, PutState):
        _put_state(conn, op)
        return None
    if isinstance(op, TrimJournal):
        _trim_journal(conn, op)
        return None
    if isinstance(op, RecordUsage):
        _record_usage(conn, op)
        return None
    if isinstance(op, RecordAudit):
        _record_audit(conn, op)
        return None
    raise StoreError(f"not a store op: {op!r}")


def _append(conn: Connection, op: Append, item_writer: ItemWriter) -> AppendResult:
    if op.dedupe is not None:
        cur = conn.execute(
            "INSERT INTO dedupe (kind, server, key) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            op.dedupe,
        )
        if cur.rowcount == 0:
            return AppendResult(stored=False)
    # A savepoint of its own: PostgreSQL reads nothing more in a transaction a statement
    # failed in until what failed is undone, and the refused id is looked up below.
    conn.execute("SAVEPOINT records")
    try:
        item_writer.write(conn, [op.records])
    except INTEGRITY_ERRORS as exc:
        conn.execute("ROLLBACK TO records")
        conn.execute("RELEASE records")
        taken = _taken_id(conn, op.records)
        raise StoreError(f"message id {taken!r} is already stored") from exc
    conn.execute("RELEASE records")
    for entry in op.journal:
        conn.execute("INSERT INTO journal (stream, record) VALUES (?, ?)", _journal_row(entry))
    return AppendResult(stored=True)


def _taken_id(conn: Connection, records: Sequence[MessageRecord]) -> str | None:
    """The first id of ``records`` given twice among them or already stored."""
    seen: set[str] = set()
    for r in records:
        stored = conn.execute("SELECT 1 FROM message_refs WHERE id = ?", (r.id,)).fetchone()
        if r.id in seen or stored is not None:
            return r.id
        seen.add(r.id)
    return None


def _journal_row(entry: JournalEntry) -> tuple[str, bytes]:
    return entry.stream, encode_value(entry.record)


def _trim_journal(conn: Connection, op: TrimJournal) -> None:
    conn.execute("DELETE FROM journal WHERE stream = ? AND seq < ?", (op.stream, op.before_seq))


def _put_state(conn: Connection, op: PutState) -> None:
    if op.value is None:
        conn.execute("DELETE FROM state WHERE namespace = ? AND key = ?", (op.namespace, op.key))
        return
    conn.execute(
        "INSERT INTO state (namespace, key, value) VALUES (?, ?, ?)"
        " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value",
        (op.namespace, op.key, encode_value(op.value)),
    )


_USAGE_INSERT = (
    f"INSERT INTO usage ({', '.join(USAGE_COLUMNS)}) VALUES ({', '.join('?' * len(USAGE_COLUMNS))})"
)


def _record_usage(conn: Connection, op: RecordUsage) -> None:
    # ``silent`` is stored as 0 or 1 on both engines
    conn.execute(_USAGE_INSERT, [int(v) if isinstance(v, bool) else v for v in op.row()])


_AUDIT_INSERT = (
    f"INSERT INTO audit ({', '.join(AUDIT_COLUMNS)}) VALUES ({', '.join('?' * len(AUDIT_COLUMNS))})"
)


def _record_audit(conn: Connection, op: RecordAudit) -> None:
    """One row more; the oldest past ``AUDIT_KEEP`` go (nums are never reused, so the newest
    ``AUDIT_KEEP`` are those within that many of the one just written)."""
    row = [int(v) if isinstance(v, bool) else v for v in op.row()]
    num = conn.execute(_AUDIT_INSERT + " RETURNING num", row).fetchone()[0]
    conn.execute("DELETE FROM audit WHERE num <= ?", (int(num) - AUDIT_KEEP,))
