"""The fleet rows of the benchmark: what a second host adds on one PostgreSQL database, and how
long an agent is silent when the host running it is killed.

Every host runs in a process of its own (``python -m examples.bench.fleet HOST.json``: opens a
:class:`actors.Host` on the config, prints ``ready`` and runs until ``SIGTERM``), so two hosts
are two trio loops, as on a real fleet. The servers are toolkit chat servers
(:class:`examples.bench.room.OneRoom`) served over websockets by the measuring process; only
the holder of a server's lease (``server:<id>``) dials it, and an agent on the other host
speaks through the store's outbox.

**Throughput** (:func:`run_throughput`): ``agents`` agents, agent ``i`` hearing only server
``i``'s one channel, on ``hosts`` host processes (1 or 2). Once the leases are spread (each host
holds its fair share of agents and of servers, every channel accepted) and every agent answered
one line, every server sends ``lines`` lines one after the other, each once the answer to the
one before arrived (``q <n>`` answered ``a <n>``; the authors take turns, so the loop breaker
sees a conversation), all servers at once. The figure is the wall time from the first line to
the last answer. Where the leases put an agent on one host and its server's connection on the
other, its lines are woken by ``NOTIFY`` and its answers go through the outbox: the run says
how many agents were so placed.

**Failover** (:func:`run_failover`): one agent on one server, two host processes; the first to
step takes both leases (a fair share of one is one). After one answer and a pause drawn
anywhere in the renewal period (so the kill falls anywhere between two renewals), the holder
of the agent's lease is sent ``SIGKILL``; from then on the server posts a line every
:data:`POST_EVERY_S` (while no host is connected the post fails and is tried again at the next
tick) until the agent's answer arrives. The figure is the time from the kill to that answer,
against :data:`protocol.leases.LEASE_S`: the survivor takes the leases at its first step after
they expired (every :data:`protocol.leases.RENEW_S`), dials the server and starts the agent.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import trio

from actors import Host
from actors.serverkit import MCPLServer, Publish
from examples.bench import host as bh
from examples.bench.room import OneRoom
from protocol.leases import LEASE_S, RENEW_S, fair_share
from store.errors import StoreError
from store.leases import read_fleet

#: Each agent's scripted model answers ``q <n>`` with ``a <n>``.
ANSWERS = "[[rules]]\nwhen = 'q (\\d+)'\nsay = \"a {1}\"\n"
_ANSWER = re.compile(r"a (\d+)")
#: The people whose lines the servers send, in turn.
PEOPLE = ("alice", "bob", "carol")
#: A failover run posts a line this often until the agent answers.
POST_EVERY_S = 0.5
#: Bounds: the leases spreading, one answer, a host process stopping.
SETTLE_S = 90.0
ANSWER_S = 60.0
STOP_S = 20.0
_ROOT = Path(__file__).resolve().parents[2]


class Room(OneRoom):
    """One server with one channel; remembers when each answer ``a <n>`` arrived."""

    def __init__(self, server_id: str) -> None:
        super().__init__(MCPLServer(server_id, version="0"), f"{server_id}:#general")
        self.server_id = server_id
        self.answers: dict[int, float] = {}
        self.changed = trio.Event()
        self.room.on_publish(self._heard)

    def _heard(self, publish: Publish) -> None:
        match = _ANSWER.search(publish.text)
        if match is not None:
            self.answers.setdefault(int(match.group(1)), time.monotonic())
            self.changed.set()
            self.changed = trio.Event()

    @property
    def ready(self) -> bool:
        """Whether a host is connected and accepted the channel."""
        link = self.kit.link
        return link is not None and self.channel in self.kit.accepted_channels(link)

    async def post(self, n: int) -> bool:
        """Send ``q <n>``; whether the host accepted it."""
        author = PEOPLE[n % len(PEOPLE)]
        result = await self.room.send(f"q {n}", author={"id": author, "name": author})
        return result.get("accepted") is True

    async def answered(self, n: int, within_s: float = ANSWER_S) -> float:
        """When ``a <n>`` arrived (waiting for it at most ``within_s``)."""
        with trio.fail_after(within_s):
            while n not in self.answers:
                await self.changed.wait()
        return self.answers[n]


def host_config(
    work: Path, host_id: str, dsn: str, rooms: list[Room], model_spec: str
) -> dict[str, Any]:
    """One host's config: every host of a fleet names the same servers and agents (agent
    ``i`` hears server ``i`` only); its own ``host_id`` and data folder."""
    servers = [{"id": r.server_id, "url": r.url} for r in rooms]
    agents = [bh.agent(f"Agent{i}", model_spec, [r.server_id]) for i, r in enumerate(rooms)]
    cfg = bh.config(work / host_id, servers, agents)
    cfg["host"].update(host_id=host_id, store=dsn)
    return cfg


class HostProcess:
    """A host in a process of its own, its output in ``<work>/<host_id>.log``."""

    def __init__(self, work: Path, cfg: dict[str, Any]) -> None:
        self.host_id: str = cfg["host"]["host_id"]
        self.path = work / f"{self.host_id}.json"
        self.path.write_text(json.dumps(cfg), encoding="utf-8")
        self.log = work / f"{self.host_id}.log"
        self.process: trio.Process | None = None

    async def start(self) -> None:
        path = [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        with self._log_file() as out:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "examples.bench.fleet", str(self.path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=_ROOT,
                env=env,
            )

    def _log_file(self) -> IO[bytes]:
        return self.log.open("wb")

    def tail(self) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return f"{self.host_id}: {text.strip()[-1500:]}"

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)

    async def stop(self) -> None:
        """A clean stop (SIGTERM), SIGKILL if it does not end in time."""
        process = self.process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_S):
            await process.wait()
            return
        process.send_signal(signal.SIGKILL)
        await process.wait()


def cpu_seconds(pids: Iterable[int]) -> float:
    """The CPU time (user and system) the processes ``pids`` have used so far (those gone
    count nothing)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def _holders(dsn: str) -> dict[str, str]:
    """Who holds each resource now (expired and free leases left out; none before a host made
    the store)."""
    try:
        fleet = read_fleet(dsn)
    except StoreError:
        return {}
    return {
        lease.resource: lease.holder
        for lease in fleet.leases
        if lease.holder and lease.expires_at is not None and lease.expires_at > fleet.now
    }


async def settle(
    dsn: str, rooms: list[Room], hosts: list[HostProcess], agents: list[str]
) -> dict[str, str]:
    """Wait until every agent and server is held, spread evenly (each host holding at most
    its fair share of each kind, and at least its whole share), and every room's channel
    accepted; the holders."""
    ids = [h.host_id for h in hosts]
    wanted = {
        "agent": [f"agent:{a}" for a in agents],
        "server": [f"server:{r.server_id}" for r in rooms],
    }
    with trio.move_on_after(SETTLE_S):
        while True:
            for h in hosts:
                assert h.process is not None
                if h.process.returncode is not None:
                    raise RuntimeError(f"a host process ended ({h.process.returncode}): {h.tail()}")
            held = await trio.to_thread.run_sync(_holders, dsn)
            spread = all(
                all(r in held for r in names)
                and all(
                    len(names) // len(ids)
                    <= sum(held[r] == i for r in names)
                    <= fair_share(len(names), len(ids))
                    for i in ids
                )
                for names in wanted.values()
            )
            if spread and all(r.ready for r in rooms):
                return held
            await trio.sleep(0.1)
    raise RuntimeError(
        f"the leases did not spread within {SETTLE_S} s: {[h.tail() for h in hosts]}"
    )


async def _warm_up(rooms: list[Room]) -> None:
    """Every agent answers one line (its first turn, its model loaded)."""
    async with trio.open_nursery() as nursery:
        for room in rooms:

            async def one(room: Room = room) -> None:
                await room.post(0)
                await room.answered(0)

            nursery.start_soon(one)


async def run_throughput(
    work: Path,
    dsn: str,
    hosts: int,
    agents: int,
    lines: int,
    db_pids: Callable[[], list[int]] = list,
) -> dict[str, Any]:
    """See the module's notes: ``{"seconds", "replies", "remote", "cpu"}`` (``remote``: agents
    whose server's connection is held by the other host; ``cpu``: the share of one core each of
    the hosts, the database's processes (``db_pids``) and this process used in the timed
    part)."""
    model_spec = bh.model(work, "answers", ANSWERS)  # makes ``work``
    rooms = [Room(f"s{i}") for i in range(agents)]
    names = [f"Agent{i}" for i in range(agents)]
    procs: list[HostProcess] = []
    async with trio.open_nursery() as nursery:
        for room in rooms:
            await nursery.start(room.serve)
        try:
            procs = [
                HostProcess(work, host_config(work, f"host-{k + 1}", dsn, rooms, model_spec))
                for k in range(hosts)
            ]
            for proc in procs:
                await proc.start()
            held = await settle(dsn, rooms, procs, names)
            await _warm_up(rooms)
            remote = sum(
                held[f"agent:{a}"] != held[f"server:{r.server_id}"]
                for a, r in zip(names, rooms, strict=True)
            )

            async def converse(room: Room) -> None:
                for n in range(1, lines + 1):
                    await room.post(n)
                    await room.answered(n)

            pids = {p.host_id: [p.process.pid] for p in procs if p.process is not None}
            own = [pid for each in pids.values() for pid in each]
            before = {pid: cpu_seconds([pid]) for pid in [*db_pids(), *own]}
            mine = time.process_time()
            start = time.monotonic()
            async with trio.open_nursery() as talks:
                for room in rooms:
                    talks.start_soon(converse, room)
            seconds = time.monotonic() - start
            pids["database"] = db_pids()  # with the backends started meanwhile
            cpu = {
                k: sum(cpu_seconds([pid]) - before.get(pid, 0.0) for pid in v) / seconds
                for k, v in pids.items()
            }
            cpu["servers"] = (time.process_time() - mine) / seconds
        finally:
            with trio.CancelScope(shield=True):
                for proc in procs:
                    await proc.stop()
        nursery.cancel_scope.cancel()
    return {"seconds": seconds, "replies": agents * lines, "remote": remote, "cpu": cpu}


async def run_failover(work: Path, dsn: str) -> dict[str, Any]:
    """See the module's notes: ``{"seconds", "reconnected", "server_moved", "posts", "phase"}``
    (``reconnected``: seconds from the kill to the first line the new holder accepted)."""
    model_spec = bh.model(work, "answers", ANSWERS)  # makes ``work``
    room = Room("lobby")
    agent = "Agent0"
    procs: list[HostProcess] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(room.serve)
        try:
            procs = [
                HostProcess(work, host_config(work, f"host-{k + 1}", dsn, [room], model_spec))
                for k in range(2)
            ]
            for proc in procs:
                await proc.start()
            held = await settle(dsn, [room], procs, [agent])
            await _warm_up([room])
            victim = next(p for p in procs if p.host_id == held[f"agent:{agent}"])
            server_moved = held["server:lobby"] == victim.host_id
            # anywhere in the renewal period: the settling ended just after a step
            phase = random.uniform(0, RENEW_S)
            await trio.sleep(phase)
            victim.kill()
            killed = time.monotonic()
            accepted: list[float] = []
            posts = 0

            async def post(n: int) -> None:
                with trio.move_on_after(5 * POST_EVERY_S):
                    try:
                        if await room.post(n):
                            accepted.append(time.monotonic())
                    except Exception:  # no host connected yet: the next tick tries again
                        return

            with trio.fail_after(3 * LEASE_S + ANSWER_S):
                async with trio.open_nursery() as posting:
                    n = 0
                    while not any(k > 0 for k in room.answers):
                        n += 1
                        posts += 1
                        posting.start_soon(post, n)
                        with trio.move_on_after(POST_EVERY_S):
                            while not any(k > 0 for k in room.answers):
                                await room.changed.wait()
                    posting.cancel_scope.cancel()
            answered = min(t for k, t in room.answers.items() if k > 0)
        finally:
            with trio.CancelScope(shield=True):
                for proc in procs:
                    await proc.stop()
        nursery.cancel_scope.cancel()
    return {
        "seconds": answered - killed,
        "reconnected": (min(accepted) - killed) if accepted else None,
        "server_moved": server_moved,
        "posts": posts,
        "phase": phase,
        "lease_s": LEASE_S,
        "renew_s": RENEW_S,
    }


async def serve_host(cfg: dict[str, Any]) -> None:
    """A host on ``cfg`` until SIGTERM."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with Host.open(cfg, status_file=False):
            print("ready", flush=True)
            async for _ in signals:
                break


if __name__ == "__main__":
    trio.run(serve_host, json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))
