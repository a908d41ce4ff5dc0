"""``mcplive migrate --from DATA_DIR --to postgresql://…``: copy an embedded (SQLite) store into
a PostgreSQL store, and show that the copy is whole.

The target is a store of the PostgreSQL backend (:mod:`store.postgres`), made by its own code:
the command opens it as a host does (:func:`store.postgres.connect`: the schema created, or
brought to the version this program writes, by its migrations), and talks to it over that
connection, whose adapters escape every string written and unescape every string read
(:func:`store.postgres.escape`; PostgreSQL's text holds no NUL). A host started on the DSN
afterwards goes on with the agents' history.

The copy
--------

The store's physical tables (:data:`COPIED`: ``dedupe``, ``state``, ``journal``,
``agent_facts``, ``items``, ``names``, ``message_refs``, ``usage``, ``audit``) are read as they
are stored, in one read-only snapshot (:func:`store.connect_read_only`), and copied row by row
with ``COPY`` (which keeps the numbers of identity columns, as ``OVERRIDING SYSTEM VALUE``
does). ``meta`` keeps the backend's own keys (its schema's version); any other key is copied.
The text index is not copied but made: ``item_text`` gets, for every item, the text the
backend's writer indexes (:func:`store.items.text_of_body`).

The numbers go on where the store left them: ``message_seq`` is set to the largest seq the store
ever gave a message, and the identities of ``journal``, ``usage``, ``audit``, ``names`` and
``items`` restart past their largest number, counting the rows a trim removed (SQLite's
``sqlite_sequence`` keeps them for the AUTOINCREMENT tables). A host on the copy never gives a
number twice.

The copy is one transaction (the schema is made before it, in the backend's own transaction,
as a host's first start makes it). A target whose store tables already hold rows is refused
unless ``--force``, which empties them first, in the copy's transaction. A store older than
:data:`OLDEST_SOURCE` (bodies not yet kept once) is refused: a host's start upgrades it.

The check
---------

While the store is read, each *logical* table (:data:`TABLES`: ``messages``, the view joining
items, names and refs, then ``dedupe``, ``state``, ``journal``, ``agent_facts``, ``usage``,
``audit``) is counted and digested: SHA-256 over each row in key order, each value written with
its type (:func:`row_bytes`). After the commit the target's tables are read back the same way,
in one snapshot, their text unescaped, and ordered alike: a text key is sorted by the code
points of its escaped form on both sides (PostgreSQL's ``C`` collation on the stored text; on
SQLite, a collation of this command's, :func:`escaped_order`). The command prints a line per
table and exits 0 only when every count and digest matches (1 otherwise, or for a failure said
in one line; 2 for a bad command line).

The DSN's password is never printed: the target is shown as ``postgresql://user@host:port/db``.
"""

from __future__ import annotations

import argparse
import hashlib
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
from store.dbapi import safe_dsn
from store.items import text_of_body
from store.records import AUDIT_COLUMNS, USAGE_COLUMNS
from store.schema import schema_version

from .errors import EXIT_CONFIG, EXIT_FAILED

#: Rows read back per fetch.
BATCH = 1000
#: The oldest embedded store schema copied: the one that keeps messages as items, names and refs.
OLDEST_SOURCE = 4
#: The characters :func:`store.postgres.escape` changes (NUL, and its escape character).
_ESCAPED = ("\x00", "\ufffe")
#: The SQLite collation ordering text as PostgreSQL's ``C`` collation orders its escaped form.
COLLATION = "migrate_escaped"


@attrs.frozen
class Table:
    """A table of the store: its columns (in the order copied and digested), its key (the
    columns that order its rows), which of those are text, and, for a table whose first key
    column the store numbers itself, ``sqlite_sequence``'s name for it (when the column is
    AUTOINCREMENT, which remembers the numbers of rows since removed)."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    text_keys: tuple[str, ...] = ()
    sqlite_sequence: str | None = None

    @property
    def column_list(self) -> str:
        return ", ".join(self.columns)

    def sqlite_order(self) -> str:
        return ", ".join(f"{k} COLLATE {COLLATION}" if k in self.text_keys else k for k in self.key)

    def pg_order(self) -> str:
        return ", ".join(f'{k} COLLATE "C"' if k in self.text_keys else k for k in self.key)


_DEDUPE = Table(
    "dedupe",
    ("kind", "server", "key"),
    ("kind", "server", "key"),
    text_keys=("kind", "server", "key"),
)
_STATE = Table("state", ("namespace", "key", "value"), ("namespace", "key"), ("namespace", "key"))
_JOURNAL = Table("journal", ("seq", "stream", "record"), ("seq",), sqlite_sequence="journal")
_FACTS = Table("agent_facts", ("agent", "fact"), ("agent", "fact"), ("agent", "fact"))
_USAGE = Table("usage", ("num", *USAGE_COLUMNS), ("num",))
_AUDIT = Table("audit", ("num", *AUDIT_COLUMNS), ("num",), sqlite_sequence="audit")
_ITEMS = Table("items", ("num", "role", "created_at", "first_seq", "last_seq", "body"), ("num",))
_NAMES = Table("names", ("num", "name"), ("num",))
_REFS = Table(
    "message_refs", ("seq", "id", "agent", "item"), ("seq",), sqlite_sequence="message_refs"
)

#: The store's logical tables (see :mod:`store.schema`), compared after the copy, each ordered
#: by its key.
TABLES: tuple[Table, ...] = (
    Table("messages", ("seq", "id", "agent", "role", "created_at", "body"), ("seq",)),
    _DEDUPE,
    _STATE,
    _JOURNAL,
    _FACTS,
    _USAGE,
    _AUDIT,
)
#: The physical tables copied row by row (``item_text`` is made, ``meta`` merged).
COPIED: tuple[Table, ...] = (
    _DEDUPE,
    _STATE,
    _JOURNAL,
    _FACTS,
    _ITEMS,
    _NAMES,
    _REFS,
    _USAGE,
    _AUDIT,
)
#: The tables whose identity column the backend numbers new rows with, and that column.
IDENTITIES: dict[str, str] = {
    "journal": "seq",
    "usage": "num",
    "audit": "num",
    "names": "num",
    "items": "num",
}
#: The tables a target must not hold rows in (unless ``--force``): the logical ones first.
HELD = (*(t.name for t in TABLES), "items", "names", "item_text")
#: What ``--force`` empties.
EMPTIED = (*(t.name for t in COPIED), "item_text")
#: The ``meta`` keys the backend owns.
OWN_META = frozenset({"schema_version"})


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


def escaped_order(a: str, b: str) -> int:
    """SQLite's collation :data:`COLLATION`: ``a`` and ``b`` compared as PostgreSQL's ``C``
    collation compares them as the backend stores them (escaped, by code point)."""
    if any(c in a or c in b for c in _ESCAPED):
        from store.postgres import escape

        a, b = escape(a), escape(b)
    return (a > b) - (a < b)


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
    """The largest number each numbered table (``message_refs`` and :data:`IDENTITIES`'s) has
    given: its largest row's, or AUTOINCREMENT's record of one since removed (a trimmed
    journal's), whichever is larger; 0 when it has given none."""
    found: dict[str, int] = {}
    sequences: dict[str, int] = {}
    if "sqlite_sequence" in present:
        sequences = {
            str(n): int(s) for n, s in conn.execute("SELECT name, seq FROM sqlite_sequence")
        }
    for table in COPIED:
        if table.name != "message_refs" and table.name not in IDENTITIES:
            continue
        top = 0
        if table.name in present:
            (largest,) = conn.execute(f"SELECT MAX({table.key[0]}) FROM {table.name}").fetchone()
            top = int(largest or 0)
        if table.sqlite_sequence is not None:
            top = max(top, sequences.get(table.sqlite_sequence, 0))
        found[table.name] = top
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
    """``text`` (an error's) on one line, with the DSN's password, if any, replaced."""
    from psycopg.conninfo import conninfo_to_dict

    text = text.replace(safe_dsn(dsn), redacted(dsn))
    try:
        password = conninfo_to_dict(dsn).get("password")
    except Exception:
        return " ".join(text.replace(dsn, "«the DSN»").split())
    if password:
        text = text.replace(str(password), "«redacted»")
    return " ".join(text.split())


def _count(conn: Any, table: str) -> int:
    return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def copy_rows(conn: Any, table: str, columns: str, rows: Iterable[Iterable[Any]]) -> None:
    """Copy ``rows`` into ``table`` (``COPY``, in the caller's transaction; identity columns
    keep the numbers given)."""
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _tallied(rows: Iterable[tuple[Any, ...]], tally: Tally | None) -> Iterator[tuple[Any, ...]]:
    for row in rows:
        if tally is not None:
            tally.add(row)
        yield row


def index_rows(conn: sqlite3.Connection, present: set[str]) -> Iterator[tuple[int, str]]:
    """The ``item_text`` rows of the store's items, as the backend's writer makes them: each
    item's index text (a body that does not decode has none, as in an upgraded store)."""
    if "items" not in present:
        return
    for num, body in conn.execute("SELECT num, body FROM items ORDER BY num"):
        text = text_of_body(body)
        if text is not None:
            yield int(num), text


def advance_numbers(conn: Any, tops: dict[str, int]) -> None:
    """Have the backend's numbers go on after the largest the store gave: ``message_seq`` set
    to the largest message seq (the writers take the next ones), each identity restarted past its
    table's."""
    top = tops.get("message_refs", 0)
    # never 0: the writers take seqs with nextval, and a seq is 1 or more
    conn.execute("SELECT setval('message_seq', %s, %s)", (max(top, 1), top > 0))
    for name, column in IDENTITIES.items():
        conn.execute(
            f"ALTER TABLE {name} ALTER COLUMN {column} RESTART WITH {tops.get(name, 0) + 1}"
        )


def target_tally(conn: Any, table: Table) -> Tally:
    """``table``'s rows in the target, read back in key order, tallied. ``conn`` is a psycopg
    connection of :class:`store.postgres.PgConnection` (``.raw()``): its text is read back
    unescaped."""
    tally = Tally()
    sql = f"SELECT {table.column_list} FROM {table.name} ORDER BY {table.pg_order()}"
    with conn.transaction(), conn.cursor(name=f"migrate_{table.name}") as cur:
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

    from store import postgres

    try:
        source = connect_read_only(plan.store)
    except StoreError as exc:
        raise MigrateError(f"{plan.store}: {exc}") from None
    try:
        source.create_collation(COLLATION, escaped_order)
        version = schema_version(source) or 0
        if version < OLDEST_SOURCE:
            raise MigrateError(
                f"{plan.store} has store schema version {version}; start a host on it once "
                "(it upgrades the store), stop it, and migrate then"
            )
        try:
            target = postgres.connect(plan.dsn)  # the backend's schema, made or upgraded
        except StoreError as exc:
            raise MigrateError(_scrubbed(str(exc), plan.dsn)) from None
        try:
            return _copy_and_compare(source, target.raw(), plan, out)
        except psycopg.Error as exc:
            raise MigrateError(f"{plan.shown}: {_scrubbed(str(exc), plan.dsn)}") from None
        except StoreError as exc:
            raise MigrateError(_scrubbed(str(exc), plan.dsn)) from None
        except sqlite3.Error as exc:
            raise MigrateError(f"{plan.store}: cannot read the store: {exc}") from None
        finally:
            target.close()
    finally:
        source.close()


def _copy_and_compare(
    source: sqlite3.Connection, target: Any, plan: Plan, out: TextIO
) -> list[Compared]:

    from store.postgres import PG_SCHEMA_VERSION

    tallies = {t.name: Tally() for t in TABLES}
    source.execute("BEGIN")  # one snapshot of the store for every table
    try:
        present = _sqlite_tables(source)
        tops = last_numbers(source, present)
        with target.transaction():
            counts = {name: _count(target, name) for name in HELD}
            full = {name: n for name, n in counts.items() if n}
            if full and not plan.force:
                held = ", ".join(f"{name} ({n:,} rows)" for name, n in full.items())
                raise MigrateError(
                    f"{plan.shown} is not empty: {held}; give --force to empty those tables "
                    "and copy"
                )
            if full:
                target.execute(f"TRUNCATE {', '.join(EMPTIED)}")
            for table in COPIED:
                rows = _tallied(source_rows(source, table, present), tallies.get(table.name))
                _copy(target, plan, table.name, table.column_list, rows)
            _copy(target, plan, "item_text", "num, text", index_rows(source, present))
            for row in source_rows(source, TABLES[0], present):
                tallies["messages"].add(row)
            for key, value in source.execute("SELECT key, value FROM meta"):
                if key not in OWN_META:
                    target.execute(
                        "INSERT INTO meta (key, value) VALUES (%s, %s) "
                        "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                        (key, value),
                    )
            advance_numbers(target, tops)
    finally:
        source.execute("ROLLBACK")
    print(
        f"copied {plan.store} into {plan.shown} (store schema version {PG_SCHEMA_VERSION})",
        file=out,
    )
    with target.transaction():
        target.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return [Compared(t.name, tallies[t.name], target_tally(target, t)) for t in TABLES]


def _copy(target: Any, plan: Plan, table: str, columns: str, rows: Iterable[Any]) -> None:
    import psycopg

    try:
        copy_rows(target, table, columns, rows)
    except psycopg.Error as exc:
        raise MigrateError(
            f"{plan.shown}: copying {table}: {_scrubbed(str(exc), plan.dsn)}"
        ) from None


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
