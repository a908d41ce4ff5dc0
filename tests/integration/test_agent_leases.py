"""Agents are leased on a PostgreSQL store: two hosts on one database run each agent on exactly
one of them, spread evenly; a host that stops cleanly hands its agents to the other at its next
step; and the turn log never shows one agent turning on both hosts at once. On the embedded
store there is no keeper: every agent runs on its one host."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.host import Host
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from protocol.leases import SAFETY_S, fair_share
from store.leases import LeaseTable, StepResult
from tests.helpers import agent_configs, config, texts

pytestmark = pytest.mark.slow

AGENTS = ("Ada", "Grace", "Linus")
PONG = '[[rules]]\nwhen = "ping (\\\\d+)"\nsay = "pong {1}"\n'
LOGGED = frozenset({"turn-start", "turn-end", "turn-aborted", "agent-lease"})


def host_config(tmp_path: Path, host_id: str, store: str | None) -> dict[str, Any]:
    cfg = config(tmp_path / host_id, [], agent_configs(tmp_path, dict.fromkeys(AGENTS, PONG)))
    cfg["host"]["host_id"] = host_id
    if store is not None:
        cfg["host"]["store"] = store
    return cfg


class RunningHost:
    """A host run in a task of its own (so that hosts opened one after the other can stop in
    any order); its turn and lease events are appended to ``log`` with its id."""

    def __init__(self, cfg: dict[str, Any], log: list[tuple[str, TraceEvent]]) -> None:
        self.cfg = cfg
        self.log = log
        self.stop = trio.Event()
        self.stopped = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with Host.open(self.cfg, status_file=False) as host, trio.open_nursery() as n:
                stream = host.trace(kinds=LOGGED)

                async def read() -> None:
                    async for event in stream:
                        self.log.append((host.ctx.host_id, event))

                n.start_soon(read)
                task_status.started(host)
                await self.stop.wait()
                await stream.aclose()
                n.cancel_scope.cancel()
        finally:
            self.stopped.set()

    async def close(self) -> None:
        """A clean stop, awaited."""
        self.stop.set()
        await self.stopped.wait()


def partitioned(hosts: list[Host]) -> bool:
    """Every agent runs on exactly one of ``hosts``, each holding at most its fair share."""
    running = [name for host in hosts for name in host.ctx.agents]
    share = fair_share(len(AGENTS), len(hosts))
    return sorted(running) == sorted(AGENTS) and all(len(h.ctx.agents) <= share for h in hosts)


async def step_until(hosts: list[Host], rounds: int = 10) -> None:
    """Every host steps its leases, round after round, until the agents are partitioned."""
    for _ in range(rounds):
        for host in hosts:
            assert host.lease_keeper is not None
            assert await host.lease_keeper.step_now() is not None
        if partitioned(hosts):
            return
    raise AssertionError({h.ctx.host_id: sorted(h.ctx.agents) for h in hosts})


async def ping_all(hosts: list[Host], n: int, agents: Iterable[str]) -> None:
    for name in agents:
        [holder] = [h for h in hosts if name in h.ctx.agents]
        await holder.post_local(name, f"ping {n}")
    for host in hosts:
        await host.run_until_idle()


def turns(log: list[tuple[str, TraceEvent]]) -> dict[str, list[tuple[str, float, float]]]:
    """Each agent's turns, as (host, start, end); a turn still open ends with its host's stop of
    the agent (an ``agent-lease`` move), or never (infinity)."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    open_: dict[tuple[str, str], float] = {}
    for host, e in log:
        assert e.agent is not None
        key = (host, e.agent)
        if e.kind == "turn-start":
            assert key not in open_
            assert e.data["host_id"] == host and isinstance(e.data["epoch"], int)
            open_[key] = e.ts
        elif e.kind != "agent-lease" or e.data["state"] == "moved":
            if key in open_:
                out.setdefault(e.agent, []).append((host, open_.pop(key), e.ts))
    for (host, agent), start in open_.items():
        out.setdefault(agent, []).append((host, start, float("inf")))
    return out


async def test_two_hosts_share_the_agents_and_one_leaving_hands_them_over(
    tmp_path: Path, pg_dsn: str
) -> None:
    log: list[tuple[str, TraceEvent]] = []
    first = RunningHost(host_config(tmp_path, "host-a", pg_dsn), log)
    second = RunningHost(host_config(tmp_path, "host-b", pg_dsn), log)
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            a = await nursery.start(first.run)
            # the first host alone takes every agent at its first step
            assert sorted(a.ctx.agents) == sorted(AGENTS)
            b = await nursery.start(second.run)
            await step_until([a, b])
            assert a.ctx.agents and b.ctx.agents
            for host in (a, b):
                assert sorted(host.ctx.lease_epochs) == sorted(host.ctx.agents)
                assert host.lease_keeper is not None
                assert host.lease_keeper.running == host.ctx.lease_epochs
            kept, moved = sorted(a.ctx.agents), sorted(b.ctx.agents)
            # an agent held elsewhere is not here: the Python API says so
            with pytest.raises(KeyError, match="does not run on this host"):
                await a.post_local(moved[0], "ping 0")
            # (only the first host writes until it stops: two hosts writing messages at once
            # wait for seqs the database gives out)
            await ping_all([a], 1, kept)

            await first.close()  # a clean stop: its leases are released at once
            assert b.lease_keeper is not None
            await b.lease_keeper.step_now()
            assert sorted(b.ctx.agents) == sorted(AGENTS)
            await ping_all([b], 2, AGENTS)
            for name in AGENTS:  # each goes on with its history, wherever it ran before
                history = b.history(name)
                pings = [1, 2] if name in kept else [2]
                assert texts(history, "user") == [f"ping {n}" for n in pings]
                assert texts(history, "assistant") == [f"pong {n}" for n in pings]
            await second.close()

    # the turn log: every agent turned once per ping, never on both hosts at once
    by_agent = turns(log)
    assert sorted(by_agent) == sorted(AGENTS)
    for name, spans in by_agent.items():
        assert len(spans) == (2 if name in kept else 1), spans
        for i, (host, start, end) in enumerate(spans):
            for other, start2, end2 in spans[i + 1 :]:
                assert host == other or end <= start2 or end2 <= start, (name, spans)
    # the lease moves are traced, and read as lines
    leases = [(host, e) for host, e in log if e.kind == "agent-lease"]
    runs = [format_event(e) for host, e in leases if host == "host-b" and e.data["state"] == "runs"]
    assert f"· {moved[0]} runs here (lease epoch 2)" in runs
    assert f"· {kept[0]} runs here (lease epoch 2)" in runs  # taken when the first host left
    handed = [
        format_event(e) for host, e in leases if host == "host-a" and e.data["state"] == "moved"
    ]
    assert handed == [
        f"· {name} moved: its lease was handed on (the work is spread over the hosts)"
        for name in moved
    ]


class Unreachable:
    """A lease table whose first step works (with a short lease) and whose later steps fail,
    as when the database can no longer be reached."""

    def __init__(self, dsn: str) -> None:
        self.table = LeaseTable(dsn, lease_s=SHORT_LEASE_S)
        self.steps = 0

    def step(self, *args: Any, **kwargs: Any) -> StepResult:
        self.steps += 1
        if self.steps > 1:
            raise OSError("the database cannot be reached")
        return self.table.step(*args, **kwargs)

    def release_all(self, host_id: str) -> tuple[str, ...]:
        return self.table.release_all(host_id)

    def close(self) -> None:
        self.table.close()

    def __enter__(self) -> Unreachable:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


SHORT_LEASE_S = SAFETY_S + 1.0


async def test_a_host_that_cannot_renew_stops_its_agents_before_their_leases_expire(
    tmp_path: Path, pg_dsn: str
) -> None:
    log: list[tuple[str, TraceEvent]] = []
    alone = RunningHost(host_config(tmp_path, "host-a", pg_dsn), log)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a = await nursery.start(alone.run)
            keeper = a.lease_keeper
            assert keeper is not None and sorted(a.ctx.agents) == sorted(AGENTS)
            async with keeper._lock:  # between two steps: the table is not in use
                keeper._make_table = lambda: Unreachable(pg_dsn)  # type: ignore[assignment,return-value]
                old, keeper._table = keeper._table, None
            if old is not None:
                await trio.to_thread.run_sync(old.close)
            stream = a.trace(kinds={"agent-lease", "error"})
            renewed = await keeper.step_now()  # renewed for SHORT_LEASE_S, and then no more
            assert renewed is not None and sorted(renewed.held) == [f"agent:{n}" for n in AGENTS]
            assert await keeper.step_now() is None  # fails: traced, nothing stopped yet
            moved, errors = 0, []
            async for event in stream:  # the watcher stops them SAFETY_S before the expiry
                if event.kind == "error":
                    errors.append(event.data["error"])
                    continue
                moved += event.data["state"] == "moved"
                if moved == len(AGENTS):
                    break
            assert a.ctx.agents == {}
            # (the keeper's own steps may have failed too meanwhile)
            assert errors and set(errors) == {
                "lease step failed: OSError: the database cannot be reached"
            }
            with LeaseTable(pg_dsn) as table:  # still theirs, and not yet expired
                now = table.now()
                leases = table.leases()
            assert {lease.holder for lease in leases.values()} == {"host-a"}
            assert all(now < lease.expires_at for lease in leases.values())
            assert a.ctx.lease_epochs == {} and keeper.running == {}
            await stream.aclose()
            await alone.close()
    moves = [format_event(e) for _, e in log if e.kind == "agent-lease"]
    assert moves[-3:] == [
        f"· {name} moved: its lease expired (not renewed in time)" for name in sorted(AGENTS)
    ]


async def test_on_the_embedded_store_every_agent_runs_at_once(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with Host.open(host_config(tmp_path, "solo", None), status_file=False) as host:
            assert host.lease_keeper is None and host.ctx.lease_epochs == {}
            assert sorted(host.ctx.agents) == sorted(AGENTS)
            await host.post_local("Ada", "ping 1")
            await host.run_until_idle()
            assert texts(host.history("Ada"), "assistant") == ["pong 1"]
