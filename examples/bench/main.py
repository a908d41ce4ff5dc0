"""Benchmark: ``python -m examples.bench [--quick]`` (also ``tox -e bench``).

Every figure is measured in a fresh process, over real stdio servers (``examples.bench.server``)
and a real store, and printed with its goal. Rows:

Ingest, in paired rounds: each round runs (a), (a') and (b) back to back on the same messages,
one per ``channels/incoming`` request; the ratios are the median of the rounds' ratios, with
their min and max. The headline is (a') / (b).

(a) mcplive's channel-message ingest: line → stored durably → wake decided. One agent hears the
    channel, registered closed, so the decision is "no wake" and no turn runs;
(a') the same with the channel open: the agent is woken and runs turns (a silent scripted model);
(b) the thinnest host (``examples.bench.ingest``): does only what storing these items needs
    (one task reads and builds the rows, another commits them in a worker thread as reading
    goes on) and stores the same rows. A check sends the same messages (every seventh
    with a forged header) to mcplive and to (b) and compares what both stored, message by
    message: the row count, each row's agent, role, blocks (header and marked body) and metadata
    (every key; ``accepted_at`` for its format, ids to be unique) and the dedupe keys;
(c) the raw append of those rows with ``executemany`` in one transaction.

Wakes (``examples.bench.wakes``): latency to the model call at 1,000 messages per second
offered, from the moment the server sent a message to the first model call that had it in its
context, with turns running (every message wakes the agent) and with the agent idle (the load
in a closed channel, every K-th message a probe in an open one); coalescing 300 edits of one
unread message (RFC-006); wake-to-reply latency (d) of one and ten agents hearing one channel at
1,000 messages per second, and (e) of a healthy agent while another server floods the host with
pipelined ``push/event`` requests (``--flood``); each of (d) and (e) pools three runs of each
kind, alternated.

Scale (``examples.bench.scale``): 1 / 10 / 50 / 200 agents hearing one channel (msg/s, and the
CPU time and store bytes each additional agent adds per message); 1 / 1,000 / 10,000 registered
channels (10 servers of 1,000: registration time, and ingest with 1,000 channels against 1); a
stored history of 10k / 100k / 500k messages built through ``store.Database.apply`` (search
time, the first turn's time to its model call, rollback time). Marking
(``examples.bench.marking``) against a plain ``re`` scan of the same text. Hostile peers
(``examples.bench.hostile``): the longest loop step while a healthy agent answers beside each
hostile model endpoint, config or gate file and console request, against a quiet run's.
Community (``examples.bench.community``): tokens per useful reply of five agents hearing a
scripted conversation, with no gate against ``gate = "community"``, as a ratio, and whether the
preset answered every line addressed to an agent.

Fleet (``examples.bench.fleet``), on a throwaway PostgreSQL cluster: replies per second of
agents each answering its own server's lines one after another, all at once, with two host
processes against one, as a ratio; and failover, from ``SIGKILL`` of the host running an agent
to that agent's next answer from the other host, against the lease.

Silence (``examples.bench.silence``): the cache-read share of silent turns: one agent on the
Anthropic provider and one on the OpenAI-compatible provider, each against its fake API on
loopback HTTP with the fake's prompt cache on, hear a channel of chatter and say nothing every
turn; from the usage ledger, the share of the input of every turn after the first that was read
from the cache.

``--quick`` runs every row on small sizes (under a minute). Figures are ratios of one run on one
machine; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import attrs
import trio

from examples.bench import community as bench_community
from examples.bench import fleet as bench_fleet
from examples.bench import hostile as bench_hostile
from examples.bench import ingest as bench_ingest
from examples.bench import marking as bench_marking
from examples.bench import scale as bench_scale
from examples.bench import silence as bench_silence
from examples.bench import wakes as bench_wakes
from examples.bench.host import pct

WOKEN = "a'"


@attrs.frozen(kw_only=True)
class Plan:
    """The sizes of one run."""

    messages: int = 10_000
    rounds: int = 5
    shape: int = 500
    wake_messages: int = 3_000
    idle_messages: int = 5_000
    probe_every: int = 100
    coalesced: int = 300
    coalesce_runs: int = 3
    agents: tuple[int, ...] = (1, 10, 50, 200)
    agent_messages: int = 3_000
    channels: tuple[tuple[int, int], ...] = ((1, 1), (1, 1_000), (10, 1_000))  # servers, each
    channel_messages: int = 5_000
    stores: tuple[int, ...] = (10_000, 100_000, 500_000)
    replies: tuple[int, float] = (10_000, 1_000.0)  # (d): messages, rate
    healthy: tuple[int, float] = (300, 20.0)  # (e): messages, rate
    flood: int = 100_000
    reply_rounds: int = 3  # (d) and (e): runs of each kind, pooled
    hostile_answers: int = 20  # the healthy agent's posts under each hostile peer
    community_lines: int = 200  # lines of the scripted conversation five agents hear
    silent_turns: int = 20  # silent turns of the agent on each provider
    fleet_agents: int = 16  # agents (each on its own server) of the fleet row
    fleet_lines: int = 40  # lines each of them answers, one after another
    failovers: int = 3  # runs of the failover row


QUICK = Plan(
    messages=1_500,
    rounds=2,
    shape=60,
    wake_messages=600,
    idle_messages=1_000,
    probe_every=50,
    coalesced=60,
    coalesce_runs=1,
    agents=(1, 10, 50),
    agent_messages=200,
    channels=((1, 1), (1, 100), (4, 250)),
    channel_messages=600,
    stores=(10_000,),
    replies=(800, 1_000.0),
    healthy=(30, 20.0),
    flood=10_000,
    reply_rounds=1,
    hostile_answers=5,
    community_lines=40,
    silent_turns=6,
    fleet_agents=4,
    fleet_lines=10,
    failovers=1,
)


async def measure(kind: str, messages: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    name, *params = kind.split("-")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if kind == "community":
            return await bench_community.compare(work, messages)
        if kind == "silence":
            return await bench_silence.measure(work, messages)
        if kind.startswith("hostile:"):
            run = await bench_hostile.run_case(work, kind.split(":", 1)[1], answers=messages)
            return attrs.asdict(run)
        if kind == "a":
            return {"seconds": await bench_ingest.run_mcplive(work, messages, ["--closed"])}
        if kind == "postgresql":
            return await _on_postgresql(work, messages)
        if name == "fleet":
            hosts, agents = params
            return await _on_postgresql(work, messages, hosts=int(hosts), agents=int(agents))
        if kind == "failover":
            return await _on_postgresql(work, messages, failover=True)
        if kind == "a'":
            return {"seconds": await bench_ingest.run_mcplive(work, messages, [])}
        if kind == "b":
            return {"seconds": await bench_ingest.run_thin(work, messages)}
        if kind == "c":
            return {"seconds": await trio.to_thread.run_sync(bench_ingest.run_raw, work, messages)}
        if kind == "shape":
            return await bench_ingest.check_shape(work, messages)
        if kind == "coalesce":
            extra = ["--closed", "--coalesce"]
            return {"seconds": await bench_ingest.run_mcplive(work, messages, extra)}
        if name == "wake":
            return await bench_wakes.run_model_latency(work, messages, 1000.0, int(params[0]))
        if name == "replies":
            agents, sent, per_s, flood = params
            cpu, wall = time.process_time(), time.perf_counter()
            lat = await bench_wakes.run_replies(
                work, int(agents), int(sent), float(per_s), int(flood)
            )
            busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
            return {"latencies": lat, "busy": busy}
        if name == "agents":
            return await bench_scale.run_agents(work, int(params[0]), messages)
        if name == "channels":
            servers, each = params
            return await bench_scale.run_channels(work, int(servers), int(each), messages)
        if name == "store":
            return await bench_scale.run_store(work, int(params[0]))
    raise ValueError(kind)


class MeasurementFailed(Exception):
    """A measurement's process failed; the message holds its traceback."""


async def _on_postgresql(
    work: Path, messages: int, *, hosts: int = 0, agents: int = 0, failover: bool = False
) -> dict[str, Any]:
    """On a durable throwaway PostgreSQL cluster of the system's programs (commits wait for
    the disk, as the embedded store's do): (a) of ``messages``; with ``hosts``, the fleet's
    throughput (``agents`` answering ``messages`` lines each); with ``failover``, the failover
    row. Or why it could not run.

    The cluster is started and stopped on this (the main) thread, never in a worker thread:
    its server is told to quit when the thread that started it ends (the parent-death signal
    follows the thread), and an idle worker thread ends after a while."""
    from tests import pgcluster  # the tests' cluster: the benchmark runs from a clone

    try:
        cluster = pgcluster.start(
            durable=True
        )  # blocks this fresh process's loop: nothing else runs
    except pgcluster.ClusterError as exc:
        return {"skipped": str(exc)}
    try:
        dsn = cluster.create_database()
        if failover:
            return await bench_fleet.run_failover(work, dsn)
        if hosts:
            return await bench_fleet.run_throughput(
                work, dsn, hosts, agents, messages, db_pids=cluster.pids
            )
        return {"seconds": await bench_ingest.run_mcplive(work, messages, ["--closed"], dsn)}
    finally:
        cluster.stop()


def _child(kind: str, messages: int, conn: Connection) -> None:
    try:
        conn.send(("ok", trio.run(measure, kind, messages)))
    except BaseException:  # reported to the parent, which stops the run
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _measure_in_child(kind: str, messages: int) -> dict[str, Any]:
    """Run one measurement in a new process forked from a server process that imported the
    benchmark and nothing else, so no run inherits another's garbage nor pays the imports."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["examples.bench.scale"])
    receiving, sending = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(kind, messages, sending))
    child.start()
    sending.close()
    try:
        status, value = receiving.recv()
    except EOFError:
        child.join()
        status, value = "error", f"the measurement process exited with code {child.exitcode}"
    child.join()
    if status != "ok":
        raise MeasurementFailed(f"measurement {kind} failed:\n{value}")
    result: dict[str, Any] = value
    return result


async def in_fresh_process(kind: str, messages: int = 0) -> dict[str, Any]:
    """One measurement in a fresh process (see :func:`_measure_in_child`)."""
    return await trio.to_thread.run_sync(_measure_in_child, kind, messages)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def _ms(values: list[float]) -> str:
    if not values:
        return "no samples"
    return f"p50 {pct(values, 0.5) * 1000:7.1f} ms, p99 {pct(values, 0.99) * 1000:7.1f} ms"


async def ingest_rows(plan: Plan) -> bool:
    """(a), (a'), (b) in paired rounds, (c), and the check that (b) stores what (a) stores;
    False when that check failed."""
    n = plan.messages
    rounds: list[dict[str, float]] = []
    print(f"ingest: {n} messages per run, one per channels/incoming request, real stdio server")
    print(f"rounds: {plan.rounds}, each (a), (a'), (b) back to back, each in a fresh process:")
    for r in range(plan.rounds):
        rate = {k: n / (await in_fresh_process(k, n))["seconds"] for k in ("a", WOKEN, "b")}
        rounds.append(rate)
        a, woken, b = rate["a"], rate[WOKEN], rate["b"]
        print(
            f"  round {r + 1}: a {a:7.0f}  a' {woken:7.0f}  b {b:7.0f} msg/s"
            f"   a'/b {woken / b:.2f}  a/b {a / b:.2f}"
        )
    c = n / (await in_fresh_process("c", n))["seconds"]
    median = {k: statistics.median(r[k] for r in rounds) for k in ("a", WOKEN, "b")}
    print(f"(a)  mcplive ingest: stored durably, wake decided (no turn): {median['a']:8.0f} msg/s")
    print(
        f"(a') mcplive ingest, the agent woken, turns running:         {median[WOKEN]:8.0f} msg/s"
    )
    print(f"(b)  thinnest host (only what storing needs, group commit):  {median['b']:8.0f} msg/s")
    print(f"(c)  raw executemany in one transaction:                     {c:8.0f} msg/s")
    print(f"a'/b = {_spread([r[WOKEN] / r['b'] for r in rounds])}   (target >= 0.8)")
    print(f"a/b  = {_spread([r['a'] / r['b'] for r in rounds])}")
    print(f"b/c  = {median['b'] / c:.3f}")
    shape = await in_fresh_process("shape", plan.shape)
    verdict = "identical" if not shape["problems"] else "DIFFERENT: " + "; ".join(shape["problems"])
    print(
        f"check: (a) and (b) stored {shape['rows']} rows for the same {plan.shape} messages "
        f"({shape['marked']} with a forged header marked); row by row (agent, role, blocks, "
        f"metadata, dedupe keys): {verdict}"
    )
    return not shape["problems"]


async def wake_rows(plan: Plan) -> None:
    busy = await in_fresh_process("wake-0", plan.wake_messages)
    idle = await in_fresh_process(f"wake-{plan.probe_every}", plan.idle_messages)
    print("latency to the model call at 1000 msg/s offered (sent -> first call that saw it):")
    print(
        f"  turns running, every message wakes the agent ({len(busy['latencies'])} messages, "
        f"{busy['calls']} calls): {_ms(busy['latencies'])} (target p99 < 10 ms)"
    )
    print(f"      to the wake decision: {_ms(busy['decided'])}")
    print(
        f"  agent idle, the load in a closed channel, every {plan.probe_every}th message a probe "
        f"that wakes it ({len(idle['latencies'])} probes, {idle['during_turns']} sent while a "
        f"turn ran): {_ms(idle['latencies'])} (target p99 < 10 ms)"
    )
    print(f"      to the wake decision: {_ms(idle['decided'])}")
    for result in (busy, idle):
        if result["dropped"]:
            print(f"  ({result['dropped']} trace events were dropped; their samples are missing)")
    coalesced = [
        (await in_fresh_process("coalesce", plan.coalesced))["seconds"]
        for _ in range(plan.coalesce_runs)
    ]
    print(
        f"coalescing: {plan.coalesced} edits of one unread message (one subject), each stored "
        f"and acknowledged: {statistics.median(coalesced):.3f} s (median of {len(coalesced)})"
    )


def _ratio(loaded: list[float], alone: list[float]) -> str:
    p50 = pct(loaded, 0.5) / pct(alone, 0.5)
    p99 = pct(loaded, 0.99) / pct(alone, 0.99)
    return f"{p50:.2f}x / {p99:.2f}x (target <= 3x)"


@attrs.define
class _Runs:
    """The pooled latencies of one kind of run, and the host's CPU use in each: the CPU time of
    the host's process (all its threads) over the run's wall time, so near 100% the host is
    saturated and latency measures queueing more than work."""

    latencies: list[float] = attrs.field(factory=list)
    busy: list[float] = attrs.field(factory=list)

    def add(self, result: dict[str, Any]) -> None:
        self.latencies += result["latencies"]
        self.busy.append(result["busy"])

    def line(self, unit: str) -> str:
        cpu = ", ".join(f"{b:.0%}" for b in self.busy)
        return f"{_ms(self.latencies)}  ({len(self.latencies)} {unit}; host CPU {cpu})"


async def _paired(plan: Plan, base: str, loaded: str) -> tuple[_Runs, _Runs]:
    """``plan.reply_rounds`` runs of each kind, alternating (base, loaded, base…) so a drift
    in the machine's speed weighs on both alike; pooled, so a p99 rests on a few times more
    samples than one run gives."""
    base_runs, loaded_runs = _Runs(), _Runs()
    for _ in range(plan.reply_rounds):
        base_runs.add(await in_fresh_process(base))
        loaded_runs.add(await in_fresh_process(loaded))
    return base_runs, loaded_runs


async def replies_rows(plan: Plan) -> None:
    """(d) and (e): wake-to-reply latency."""
    n = plan.reply_rounds
    rounds = f"{n} alternating runs of each, pooled" if n > 1 else "one run of each"
    sent, rate = plan.replies
    one, ten = await _paired(plan, f"replies-1-{sent}-{rate}-0", f"replies-10-{sent}-{rate}-0")
    seconds = sent / rate
    print(
        f"(d) wake-to-reply, agents hearing one channel at {rate:.0f} msg/s for {seconds:.0f} s "
        f"({rounds}):"
    )
    print(f"      1 agent:  {one.line('replies')}")
    print(f"     10 agents: {ten.line('replies')}")
    print(f"     10 agents / 1 agent, p50 / p99: {_ratio(ten.latencies, one.latencies)}")
    sent, rate = plan.healthy
    alone, flooded = await _paired(
        plan, f"replies-1-{sent}-{rate}-0", f"replies-1-{sent}-{rate}-{plan.flood}"
    )
    print(
        f"(e) a healthy agent's wake-to-reply ({rate:.0f} msg/s for {sent / rate:.0f} s) while "
        f"another server floods ({rounds}):"
    )
    print(f"     alone:               {alone.line('replies')}")
    print(f"     with {plan.flood} pushes: {flooded.line('replies')}")
    print(f"     flooded / alone, p50 / p99: {_ratio(flooded.latencies, alone.latencies)}")


async def agent_rows(plan: Plan) -> None:
    m = plan.agent_messages
    runs = {a: await in_fresh_process(f"agents-{a}", m) for a in plan.agents}
    print(f"agents hearing one closed channel ({m} messages; stored and wake decided for each):")
    base = runs[plan.agents[0]]
    for agents, run in runs.items():
        line = f"  {agents:4d} agents: {m / run['seconds']:8.0f} msg/s"
        extra = agents - plan.agents[0]
        if extra:
            cpu = (run["cpu"] - base["cpu"]) / extra / m * 1e6
            size = (run["bytes"] - base["bytes"]) / extra / m
            line += (
                f"; per additional agent per message: CPU {cpu:6.1f} us (target <= 5 us), "
                f"store {size:6.0f} B (target <= 64 B)"
            )
        print(line + f"; store {run['bytes'] / 1e6:.1f} MB")


async def channel_rows(plan: Plan) -> None:
    m = plan.channel_messages
    print(f"registered channels (closed, one agent hearing them; {m} messages per ingest run):")
    runs = []
    for servers, each in plan.channels:
        messages = m if servers == 1 else 0
        run = await in_fresh_process(f"channels-{servers}-{each}", messages)
        runs.append(run)
        total = servers * each
        line = (
            f"  {total:6d} channels ({servers} server{'s' if servers > 1 else ''} x {each}): "
            f"registered in {run['register_s'] * 1000:8.1f} ms ({run['accepted']} accepted)"
        )
        if total >= 10_000:
            line += " (target < 1 s)"
        if messages:
            line += f"; ingest {messages / run['seconds']:6.0f} msg/s"
        print(line)
    one, many, spread = runs
    (_, n_many), (s_all, n_all) = plan.channels[1], plan.channels[2]
    print(
        f"  ingest time with {n_many} channels / with 1: {many['seconds'] / one['seconds']:.2f}x "
        f"(target <= 1.3x)"
    )
    factor = s_all * n_all / n_many
    print(
        f"  registering {s_all * n_all} / {n_many} channels: "
        f"{spread['register_s'] / many['register_s']:.1f}x for {factor:.0f}x the channels "
        f"(target: linear)"
    )


async def store_rows(plan: Plan) -> None:
    print("a stored history of one agent (written through store.Database.apply):")
    for size in plan.stores:
        run = await in_fresh_process(f"store-{size}")
        to_call = run["open_s"] + run["first_turn_s"]
        print(f"  {size} messages (written in {run['build_s']:.1f} s):")
        print(
            f"      Reader.search for a word {run['found']} of them hold: "
            f"{run['search_s'] * 1000:.1f} ms (median of {run['searches']}; target < 100 ms)"
        )
        print(
            f"      Host.open to the first model call: {to_call * 1000:.1f} ms; of which the "
            f"first turn, a local message to its model call: {run['first_turn_s'] * 1000:.1f} ms "
            "(target < 50 ms)"
        )
        if run["rollback_error"]:
            print(
                f"      Host.rollback failed after {run['rollback_s'] * 1000:.0f} ms "
                f"(target < 1 s): {run['rollback_error']}"
            )
        else:
            print(
                f"      Host.rollback setting aside {run['set_aside']} messages: "
                f"{run['rollback_s'] * 1000:.0f} ms (target < 1 s)"
            )


async def postgresql_rows(plan: Plan) -> None:
    """(a) on PostgreSQL against (a) on the embedded store, paired rounds in fresh processes."""
    n = plan.messages
    on_pg: list[float] = []
    on_sqlite: list[float] = []
    for _ in range(max(1, plan.rounds // 2)):
        run = await in_fresh_process("postgresql", n)
        if "skipped" in run:
            print(f"ingest on PostgreSQL: not measured ({run['skipped']})")
            return
        on_pg.append(n / run["seconds"])
        on_sqlite.append(n / (await in_fresh_process("a", n))["seconds"])
    pg, lite = statistics.median(on_pg), statistics.median(on_sqlite)
    print(f"ingest (a), one host, {n} messages, durable commits on both:")
    print(f"  on PostgreSQL (local, loopback): {pg:8.0f} msg/s")
    print(f"  on the embedded SQLite store:    {lite:8.0f} msg/s")
    print(
        f"  PostgreSQL / SQLite: {pg / lite:.2f}x (on 2 cores the server's backend, the store "
        "process and the host share them; a database on its own machine frees one)"
    )


def _rate(run: dict[str, Any]) -> float:
    return float(run["replies"] / run["seconds"])


def _shares(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in cpu.items())


async def fleet_rows(plan: Plan) -> None:
    """Two hosts against one on PostgreSQL (paired rounds in fresh processes), and the time an
    agent takes to answer again on another host after its host was killed."""
    agents, lines = plan.fleet_agents, plan.fleet_lines
    one: list[dict[str, Any]] = []
    two: list[dict[str, Any]] = []
    for _ in range(max(1, plan.rounds // 2)):
        run = await in_fresh_process(f"fleet-1-{agents}", lines)
        if "skipped" in run:
            print(f"a fleet on PostgreSQL: not measured ({run['skipped']})")
            return
        one.append(run)
        two.append(await in_fresh_process(f"fleet-2-{agents}", lines))
    print(
        f"a fleet on PostgreSQL: {agents} agents, each hearing its own server (websocket), each "
        f"answering {lines} lines one after another (the next sent once the answer arrived), all "
        "at once; durable commits; hosts in processes of their own:"
    )
    for label, runs in (("one host:  ", one), ("two hosts: ", two)):
        for r in runs:
            line = f"  {label} {_rate(r):7.0f} replies/s  (CPU, of a core: {_shares(r['cpu'])})"
            if label.startswith("two"):
                line += f"; {r['remote']} agents' connections on the other host"
            print(line)
    ratios = [_rate(b) / _rate(a) for a, b in zip(one, two, strict=True)]
    print(
        f"  two hosts / one host: {_spread(ratios)} (on 2 cores the two hosts, the database and "
        "the servers share them: a second host adds a trio loop, not a core; when no process "
        "fills a core, the round trip of each line through the store limits it)"
    )
    times = []
    for _ in range(plan.failovers):
        run = await in_fresh_process("failover")
        times.append(run)
    seconds = [r["seconds"] for r in times]
    lease = times[0]["lease_s"]
    moved = all(r["server_moved"] for r in times)
    print(
        "failover: SIGKILL of the host running an agent"
        + (" and holding its server's connection" if moved else "")
        + f", to that agent's next answer from the other host (a line posted every "
        f"{bench_fleet.POST_EVERY_S} s; {len(seconds)} runs, each killed at a random moment "
        f"between two renewals): {_spread(seconds)} s, "
        f"{statistics.median(seconds) / lease:.2f}x the lease of {lease:.0f} s "
        f"(bound: the lease, one renewal step of {times[0]['renew_s']:.0f} s, then the dial and "
        "the agent's start; the lease length limits it, by design)"
    )


async def hostile_rows(plan: Plan) -> None:
    print(
        f"the loop under hostile peers (the longest task step while a healthy agent answered "
        f"{plan.hostile_answers} posts, after a warm-up; target: at most 2x quiet, or < 50 ms):"
    )
    quiet = await in_fresh_process("hostile:quiet", plan.hostile_answers)
    print(f"  {'quiet':18} {quiet['longest_ms']:7.1f} ms  ({quiet['longest_task']})")
    for case in bench_hostile.CASES[1:]:
        run = await in_fresh_process(f"hostile:{case}", plan.hostile_answers)
        ms = run["longest_ms"]
        ok = ms < 50 or ms <= 2 * quiet["longest_ms"]
        print(
            f"  {case:18} {ms:7.1f} ms  {ms / max(quiet['longest_ms'], 0.001):6.1f}x quiet  "
            f"{'ok' if ok else 'OVER'}  answered {run['answers']}/{plan.hostile_answers}, "
            f"{len(run['acts'])} hostile acts  ({run['longest_task']})"
        )


async def community_rows(plan: Plan) -> None:
    runs = await in_fresh_process("community", plan.community_lines)
    none, preset = runs["none"], runs["community"]
    print(
        f"tokens per useful reply, five agents hearing a scripted conversation of "
        f"{plan.community_lines} lines ({preset['addressed']} address one agent, the rest chatter):"
    )
    for label, run in (("no gate (every line wakes all)", none), ('gate = "community"', preset)):
        print(
            f"  {label:31} {run['per_reply']:8.0f} tokens per reply  ({run['tokens']} tokens, "
            f"{run['replies']} replies, {run['turns']} turns, {run['silent_share']:.0%} silent)"
        )
    answered = preset["answered"] == preset["addressed"]
    print(
        f"  no gate / community: {none['per_reply'] / preset['per_reply']:.1f}x "
        f"(goal: far fewer tokens under the preset); under the preset "
        f"{preset['answered']}/{preset['addressed']} addressed lines answered"
        + ("" if answered else " (MISSED: " + "; ".join(preset["unanswered"]) + ")")
    )


async def silence_rows(plan: Plan) -> None:
    runs = await in_fresh_process("silence", plan.silent_turns)
    print(
        f"cache-read share of silent turns: one agent, {plan.silent_turns} lines of chatter it "
        "does not answer, each provider against its fake API (prompt cache on), from the usage "
        "ledger, every turn after the first:"
    )
    for provider, run in runs.items():
        print(
            f"  {provider:10} {run['share']:6.1%} of the input read from the cache  "
            f"({run['read']} of {run['prompt']} tokens; {run['silent']}/{run['turns']} turns "
            f"silent)  {'ok' if run['share'] >= 0.8 else 'LOW'} (goal: at least 80%)"
        )


def marking_rows() -> None:
    # marking header-shaped openings is linear: a block of 320,000 bytes with 40,000 openings
    bench_marking.report("marking", [bench_marking.block(40_000)], 40_000)


async def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m examples.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="every row on small sizes (< 1 min)")
    p.add_argument("--messages", type=int, help="messages per ingest run")
    p.add_argument("--rounds", type=int, help="paired rounds of (a), (a'), (b)")
    p.add_argument("--flood", type=int, help="pushes the flooding server sends (row e)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # rows as they come
    if args.one:
        print(json.dumps(await measure(args.one, args.messages or 0)))
        return
    plan = QUICK if args.quick else Plan()
    changes = {k: getattr(args, k) for k in ("messages", "rounds", "flood")}
    plan = attrs.evolve(plan, **{k: v for k, v in changes.items() if v is not None})
    started = time.perf_counter()
    try:
        same = await ingest_rows(plan)
        await wake_rows(plan)
        await replies_rows(plan)
        await agent_rows(plan)
        await channel_rows(plan)
        await store_rows(plan)
        await postgresql_rows(plan)
        await fleet_rows(plan)
        await hostile_rows(plan)
        await community_rows(plan)
        await silence_rows(plan)
    except MeasurementFailed as exc:
        sys.exit(str(exc))
    marking_rows()
    print(f"wall time: {time.perf_counter() - started:.1f} s")
    if not same:
        sys.exit(
            "the thinnest host did not store what mcplive stores: its figure is not comparable"
        )


if __name__ == "__main__":
    trio.run(main)
