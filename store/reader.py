"""Reading the store: :class:`Reader`, with its own connection, safe to share between threads.

Every answer is built from the stored rows as they are now; a record that does not decode is
left out and reported once (:class:`SkippedRecord`), never raised.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import attrs

from store.bodytext import body_text, text_matcher
from store.codec import decode_body, decode_value
from store.dbapi import Connection, Location, describe, is_dsn
from store.errors import CorruptRecord, StoreClosed, StoreDamaged, StoreError
from store.facts import read_facts
from store.schema import schema_version
from store.sqlite import _is_damage, connect, connect_read_only
from store.textindex import NUL_STAND_IN, encodable, needle_query

#: Decoded bodies a reader keeps for ``rows(shared=True)`` (the copies of one item for every
#: agent hearing it decode once).
MAX_SHARED_BODIES = 1024

_MESSAGE_COLUMNS = "seq, id, agent, role, body"
_NO_BOUND = 2**63 - 1  # above every seq (``rows`` newest first without ``before_seq``)

#: The SQL function a reader's connection has: whether a stored body's text holds a needle
#: (case-insensitive, as :func:`~store.bodytext.text_matcher` matches), for the needles the
#: text index cannot look up and for stores without one.
_HOLDS = "mcplive_body_holds"
#: Which messages' items hold a needle, through the text index (version 4 and later).
_INDEXED_SEQS = (
    "seq IN (SELECT r.seq FROM item_text JOIN items i ON i.num = item_text.rowid"
    " JOIN message_refs r ON r.seq BETWEEN i.first_seq AND i.last_seq AND r.item = i.num"
    " WHERE item_text MATCH ?)"
)
#: The same through PostgreSQL's text index (:mod:`store.postgres`): a ``LIKE`` on the folded
#: text, which its trigram index answers.
_PG_INDEXED_SEQS = (
    "seq IN (SELECT r.seq FROM item_text t JOIN items i ON i.num = t.num"
    " JOIN message_refs r ON r.seq BETWEEN i.first_seq AND i.last_seq AND r.item = i.num"
    " WHERE t.text LIKE ?)"
)


def _body_holds(body: object, needle: object) -> bool:
    """``_HOLDS``: a body that does not decode counts as holding it, so that the reader that
    reads the row reports it (:class:`SkippedRecord`) as it would without the filter."""
    if not isinstance(body, bytes) or not isinstance(needle, str):
        return True
    try:
        blocks, metadata = decode_body(body)
    except CorruptRecord:
        return True
    return text_matcher(needle)(body_text({"blocks": blocks, "metadata": metadata}))


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


def decode_row(
    row: tuple[Any, ...], shared: OrderedDict[bytes, tuple[Any, Any]] | None = None
) -> dict[str, Any]:
    """The message of a ``(seq, id, agent, role, body)`` row; with ``shared``, a body already
    decoded there is not decoded again (its blocks and metadata are then the same objects as in
    other results), and at most ``MAX_SHARED_BODIES`` are kept there (the oldest go first).
    Raises :class:`CorruptRecord` when the body does not decode."""
    seq, message_id, agent, role, body = row
    decoded = shared.get(body) if shared is not None else None
    if decoded is None:
        try:
            decoded = decode_body(body)
        except CorruptRecord as exc:
            raise CorruptRecord(f"message {message_id!r} (seq {seq}): {exc}") from exc
        if shared is not None:
            if len(shared) >= MAX_SHARED_BODIES:
                shared.popitem(last=False)  # the oldest goes first (in constant time)
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

    ``path`` is the store's location: an SQLite file, or a PostgreSQL DSN (see
    :mod:`store.dbapi`); both answer alike.

    ``read_only=True`` opens an existing store with :func:`connect_read_only`: a missing,
    damaged or newer store raises at once, and nothing is ever written. Otherwise the store is
    opened as the writer opens it (created or upgraded when needed).

    A record that does not decode is left out of every answer, never raised: each is reported
    once through :meth:`take_skipped`, so one bad record cannot stop any reader.
    """

    def __init__(self, path: Location, *, read_only: bool = False) -> None:
        #: The SQLite file; for a PostgreSQL store, its DSN without the password.
        self.path: Path | str = describe(path) if is_dsn(path) else Path(path)
        self._lock = threading.Lock()
        self._skips = _SkipLog()
        # body -> (blocks, metadata), see rows
        self._shared: OrderedDict[bytes, tuple[Any, Any]] = OrderedDict()
        self._postgres = is_dsn(path)
        if self._postgres:
            self._conn: Any = _open_postgres(str(path), read_only)
            # the migrations bring every PostgreSQL store to the whole schema
            self._indexed = self._items = self._ledger = True
            return
        conn = connect_read_only(self.path) if read_only else connect(self.path)
        self._conn = conn
        try:
            # A store of an older version, opened read-only, is read as it is: before version 3
            # it has no facts index, before version 4 a messages table and no text index.
            version = schema_version(conn) or 0
            conn.create_function(_HOLDS, 2, _body_holds, deterministic=True)
        except sqlite3.Error as exc:
            conn.close()
            raise self._failure(exc) from exc
        self._indexed = version >= 3
        self._items = version >= 4
        self._ledger = version >= 5
        self._audited = version >= 6

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @property
    def dialect(self) -> str:
        """The engine the store is on: ``sqlite`` or ``postgresql``."""
        return "postgresql" if self._postgres else "sqlite"

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            if self._conn is None:
                raise StoreClosed("reader is closed")
            try:
                rows: list[tuple[Any, ...]] = self._conn.execute(sql, tuple(params)).fetchall()
                return rows
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
            return decode_row(row, self._shared if shared else None)
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
        contains: str | None = None,
        newest_first: bool = False,
        limit: int = 256,
        offset: int = 0,
        shared: bool = False,
        until: float | None = None,
    ) -> list[StoredRow]:
        """One page of stored messages with their seq and time: those with a seq above
        ``after_seq`` and below ``before_seq``, stored at ``since`` or later and before ``until``
        (None: no bound), of ``agent`` (None:
        every agent), of ``roles`` (None: every role) and whose body text holds ``contains``
        (case-insensitive, as :meth:`search` matches; None: any); oldest first, or newest first,
        skipping ``offset`` and at most ``limit`` of them. Page on with the last row's seq.

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
        if until is not None:
            clauses.append("created_at < ?")
            params.append(until)
        if roles is not None:
            wanted = sorted(set(roles))
            clauses.append(f"role IN ({', '.join('?' * len(wanted))})")
            params.extend(wanted)
        recheck: Callable[[dict[str, Any]], bool] | None = None
        if contains:  # every body holds the empty text
            clause, values, recheck = self._holding(contains)
            clauses.append(clause)
            params.extend(values)
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
                if message is not None and (recheck is None or recheck(message)):
                    page.append(StoredRow(seq=int(seq), created_at=float(at), message=message))
            if len(rows) < want:
                break
            bound, offset = int(rows[-1][0]), 0
        return page

    def walk(
        self,
        *,
        agent: str | None = None,
        after_seq: int = 0,
        before_seq: int | None = None,
        since: float | None = None,
        roles: Iterable[str] | None = None,
        contains: str | None = None,
        newest_first: bool = False,
        page: int = 256,
        limit: int | None = None,
    ) -> Iterator[StoredRow]:
        """Every message :meth:`rows` selects with the same arguments, in its order, read
        ``page`` at a time (each page read when the one before it is used up): at most
        ``limit`` of them, and no more than that many read. A caller stops early by ending its
        loop."""
        if page < 1 or (limit is not None and limit < 0):
            raise ValueError(f"page must be >= 1 and limit >= 0, got {page}, {limit}")
        wanted = tuple(roles) if roles is not None else None
        left = limit
        while left is None or left > 0:
            want = page if left is None else min(page, left)
            rows = self.rows(
                agent=agent,
                after_seq=after_seq,
                before_seq=before_seq,
                since=since,
                roles=wanted,
                contains=contains,
                newest_first=newest_first,
                limit=want,
            )
            yield from rows
            if len(rows) < want:
                return
            if left is not None:
                left -= len(rows)
            if newest_first:
                before_seq = rows[-1].seq
            else:
                after_seq = rows[-1].seq

    def last_message_seq(self) -> int:
        """The seq of the newest stored message (0 when there is none)."""
        table = "message_refs" if self._items else "messages"
        return int(self._query(f"SELECT COALESCE(MAX(seq), 0) FROM {table}")[0][0])

    def agents(self) -> list[str]:
        """Every agent with at least one stored message, sorted by name."""
        sql = "SELECT DISTINCT agent FROM messages ORDER BY agent"
        if self._items:
            sql = (
                "SELECT name FROM names WHERE EXISTS"
                " (SELECT 1 FROM message_refs WHERE agent = names.num) ORDER BY name"
            )
        return [row[0] for row in self._query(sql)]

    def _holding(
        self, needle: str
    ) -> tuple[str, list[str], Callable[[dict[str, Any]], bool] | None]:
        """The SQL condition (and its parameters) on ``messages`` for the bodies whose text
        holds ``needle``: through the text index where it can answer, else a scan; and, when
        the index may find more than that (PostgreSQL's, for a needle holding a NUL or its
        stand-in), the check each decoded message must pass too."""
        if not encodable(needle):
            return "1 = 0", [], None  # stored text is well-formed: never a lone surrogate
        if self._postgres:
            from store.postgres import like_pattern

            folded = needle.casefold()
            pattern = like_pattern(folded.replace("\x00", NUL_STAND_IN))
            if "\x00" in folded or NUL_STAND_IN in folded:
                matches = text_matcher(needle)
                return _PG_INDEXED_SEQS, [pattern], lambda m: matches(body_text(m))
            return _PG_INDEXED_SEQS, [pattern], None
        query = needle_query(needle) if self._items else None
        if query is not None:
            return _INDEXED_SEQS, [query], None
        return f"{_HOLDS}(body, ?)", [needle], None

    def search(
        self,
        text: str,
        *,
        agent: str | None = None,
        regex: bool = False,
        limit: int | None = None,
        keep: Callable[[dict[str, Any]], bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Messages whose body text (:func:`~store.bodytext.body_text`) matches, oldest first.

        Matching reads the body without its stored source header
        (:func:`~store.bodytext.without_header`), so a channel's label or id matches only where a
        sender wrote it; the messages come back whole, header included. Substring matching is
        case-insensitive and goes through the text index (:mod:`store.textindex`; a needle
        shorter than it can look up is scanned for); ``regex=True`` is a :mod:`re` search where
        ``^`` anchors at the body's start (a bad pattern raises :class:`re.error`), reading the
        messages one at a time. ``limit`` keeps the newest N matches; with ``keep``, only
        matches it keeps count (the others are passed over).
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        clauses: list[str] = []
        params: list[Any] = []
        if agent is not None:
            clauses.append("agent = ?")
            params.append(agent)
        if regex:
            matches = text_matcher(text, regex=True)
            found: deque[dict[str, Any]] = deque(maxlen=limit)  # only the newest matches kept
            with closing(self._scan(clauses, params, newest_first=False)) as messages:
                for message in messages:
                    if matches(body_text(message)) and (keep is None or keep(message)):
                        found.append(message)
            return list(found)
        recheck: Callable[[dict[str, Any]], bool] | None = None
        if text:
            clause, values, recheck = self._holding(text)
            clauses.append(clause)
            params.extend(values)
        newest: list[dict[str, Any]] = []
        if limit != 0:
            with closing(self._scan(clauses, params, newest_first=True)) as messages:
                for message in messages:
                    if recheck is not None and not recheck(message):
                        continue
                    if keep is not None and not keep(message):
                        continue
                    newest.append(message)
                    if len(newest) == limit:
                        break
        newest.reverse()
        return newest

    def _scan(
        self, clauses: list[str], params: list[Any], *, newest_first: bool
    ) -> Generator[dict[str, Any], None, None]:
        """The decodable messages meeting ``clauses``, read one at a time under the lock (a
        caller that stops early ends the read)."""
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        order = "DESC" if newest_first else "ASC"
        sql = f"SELECT {_MESSAGE_COLUMNS} FROM messages {where} ORDER BY seq {order}"
        with self._lock:
            if self._conn is None:
                raise StoreClosed("reader is closed")
            cursor = self._conn.cursor()
            try:
                for row in cursor.execute(sql, params):
                    message = self._decoded(row)
                    if message is not None:
                        yield message
            except sqlite3.Error as exc:
                raise self._failure(exc) from exc
            finally:
                # Ends the read transaction even when the caller or a bad row stops it early.
                cursor.close()

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
        table = "message_refs" if self._items else "messages"
        return int(self._query(f"SELECT COUNT(*) FROM {table}")[0][0])

    def usage(self, *, since: float | None = None, agent: str | None = None) -> list[UsageTotal]:
        """The usage ledger summed by UTC day, agent, model and wake place (server, channel),
        for the turns recorded at or after ``since`` (seconds since the epoch) of ``agent``
        (None: every agent). One row per group: as many as there are days, agents, models and
        places used together, not one per turn."""
        return _usage_totals(self, since, agent)

    def audit(self, *, since: float | None = None, limit: int | None = None) -> list[AuditEntry]:
        """The audit record of the operator's actions (:class:`store.records.RecordAudit`)
        recorded at or after ``since`` (seconds since the epoch), oldest first; ``limit`` keeps
        the newest N. A store from before the record has none."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        if not self._audited:
            return []
        sql = (
            "SELECT num, at, action, target, source, changed, detail FROM audit"
            " WHERE at >= ? ORDER BY num DESC"
        )
        params: list[Any] = [-math.inf if since is None else since]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows = self._query(sql, params)
        rows.reverse()
        return [
            AuditEntry(
                num=int(num),
                at=float(at),
                action=str(action),
                target=str(target),
                source=str(source),
                changed=bool(changed),
                detail=str(detail),
            )
            for num, at, action, target, source, changed, detail in rows
        ]

    def seq_of(self, message_id: str, agent: str | None = None) -> int | None:
        """The seq of the stored message ``message_id`` (of ``agent``, when given); None when
        there is none. One lookup on the id's unique index; the body is not read."""
        rows = self._query("SELECT seq, agent FROM messages WHERE id = ?", (message_id,))
        if not rows or (agent is not None and rows[0][1] != agent):
            return None
        return int(rows[0][0])


def _open_postgres(dsn: str, read_only: bool) -> Connection:
    from store import postgres  # psycopg only for a store that needs it

    return postgres.connect_read_only(dsn) if read_only else postgres.connect(dsn)


@attrs.frozen(kw_only=True)
class AuditEntry:
    """One row of the audit record: ``num`` orders it (never reused), the rest as
    :class:`store.records.RecordAudit` wrote it."""

    num: int
    at: float
    action: str
    target: str
    source: str
    changed: bool
    detail: str

    def as_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class UsageTotal:
    """The usage ledger's rows of one UTC day, agent, model and wake place, summed."""

    day: str  # YYYY-MM-DD, UTC
    agent: str
    model: str
    server: str | None
    channel: str | None
    turns: int
    calls: int
    silent_turns: int
    failed_turns: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int


_USAGE_TOTALS = (
    "SELECT {day} AS day, agent, model, server, channel, COUNT(*), SUM(calls),"
    " SUM(silent), SUM(CASE WHEN phase = 'failed' THEN 1 ELSE 0 END), SUM(input_tokens),"
    " SUM(output_tokens), SUM(cache_read_tokens), SUM(cache_write_tokens) FROM usage"
    " WHERE at >= ? AND (CAST(? AS TEXT) IS NULL OR agent = ?)"
    " GROUP BY day, agent, model, server, channel"
    " ORDER BY day, agent, model, server NULLS FIRST, channel NULLS FIRST"
)
#: The UTC day of a ledger row, on each engine.
_USAGE_DAY = {
    "sqlite": "date(at, 'unixepoch')",
    "postgresql": "to_char(to_timestamp(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
}


def _usage_totals(reader: Reader, since: float | None, agent: str | None) -> list[UsageTotal]:
    if not reader._ledger:  # a store from before the ledger: nothing was recorded
        return []
    sql = _USAGE_TOTALS.format(day=_USAGE_DAY[reader.dialect])
    rows = reader._query(sql, (-math.inf if since is None else since, agent, agent))
    return [
        UsageTotal(
            day=day,
            agent=name,
            model=model,
            server=server,
            channel=channel,
            turns=int(turns),
            calls=int(calls),
            silent_turns=int(silent),
            failed_turns=int(failed),
            input_tokens=int(i),
            output_tokens=int(o),
            cache_read_tokens=int(cr),
            cache_write_tokens=int(cw),
        )
        for day, name, model, server, channel, turns, calls, silent, failed, i, o, cr, cw in rows
    ]
