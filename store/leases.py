"""A fleet's leases on PostgreSQL: the rules of :mod:`protocol.leases`, carried out one step per
transaction on the ``hosts`` and ``leases`` tables (schema version 3 of :mod:`store.postgres`).

``hosts`` has a row per host: when it started, its last heartbeat, and whether it is leaving.
``leases`` has a row per resource (``agent:Ada``, ``server:lobby``): its holder (NULL: free), its
epoch (0 until first taken; each take adds one) and its expiry.

**Whose clock.** Every time in these tables is the *database's* clock (``clock_timestamp()``,
read once per transaction, after its row locks are taken), never a host's. Hosts whose clocks
disagree still agree on when a lease expires, and a row's times only grow: a step that locks a row
after another step's commit reads a later time. The pure rules take that ``now`` as their
parameter. A test may give :class:`LeaseTable` a clock of its own (``clock``), and
:func:`fenced_write` a ``now``; the database's clock is then not read.

**A step** (:meth:`LeaseTable.step`) is one transaction:

1. insert a free row for each resource that has none (``ON CONFLICT DO NOTHING``, in name order);
2. read and lock the rows with ``SELECT … FOR UPDATE SKIP LOCKED``. A row another host's step
   (or a fenced write) has locked is *skipped* for this step: neither taken nor counted as free;
   if it is this host's own and unexpired, it stays held, unrenewed, until a later step;
3. read the time, record the heartbeat, read the live hosts (a heartbeat within ``live_s`` and
   not leaving);
4. :func:`protocol.leases.plan` on the rows read, then ``UPDATE``\\ s that check each row again
   in SQL: renew only ``WHERE holder = me AND epoch = mine AND expires_at > now``, release only
   ``WHERE holder = me``, take only ``WHERE holder IS NULL OR expires_at <= now`` (the epoch
   grows by one);
5. commit, and say what this host now holds (epoch and expiry of each), took, released and lost.

Resources this host held at its last step but no longer names are released at this one.

**Fencing.** A write made for a lease checks it in the writer's own transaction with
:func:`fenced_write` (``SELECT 1 … FOR SHARE``): it lands only when the writer is the holder,
under the current epoch, before expiry; the share lock keeps the row from being taken until that
transaction ends.

**Reading the fleet** (:func:`read_fleet`, for ``mcplive status`` and the console): the
``hosts`` and ``leases`` rows as committed, and the database's time, over a read-only connection
of its own with short timeouts; nothing is created, upgraded or locked.

Bounds: at most :data:`MAX_RESOURCES` resources per step, :data:`MAX_HOSTS` live hosts read and
host ids stepped through one table. Not thread-safe: one :class:`LeaseTable` per thread.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

import attrs

from protocol.leases import LEASE_S, Lease, plan
from store.dbapi import Connection

if TYPE_CHECKING:  # psycopg only for a store that needs it: see ``_postgres``
    from store.postgres import PgConnection


def _postgres() -> Any:
    """``store.postgres``, imported when a lease table is first opened: a host on the embedded
    store (or without the ``postgresql`` extra) never loads psycopg."""
    from store import postgres

    return postgres


__all__ = [
    "FENCE_SQL",
    "MAX_HOSTS",
    "MAX_RESOURCES",
    "READ_TIMEOUT_S",
    "Fleet",
    "FleetTable",
    "Held",
    "HostRow",
    "LeaseTable",
    "StepResult",
    "fenced_write",
    "read_fleet",
]

#: The most resources one step names (a clear error beyond).
MAX_RESOURCES = 10_000
#: The most live hosts a step reads (and host ids one table steps for).
MAX_HOSTS = 1_000

#: Seconds :func:`read_fleet` may wait to connect, and for each statement.
READ_TIMEOUT_S = 3.0

#: The database's clock, in seconds since the epoch.
DB_NOW = "extract(epoch from clock_timestamp())::float8"

#: The fence: a row only when ``holder`` holds ``resource`` under ``epoch`` and it has not
#: expired at the time given (NULL: the database's clock); share-locked until the transaction ends.
FENCE_SQL = (
    "SELECT 1 FROM leases WHERE resource = ? AND holder = ? AND epoch = ?"
    f" AND expires_at > COALESCE(?::float8, {DB_NOW}) FOR SHARE"
)

#: How long a step waits for the rows of its own leases that a write holds (milliseconds).
OWN_LOCK_WAIT_MS = 1000


def _lock_timed_out(exc: Exception) -> bool:
    """Whether ``exc`` is PostgreSQL's lock timeout (or a deadlock it broke)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return getattr(cause, "sqlstate", None) in ("55P03", "40P01")


# Stands for the holder of a row skipped by a step: held by someone, so neither taken nor free.
_LOCKED = "\x00locked by another step"


@attrs.frozen
class Held:
    """A lease this host holds: its epoch (every write made for it carries it) and expiry."""

    epoch: int
    expires_at: float


@attrs.frozen
class StepResult:
    """What one step left: the time it ran at (the table's clock: when the leases it renewed
    were renewed, for :func:`protocol.leases.must_stop`), what the host holds now, and what
    changed. A resource in both ``lost`` and ``taken`` was held under an older epoch that
    expired: stop acting for it, then start again under the new epoch. ``skipped``: the rows
    another transaction had locked, left alone by this step."""

    now: float
    held: Mapping[str, Held]
    taken: tuple[str, ...] = ()
    released: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    live_hosts: tuple[str, ...] = ()


@attrs.frozen
class HostRow:
    """A host's row: when it started, its last heartbeat (the database's clock), whether it
    left cleanly."""

    host_id: str
    started_at: float
    heartbeat_at: float
    leaving: bool


@attrs.frozen
class Fleet:
    """What :func:`read_fleet` read: the database's time then, the hosts and the lease rows
    (each in name order)."""

    now: float
    hosts: tuple[HostRow, ...]
    leases: tuple[Lease, ...]


def read_fleet(dsn: str, *, timeout_s: float = READ_TIMEOUT_S) -> Fleet:
    """The fleet on the store at ``dsn`` (at most :data:`MAX_HOSTS` hosts and
    :data:`MAX_RESOURCES` leases), read in one read-only transaction. ``timeout_s`` bounds the
    connection attempt (whole seconds, at least one) and each statement. Raises
    :class:`~store.errors.StoreError` (one line, no password) when the store cannot be read: not
    reachable, not a store, or a schema older than the fleet's tables."""
    conn = _postgres().connect_read_only(dsn, connect_timeout=timeout_s)
    try:
        conn.execute(f"SET statement_timeout = {max(1, int(timeout_s * 1000))}")
        conn.execute("BEGIN")
        try:
            (now,) = conn.execute(f"SELECT {DB_NOW}").fetchall()[0]
            hosts = conn.execute(
                "SELECT host_id, started_at, heartbeat_at, leaving FROM hosts"
                " ORDER BY host_id LIMIT ?",
                (MAX_HOSTS,),
            ).fetchall()
            leases = conn.execute(
                "SELECT resource, holder, epoch, expires_at FROM leases ORDER BY resource LIMIT ?",
                (MAX_RESOURCES,),
            ).fetchall()
        finally:
            conn.end_transaction()
    finally:
        conn.close()
    return Fleet(
        now=float(now),
        hosts=tuple(
            HostRow(str(h), float(started), float(beat), bool(leaving))
            for h, started, beat, leaving in hosts
        ),
        leases=tuple(map(_lease, leases)),
    )


Clock = Callable[[], float]


def fenced_write(
    conn: Connection, resource: str, holder: str, epoch: int, *, now: float | None = None
) -> bool:
    """Whether a write made by ``holder`` for ``resource`` under ``epoch`` may land: run inside
    the writer's transaction (whose outcome it guards), before the write. True keeps the lease
    row share-locked until that transaction ends, so it cannot be taken meanwhile; False: the
    epoch is stale, another host holds it, or it expired (at ``now``; None: the database's
    clock) — roll back."""
    if not conn.in_transaction:
        raise ValueError("fenced_write checks a lease inside the write's own transaction")
    return conn.execute(FENCE_SQL, (resource, holder, epoch, now)).fetchone() is not None


class FleetTable:
    """A table of a fleet's store over a connection of its own to ``dsn`` (its schema created
    or upgraded), one transaction per call (:meth:`_transaction`); ``clock``: where the time
    comes from (None: the database's clock, :meth:`_now`). Blocking: run it off the loop."""

    def __init__(self, dsn: str, *, clock: Clock | None = None) -> None:
        self._clock = clock
        self._conn: PgConnection = _postgres().connect(dsn)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[PgConnection]:
        conn = self._conn
        conn.execute("BEGIN")
        try:
            yield conn
        except BaseException:
            conn.end_transaction()
            raise
        conn.execute("COMMIT")

    def _now(self, conn: PgConnection) -> float:
        if self._clock is not None:
            return float(self._clock())
        (now,) = conn.execute(f"SELECT {DB_NOW}").fetchall()[0]
        return float(now)

    def notify(self, notices: Sequence[tuple[str, str]]) -> None:
        """Send ``notices`` (channel, payload) with PostgreSQL's ``NOTIFY``, in one transaction
        (each is delivered to the listeners at its commit, in order)."""
        if not notices:
            return
        with self._transaction() as conn:
            conn.execute(
                "SELECT pg_notify(c, p) FROM unnest(?::text[], ?::text[])"
                " WITH ORDINALITY AS n (c, p, i) ORDER BY i",
                ([c for c, _ in notices], [p for _, p in notices]),
            )


class LeaseTable(FleetTable):
    """The lease table over a connection of its own to the store at ``dsn`` (its schema created
    or upgraded), one transaction per call. ``lease_s``: how long a take or renewal lasts;
    ``live_s``: how recent a heartbeat makes a host live (``lease_s`` unless given); ``clock``:
    where the time comes from (None: the database)."""

    def __init__(
        self,
        dsn: str,
        *,
        lease_s: float = LEASE_S,
        live_s: float | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not (math.isfinite(lease_s) and lease_s > 0):
            raise ValueError(f"lease_s must be a positive number of seconds, not {lease_s!r}")
        live_s = lease_s if live_s is None else live_s
        if not (math.isfinite(live_s) and live_s > 0):
            raise ValueError(f"live_s must be a positive number of seconds, not {live_s!r}")
        self.lease_s = lease_s
        self.live_s = live_s
        super().__init__(dsn, clock=clock)
        # what each host stepping through this table held after its last step
        self._views: dict[str, dict[str, Held]] = {}

    def now(self) -> float:
        """The table's time now (the database's clock, or the clock given)."""
        with self._transaction() as conn:
            return self._now(conn)

    def _beat(self, conn: PgConnection, host_id: str, now: float) -> None:
        # started_at is new when the host left, or was silent for longer than live_s
        conn.execute(
            "INSERT INTO hosts (host_id, started_at, heartbeat_at, leaving) VALUES (?, ?, ?, false)"
            " ON CONFLICT (host_id) DO UPDATE SET heartbeat_at = EXCLUDED.heartbeat_at,"
            " leaving = false, started_at = CASE WHEN hosts.leaving OR hosts.heartbeat_at < ?"
            " THEN EXCLUDED.started_at ELSE hosts.started_at END",
            (host_id, now, now, now - self.live_s),
        )

    def _live(self, conn: PgConnection, since: float) -> tuple[str, ...]:
        rows = conn.execute(
            "SELECT host_id FROM hosts WHERE NOT leaving AND heartbeat_at > ?"
            " ORDER BY host_id LIMIT ?",
            (since, MAX_HOSTS),
        ).fetchall()
        return tuple(str(r[0]) for r in rows)

    def heartbeat(self, host_id: str) -> float:
        """Record that ``host_id`` is alive (and not leaving); the time it was recorded at."""
        with self._transaction() as conn:
            now = self._now(conn)
            self._beat(conn, host_id, now)
        return now

    def live_hosts(self, within_s: float | None = None) -> tuple[str, ...]:
        """The hosts whose last heartbeat is within ``within_s`` (``live_s`` unless given) and
        that are not leaving, in name order (at most :data:`MAX_HOSTS`)."""
        within = self.live_s if within_s is None else within_s
        with self._transaction() as conn:
            return self._live(conn, self._now(conn) - within)

    def leases(self, resources: Iterable[str] | None = None) -> dict[str, Lease]:
        """The lease rows of ``resources`` (None: every row, at most :data:`MAX_RESOURCES`), as
        they are committed; nothing locked."""
        with self._transaction() as conn:
            if resources is None:
                rows = conn.execute(
                    "SELECT resource, holder, epoch, expires_at FROM leases"
                    " ORDER BY resource LIMIT ?",
                    (MAX_RESOURCES,),
                ).fetchall()
            else:
                names = _bounded(resources)
                rows = conn.execute(
                    "SELECT resource, holder, epoch, expires_at FROM leases"
                    " WHERE resource = ANY(?::text[]) ORDER BY resource",
                    (names,),
                ).fetchall()
        return {lease.resource: lease for lease in map(_lease, rows)}

    def _view(self, host_id: str) -> dict[str, Held]:
        view = self._views.get(host_id)
        if view is None:
            if len(self._views) >= MAX_HOSTS:
                raise ValueError(f"one lease table steps for at most {MAX_HOSTS} host ids")
            view = self._views[host_id] = {}
        return view

    def step(
        self,
        host_id: str,
        resources: Iterable[str],
        *,
        before_release: Callable[[tuple[str, ...]], None] | None = None,
    ) -> StepResult:
        """One step of ``host_id``, which runs ``resources``, in one transaction (see the module's
        docstring): renew, take and release as :func:`protocol.leases.plan` says on the rows it
        could lock. ``before_release`` is called, inside the transaction and with those rows
        still locked, with what this host is about to let go (only when something is): the
        holder stops acting for them there, before another host can take them. If it raises,
        the step is rolled back."""
        if not host_id:
            raise ValueError("a host id is a non-empty string")
        names = _bounded(resources)
        view = self._view(host_id)
        wanted = set(names)
        dropped = sorted(r for r in view if r not in wanted)
        with self._transaction() as conn:
            if names:
                conn.execute(
                    "INSERT INTO leases (resource, holder, epoch, expires_at)"
                    " SELECT r, NULL, 0, 0 FROM unnest(?::text[]) AS r ORDER BY r"
                    " ON CONFLICT (resource) DO NOTHING",
                    (names,),
                )
            rows = conn.execute(
                "SELECT resource, holder, epoch, expires_at FROM leases"
                " WHERE resource = ANY(?::text[]) ORDER BY resource FOR UPDATE SKIP LOCKED",
                (names + dropped,),
            ).fetchall()
            now = self._now(conn)  # after the locks: later than any commit on these rows
            self._beat(conn, host_id, now)
            live = self._live(conn, now - self.live_s)
            locked = {lease.resource: lease for lease in map(_lease, rows)}
            mine_busy = [r for r in names + dropped if r not in locked and r in view]
            if mine_busy:  # a fenced write of this host's share-locks them: wait for it
                locked.update(self._lock_own(conn, mine_busy))
            seen = dict(locked)
            skipped = [r for r in names + dropped if r not in locked]
            kept: dict[str, Held] = {}  # its own, skipped: held until a later step renews them
            for resource in skipped:
                mine = view.get(resource)
                if mine is not None and now < mine.expires_at:
                    kept[resource] = mine
                    seen[resource] = Lease(resource, host_id, mine.epoch, mine.expires_at)
                else:
                    seen[resource] = Lease(resource, _LOCKED, 0, math.inf)
            step = plan(host_id, now, seen, names, live)
            release = [r for r in step.release if r in locked]
            release += [r for r in dropped if r in locked and locked[r].holder == host_id]
            renew = [r for r in step.renew if r in locked]
            take = [r for r in step.take if r in locked]
            held: dict[str, Held] = {}
            if renew:
                for resource, epoch, expires_at in conn.execute(
                    "UPDATE leases AS l SET expires_at = ?"
                    " FROM unnest(?::text[], ?::bigint[]) AS m (resource, epoch)"
                    " WHERE l.resource = m.resource AND l.holder = ? AND l.epoch = m.epoch"
                    " AND l.expires_at > ? RETURNING l.resource, l.epoch, l.expires_at",
                    (now + self.lease_s, renew, [locked[r].epoch for r in renew], host_id, now),
                ).fetchall():
                    held[resource] = Held(int(epoch), float(expires_at))
            released: list[str] = []
            if release and before_release is not None:
                before_release(tuple(sorted(release)))
            if release:
                released = [
                    str(row[0])
                    for row in conn.execute(
                        "UPDATE leases SET holder = NULL, expires_at = ?"
                        " WHERE resource = ANY(?::text[]) AND holder = ? RETURNING resource",
                        (now, release, host_id),
                    ).fetchall()
                ]
            taken: list[str] = []
            if take:
                for resource, epoch, expires_at in conn.execute(
                    "UPDATE leases SET holder = ?, epoch = epoch + 1, expires_at = ?"
                    " WHERE resource = ANY(?::text[]) AND (holder IS NULL OR expires_at <= ?)"
                    " RETURNING resource, epoch, expires_at",
                    (host_id, now + self.lease_s, take, now),
                ).fetchall():
                    held[resource] = Held(int(epoch), float(expires_at))
                    taken.append(resource)
        for resource, mine in kept.items():
            held.setdefault(resource, mine)
        gone = set(released)
        lost = [
            r
            for r, mine in view.items()
            if r not in gone and (r not in held or held[r].epoch != mine.epoch)
        ]
        view.clear()
        view.update(held)
        return StepResult(
            now=now,
            held=dict(sorted(held.items())),
            taken=tuple(sorted(taken)),
            released=tuple(sorted(released)),
            lost=tuple(sorted(lost)),
            skipped=tuple(skipped),
            live_hosts=live,
        )

    @staticmethod
    def _lock_own(conn: PgConnection, resources: list[str]) -> dict[str, Lease]:
        """Lock the rows of leases this host holds that the step's first pass skipped: a
        fenced write (of this host, most often) holds them share-locked for the few
        milliseconds of its transaction. Waited for at most :data:`OWN_LOCK_WAIT_MS`, in a
        savepoint: a row still locked then is left as skipped (kept until a later step),
        and the step goes on. Without this wait a host writing without pause (a server's
        burst) would skip its own renewal step after step, and stop in time for nothing."""
        conn.execute("SAVEPOINT own_rows")
        try:
            conn.execute(f"SET LOCAL lock_timeout = {OWN_LOCK_WAIT_MS}")
            rows = conn.execute(
                "SELECT resource, holder, epoch, expires_at FROM leases"
                " WHERE resource = ANY(?::text[]) ORDER BY resource FOR UPDATE",
                (sorted(resources),),
            ).fetchall()
        except Exception as exc:
            if not _lock_timed_out(exc):
                raise
            conn.execute("ROLLBACK TO SAVEPOINT own_rows")
            rows = []
        conn.execute("RELEASE SAVEPOINT own_rows")
        conn.execute("SET LOCAL lock_timeout = 0")
        return {lease.resource: lease for lease in map(_lease, rows)}

    def leaving(self, host_id: str) -> None:
        """Mark ``host_id`` leaving, keeping its leases: the lease keeper lets them go once
        its agents have stopped (:meth:`release_all`)."""
        with self._transaction() as conn:
            now = self._now(conn)
            conn.execute(
                "INSERT INTO hosts (host_id, started_at, heartbeat_at, leaving)"
                " VALUES (?, ?, ?, true) ON CONFLICT (host_id) DO UPDATE SET leaving = true,"
                " heartbeat_at = EXCLUDED.heartbeat_at",
                (host_id, now, now),
            )

    def release_all(self, host_id: str) -> tuple[str, ...]:
        """A clean leave: every lease ``host_id`` holds is let go at once (free to another host's
        next step, its epoch kept so that no old write lands) and the host is marked leaving. The
        resources released. Waits for rows another step has locked."""
        with self._transaction() as conn:
            now = self._now(conn)
            released = tuple(
                sorted(
                    str(row[0])
                    for row in conn.execute(
                        "UPDATE leases SET holder = NULL, expires_at = LEAST(expires_at, ?)"
                        " WHERE holder = ? RETURNING resource",
                        (now, host_id),
                    ).fetchall()
                )
            )
            conn.execute(
                "INSERT INTO hosts (host_id, started_at, heartbeat_at, leaving)"
                " VALUES (?, ?, ?, true) ON CONFLICT (host_id) DO UPDATE SET leaving = true,"
                " heartbeat_at = EXCLUDED.heartbeat_at",
                (host_id, now, now),
            )
        self._views.pop(host_id, None)
        return released


def _bounded(resources: Iterable[str]) -> list[str]:
    """``resources`` once each, in name order; at most :data:`MAX_RESOURCES`."""
    names: set[str] = set()
    for resource in resources:
        if not isinstance(resource, str) or not resource:
            raise ValueError(f"a resource is a non-empty string, not {resource!r}")
        names.add(resource)
        if len(names) > MAX_RESOURCES:
            raise ValueError(f"a step names more than {MAX_RESOURCES} resources")
    return sorted(names)


def _lease(row: Any) -> Lease:
    resource, holder, epoch, expires_at = row
    holder = None if holder is None else str(holder)
    return Lease(str(resource), holder, int(epoch), float(expires_at))
