"""The lease table on a real PostgreSQL (:mod:`store.leases`): three hosts, each with a
connection of its own, over six agents and one server. They end up holding each resource once
and evenly; a host that stops stepping keeps its leases until they expire; each take makes a new
epoch, and a write under an old one is refused; a clean leave hands everything over at once; and
hosts stepping at the same time from three threads never both hold one resource (``SKIP LOCKED``
and the updates' own checks).

Most tests give the tables one clock they control, so expiry needs no waiting; one runs on the
database's clock with a one-second lease and polls that clock, bounded."""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Iterator, Mapping, Sequence

import pytest

from protocol.leases import fair_share, kind_of
from store import Database
from store.leases import MAX_RESOURCES, Held, LeaseTable, StepResult, fenced_write
from store.postgres import PgConnection

from .conftest import run_sql

HOSTS = ("h1", "h2", "h3")
AGENTS = tuple(f"agent:a{i}" for i in range(6))
SERVER = "server:lobby"
RESOURCES = (*AGENTS, SERVER)
LEASE_S = 10.0


class Clock:
    """A clock the test moves (thread-safe)."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.t = start
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def advance(self, seconds: float) -> None:
        with self.lock:
            self.t += seconds


class TickingClock(Clock):
    """A clock that moves on at each reading, now and then by more than a lease: every host's
    leases expire at once, and the next steps race to take them."""

    def __init__(self, lease_s: float, seed: int = 40) -> None:
        super().__init__()
        self.lease_s = lease_s
        self.rng = random.Random(seed)
        self.reads = 0
        self.ticking = True

    def __call__(self) -> float:
        with self.lock:
            if self.ticking:
                self.reads += 1
                jump = self.lease_s * 1.5 if self.reads % 25 == 0 else 0.0
                self.t += self.rng.uniform(0.0, self.lease_s / 8) + jump
            return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tables(pg_dsn: str, clock: Clock) -> Iterator[dict[str, LeaseTable]]:
    opened = {h: LeaseTable(pg_dsn, lease_s=LEASE_S, clock=clock) for h in HOSTS}
    try:
        yield opened
    finally:
        for table in opened.values():
            table.close()


def step_all(
    tables: Mapping[str, LeaseTable], rounds: int = 3, hosts: Sequence[str] = HOSTS
) -> dict[str, StepResult]:
    """Every host in ``hosts`` steps, round after round; each one's last result."""
    last: dict[str, StepResult] = {}
    for _ in range(rounds):
        for host in hosts:
            last[host] = tables[host].step(host, RESOURCES)
    return last


def holders(table: LeaseTable, now: float) -> dict[str, str]:
    """Who holds each resource at ``now``, as the table says."""
    return {
        r: lease.holder for r, lease in table.leases().items() if lease.held(now) and lease.holder
    }


def check_spread(results: Mapping[str, StepResult], hosts: Sequence[str]) -> None:
    """Each resource held by exactly one of ``hosts``, each holding at most its fair share."""
    claims = [(r, h) for h in hosts for r in results[h].held]
    assert sorted(r for r, _ in claims) == sorted(RESOURCES)  # each once, none left out
    for kind in ("agent", "server"):
        share = fair_share(sum(kind_of(r) == kind for r in RESOURCES), len(hosts))
        for host in hosts:
            assert sum(kind_of(r) == kind for r in results[host].held) <= share


def test_the_schema_is_a_migration_of_the_store(pg_dsn: str) -> None:
    Database(pg_dsn).close()  # the store made first: the lease table finds its tables there
    with LeaseTable(pg_dsn) as table:
        assert table.leases() == {}
    columns = run_sql(
        pg_dsn,
        "SELECT table_name, column_name, data_type, collation_name"
        " FROM information_schema.columns WHERE table_name IN ('hosts', 'leases')"
        " ORDER BY table_name, ordinal_position",
    )
    assert columns == [
        ("hosts", "host_id", "text", "C"),
        ("hosts", "started_at", "double precision", None),
        ("hosts", "heartbeat_at", "double precision", None),
        ("hosts", "leaving", "boolean", None),
        ("leases", "resource", "text", "C"),
        ("leases", "holder", "text", "C"),
        ("leases", "epoch", "bigint", None),
        ("leases", "expires_at", "double precision", None),
    ]


def test_three_hosts_hold_each_resource_once_and_evenly(
    tables: dict[str, LeaseTable], clock: Clock
) -> None:
    for host in HOSTS:
        tables[host].heartbeat(host)
    assert tables["h1"].live_hosts() == HOSTS
    results = step_all(tables)
    check_spread(results, HOSTS)
    assert all(results[h].live_hosts == HOSTS for h in HOSTS)
    # the table says the same as the hosts
    said = {r: h for h in HOSTS for r in results[h].held}
    assert holders(tables["h1"], clock()) == said
    # and stays put while they renew
    clock.advance(LEASE_S / 2)
    again = step_all(tables, rounds=1)
    assert {r: h for h in HOSTS for r in again[h].held} == said
    assert all(again[h].taken == again[h].lost == () for h in HOSTS)
    for host in HOSTS:
        for resource, held in again[host].held.items():
            assert held.epoch == results[host].held[resource].epoch
            assert held.expires_at == clock() + LEASE_S  # renewed from the table's time


def test_hosts_that_come_one_by_one_spread_the_load(
    tables: dict[str, LeaseTable], clock: Clock
) -> None:
    """The first host takes everything; as the others come, it lets the extra go, and they
    take it at once (a release, not an expiry: no time passes)."""
    first = tables["h1"].step("h1", RESOURCES)
    assert sorted(first.held) == sorted(RESOURCES) and first.live_hosts == ("h1",)
    results = step_all(tables, rounds=3)
    check_spread(results, HOSTS)
    released = tables["h1"].leases()
    assert max(lease.epoch for lease in released.values()) == 2  # each handed over once at most


def test_a_host_that_stops_stepping_loses_its_leases_only_after_expiry(
    pg_dsn: str, tables: dict[str, LeaseTable], clock: Clock
) -> None:
    for host in HOSTS:
        tables[host].heartbeat(host)
    before = step_all(tables)
    h3 = dict(before["h3"].held)
    assert h3
    # h3 stops; short of the expiry, the others take nothing of it
    clock.advance(LEASE_S - 0.5)
    during = step_all(tables, rounds=2, hosts=("h1", "h2"))
    assert all(set(during[h].held).isdisjoint(h3) for h in ("h1", "h2"))
    rows = tables["h1"].leases(h3)
    assert {r: (rows[r].holder, rows[r].epoch) for r in h3} == {
        r: ("h3", held.epoch) for r, held in h3.items()
    }
    assert all(during[h].live_hosts == HOSTS for h in ("h1", "h2"))  # its heartbeat is recent
    # past the expiry: h3 is no longer live, and the others share everything
    clock.advance(1.0)
    after = step_all(tables, rounds=2, hosts=("h1", "h2"))
    check_spread(after, ("h1", "h2"))
    assert after["h1"].live_hosts == ("h1", "h2")
    for resource, held in h3.items():
        owner = "h1" if resource in after["h1"].held else "h2"
        assert after[owner].held[resource].epoch == held.epoch + 1  # a take: a new epoch
    # h3 comes back: it has lost them, and a write under its old epoch is refused
    back = tables["h3"].step("h3", RESOURCES)
    assert set(h3) <= set(back.lost)
    assert set(back.held).isdisjoint(h3)
    pg = PgConnection(pg_dsn)
    try:
        pg.execute("BEGIN")
        for resource, held in h3.items():
            assert not fenced_write(pg, resource, "h3", held.epoch, now=clock())
            owner = "h1" if resource in after["h1"].held else "h2"
            current = after[owner].held[resource].epoch
            assert fenced_write(pg, resource, owner, current, now=clock())
            assert not fenced_write(pg, resource, "h3", current, now=clock())  # not its own
        pg.execute("ROLLBACK")
    finally:
        pg.close()


def test_epochs_grow_with_each_take(tables: dict[str, LeaseTable], clock: Clock) -> None:
    one = ("agent:solo",)
    epochs = []
    for host in ("h1", "h2", "h3", "h1"):
        result = tables[host].step(host, one)
        assert result.taken == one
        epochs.append(result.held["agent:solo"].epoch)
        renewed = tables[host].step(host, one)  # a renewal keeps the epoch
        assert renewed.held["agent:solo"].epoch == epochs[-1] and renewed.taken == ()
        clock.advance(LEASE_S)  # expires exactly now: free to take
    assert epochs == [1, 2, 3, 4]


def test_a_stale_epoch_cannot_write_and_a_fenced_write_keeps_its_row(
    pg_dsn: str, tables: dict[str, LeaseTable], clock: Clock
) -> None:
    resource = "agent:a0"
    first = tables["h1"].step("h1", [resource]).held[resource]
    pg = PgConnection(pg_dsn)
    try:
        with pytest.raises(ValueError, match="transaction"):
            fenced_write(pg, resource, "h1", first.epoch)  # outside a transaction it means nothing
        pg.execute("BEGIN")
        assert fenced_write(pg, resource, "h1", first.epoch, now=clock())
        # while the writer's transaction is open its row cannot be taken, even once expired:
        # a step skips it
        clock.advance(LEASE_S + 1)
        blocked = tables["h2"].step("h2", [resource])
        assert blocked.skipped == (resource,) and blocked.held == {}
        pg.execute("COMMIT")
        taken = tables["h2"].step("h2", [resource])
        assert taken.held[resource].epoch == first.epoch + 1
        pg.execute("BEGIN")
        assert not fenced_write(pg, resource, "h1", first.epoch, now=clock())
        assert fenced_write(pg, resource, "h2", first.epoch + 1, now=clock())
        clock.advance(LEASE_S)
        assert not fenced_write(pg, resource, "h2", first.epoch + 1, now=clock())  # expired
        pg.execute("ROLLBACK")
    finally:
        pg.close()


def test_a_skipped_row_of_its_own_stays_held_unrenewed(
    pg_dsn: str, tables: dict[str, LeaseTable], clock: Clock
) -> None:
    first = tables["h1"].step("h1", RESOURCES)
    pg = PgConnection(pg_dsn)
    try:
        pg.execute("BEGIN")
        pg.execute("SELECT 1 FROM leases WHERE resource = ? FOR UPDATE", ("agent:a1",))
        clock.advance(1.0)
        result = tables["h1"].step("h1", RESOURCES)
        assert result.skipped == ("agent:a1",)
        assert result.held["agent:a1"] == first.held["agent:a1"]  # not renewed, not lost
        assert result.lost == ()
        assert result.held["agent:a2"].expires_at == clock() + LEASE_S
        # another host skips it too: not taken, not counted as free
        other = tables["h2"].step("h2", RESOURCES)
        assert "agent:a1" not in other.held and other.skipped == ("agent:a1",)
        pg.execute("ROLLBACK")
    finally:
        pg.close()
    assert tables["h1"].step("h1", RESOURCES).held["agent:a1"].expires_at == clock() + LEASE_S


def test_a_renewal_waits_for_its_own_fenced_write_instead_of_skipping(
    pg_dsn: str, tables: dict[str, LeaseTable], clock: Clock
) -> None:
    """A host that writes without pause holds its own lease rows share-locked most of the time;
    its step waits for the write's commit and renews, rather than skipping (and so, in the end,
    stopping for nothing)."""
    first = tables["h1"].step("h1", RESOURCES).held["agent:a1"]
    pg = PgConnection(pg_dsn)
    watcher = PgConnection(pg_dsn)
    outcome: list[StepResult] = []
    try:
        pg.execute("BEGIN")
        assert fenced_write(pg, "agent:a1", "h1", first.epoch, now=clock())
        clock.advance(1.0)
        stepping = threading.Thread(
            target=lambda: outcome.append(tables["h1"].step("h1", RESOURCES))
        )
        stepping.start()
        for _ in range(2_000):  # until the step waits on the row (bounded)
            waiting = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype IN"
                " ('tuple', 'transactionid')"
            ).fetchone()
            if waiting is not None and waiting[0] > 0:
                break
            threading.Event().wait(0.01)
        pg.execute("COMMIT")
        stepping.join(timeout=60)
    finally:
        pg.close()
        watcher.close()
    (result,) = outcome
    assert result.skipped == ()
    assert result.held["agent:a1"] == Held(first.epoch, clock() + LEASE_S)  # renewed


def test_a_clean_leave_hands_over_at_once(tables: dict[str, LeaseTable], clock: Clock) -> None:
    held = tables["h1"].step("h1", RESOURCES).held
    tables["h2"].heartbeat("h2")
    assert tables["h1"].release_all("h1") == tuple(sorted(RESOURCES))
    assert tables["h2"].live_hosts() == ("h2",)  # h1 is leaving
    taken = tables["h2"].step("h2", RESOURCES)  # no time has passed
    assert sorted(taken.taken) == sorted(RESOURCES)
    assert {r: h.epoch for r, h in taken.held.items()} == {r: h.epoch + 1 for r, h in held.items()}
    # h1 starts again: a host again, and the two share
    tables["h1"].heartbeat("h1")
    assert tables["h1"].live_hosts() == ("h1", "h2")
    check_spread(step_all(tables, rounds=2, hosts=("h1", "h2")), ("h1", "h2"))


def test_a_resource_no_longer_named_is_released(
    tables: dict[str, LeaseTable], clock: Clock
) -> None:
    tables["h1"].step("h1", ["agent:a0", "agent:a1"])
    result = tables["h1"].step("h1", ["agent:a0"])
    assert result.released == ("agent:a1",) and sorted(result.held) == ["agent:a0"]
    assert tables["h2"].step("h2", ["agent:a1"]).taken == ("agent:a1",)


def test_the_holder_lets_go_inside_the_step_before_another_can_take(
    tables: dict[str, LeaseTable], clock: Clock
) -> None:
    """``before_release`` runs with the rows still locked: another host's step meanwhile skips
    them, so the holder has stopped acting before anyone else can start; if it raises, nothing
    is released."""
    tables["h1"].step("h1", RESOURCES)
    tables["h2"].heartbeat("h2")
    seen: list[tuple[str, ...]] = []

    def refuse(names: tuple[str, ...]) -> None:
        raise RuntimeError("not stopped")

    with pytest.raises(RuntimeError):
        tables["h1"].step("h1", RESOURCES, before_release=refuse)
    assert set(holders(tables["h1"], clock.t).values()) == {"h1"}  # rolled back: all still held

    others: list[StepResult] = []
    other = threading.Thread(target=lambda: others.append(tables["h2"].step("h2", RESOURCES)))

    def meanwhile(names: tuple[str, ...]) -> None:
        seen.append(names)
        # another host sees them held, and its step cannot take them until this one commits
        assert {tables["h2"].leases(names)[r].holder for r in names} == {"h1"}
        other.start()
        other.join(0.3)
        assert other.is_alive() or others[0].taken == ()

    result = tables["h1"].step("h1", RESOURCES, before_release=meanwhile)
    other.join(30)
    assert seen == [result.released] and result.released
    assert set(others[0].taken) == set(result.released)


def test_a_step_names_at_most_max_resources(tables: dict[str, LeaseTable]) -> None:
    many = [f"agent:{i:05}" for i in range(MAX_RESOURCES)]
    assert len(tables["h1"].step("h1", many + many[:10]).held) == MAX_RESOURCES
    with pytest.raises(ValueError, match=f"more than {MAX_RESOURCES}"):
        tables["h2"].step("h2", [*many, "agent:one-more"])
    with pytest.raises(ValueError, match="non-empty"):
        tables["h2"].step("h2", [""])
    with pytest.raises(ValueError, match="lease_s"):
        LeaseTable("postgresql://unused", lease_s=0)


def test_expiry_on_the_database_clock(pg_dsn: str) -> None:
    """No clock given: every time is the database's, whatever the hosts' clocks say."""
    with LeaseTable(pg_dsn, lease_s=1.0) as t1, LeaseTable(pg_dsn, lease_s=1.0) as t2:
        first = t1.step("h1", ["agent:a0"])
        held = first.held["agent:a0"]
        assert held.epoch == 1 and held.expires_at == pytest.approx(first.now + 1.0)
        assert first.now <= t2.now()
        assert t2.step("h2", ["agent:a0"]).held == {}  # not before it expires
        for _ in range(400):  # bounded: the lease is one second long
            if t2.now() >= held.expires_at:
                break
            threading.Event().wait(0.01)
        else:  # pragma: no cover
            pytest.fail("the database's clock did not pass the lease's expiry")
        taken = t2.step("h2", ["agent:a0"])
        assert taken.held["agent:a0"].epoch == 2
        assert taken.now >= held.expires_at
        pg = PgConnection(pg_dsn)
        try:
            pg.execute("BEGIN")
            assert not fenced_write(pg, "agent:a0", "h1", 1)
            assert fenced_write(pg, "agent:a0", "h2", 2, now=taken.now)
            pg.execute("ROLLBACK")
        finally:
            pg.close()
        assert t1.step("h1", ["agent:a0"]).lost == ("agent:a0",)


def test_hosts_stepping_at_once_never_both_hold_a_resource(pg_dsn: str) -> None:
    lease_s = 1.0
    clock = TickingClock(lease_s)
    steps = 50
    lock = threading.Lock()
    epoch_holder: dict[tuple[str, int], str] = {}  # (resource, epoch) -> its only holder
    # (resource, epoch) -> [from, until]: when its holder may act for it
    spans: dict[tuple[str, int], list[float]] = {}
    errors: list[BaseException] = []
    last: dict[str, StepResult] = {}
    start = threading.Barrier(len(HOSTS))

    def record(host: str, before: Mapping[str, Held], result: StepResult) -> None:
        with lock:
            for resource in result.released:
                span = spans[resource, before[resource].epoch]
                span[1] = min(span[1], result.now)
            for resource, held in result.held.items():
                assert epoch_holder.setdefault((resource, held.epoch), host) == host
                span = spans.setdefault((resource, held.epoch), [result.now, held.expires_at])
                span[1] = max(span[1], held.expires_at)

    def check_table(table: LeaseTable, seen: dict[str, int]) -> None:
        for resource, lease in table.leases().items():
            assert lease.epoch >= seen.get(resource, 0)  # epochs only grow
            seen[resource] = lease.epoch
            if lease.holder is not None:
                with lock:
                    key = (resource, lease.epoch)
                    assert epoch_holder.setdefault(key, lease.holder) == lease.holder

    def host_thread(host: str) -> None:
        try:
            with LeaseTable(pg_dsn, lease_s=lease_s, clock=clock) as table:
                seen: dict[str, int] = {}
                before: Mapping[str, Held] = {}
                start.wait()
                for _ in range(steps):
                    result = table.step(host, RESOURCES)
                    record(host, before, result)
                    check_table(table, seen)
                    before = result.held
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=host_thread, args=(h,)) for h in HOSTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    # never two at once: each resource's epochs follow one another, none overlapping
    for resource in RESOURCES:
        epochs = sorted(e for r, e in spans if r == resource)
        for a, b in itertools.pairwise(epochs):
            assert spans[resource, a][1] <= spans[resource, b][0], (resource, a, b)
    assert max(e for _, e in spans) > 2  # leases did expire and were taken again
    # the clock stops jumping: a few calm rounds spread everything evenly
    clock.ticking = False
    with LeaseTable(pg_dsn, lease_s=lease_s, clock=clock) as table:
        for _ in range(3):
            for host in HOSTS:
                last[host] = table.step(host, RESOURCES)
        check_spread(last, HOSTS)
        assert {r: h for h in HOSTS for r in last[h].held} == holders(table, clock())
