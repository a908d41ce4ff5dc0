"""The facts index: what an agent's stored history has ever held, answered without decoding it.

A *fact* is a property of one stored message that a reader needs to know about the agent's whole
history, however far back the message sits:

``source-header``
    the message's metadata has a string ``source_header`` (a host-written header);
``source-header-notice``
    the message is the host's own notice explaining those headers: metadata ``system`` is
    ``True`` and ``kind`` is :data:`NOTICE_KIND` (an adapter cannot set ``system``).

The table ``agent_facts (agent, fact)`` (schema version 3) holds one row per agent and fact. The
writer fills it in the same transaction as the messages (:class:`FactWriter`), so a fact is
recorded exactly when a message that makes it is; messages are never deleted, so a fact never
stops holding. A store upgraded from version 2 gets its rows from :func:`backfill`.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from store.codec import decode_body
from store.dbapi import Connection
from store.errors import CorruptRecord
from store.records import Append

#: The kind of the host's notice about source headers.
NOTICE_KIND = "source-header-notice"
#: Some stored message of the agent has a source header.
HEADER_FACT = "source-header"
#: The host's notice about source headers is stored for the agent.
NOTICE_FACT = "source-header-notice"

FACTS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS agent_facts ("
    " agent TEXT NOT NULL, fact TEXT NOT NULL, PRIMARY KEY (agent, fact)) WITHOUT ROWID",
)

_INSERT = "INSERT INTO agent_facts (agent, fact) VALUES (?, ?) ON CONFLICT DO NOTHING"
#: (agent, fact) pairs a :class:`FactWriter` remembers as already written.
MAX_KNOWN_FACTS = 4096
#: Messages read per query while backfilling or scanning an unindexed store.
SCAN_PAGE = 512
#: The bytes every message making a fact holds in its CBOR body (a text key or value is stored
#: as its UTF-8 bytes): a body without them cannot make that fact and is not decoded.
MARKERS = {HEADER_FACT: b"source_header", NOTICE_FACT: NOTICE_KIND.encode()}


def facts_of(metadata: Mapping[str, Any]) -> tuple[str, ...]:
    """The facts one stored message with ``metadata`` makes (none for most)."""
    facts: tuple[str, ...] = ()
    if isinstance(metadata.get("source_header"), str):
        facts = (HEADER_FACT,)
    if metadata.get("system") is True and metadata.get("kind") == NOTICE_KIND:
        facts = (*facts, NOTICE_FACT)
    return facts


class FactWriter:
    """The writer's side of the index: the rows a transaction's appends add.

    :meth:`write` inserts (``INSERT … ON CONFLICT DO NOTHING``) the pairs of the appended
    records that are not already known to be stored, so the common case, an agent whose header
    fact is stored, costs a set lookup per record. A pair is known once the transaction that
    wrote it committed (:meth:`committed`); :meth:`rolled_back` forgets the pairs of a
    transaction (or savepoint) undone.

    Bound: at most :data:`MAX_KNOWN_FACTS` known pairs; past that the oldest is forgotten. A
    forgotten pair only costs one more such insert when it is met again, never a
    missing row.
    """

    def __init__(self, cap: int = MAX_KNOWN_FACTS) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()  # oldest first
        self._pending: set[tuple[str, str]] = set()

    def known(self) -> list[tuple[str, str]]:
        """The pairs known to be stored, oldest first."""
        return list(self._known)

    def write(self, conn: Connection, appends: Iterable[Append]) -> None:
        """Insert the fact rows of ``appends`` inside the current transaction."""
        rows: list[tuple[str, str]] = []
        metadata: Mapping[str, Any] | None = None
        facts: tuple[str, ...] = ()
        for op in appends:
            for record in op.records:
                if record.metadata is not metadata:  # the copies of one item share theirs
                    metadata = record.metadata
                    facts = facts_of(metadata)
                for fact in facts:
                    pair = (record.agent, fact)
                    if pair not in self._known and pair not in self._pending:
                        self._pending.add(pair)
                        rows.append(pair)
        if rows:
            # sorted: writers of one database adding some of the same rows wait on each other
            # in one order, never in a cycle
            conn.executemany(_INSERT, sorted(rows))

    def committed(self) -> None:
        """The current transaction committed: its pairs are known to be stored."""
        for pair in self._pending:
            self._known[pair] = None
            if len(self._known) > self.cap:
                self._known.popitem(last=False)
        self._pending.clear()

    def rolled_back(self) -> None:
        """What was written since the last commit may be undone: forget it."""
        self._pending.clear()


def _holds(conn: Connection, agent: str, fact: str) -> bool:
    """Whether some stored message of ``agent`` makes ``fact``, reading a page at a time and
    decoding only the bodies that hold the fact's marker; a body that does not decode makes no
    fact."""
    sql = (
        "SELECT seq, body FROM messages WHERE agent = ? AND seq > ? AND instr(body, ?) > 0 "
        "ORDER BY seq LIMIT ?"
    )
    marker = MARKERS[fact]
    after = 0
    while True:
        rows = conn.execute(sql, (agent, after, marker, SCAN_PAGE)).fetchall()
        for seq, body in rows:
            after = int(seq)
            try:
                _blocks, metadata = decode_body(body)
            except CorruptRecord:
                continue
            if fact in facts_of(metadata):
                return True
        if len(rows) < SCAN_PAGE:
            return False


def _agents(conn: Connection) -> Iterator[str]:
    """Every agent with a stored message, one query each (a walk of the agent index)."""
    row = conn.execute("SELECT MIN(agent) FROM messages").fetchone()
    while row is not None and row[0] is not None:
        yield str(row[0])
        row = conn.execute("SELECT MIN(agent) FROM messages WHERE agent > ?", (row[0],)).fetchone()


def scan(conn: Connection, agent: str) -> frozenset[str]:
    """The facts of ``agent`` found by reading its stored messages."""
    return frozenset(fact for fact in MARKERS if _holds(conn, agent, fact))


def backfill(conn: sqlite3.Connection) -> None:
    """Create the index and fill it from the messages already stored (the upgrade from version
    2), inside the caller's transaction. Memory stays bounded by a page of messages; per agent,
    the reading of a fact stops at the first message that makes it."""
    for statement in FACTS_SCHEMA:
        conn.execute(statement)
    for agent in _agents(conn):
        for fact in scan(conn, agent):
            conn.execute(_INSERT, (agent, fact))


def read_facts(conn: Connection, agent: str, *, indexed: bool) -> frozenset[str]:
    """The facts of ``agent``: from the index, or (a store of an older version opened read-only)
    by scanning its messages."""
    if indexed:
        rows = conn.execute("SELECT fact FROM agent_facts WHERE agent = ?", (agent,)).fetchall()
        return frozenset(str(fact) for (fact,) in rows)
    return scan(conn, agent)
