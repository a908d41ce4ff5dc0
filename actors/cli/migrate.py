"""``mcplive migrate --from DATA_DIR --to postgresql://…``: copy an embedded (SQLite) store into
a PostgreSQL database, and show that the copy is whole.

The seam with the PostgreSQL store
----------------------------------

This command knows the store's *logical* tables (:data:`TABLES`): their names, columns, and the
key that orders their rows. It needs of the PostgreSQL side only that:

- the database has a table of each name with (at least) those columns, of types that hold the
  same values (text, whole numbers, floating point numbers, bytes; NULL where the store has it),
  but for ``dedupe.key``: text joined with NULs, which PostgreSQL's text cannot hold, so it is
  ``BYTEA``, the key's UTF-8 bytes (:attr:`Column.utf8`);
  ``store.postgres.ensure_schema(conn)``, when that function exists, makes them (given an open
  ``psycopg`` connection, inside this command's transaction); else this module's
  :data:`FALLBACK_DDL` does;
- a sequence behind ``messages.seq``, ``journal.seq`` or ``usage.num``, if there is one
  (``pg_get_serial_sequence``), may be moved past the largest value copied, so that the store
  never gives a copied seq again.

On the SQLite side, the tables are read as they are stored, in one read-only snapshot
(:func:`store.connect_read_only`): ``messages`` is the view joining the items, names and refs
(a body shared by several agents' copies is copied with each), ``meta`` (the SQLite schema's
version) and the text index stay behind, as each backend keeps its own.

Verifiably: while a table is copied, its rows are counted and digested (SHA-256 over each row in
key order, each value written with its type: see :func:`row_bytes`); after the commit, the
target's rows are read back in the same order and digested the same way. The command prints a
line per table and exits 0 only when every count and digest matches (1 otherwise, 2 for a bad
command line). A target whose tables already hold rows is refused unless ``--force``, which
empties them first, in the same transaction as the copy.

The DSN's password is never printed: the target is shown as ``postgresql://user@host:port/db``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import sqlite3
import struct
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import attrs

from actors.datadir import holder
from store import StoreError, connect_read_only, db_path

from .errors import EXIT_CONFIG, EXIT_FAILED

#: Rows sent to PostgreSQL per batch, and read back per fetch.
BATCH = 1000


@attrs.frozen
class Column:
    name: str
    #: Its PostgreSQL type in :data:`FALLBACK_DDL` (``TEXT``, ``BIGINT``, ``INTEGER``,
    #: ``DOUBLE PRECISION`` or ``BYTEA``), which also says how the key orders it.
    pg_type: str
    nullable: bool = False
    #: Text the store keeps as text, PostgreSQL as its UTF-8 bytes (``BYTEA``): text that may
    #: hold a NUL, which PostgreSQL's text cannot (the dedupe keys join their parts with one).
    utf8: bool = False

    @property
    def text(self) -> bool:
        return self.pg_type == "TEXT"


@attrs.frozen
class Table:
    """A logical table of the store: its columns (in the order copied and digested), its key
    (the columns that order its rows), and the SQLite sequence behind its first key column
    (``sqlite_sequence``'s name for it, when the column is AUTOINCREMENT)."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    sqlite_sequence: str | None = None
    #: The PostgreSQL constraints after the columns in :data:`FALLBACK_DDL`.
    constraints: tuple[str, ...] = ()

    def as_stored(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """A store's row as PostgreSQL is given it (the ``utf8`` columns' text as bytes)."""
        if not any(c.utf8 for c in self.columns):
            return row
        return tuple(
            v.encode("utf-8") if c.utf8 and isinstance(v, str) else v
            for c, v in zip(self.columns, row, strict=True)
        )

    @property
    def column_list(self) -> str:
        return ", ".join(c.name for c in self.columns)

    def sqlite_order(self) -> str:
        # SQLite compares text with BINARY: the bytes of its UTF-8, as PostgreSQL's "C" does
        return ", ".join(self.key)

    def pg_order(self) -> str:
        text = {c.name for c in self.columns if c.text}
        return ", ".join(f'{k} COLLATE "C"' if k in text else k for k in self.key)


def _c(name: str, pg_type: str, nullable: bool = False) -> Column:
    return Column(name, pg_type, nullable)


#: The store's logical tables (see :mod:`store.schema`), each ordered by its key.
TABLES: tuple[Table, ...] = (
    Table(
        "messages",
        (
            _c("seq", "BIGINT"),
            _c("id", "TEXT"),
            _c("agent", "TEXT"),
            _c("role", "TEXT"),
            _c("created_at", "DOUBLE PRECISION"),
            _c("body", "BYTEA"),
        ),
        key=("seq",),
        sqlite_sequence="message_refs",
        constraints=("UNIQUE (id)",),
    ),
    Table(
        "dedupe",
        (_c("kind", "TEXT"), _c("server", "TEXT"), Column("key", "BYTEA", utf8=True)),
        key=("kind", "server", "key"),
    ),
    Table(
        "state",
        (_c("namespace", "TEXT"), _c("key", "TEXT"), _c("value", "BYTEA")),
        key=("namespace", "key"),
    ),
    Table(
        "journal",
        (_c("seq", "BIGINT"), _c("stream", "TEXT"), _c("record", "BYTEA")),
        key=("seq",),
        sqlite_sequence="journal",
    ),
    Table("agent_facts", (_c("agent", "TEXT"), _c("fact", "TEXT")), key=("agent", "fact")),
    Table(
        "usage",
        (
            _c("num", "BIGINT"),
            _c("at", "DOUBLE PRECISION"),
            _c("agent", "TEXT"),
            _c("model", "TEXT"),
            _c("turn", "BIGINT"),
            _c("turn_id", "TEXT"),
            _c("server", "TEXT", nullable=True),
            _c("channel", "TEXT", nullable=True),
            _c("phase", "TEXT"),
            _c("silent", "INTEGER"),
            _c("calls", "INTEGER"),
            _c("input_tokens", "BIGINT"),
            _c("output_tokens", "BIGINT"),
            _c("cache_read_tokens", "BIGINT"),
            _c("cache_write_tokens", "BIGINT"),
        ),
        key=("num",),
    ),
)
#: The tables whose first key column a store numbers itself (a sequence may stand behind it).
NUMBERED = {"messages": "seq", "journal": "seq", "usage": "num"}


def _ddl(table: Table) -> str:
    columns = []
    for column in table.columns:
        if table.name in NUMBERED and column.name == NUMBERED[table.name]:
            columns.append(f"{column.name} BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")
        else:
            null = "" if column.nullable else " NOT NULL"
            columns.append(f"{column.name} {column.pg_type}{null}")
    if table.name not in NUMBERED:
        columns.append(f"PRIMARY KEY ({', '.join(table.key)})")
    columns.extend(table.constraints)
    return f"CREATE TABLE IF NOT EXISTS {table.name} ({', '.join(columns)})"


#: The tables this command makes when ``store.postgres.ensure_schema`` does not exist. When the
#: PostgreSQL store is there, its schema (made by its migrations) is the one place the tables
#: are defined, and this is not used.
FALLBACK_DDL: tuple[str, ...] = tuple(_ddl(t) for t in TABLES)


class MigrateError(Exception):
    """A failure said in one line, with the exit status it owes."""

    def __init__(self, line: str, status: int = EXIT_FAILED) -> None:
        super().__init__(line)
        self.status = status


# -- digests


def row_bytes(row: Iterable[Any]) -> bytes:
    """A row's canonical bytes, the same for the same values on either side: each value is
    written with its type (``n`` NULL, ``i`` whole number, ``f`` float as its IEEE 754 bits,
    ``s`` text as UTF-8, ``b`` bytes), text and bytes with their length first."""
    out = bytearray()
    for value in row:
        if value is None:
            out += b"n"
        elif isinstance(value, bool | int):
            out += b"i%d;" % int(value)
        elif isinstance(value, float):
            out += b"f" + struct.pack(">d", value)
        elif isinstance(value, str):
            data = value.encode("utf-8", "surrogatepass")
            out += b"s%d:" % len(data) + data
        elif isinstance(value, bytes | bytearray | memoryview):
            data = bytes(value)
            out += b"b%d:" % len(data) + data
        else:
            raise TypeError(f"a value of type {type(value).__name__} in a stored row")
    return bytes(out)


@attrs.define
class Tally:
    """The rows of one table seen so far: how many, and their digest."""

    rows: int = 0
    digest: Any = attrs.field(factory=hashlib.sha256)

    def add(self, row: Iterable[Any]) -> None:
        data = row_bytes(row)
        self.digest.update(struct.pack(">Q", len(data)))
        self.digest.update(data)
        self.rows += 1

    @property
    def hexdigest(self) -> str:
        return str(self.digest.hexdigest())


@attrs.frozen
class Compared:
    table: str
    source: Tally
    target: Tally

    @property
    def matches(self) -> bool:
        return (
            self.source.rows == self.target.rows and self.source.hexdigest == self.target.hexdigest
        )


# -- the source


def _sqlite_tables(conn: sqlite3.Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
    return {str(name) for (name,) in rows}


def source_rows(
    conn: sqlite3.Connection, table: Table, present: set[str]
) -> Iterator[tuple[Any, ...]]:
    """``table``'s rows in key order (none when an older store lacks it)."""
    if table.name not in present:
        return iter(())
    sql = f"SELECT {table.column_list} FROM {table.name} ORDER BY {table.sqlite_order()}"
    return iter(conn.execute(sql))


def last_numbers(conn: sqlite3.Connection, present: set[str]) -> dict[str, int]:
    """The largest number each numbered table has given (AUTOINCREMENT remembers the numbers of
    rows since removed, as a trimmed journal's)."""
    found: dict[str, int] = {}
    for table in TABLES:
        if table.name not in NUMBERED or table.name not in present:
            continue
        column = NUMBERED[table.name]
        (top,) = conn.execute(f"SELECT MAX({column}) FROM {table.name}").fetchone()
        if table.sqlite_sequence is not None and "sqlite_sequence" in present:
            row = conn.execute(
                "SELECT seq FROM sqlite_sequence WHERE name = ?", (table.sqlite_sequence,)
            ).fetchone()
            if row is not None:
                top = max(top or 0, row[0])
        if top is not None:
            found[table.name] = int(top)
    return found


# -- the target


def redacted(dsn: str) -> str:
    """The DSN as shown: ``postgresql://user@host:port/dbname``, never its password."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    user = params.get("user")
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port")
    where = f"{host}:{port}" if port else str(host)
    return f"postgresql://{f'{user}@' if user else ''}{where}/{params.get('dbname') or ''}"


def _scrubbed(text: str, dsn: str) -> str:
    """``text`` (an error's) with the DSN's password, if any, replaced."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:
        return text.replace(dsn, "«the DSN»")
    if password:
        text = text.replace(str(password), "«redacted»")
    return " ".join(text.split())


def ensure_target_schema(conn: Any) -> str:
    """Make the store's tables in the target: with ``store.postgres.ensure_schema`` when the
    PostgreSQL store is there, else with :data:`FALLBACK_DDL`. Says which."""
    try:
        module = importlib.import_module("store.postgres")
    except ModuleNotFoundError as exc:
        if exc.name != "store.postgres":
            raise
        module = None
    ensure = getattr(module, "ensure_schema", None)
    if ensure is not None:
        ensure(conn)
        return "store.postgres.ensure_schema"
    for statement in FALLBACK_DDL:
        conn.execute(statement)
    return "migrate's own tables"


def _target_counts(conn: Any) -> dict[str, int]:
    return {
        t.name: int(conn.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0]) for t in TABLES
    }


def copy_table(conn: Any, source: Iterator[tuple[Any, ...]], table: Table) -> Tally:
    """Copy ``source``'s rows into ``table`` (COPY, in the caller's transaction); their tally."""
    tally = Tally()
    with (
        conn.cursor() as cur,
        cur.copy(f"COPY {table.name} ({table.column_list}) FROM STDIN") as copy,
    ):
        for row in source:
            row = table.as_stored(row)
            tally.add(row)
            copy.write_row(row)
    return tally


def advance_sequences(conn: Any, tops: dict[str, int]) -> None:
    """Move any sequence behind a numbered column past the largest number copied."""
    for name, top in tops.items():
        column = NUMBERED[name]
        (sequence,) = conn.execute(
            "SELECT pg_get_serial_sequence(%s, %s)", (name, column)
        ).fetchone()
        if sequence is not None:
            conn.execute("SELECT setval(%s, %s)", (sequence, top))


def target_tally(conn: Any, table: Table) -> Tally:
    """``table``'s rows in the target, read back in key order, tallied."""
    tally = Tally()
    sql = f"SELECT {table.column_list} FROM {table.name} ORDER BY {table.pg_order()}"
    with conn.cursor(name=f"migrate_{table.name}") as cur:
        cur.itersize = BATCH
        cur.execute(sql)
        for row in cur:
            tally.add(row)
    return tally


# -- the command


@attrs.frozen
class Plan:
    store: Path
    dsn: str
    shown: str
    force: bool


def plan_of(args: argparse.Namespace) -> Plan:
    """What ``args`` ask for, or a :class:`MigrateError` (status 2) saying what is wrong."""
    dsn = args.to
    if args.to_env is not None:
        dsn = os.environ.get(args.to_env)
        if not dsn:
            raise MigrateError(f"--to-env {args.to_env}: that variable is not set", EXIT_CONFIG)
    if not dsn:
        raise MigrateError(
            "give the target database: --to postgresql://… or --to-env VAR", EXIT_CONFIG
        )
    if not dsn.startswith(("postgresql://", "postgres://")):
        raise MigrateError(
            "--to: not a PostgreSQL URL (postgresql://user@host:port/dbname)", EXIT_CONFIG
        )
    try:
        import psycopg
    except ImportError:
        raise MigrateError(
            "migrate needs psycopg 3: pip install 'mcplive[postgresql]' (or 'psycopg[binary]')",
            EXIT_CONFIG,
        ) from None
    try:
        shown = redacted(dsn)
    except psycopg.ProgrammingError:
        raise MigrateError(
            "--to: the URL does not parse (postgresql://user:password@host:port/dbname)",
            EXIT_CONFIG,
        ) from None
    data_dir = Path(args.source).resolve()
    store = db_path(data_dir)
    if not store.is_file():
        raise MigrateError(f"--from {args.source}: no store at {store}", EXIT_CONFIG)
    pid = holder(data_dir)
    if pid is not None:
        raise MigrateError(
            f"a host is running on {data_dir} (pid {pid or 'unknown'}); stop it first, or its "
            "later writes are not copied"
        )
    return Plan(store, dsn, shown, bool(args.force))


def migrate(plan: Plan, out: TextIO) -> list[Compared]:
    """Copy, then compare; the comparison of each table."""
    import psycopg

    try:
        source = connect_read_only(plan.store)
    except StoreError as exc:
        raise MigrateError(f"{plan.store}: {exc}") from None
    try:
        try:
            target = psycopg.connect(plan.dsn, autocommit=True, connect_timeout=20)
        except psycopg.Error as exc:
            raise MigrateError(
                f"cannot connect to {plan.shown}: {_scrubbed(str(exc), plan.dsn)}"
            ) from None
        with target:
            try:
                return _copy_and_compare(source, target, plan, out)
            except psycopg.Error as exc:
                raise MigrateError(f"{plan.shown}: {_scrubbed(str(exc), plan.dsn)}") from None
            except sqlite3.Error as exc:
                raise MigrateError(f"{plan.store}: cannot read the store: {exc}") from None
    finally:
        source.close()


def _copy_and_compare(
    source: sqlite3.Connection, target: Any, plan: Plan, out: TextIO
) -> list[Compared]:
    import psycopg

    source.execute("BEGIN")  # one snapshot of the store for every table
    try:
        present = _sqlite_tables(source)
        tops = last_numbers(source, present)
        with target.transaction():
            how = ensure_target_schema(target)
            counts = _target_counts(target)
            full = {name: n for name, n in counts.items() if n}
            if full and not plan.force:
                held = ", ".join(f"{name} ({n:,} rows)" for name, n in full.items())
                raise MigrateError(
                    f"{plan.shown} is not empty: {held}; give --force to empty those tables "
                    "and copy"
                )
            if full:
                names = ", ".join(full)
                target.execute(f"TRUNCATE {names}")
            tallies = {}
            for table in TABLES:
                try:
                    tallies[table.name] = copy_table(
                        target, source_rows(source, table, present), table
                    )
                except psycopg.Error as exc:
                    raise MigrateError(
                        f"{plan.shown}: copying {table.name}: {_scrubbed(str(exc), plan.dsn)}"
                    ) from None
            advance_sequences(target, tops)
    finally:
        source.execute("ROLLBACK")
    print(f"copied {plan.store} into {plan.shown} (tables: {how})", file=out)
    with target.transaction():
        target.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return [Compared(t.name, tallies[t.name], target_tally(target, t)) for t in TABLES]


def print_comparison(compared: list[Compared], out: TextIO) -> None:
    """A line per table: its rows and digest (the first 16 hex digits of SHA-256) on each side,
    and whether they match."""
    header = ["table", "rows (store)", "rows (postgresql)", "sha256 (store)", "sha256 (pg)", ""]
    lines = [header]
    for c in compared:
        lines.append(
            [
                c.table,
                f"{c.source.rows:,}",
                f"{c.target.rows:,}",
                c.source.hexdigest[:16],
                c.target.hexdigest[:16],
                "ok" if c.matches else "DIFFERS",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        cells = [
            cell.rjust(w) if i in (1, 2) else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip() + "\n")


def cmd_migrate(args: argparse.Namespace) -> int:
    try:
        plan = plan_of(args)
        compared = migrate(plan, sys.stdout)
    except MigrateError as exc:
        print(f"mcplive: migrate: {exc}", file=sys.stderr)
        return exc.status
    print_comparison(compared, sys.stdout)
    differ = [c.table for c in compared if not c.matches]
    if differ:
        print(f"mcplive: migrate: the copy differs in {', '.join(differ)}", file=sys.stderr)
        return EXIT_FAILED
    rows = sum(c.target.rows for c in compared)
    print(f"every table matches: {rows:,} rows copied and read back")
    return 0


def add_parser(sub: Any) -> None:
    mig = sub.add_parser(
        "migrate",
        help="copy an embedded store into PostgreSQL, and compare the copy (counts, digests)",
    )
    mig.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="DATA_DIR",
        help="the data dir holding the store (read only; no host may be running on it)",
    )
    target = mig.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--to", metavar="DSN", help="the target database: postgresql://user@host:port/dbname"
    )
    target.add_argument(
        "--to-env",
        metavar="VAR",
        help="the environment variable holding the target's DSN (keeps a password off the "
        "command line)",
    )
    mig.add_argument(
        "--force",
        action="store_true",
        help="empty the target's store tables first when they hold rows (else refused)",
    )
    mig.set_defaults(fn=cmd_migrate)
