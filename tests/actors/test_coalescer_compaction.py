"""The CoalescerActor over a real SQLite store: the journal is compacted on a count of records
(snapshot, then a trim), stays bounded, replays to the same state, survives a stop between the
snapshot and the trim, and every ``Audit`` effect becomes one ``coalesce-audit`` trace event.

The clock is trio's MockClock without autojump: the store's writer thread commits in real time,
and an autojumping clock would jump to an ask's deadline while a commit is in progress. Nothing
here waits on time, so a clock that never moves fires no deadline and the runs are exact.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.channel import coalescer as coalescer_module
from actors.channel.coalescer import STREAM, Admit, Assembled, CoalescerActor
from actors.config import AgentConfig, HostConfig, ServerConfig
from actors.context import HostContext
from actors.kernel import ActorRef, Work
from actors.storage import DB_NAME, StoreClient
from actors.trace import TraceBus, TraceEvent
from protocol.coalesce import Coalescer, CoalesceSpec, Step
from store import MessageRecord, Reader, TrimJournal

SERVER = "s1"
AGENT = "Ada"
EVERY = 8  # a small compaction threshold, so a test crosses it many times


def run(fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=trio.testing.MockClock())


@attrs.define
class Running:
    actor: CoalescerActor
    ref: ActorRef[Any]
    ctx: HostContext
    trace: trio.MemoryReceiveChannel[TraceEvent]

    @property
    def binding(self) -> str:
        return self.ctx.binding(SERVER)

    async def admit(self, event_id: str, key: str, **mode: Any) -> Step:
        """One coalesced push, answered once its write is durable."""
        retract = bool(mode.get("retract"))
        spec = CoalesceSpec(lane="push", key=key, event_id=event_id, **mode)
        occurrence = f"occ-{event_id}"
        record = MessageRecord(
            id=occurrence,
            agent=AGENT,
            role="user",
            blocks=({"type": "text", "text": f"text of {event_id}"},),
            metadata={"event_id": event_id},
            created_at=1.0,
        )
        step, future = await self.ref.ask(
            Admit(
                spec=spec,
                binding=self.binding,
                occurrence=occurrence,
                contexts=(AGENT,),
                records=(record,),
                dedupe=("event", SERVER, event_id),
                feature_set="chat",
                content=() if retract else ({"type": "text", "text": event_id},),
            ),
            timeout=60,
        )
        await future.wait()
        assert isinstance(step, Step)
        return step

    async def read(self, event_id: str) -> None:
        """The agent's request included this occurrence."""
        await self.ref.ask(Assembled(context=AGENT, occurrences=(f"occ-{event_id}",)), timeout=60)

    async def sync(self) -> None:
        """Every step asked before (its compaction included) is over: the actor handles one
        message at a time, and this one journals nothing."""
        await self.ref.ask(Assembled(context=AGENT, occurrences=()), timeout=60)

    def rows(self) -> list[tuple[int, dict[str, Any]]]:
        return self.ctx.store.reader.journal(STREAM)

    def events(self, kind: str) -> list[TraceEvent]:
        out = []
        while True:
            try:
                event = self.trace.receive_nowait()
            except trio.WouldBlock:
                return out
            if event.kind == kind:
                out.append(event)


def host_config(base: Path) -> HostConfig:
    return HostConfig(
        data_dir=base / "data",
        servers=(ServerConfig(id=SERVER, command=("unused",)),),
        agents=(AgentConfig(name=AGENT, model="scripted:unused"),),
        base_dir=base,
    )


@asynccontextmanager
async def coalescer(base: Path, every: int = EVERY) -> AsyncIterator[Running]:
    cfg = host_config(base)
    work = Work()
    store = StoreClient(cfg.data_dir, work)
    store.start()
    trace = TraceBus()
    ctx = HostContext(cfg, store, trace, work)
    ids = itertools.count()
    actor = CoalescerActor(ctx, lambda: f"marker-{next(ids)}")
    actor.compact_every = every
    events = trace.subscribe_nowait(kinds=frozenset({"coalesce-audit", "coalesce-compacted"}))
    try:
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            yield Running(actor, ref, ctx, events)
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


async def workload(co: Running, n: int, answers: dict[str, dict[str, str]]) -> None:
    """``n`` transitions over five subjects: admissions, reads and retractions, each checked
    against the bound once it is over."""
    for i in range(n):
        event_id = f"e{i}"
        key = f"K{i % 5}"
        if i % 7 == 6:
            step = await co.admit(event_id, key, retract=True)
        else:
            step = await co.admit(event_id, key, initial=i < 5)
        answers[event_id] = step.result()
        if i % 3 == 0:
            await co.read(event_id)
        await co.sync()
        assert len(co.rows()) <= co.actor.compact_every + 1


def test_the_journal_stays_bounded_and_replays_to_the_same_state(tmp_path: Path) -> None:
    answers: dict[str, dict[str, str]] = {}

    async def main() -> None:
        async with coalescer(tmp_path) as co:
            await workload(co, 120, answers)
            compactions = co.events("coalesce-compacted")
            assert len(compactions) >= 10 and all("seq" in e.data for e in compactions)
            rows = co.rows()
            assert rows[0][1]["op"] == "snapshot"
            # the store alone rebuilds exactly the state the running coalescer holds
            replayed = Coalescer.replay(record for _, record in rows)
            assert replayed.snapshot() == co.actor.co.snapshot()
            subjects = co.actor.co.subjects()
        async with coalescer(tmp_path) as again:
            assert again.actor.co.subjects() == subjects
            for event_id, answer in answers.items():
                i = int(event_id[1:])
                mode: dict[str, Any] = {"retract": True} if i % 7 == 6 else {"initial": i < 5}
                retry = await again.admit(event_id, f"K{i % 5}", **mode)
                assert retry.duplicate and retry.result() == answer

    run(main)


@pytest.mark.parametrize("extra", [0, 1])
def test_compaction_starts_past_the_cap_and_not_at_it(tmp_path: Path, extra: int) -> None:
    """Exactly ``EVERY`` records since the latest snapshot: nothing happens. One more: the
    journal is one snapshot. The same again after that snapshot."""

    async def main() -> None:
        async with coalescer(tmp_path) as co:
            assert [r["op"] for _, r in co.rows()] == ["advertise"]
            for round_ in range(2):
                have = len(co.rows()) - round_  # records besides the snapshot of round 1
                for i in range(EVERY - have):
                    await co.admit(f"r{round_}.{i}", f"K{round_}.{i}", initial=True)
                await co.sync()
                assert len(co.rows()) == EVERY + round_  # exactly at the cap
                assert co.events("coalesce-compacted") == []
                if extra:
                    await co.admit(f"r{round_}.last", f"K{round_}.last", initial=True)
                    await co.sync()
                    [row] = co.rows()
                    assert row[1]["op"] == "snapshot"
                    assert len(co.events("coalesce-compacted")) == 1
                    assert Coalescer.replay([row[1]]).snapshot() == co.actor.co.snapshot()
                else:
                    break

    run(main)


@pytest.mark.parametrize("long", [False, True])
def test_a_long_journal_is_compacted_at_start_up(tmp_path: Path, long: bool) -> None:
    """On start a journal with more than ``EVERY`` records besides its snapshot (counting the
    ``advertise`` and ``recover`` records the start adds) is compacted; one at the cap is not."""
    # the first run journals advertise + n admissions; the second adds advertise + recover
    n = EVERY - 3 + (1 if long else 0)

    async def main() -> None:
        async with coalescer(tmp_path, every=10**9) as co:
            for i in range(n):
                await co.admit(f"e{i}", f"K{i}", initial=True)
        async with coalescer(tmp_path) as co:
            rows = co.rows()
            if long:
                assert [r["op"] for _, r in rows] == ["snapshot"]
            else:
                assert len(rows) == EVERY and "snapshot" not in [r["op"] for _, r in rows]
            replayed = Coalescer.replay(record for _, record in rows)
            assert replayed.snapshot() == co.actor.co.snapshot()

    run(main)


class Stop(Exception):
    """The host stops right there (the trim is never submitted)."""


def test_a_stop_between_the_snapshot_and_the_trim_loses_and_duplicates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first compaction's trim is never applied: the store holds the older rows and the
    snapshot after them, which replay to the state the coalescer had; the restarted coalescer
    answers every retry as before, stores nothing twice, and compacts the long journal."""
    answers: dict[str, dict[str, str]] = {}

    def no_trim(**kwargs: Any) -> TrimJournal:
        raise Stop

    async def main() -> None:
        with monkeypatch.context() as patch:
            patch.setattr(coalescer_module, "TrimJournal", no_trim)
            async with coalescer(tmp_path) as co:
                for i in range(EVERY):
                    step = await co.admit(f"e{i}", f"K{i % 3}", initial=True)
                    answers[f"e{i}"] = step.result()
                await co.sync()  # the compaction ran into the stop
                live = co.actor.co.snapshot()
                assert co.events("coalesce-compacted") == []  # it never finished
        with Reader(tmp_path / "data" / DB_NAME) as reader:
            rows = reader.journal(STREAM)
        assert [r["op"] for _, r in rows] == ["advertise", *["plain"] * EVERY, "snapshot"]
        before = [r for _, r in rows[:-1]]
        assert Coalescer.replay(before).snapshot() == live
        assert Coalescer.replay(r for _, r in rows).snapshot() == live
        async with coalescer(tmp_path) as co:
            assert [r["op"] for _, r in co.rows()] == ["snapshot"]
            for i in range(EVERY):
                retry = await co.admit(f"e{i}", f"K{i % 3}", initial=True)
                assert retry.duplicate and retry.result() == answers[f"e{i}"]
            history = co.ctx.store.reader.history(AGENT)
            stored = [m["metadata"]["event_id"] for m in history if "event_id" in m["metadata"]]
            assert sorted(stored) == sorted(answers)  # each once, none lost

    run(main)


def test_recovery_audits_what_it_seals(tmp_path: Path) -> None:
    """What was unread at a restart is kept as an ordinary item: one audit event each."""

    async def main() -> None:
        async with coalescer(tmp_path) as co:
            await co.admit("e0", "K0", initial=True)
            await co.admit("e1", "K1", initial=True)
            await co.read("e1")
        async with coalescer(tmp_path) as co:
            [sealed] = co.events("coalesce-audit")
        assert (sealed.server_id, sealed.channel_id) == (SERVER, None)
        assert sealed.data["kind"] == "sealed" and sealed.data["event_ids"] == ["e0"]
        assert (sealed.data["key"], sealed.data["feature_set"]) == ("K0", "chat")

    run(main)
