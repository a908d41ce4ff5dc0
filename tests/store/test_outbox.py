"""The fleet's outbox on a real PostgreSQL (:mod:`store.outbox`): an agent's host puts under the
agent's lease, the server's holder claims under the server's, finishes, and the outcome is read
back. A put is idempotent by key; a stale fence puts or claims nothing; a holder that took the
server over claims its predecessor's unfinished rows again, and the predecessor's late finish
records nothing; two claimers at once never claim one row; a server's outbox is bounded; the
notifications arrive at commit, and never for a refused put.

The lease tables and the outboxes share one clock the test moves: expiry needs no waiting."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from protocol.outbox import claimable
from store import Database, Fence, StaleFence
from store import outbox as outbox_module
from store.leases import LeaseTable
from store.outbox import (
    NOTIFY_DONE,
    NOTIFY_QUEUED,
    Outbox,
    OutboxEntry,
    OutboxFull,
    OutboxRow,
)

from .conftest import run_sql

ADA = "agent:Ada"
LOBBY = "server:lobby"
LEASE_S = 10.0


class Clock:
    """The tables' clock, set by the test."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


class Fleet:
    """Two hosts over the store at ``dsn``: each a lease table and an outbox."""

    def __init__(self, dsn: str) -> None:
        Database(dsn).close()
        self.dsn = dsn
        self.clock = Clock()
        self.leases = {h: LeaseTable(dsn, lease_s=LEASE_S, clock=self.clock) for h in ("h1", "h2")}
        self.boxes = {h: Outbox(dsn, clock=self.clock) for h in ("h1", "h2")}
        self.wanted: dict[str, set[str]] = {"h1": set(), "h2": set()}

    def take(self, host: str, resource: str) -> Fence:
        """``host`` steps for ``resource`` too (and what it took before): its fence for it."""
        self.wanted[host].add(resource)
        held = self.leases[host].step(host, self.wanted[host]).held[resource]
        return Fence(resource, host, held.epoch)

    def close(self) -> None:
        for table in self.leases.values():
            table.close()
        for box in self.boxes.values():
            box.close()


@pytest.fixture
def fleet(pg_dsn: str) -> Iterator[Fleet]:
    fleet = Fleet(pg_dsn)
    try:
        yield fleet
    finally:
        fleet.close()


def entry(key: str, server: str = "lobby", text: str = "hello") -> OutboxEntry:
    return OutboxEntry(
        server_id=server,
        channel_id="general",
        thread_id=None,
        agent="Ada",
        key=key,
        blocks=({"type": "text", "text": text},),
        prose=True,
    )


def count(dsn: str) -> int:
    return int(run_sql(dsn, "SELECT count(*) FROM outbox")[0][0])


def test_the_schema_is_a_migration_of_the_store(fleet: Fleet) -> None:
    columns = run_sql(
        fleet.dsn,
        "SELECT column_name, data_type, collation_name FROM information_schema.columns"
        " WHERE table_name = 'outbox' ORDER BY ordinal_position",
    )
    assert [c[0] for c in columns] == [
        "id",
        "server_id",
        "channel_id",
        "thread_id",
        "agent",
        "key",
        "blocks",
        "prose",
        "created_at",
        "state",
        "claimed_by",
        "claim_epoch",
        "outcome",
        "finished_at",
    ]
    assert {c[0] for c in columns if c[2] == "C"} >= {"server_id", "agent", "key", "claimed_by"}
    indexes = {r[0] for r in run_sql(fleet.dsn, "SELECT indexname FROM pg_indexes")}
    assert "outbox_claim" in indexes


def test_put_claim_finish_and_read_the_outcome(fleet: Fleet) -> None:
    ada = fleet.take("h1", ADA)
    lobby = fleet.take("h2", LOBBY)
    agent_side, server_side = fleet.boxes["h1"], fleet.boxes["h2"]
    threaded = OutboxEntry(
        server_id="lobby",
        channel_id="general",
        thread_id="t\x001",
        agent="Ada",
        key="k2",
        blocks=[{"type": "text", "text": "a\x00b \ud800 é"}],
        prose=False,
    )
    first = agent_side.put(entry("k1"), ada)
    second = agent_side.put(threaded, ada)
    assert second > first
    assert agent_side.outcomes([first, second, 10_000]) == {first: None, second: None}

    rows = server_side.claim("lobby", "h2", lobby.epoch)
    assert rows == [
        OutboxRow(first, entry("k1"), 1_000.0, "h2", lobby.epoch),
        OutboxRow(second, threaded, 1_000.0, "h2", lobby.epoch),
    ]
    assert server_side.claim("lobby", "h2", lobby.epoch) == []  # its own claims stay its own

    fleet.clock.t += 1
    assert server_side.finish(first, {"message_id": "m1"}, "h2", lobby.epoch)
    assert not server_side.finish(first, {"message_id": "again"}, "h2", lobby.epoch)  # done
    assert agent_side.outcomes([first, second]) == {first: {"message_id": "m1"}, second: None}
    assert run_sql(fleet.dsn, "SELECT state, finished_at FROM outbox WHERE id = ?", (first,)) == [
        ("done", 1_001.0)
    ]


def test_a_claim_for_a_server_it_does_not_hold_raises(fleet: Fleet) -> None:
    fleet.take("h2", LOBBY)
    with pytest.raises(StaleFence):
        fleet.boxes["h2"].claim("other", "h2", 1)


def test_a_put_is_idempotent_by_key(fleet: Fleet) -> None:
    ada = fleet.take("h1", ADA)
    box = fleet.boxes["h1"]
    first = box.put(entry("k1"), ada)
    assert box.put(entry("k1", text="said again"), ada) == first
    assert fleet.boxes["h2"].put(entry("k1"), ada) == first
    assert count(fleet.dsn) == 1


def test_a_put_under_a_stale_agent_fence_raises_and_puts_nothing(fleet: Fleet) -> None:
    old = fleet.take("h1", ADA)
    fleet.clock.t += LEASE_S + 1  # h1's lease expired: h2 takes Ada under a newer epoch
    new = fleet.take("h2", ADA)
    assert new.epoch == old.epoch + 1
    with pytest.raises(StaleFence) as raised:
        fleet.boxes["h1"].put(entry("k1"), old)
    assert (raised.value.resource, raised.value.epoch) == (ADA, old.epoch)
    assert count(fleet.dsn) == 0
    with pytest.raises(StaleFence):  # a fence past its expiry, not taken over
        fleet.boxes["h2"].put(entry("k2"), Fence(ADA, "h2", new.epoch + 1))
    assert count(fleet.dsn) == 0
    assert fleet.boxes["h2"].put(entry("k1"), new) > 0


def test_a_claim_under_a_stale_server_fence_raises_and_claims_nothing(fleet: Fleet) -> None:
    ada = fleet.take("h1", ADA)
    old = fleet.take("h1", LOBBY)
    fleet.boxes["h1"].put(entry("k1"), ada)
    fleet.clock.t += LEASE_S + 1
    fleet.take("h2", LOBBY)
    with pytest.raises(StaleFence):
        fleet.boxes["h1"].claim("lobby", "h1", old.epoch)
    assert run_sql(fleet.dsn, "SELECT state, claimed_by FROM outbox") == [("queued", None)]


def test_a_holder_taking_over_claims_the_unfinished_rows_and_the_old_finish_is_refused(
    fleet: Fleet,
) -> None:
    ada = fleet.take("h1", ADA)
    old = fleet.take("h1", LOBBY)
    box1, box2 = fleet.boxes["h1"], fleet.boxes["h2"]
    ids = [box1.put(entry(f"k{i}"), ada) for i in range(3)]
    claimed = box1.claim("lobby", "h1", old.epoch)
    assert [r.id for r in claimed] == ids
    assert box1.finish(ids[0], {"ok": True}, "h1", old.epoch)

    fleet.clock.t += LEASE_S + 1  # h1 stops renewing; h2 takes the server over
    new = fleet.take("h2", LOBBY)
    assert new.epoch == old.epoch + 1
    again = box2.claim("lobby", "h2", new.epoch)
    assert [(r.id, r.entry.key, r.claimed_by, r.claim_epoch) for r in again] == [
        (ids[1], "k1", "h2", new.epoch),
        (ids[2], "k2", "h2", new.epoch),
    ]

    before = run_sql(fleet.dsn, "SELECT * FROM outbox ORDER BY id")
    assert not box1.finish(ids[1], {"late": True}, "h1", old.epoch)  # a stale fence
    fleet.clock.t -= LEASE_S + 1  # even while h1's old lease looks unexpired to it
    assert not box1.finish(ids[2], {"late": True}, "h1", old.epoch)  # no longer its claim
    fleet.clock.t += LEASE_S + 1
    assert run_sql(fleet.dsn, "SELECT * FROM outbox ORDER BY id") == before

    assert box2.finish(ids[1], {"by": "h2"}, "h2", new.epoch)
    assert box1.outcomes(ids) == {ids[0]: {"ok": True}, ids[1]: {"by": "h2"}, ids[2]: None}


def test_two_claimers_at_once_never_claim_one_row(fleet: Fleet) -> None:
    ada = fleet.take("h1", ADA)
    lobby = fleet.take("h2", LOBBY)
    ids = {fleet.boxes["h1"].put(entry(f"k{i}"), ada) for i in range(300)}
    got: dict[int, list[int]] = {0: [], 1: []}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def claim(worker: int) -> None:
        try:
            with Outbox(fleet.dsn, clock=fleet.clock) as box:
                start.wait()
                while rows := box.claim("lobby", "h2", lobby.epoch, limit=7):
                    got[worker] += [r.id for r in rows]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert set(got[0]) & set(got[1]) == set()
    assert len(got[0]) + len(got[1]) == len(ids)
    assert set(got[0]) | set(got[1]) == ids


def test_the_claim_in_sql_is_the_pure_rule(fleet: Fleet) -> None:
    ada = fleet.take("h1", ADA)
    lobby = fleet.take("h2", LOBBY)
    cases = [
        ("queued", None, None),
        ("done", "h2", lobby.epoch - 1),
        *(
            ("claimed", by, at)
            for by in ("h1", "h2")
            for at in (lobby.epoch - 1, lobby.epoch, lobby.epoch + 1)
        ),
    ]
    expected = set()
    for i, (state, by, at) in enumerate(cases):
        row = fleet.boxes["h1"].put(entry(f"k{i}"), ada)
        run_sql(
            fleet.dsn,
            "UPDATE outbox SET state = ?, claimed_by = ?, claim_epoch = ? WHERE id = ?",
            (state, by, at, row),
        )
        if claimable(state, by, at, "h2", lobby.epoch):
            expected.add(row)
    claimed = {r.id for r in fleet.boxes["h2"].claim("lobby", "h2", lobby.epoch, limit=100)}
    assert claimed == expected
    assert len(expected) == 4  # queued, an older epoch's two, another holder's at this epoch


def test_a_full_outbox_refuses_a_put_naming_the_server(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "MAX_QUEUED", 3)
    ada = fleet.take("h1", ADA)
    lobby = fleet.take("h2", LOBBY)
    box = fleet.boxes["h1"]
    ids = [box.put(entry(f"k{i}"), ada) for i in range(3)]
    with pytest.raises(OutboxFull, match="'lobby'"):
        box.put(entry("k3"), ada)
    assert count(fleet.dsn) == 3
    assert box.put(entry("k0"), ada) == ids[0]  # a key already put is no new row
    box.put(entry("x0", server="other"), ada)  # each server has its own bound

    claimed = fleet.boxes["h2"].claim("lobby", "h2", lobby.epoch)  # claimed rows still count
    with pytest.raises(OutboxFull):
        box.put(entry("k3"), ada)
    assert fleet.boxes["h2"].finish(claimed[0].id, {}, "h2", lobby.epoch)
    assert box.put(entry("k3"), ada) > ids[-1]


def test_blocks_past_the_bound_are_refused(fleet: Fleet) -> None:
    ada = fleet.take("h1", ADA)
    with pytest.raises(ValueError, match="bytes"):
        fleet.boxes["h1"].put(entry("k1", text="x" * 256 * 1024), ada)
    with pytest.raises(ValueError, match="JSON"):
        fleet.boxes["h1"].put(entry("k1", text=float("nan")), ada)  # type: ignore[arg-type]
    assert count(fleet.dsn) == 0


def test_prune_deletes_done_rows_kept_past_their_time(fleet: Fleet) -> None:
    ada = fleet.take("h1", ADA)
    lobby = fleet.take("h2", LOBBY)
    box = fleet.boxes["h2"]
    ids = [fleet.boxes["h1"].put(entry(f"k{i}"), ada) for i in range(3)]
    box.claim("lobby", "h2", lobby.epoch)
    assert box.finish(ids[0], {"n": 0}, "h2", lobby.epoch)
    fleet.clock.t += 5
    assert box.finish(ids[1], {"n": 1}, "h2", lobby.epoch)
    fleet.clock.t += 3
    assert box.prune(4.0) == 1
    assert box.outcomes(ids) == {ids[1]: {"n": 1}, ids[2]: None}
    fleet.clock.t += 3_600
    assert box.prune() == 1
    assert box.outcomes(ids) == {ids[2]: None}  # not done: never pruned


def test_listeners_hear_a_put_and_a_finish_at_commit_and_nothing_for_a_refused_put(
    fleet: Fleet,
) -> None:
    ada = fleet.take("h1", ADA)
    lobby = fleet.take("h2", LOBBY)
    with psycopg.connect(fleet.dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_QUEUED}")
        listener.execute(f"LISTEN {NOTIFY_DONE}")
        with pytest.raises(StaleFence):
            fleet.boxes["h1"].put(entry("k0", server="refused"), Fence(ADA, "h1", 99))
        row = fleet.boxes["h1"].put(entry("k1"), ada)
        heard = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in heard] == [(NOTIFY_QUEUED, "lobby")]

        fleet.boxes["h1"].put(entry("k1"), ada)  # already put: no new row, no notification
        fleet.boxes["h2"].claim("lobby", "h2", lobby.epoch)
        assert fleet.boxes["h2"].finish(row, {"ok": True}, "h2", lobby.epoch)
        heard = list(listener.notifies(timeout=10, stop_after=1))
        assert [(n.channel, n.payload) for n in heard] == [(NOTIFY_DONE, str(row))]
