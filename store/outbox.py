"""A fleet's durable outbox on PostgreSQL: an agent's speech to a server whose connection another
host holds (the ``outbox`` table, schema version 5 of :mod:`store.postgres`).

A server's connection is leased to one host (``server:<id>``); an agent (``agent:<name>``) may
run on another. What the agent says to that server goes through the outbox:

1. the agent's host puts a row (:meth:`Outbox.put`), fenced by the agent's lease, under an
   idempotency key: putting the same key again gives the same row;
2. the server's holder claims the server's rows (:meth:`Outbox.claim`), fenced by the server's
   lease: the rows are marked claimed by it under its epoch;
3. it publishes them, and records each outcome (:meth:`Outbox.finish`), only while the row is
   still its claim and its lease is still current;
4. the agent's host reads the outcomes (:meth:`Outbox.outcomes`).

**Failover.** A claim outlives a holder that stops: the next holder of the server's lease, under
a newer epoch, claims the claimed-but-unfinished rows again (the rule is
:func:`protocol.outbox.claimable`) and publishes them under the same key, so the server can tell
a retry from a new utterance. The old holder's late :meth:`~Outbox.finish` records nothing.

**Wake-ups.** A put notifies :data:`NOTIFY_QUEUED` with the server's id, a finish notifies
:data:`NOTIFY_DONE` with the row's id (``pg_notify`` in the write's transaction: delivered at its
commit, never for a write refused or rolled back). A notification is only a hint to look: a
listener that missed one finds the rows at its next claim or read.

**Whose clock.** ``created_at`` and ``finished_at``, and the fences' expiry checks, are the
database's clock, as in :mod:`store.leases`; a test may give :class:`Outbox` a clock of its own
(the one its lease tables run on).

**Bounds.** A row's blocks are at most :data:`MAX_BLOCKS_BYTES` of JSON, its outcome at most
:data:`MAX_OUTCOME_BYTES` (:class:`ValueError` beyond). A server has at most :data:`MAX_QUEUED`
rows not yet done: a put past that raises :class:`OutboxFull` (checked in the put's
transaction; puts racing each other may pass it together, by at most their number). Done rows are
kept for :data:`DONE_KEEP_S` (an hour) so that the agent's host reads their outcomes, then
:meth:`Outbox.prune` deletes them. A claim takes at most :data:`MAX_CLAIM` rows, an outcomes read
names at most :data:`MAX_IDS`.

Blocking, one transaction per call, over a connection of its own: callers run it in a worker
thread. Not thread-safe: one :class:`Outbox` per thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs

from protocol.leases import server_resource
from protocol.outbox import CLAIMABLE_SQL
from store.errors import StaleFence, StoreError
from store.leases import FleetTable, fenced_write
from store.records import Fence

if TYPE_CHECKING:  # psycopg only for a store that needs it (see store.leases)
    from store.postgres import PgConnection


__all__ = [
    "DONE_KEEP_S",
    "MAX_BLOCKS_BYTES",
    "MAX_CLAIM",
    "MAX_IDS",
    "MAX_NAME_CHARS",
    "MAX_OUTCOME_BYTES",
    "MAX_QUEUED",
    "NOTIFY_DONE",
    "NOTIFY_QUEUED",
    "Outbox",
    "OutboxEntry",
    "OutboxFull",
    "OutboxRow",
]

#: The channel a put notifies, with the server's id.
NOTIFY_QUEUED = "mcplive_outbox"
#: The channel a finish notifies, with the row's id.
NOTIFY_DONE = "mcplive_outbox_done"

#: The most JSON (UTF-8 bytes, ASCII-escaped) a row's blocks may take.
MAX_BLOCKS_BYTES = 256 * 1024
#: The most JSON a row's outcome may take.
MAX_OUTCOME_BYTES = 64 * 1024
#: The most rows of one server not yet done.
MAX_QUEUED = 10_000
#: How long done rows are kept (seconds) before :meth:`Outbox.prune` deletes them.
DONE_KEEP_S = 3600.0
#: The most rows one claim takes.
MAX_CLAIM = 1_000
#: The most row ids one :meth:`Outbox.outcomes` names.
MAX_IDS = 10_000
#: The longest server id, channel id, thread id, agent name or key (a notification's payload
#: holds a server id, and PostgreSQL bounds it).
MAX_NAME_CHARS = 1024


class OutboxFull(StoreError):
    """A server has :data:`MAX_QUEUED` rows not yet done: nothing was put. Its holder is behind
    (or gone); the agent's host should back off, or say it cannot be heard."""

    def __init__(self, server_id: str, limit: int) -> None:
        super().__init__(
            f"the outbox of server {server_id!r} is full ({limit} rows not yet published);"
            " nothing was put"
        )
        self.server_id = server_id
        self.limit = limit

    def __reduce__(self) -> tuple[object, ...]:
        return OutboxFull, (self.server_id, self.limit)


def _name(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{attribute.name} is longer than {MAX_NAME_CHARS} characters")


def _optional_name(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _name(inst, attribute, value)


def _blocks(_inst: object, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    for block in value:
        if not isinstance(block, Mapping):
            raise TypeError(f"{attribute.name} must hold mappings, got {type(block).__name__}")


def _tuple(blocks: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    return cast("tuple[dict[str, Any], ...]", tuple(blocks))  # each checked by ``_blocks``


def _bool(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{attribute.name} must be a bool, got {type(value).__name__}")


@attrs.frozen
class OutboxEntry:
    """What an agent says to a server: ``blocks`` (JSON-able content blocks) on ``channel_id``
    of ``server_id`` (in ``thread_id``, when one), as prose or not, under the idempotency
    ``key`` (one row per key, whoever puts it and however often)."""

    server_id: str = attrs.field(validator=_name)
    channel_id: str = attrs.field(validator=_name)
    thread_id: str | None = attrs.field(validator=_optional_name)
    agent: str = attrs.field(validator=_name)
    key: str = attrs.field(validator=_name)
    blocks: tuple[dict[str, Any], ...] = attrs.field(converter=_tuple, validator=_blocks)
    prose: bool = attrs.field(validator=_bool)


@attrs.frozen
class OutboxRow:
    """A row as a claim gives it: its ``id``, its ``entry``, when it was put, and the claim it is
    under now (``claimed_by`` under ``claim_epoch``: the claimer's own)."""

    id: int
    entry: OutboxEntry
    created_at: float
    claimed_by: str
    claim_epoch: int


def _json(value: Any, what: str, limit: int) -> str:
    """``value`` as compact, ASCII-escaped JSON (no NaN); :class:`ValueError` past ``limit``
    bytes."""
    try:
        text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    if len(text) > limit:
        raise ValueError(
            f"{what} take {len(text)} bytes of JSON, more than the outbox's {limit} bytes"
        )
    return text


class Outbox(FleetTable):
    """The outbox over a connection of its own to the store at ``dsn`` (its schema created or
    upgraded), one transaction per call; ``clock``: where the time comes from (None: the
    database, as the lease tables' own)."""

    def _fenced(self, conn: PgConnection, resource: str, holder: str, epoch: int) -> bool:
        now = None if self._clock is None else float(self._clock())
        return fenced_write(conn, resource, holder, epoch, now=now)

    def put(self, entry: OutboxEntry, fence: Fence) -> int:
        """Put ``entry`` for ``fence`` (the agent's lease), in one transaction; its row's id.
        The fence is checked first: a stale one raises :class:`~store.errors.StaleFence` and
        nothing is put. A row already under ``entry.key`` is the answer (nothing new is put, no
        notification). Otherwise the row is queued and :data:`NOTIFY_QUEUED` notified with the
        server's id at commit; :class:`OutboxFull` when the server already has
        :data:`MAX_QUEUED` rows not yet done; :class:`ValueError` for blocks that are not JSON
        or are larger than :data:`MAX_BLOCKS_BYTES`."""
        if not isinstance(entry, OutboxEntry):
            raise TypeError(f"put takes an OutboxEntry, not {type(entry).__name__}")
        if not isinstance(fence, Fence):
            raise TypeError(f"put takes a Fence, not {type(fence).__name__}")
        blocks = _json(list(entry.blocks), "the blocks", MAX_BLOCKS_BYTES)
        with self._transaction() as conn:
            if not self._fenced(conn, fence.resource, fence.holder, fence.epoch):
                raise StaleFence(fence.resource, fence.holder, fence.epoch)
            found = self._id_of(conn, entry.key)
            if found is not None:
                return found
            (waiting,) = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM outbox WHERE server_id = ?"
                " AND state <> 'done' LIMIT ?) AS w",
                (entry.server_id, MAX_QUEUED),
            ).fetchall()[0]
            if int(waiting) >= MAX_QUEUED:
                raise OutboxFull(entry.server_id, MAX_QUEUED)
            row = conn.execute(
                "INSERT INTO outbox (server_id, channel_id, thread_id, agent, key, blocks, prose,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (key) DO NOTHING RETURNING id",
                (
                    entry.server_id,
                    entry.channel_id,
                    entry.thread_id,
                    entry.agent,
                    entry.key,
                    blocks,
                    entry.prose,
                    self._now(conn),
                ),
            ).fetchone()
            if row is None:  # put meanwhile by another transaction, now committed
                found = self._id_of(conn, entry.key)
                assert found is not None
                return found
            conn.execute("SELECT pg_notify(?, ?)", (NOTIFY_QUEUED, entry.server_id))
            return int(row[0])

    @staticmethod
    def _id_of(conn: PgConnection, key: str) -> int | None:
        row = conn.execute("SELECT id FROM outbox WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def claim(self, server_id: str, holder: str, epoch: int, *, limit: int = 32) -> list[OutboxRow]:
        """Claim up to ``limit`` rows of ``server_id`` for ``holder`` under ``epoch`` (its lease
        on ``server:<server_id>``), in one transaction, oldest first: the queued rows and those
        claimed under an older epoch (:func:`protocol.outbox.claimable`). A stale fence raises
        :class:`~store.errors.StaleFence` and claims nothing. Rows another transaction has
        locked (another claim at the same time) are skipped: no row is claimed twice. The rows
        claimed, in id order."""
        if not (isinstance(limit, int) and 0 < limit <= MAX_CLAIM):
            raise ValueError(f"a claim takes 1 to {MAX_CLAIM} rows, not {limit!r}")
        resource = server_resource(server_id)
        with self._transaction() as conn:
            if not self._fenced(conn, resource, holder, epoch):
                raise StaleFence(resource, holder, epoch)
            rows = conn.execute(
                "UPDATE outbox SET state = 'claimed', claimed_by = ?, claim_epoch = ?"
                " WHERE id IN (SELECT id FROM outbox WHERE server_id = ?"
                f" AND {CLAIMABLE_SQL} ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED)"
                " RETURNING id, server_id, channel_id, thread_id, agent, key, blocks, prose,"
                " created_at, claimed_by, claim_epoch",
                (holder, epoch, server_id, epoch, epoch, holder, limit),
            ).fetchall()
        return sorted((_row(r) for r in rows), key=lambda r: r.id)

    def finish(self, row_id: int, outcome: Mapping[str, Any], holder: str, epoch: int) -> bool:
        """Record ``outcome`` (JSON-able, at most :data:`MAX_OUTCOME_BYTES`) for row ``row_id``,
        published by ``holder`` under ``epoch``, in one transaction, fenced on the lease of the
        row's server; the row is then done and :data:`NOTIFY_DONE` notified with its id at
        commit. Whether it was recorded: False (and nothing changed) when the fence is stale,
        or the row is not claimed by ``holder`` under ``epoch`` (another holder claimed it
        again, it is done already, or there is no such row)."""
        text = _json(dict(outcome), "the outcome", MAX_OUTCOME_BYTES)
        with self._transaction() as conn:
            found = conn.execute(
                "SELECT server_id FROM outbox WHERE id = ?", (int(row_id),)
            ).fetchone()
            if found is None:
                return False
            if not self._fenced(conn, server_resource(str(found[0])), holder, epoch):
                return False
            done = conn.execute(
                "UPDATE outbox SET state = 'done', outcome = ?, finished_at = ?"
                " WHERE id = ? AND state = 'claimed' AND claimed_by = ? AND claim_epoch = ?"
                " RETURNING id",
                (text, self._now(conn), int(row_id), holder, epoch),
            ).fetchone()
            if done is None:
                return False
            conn.execute("SELECT pg_notify(?, ?)", (NOTIFY_DONE, str(int(row_id))))
            return True

    def outcomes(self, ids: Iterable[int]) -> dict[int, dict[str, Any] | None]:
        """The outcome of each of the rows ``ids`` (at most :data:`MAX_IDS`): None while it is
        not done. A row not found (never put, or pruned) is left out of the answer."""
        wanted = sorted({int(i) for i in ids})
        if len(wanted) > MAX_IDS:
            raise ValueError(f"outcomes reads at most {MAX_IDS} rows at once, not {len(wanted)}")
        with self._transaction() as conn:
            rows = conn.execute(
                "SELECT id, state, outcome FROM outbox WHERE id = ANY(?::bigint[]) ORDER BY id",
                (wanted,),
            ).fetchall()
        return {
            int(i): (json.loads(outcome) if state == "done" and outcome is not None else None)
            for i, state, outcome in rows
        }

    def prune(self, older_than_s: float = DONE_KEEP_S) -> int:
        """Delete the done rows finished more than ``older_than_s`` ago (the table's clock); how
        many. Rows not yet done are never pruned."""
        with self._transaction() as conn:
            before = self._now(conn) - float(older_than_s)
            deleted = conn.execute(
                "DELETE FROM outbox WHERE state = 'done' AND finished_at < ?", (before,)
            ).rowcount
        return int(deleted)


def _row(row: Any) -> OutboxRow:
    (
        row_id,
        server_id,
        channel_id,
        thread_id,
        agent,
        key,
        blocks,
        prose,
        created_at,
        claimed_by,
        claim_epoch,
    ) = row
    entry = OutboxEntry(
        server_id=str(server_id),
        channel_id=str(channel_id),
        thread_id=None if thread_id is None else str(thread_id),
        agent=str(agent),
        key=str(key),
        blocks=tuple(json.loads(blocks)),
        prose=bool(prose),
    )
    return OutboxRow(
        id=int(row_id),
        entry=entry,
        created_at=float(created_at),
        claimed_by=str(claimed_by),
        claim_epoch=int(claim_epoch),
    )
