"""Bodies stored once (schema version 4): the write side of ``items``, ``names`` and
``message_refs`` (see :mod:`store.schema`), and the upgrade that moves a version-3 store's
messages into them.

The copies of one channel item for every agent hearing it are records of one append that share
their blocks and metadata objects (and role and time): they become one item, its body encoded
and written once, its text indexed once (:mod:`store.textindex`), and one ``message_refs`` row
per copy (seq, id, agent number, item number). Any other record is an item of its own (an
invitation copy, with its own blocks, is one). An item's ``first_seq`` and ``last_seq`` are
the seqs of its first and last copy; other messages may sit between them.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from store.codec import decode_body, encode_body
from store.dbapi import Connection, dialect_of
from store.errors import CorruptRecord
from store.records import MessageRecord
from store.textindex import index_text

#: Agent names a writer remembers the number of; past this many the oldest is forgotten (it is
#: then read from the ``names`` table again when next met).
MAX_KNOWN_NAMES = 4096
#: Rows per multi-row INSERT: 6 parameters each stays far below SQLite's parameter limit.
ROWS_PER_STATEMENT = 256
#: Messages read per query while upgrading a version-3 store.
CONVERT_PAGE = 2048
#: Bodies the upgrade looks back over for copies of one item (oldest first out).
CONVERT_OPEN = 64

#: A message row as the writer stored it: (seq, id, agent, role, body), the shape the reader
#: decodes a row of the ``messages`` view from.
WrittenRow = tuple[int, str, str, str, bytes]

_ITEMS = "items (num, role, created_at, first_seq, last_seq, body)"
_TEXT = "item_text (rowid, text)"
_PG_TEXT = "item_text (num, text)"
_REFS = "message_refs (seq, id, agent, item)"


def insert_rows(conn: Connection, target: str, width: int, rows: Sequence[tuple[Any, ...]]) -> None:
    """INSERT ``rows`` (each ``width`` values) into ``target`` a chunk per statement (on
    PostgreSQL, all of them in one ``COPY``)."""
    if not rows:
        return
    copy_rows = getattr(conn, "copy_rows", None)
    if copy_rows is not None:
        copy_rows(target, rows)
        return
    one = "(" + ", ".join("?" * width) + ")"
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        values = ", ".join([one] * len(chunk))
        conn.execute(f"INSERT INTO {target} VALUES {values}", [v for row in chunk for v in row])


class ItemWriter:
    """The writer's side of the message tables, inside the writer's transactions.

    Agent numbers read or assigned are remembered (at most :data:`MAX_KNOWN_NAMES`, the oldest
    forgotten first); one assigned in a transaction is remembered once that transaction
    committed (:meth:`committed`), and forgotten when it is rolled back (:meth:`rolled_back`).

    The message rows of committed transactions are kept for :meth:`take_committed` (whoever
    applies a batch takes them once it is done, so they are at most one batch's rows).
    """

    def __init__(self, cap: int = MAX_KNOWN_NAMES) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        self._known: OrderedDict[str, int] = OrderedDict()  # insertion order: oldest first
        self._pending: dict[str, int] = {}
        self._written: list[WrittenRow] = []  # by the current transaction
        # the highest seq and item number written, once read (two queries fewer per write);
        # forgotten when a transaction is undone
        self._last: tuple[int, int] | None = None
        self._committed: list[WrittenRow] = []
        self._gap = False

    def known(self) -> list[str]:
        """The names whose number is remembered, oldest first."""
        return list(self._known)

    def write(self, conn: Connection, appends: Sequence[Sequence[MessageRecord]]) -> None:
        """Store the records of ``appends`` (each the records of one append) in order, inside
        the current transaction. Within an append, records that share their blocks and metadata
        objects (and role and time) are copies of one item: its body is encoded, stored and
        indexed once. A message id already stored raises one of
        :data:`store.dbapi.INTEGRITY_ERRORS` (the transaction is then to be rolled back).

        Seqs and item numbers: on SQLite, the one writer of the file counts on from the highest
        given. On PostgreSQL, where several writers (a fleet's hosts) may write one database at
        once, they are taken from the database in this transaction (``nextval`` of
        ``message_seq`` and of ``items.num``'s identity, one statement each for the whole call),
        so no two writers ever give the same one. The seqs of one writer's commits increase;
        across writers they are unique but not in commit order (a seq taken by one writer may
        commit after a higher one another writer took), so a reader paging by seq may see a
        lower seq appear behind one it already read."""
        if not any(appends):
            return
        postgres = dialect_of(conn) == "postgresql"
        known = self._known
        if postgres:
            # new names numbered in one order by every writer: two writers adding the same
            # names wait on each other's rows in one order, never in a cycle
            for name in sorted({r.agent for records in appends for r in records} - set(known)):
                self._number(conn, name)
        # seqs and item numbers as indices into those the call takes, first
        seq = num = -1
        item_rows: list[list[Any]] = []
        text_rows: list[tuple[int, str]] = []
        ref_rows: list[tuple[int, str, int, int]] = []
        written: list[WrittenRow] = []
        for records in appends:
            # an item's row, by the identity of what its copies share (the records hold them)
            items: dict[tuple[int, int, str, float], list[Any]] = {}
            last: MessageRecord | None = None
            row: list[Any] = []
            for r in records:
                seq += 1
                if (
                    last is None
                    or r.blocks is not last.blocks
                    or r.metadata is not last.metadata
                    or r.role != last.role
                    or r.created_at != last.created_at
                ):
                    key = (id(r.blocks), id(r.metadata), r.role, r.created_at)
                    found = items.get(key)
                    if found is None:
                        num += 1
                        body = encode_body(r.blocks, r.metadata)
                        found = items[key] = [num, r.role, float(r.created_at), seq, seq, body]
                        item_rows.append(found)
                        text_rows.append((num, index_text(r.blocks, r.metadata)))
                    row, last = found, r
                row[4] = seq
                agent = known.get(r.agent)
                if agent is None:
                    agent = self._number(conn, r.agent)
                ref_rows.append((seq, r.id, agent, row[0]))
                written.append((seq, r.id, r.agent, r.role, row[5]))
        seqs: Sequence[int]
        nums: Sequence[int]
        if postgres:
            seqs = _taken(conn, "'message_seq'", seq + 1)
            nums = _taken(conn, "pg_get_serial_sequence('items', 'num')", num + 1)
        else:
            if self._last is None:
                self._last = (
                    _last_seq(conn),
                    int(conn.execute("SELECT COALESCE(MAX(num), 0) FROM items").fetchone()[0]),
                )
            top_seq, top_num = self._last
            seqs = range(top_seq + 1, top_seq + seq + 2)
            nums = range(top_num + 1, top_num + num + 2)
            self._last = None  # known again once these rows are in
        for item in item_rows:
            item[0], item[3], item[4] = nums[item[0]], seqs[item[3]], seqs[item[4]]
        insert_rows(conn, _ITEMS, 6, [tuple(item) for item in item_rows])
        insert_rows(conn, _PG_TEXT if postgres else _TEXT, 2, [(nums[n], t) for n, t in text_rows])
        insert_rows(conn, _REFS, 4, [(seqs[s], i, a, nums[n]) for s, i, a, n in ref_rows])
        self._written.extend((seqs[s], i, a, role, body) for s, i, a, role, body in written)
        if not postgres:
            self._last = (seqs[-1], nums[-1])

    def _number(self, conn: Connection, name: str) -> int:
        number = self._known.get(name)
        if number is None:
            number = self._pending.get(name)
        if number is not None:
            return number
        row = conn.execute("SELECT num FROM names WHERE name = ?", (name,)).fetchone()
        if row is not None:
            self._remember(name, int(row[0]))
            return int(row[0])
        # another writer of the database may be adding the name too: its row, once committed,
        # is the name's (read again below), and this insert does nothing
        row = conn.execute(
            "INSERT INTO names (name) VALUES (?) ON CONFLICT (name) DO NOTHING RETURNING num",
            (name,),
        ).fetchone()
        if row is None:
            (number,) = conn.execute("SELECT num FROM names WHERE name = ?", (name,)).fetchone()
            self._remember(name, int(number))
            return int(number)
        self._pending[name] = int(row[0])
        return int(row[0])

    def _remember(self, name: str, number: int) -> None:
        self._known[name] = number
        if len(self._known) > self.cap:
            self._known.popitem(last=False)

    def committed(self) -> None:
        """The current transaction committed: the numbers it assigned and the rows it wrote are
        stored."""
        for name, number in self._pending.items():
            self._remember(name, number)
        self._pending.clear()
        self._committed.extend(self._written)
        self._written.clear()

    def rolled_back(self, *, partly: bool = False) -> None:
        """What was written since the last commit may be undone: forget the numbers assigned.

        ``partly``: only part of the transaction was undone (a savepoint); which of the rows it
        wrote survive is not known here, so :meth:`take_committed` will report a gap."""
        self._pending.clear()
        self._written.clear()
        self._last = None
        self._gap = self._gap or partly

    def take_committed(self) -> tuple[list[WrittenRow], bool]:
        """The message rows committed since the last call, in seq order, and whether some
        committed rows may be missing from them (a transaction was undone in part)."""
        rows, gap = self._committed, self._gap
        self._committed, self._gap = [], False
        return rows, gap


def _taken(conn: Connection, sequence: str, count: int) -> list[int]:
    """``count`` numbers taken from the PostgreSQL ``sequence`` (an expression naming it) in one
    statement, in increasing order; another session's may be between them."""
    if count <= 0:
        return []
    rows = conn.execute(
        f"SELECT nextval({sequence}) FROM generate_series(1, ?::integer)", (count,)
    ).fetchall()
    return sorted(int(value) for (value,) in rows)


def _last_seq(conn: Connection) -> int:
    """The highest seq ever given to a message (AUTOINCREMENT's record of it; PostgreSQL's
    ``message_seq``)."""
    if dialect_of(conn) == "postgresql":
        value, called = conn.execute("SELECT last_value, is_called FROM message_seq").fetchone()
        return int(value) if called else 0
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'message_refs'").fetchone()
    return 0 if row is None else int(row[0])


def convert(conn: sqlite3.Connection) -> None:
    """Move a version-3 ``messages`` table's rows into items, names and refs, inside the
    caller's transaction: rows with the same role, time and body bytes among the last
    :data:`CONVERT_OPEN` bodies met (the copies of one item, an invitation copy between them)
    become one item. Seqs and ids are kept, and so is the highest seq ever given. Memory stays
    bounded by a page of messages, those bodies, and the agent names."""
    conn.execute("INSERT INTO names (name) SELECT DISTINCT agent FROM messages ORDER BY agent")
    numbers = {str(name): int(num) for num, name in conn.execute("SELECT num, name FROM names")}
    # (role, created_at, body) -> [num, role, created_at, first_seq, last_seq, body]
    open_items: dict[tuple[str, float, bytes], list[Any]] = {}
    num = 0
    after = 0
    while True:
        rows = conn.execute(
            "SELECT seq, id, agent, role, created_at, body FROM messages WHERE seq > ? "
            "ORDER BY seq LIMIT ?",
            (after, CONVERT_PAGE),
        ).fetchall()
        closed: list[tuple[Any, ...]] = []
        texts: list[tuple[int, str]] = []
        refs: list[tuple[int, str, int, int]] = []
        for seq, message_id, agent, role, created_at, body in rows:
            key = (role, created_at, body)
            item = open_items.get(key)
            if item is None:
                num += 1
                item = open_items[key] = [num, role, created_at, seq, seq, body]
                text = text_of_body(body)
                if text is not None:
                    texts.append((num, text))
                if len(open_items) > CONVERT_OPEN:
                    closed.append(tuple(open_items.pop(next(iter(open_items)))))
            item[4] = seq
            refs.append((seq, message_id, numbers[agent], item[0]))
        insert_rows(conn, _ITEMS, 6, closed)
        insert_rows(conn, _TEXT, 2, texts)
        insert_rows(conn, _REFS, 4, refs)
        if len(rows) < CONVERT_PAGE:
            break
        after = int(rows[-1][0])
    insert_rows(conn, _ITEMS, 6, [tuple(item) for item in open_items.values()])
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
    if row is not None and int(row[0]) > _last_seq(conn):
        conn.execute("DELETE FROM sqlite_sequence WHERE name = 'message_refs'")
        conn.execute(
            "INSERT INTO sqlite_sequence (name, seq) VALUES ('message_refs', ?)", (int(row[0]),)
        )


def text_of_body(body: bytes) -> str | None:
    """The index text of a stored body (what :meth:`ItemWriter.write` indexes for its blocks and
    metadata, :func:`~store.textindex.index_text`); None when it does not decode."""
    try:
        blocks, metadata = decode_body(body)
    except CorruptRecord:
        return None
    return index_text(blocks, metadata)
