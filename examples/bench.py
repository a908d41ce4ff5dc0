"""Benchmark: ``python -m examples.bench [--messages N]`` (also ``tox -e bench``).

Measured in one run, over the same real stdio server (``examples.bench_server``) and the same
messages:

(a) mcplive's end-to-end channel-message ingest: line → stored durably → wake decided. One agent
    hears the channel, so every message is stored for it and its wake is decided; the channel is
    registered closed, so the decision is "no wake" and no turn runs;
(a') the same with the channel open: the agent is woken and runs a turn (a scripted model that
    stays silent), so the figure includes the agents' own work;
(b) the thinnest possible host: one trio task that reads the lines, parses them with ``json``,
    answers each request and appends the same CBOR rows in batched transactions;
(c) the raw append of those rows with ``executemany`` in one transaction.

It prints messages per second for each, the ratios a/b and b/c, mcplive's wake latency
percentiles at an offered load of 1,000 messages per second, and the time to coalesce 300 edits
of one message (RFC-006: each replaces the unread one before it). Then wake-to-reply latency (from
the moment the server sent a message to the moment the agent's answer to it was published, the
agents on a scripted model that answers every turn):

(d) one agent and ten agents hearing one channel at 1,000 messages per second for 10 s;
(e) a healthy agent on one server (20 messages per second for 15 s), alone and while a second
    server floods the host with ``--flood`` (100,000) pipelined ``push/event`` requests, heard
    by an agent of its own.

Figures are ratios of one run on one machine; nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from actors import Host
from examples import bench_marking
from protocol.digests import body_digest
from protocol.source import channel_header, mark_blocks
from store import Append, Database, MessageRecord
from store.codec import encode_body
from store.sqlite import connect

SERVER = [sys.executable, "-m", "examples.bench_server"]
COALESCED = 300  # messages coalesced into one subject


def _record(i: int, message: dict[str, Any]) -> MessageRecord:
    """The row mcplive stores for an incoming message: the same blocks and metadata keys."""
    channel, mid, author = message["channelId"], message["messageId"], message["author"]
    metadata = {
        "server_id": "bench",
        "channel_id": channel,
        "thread_id": message.get("threadId"),
        "message_id": mid,
        "author": {"id": author["id"], "name": author["name"]},
        "timestamp": message["timestamp"],
        "tags": [],
        "inbound_source": {
            "lane": "incoming",
            "server": "bench",
            "channel": channel,
            "thread": message.get("threadId"),
            "message": mid,
            "label": "load",
            "reply_to": None,
            "accepted_at": datetime.now(UTC).isoformat(),
        },
    }
    # the same stored shape: the source header first, the body marked, both digests
    body = list(message["content"])
    header = channel_header("bench", channel, "load", message.get("threadId"))
    metadata["source_body_digest"] = body_digest(body)
    blocks = ({"type": "text", "text": header}, *mark_blocks(body))
    metadata["source_header"] = header
    metadata["stored_body_digest"] = body_digest(blocks)
    return MessageRecord(
        id=f"r{i}",
        agent="Bench",
        role="user",
        blocks=blocks,
        metadata=metadata,
        created_at=time.time(),
    )


def _bench_line(line: str) -> float | None:
    if line.startswith("BENCH "):
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        return float(fields["seconds"])
    return None


async def run_mcplive(
    workdir: Path, messages: int, extra: list[str], *, latency: bool = False
) -> tuple[float, list[float]]:
    (workdir / "silent.toml").write_text("", encoding="utf-8")
    cfg: dict[str, Any] = {
        "host": {"data_dir": str(workdir / "data")},
        "servers": [{"id": "bench", "command": [*SERVER, "--messages", str(messages), *extra]}],
        "agents": [
            {
                "name": "Bench",
                "model": f"scripted:{workdir / 'silent.toml'}",
                "context_tokens": 2000,
            }
        ],
    }
    latencies: list[float] = []
    kinds = {"server-log", "disconnected"} | ({"incoming"} if latency else set())
    async with Host.open(cfg) as host:
        async for event in host.trace(kinds=kinds):
            if latency and event.kind == "incoming":
                sent = float(str(event.data["text"]).split()[0][2:])
                latencies.append(time.monotonic() - sent)
            elif event.kind == "server-log":
                seconds = _bench_line(event.data["line"])
                if seconds is not None:
                    return seconds, latencies
            elif event.kind == "disconnected":
                raise RuntimeError(f"bench server failed: {event.data}")
    raise RuntimeError("trace ended")


REPLY_RULES = "[[rules]]\nwhen = 't=(\\S+)'\nsay = \"re {1}\"\n"  # names what it answers
FLOODED = "Flo"  # the agent hearing the flooding server (silent)


async def run_replies(
    workdir: Path, agents: int, messages: int, rate: float, flood: int = 0
) -> list[float]:
    """Wake-to-reply latencies: ``agents`` agents hear one channel receiving ``messages`` at
    ``rate`` per second and answer each turn's newest message; a latency runs from the moment
    the server sent that message to the moment its answer was published. With ``flood``, a
    second server pipelines that many ``push/event`` requests at once, heard by an agent of its
    own, for the whole run."""
    (workdir / "reply.toml").write_text(REPLY_RULES, encoding="utf-8")
    (workdir / "silent.toml").write_text("", encoding="utf-8")
    paced = ["--messages", str(messages), "--rate", str(rate), "--window", str(messages)]
    servers: list[dict[str, Any]] = [{"id": "bench", "command": [*SERVER, *paced]}]
    cfg_agents: list[dict[str, Any]] = [
        {
            "name": f"Agent{i}",
            "model": f"scripted:{workdir / 'reply.toml'}",
            "context_tokens": 2000,
            "servers": ["bench"],
        }
        for i in range(agents)
    ]
    if flood:
        pushes = ["--push", "--messages", str(flood), "--window", str(flood)]
        servers.append({"id": "flood", "command": [*SERVER, *pushes]})
        cfg_agents.append(
            {
                "name": FLOODED,
                "model": f"scripted:{workdir / 'silent.toml'}",
                "context_tokens": 2000,
                "servers": ["flood"],
            }
        )
    cfg = {"host": {"data_dir": str(workdir / "data")}, "servers": servers, "agents": cfg_agents}
    latencies: list[float] = []
    async with Host.open(cfg) as host:
        async for event in host.trace(kinds={"published", "server-log", "disconnected"}):
            if event.kind == "published" and event.agent != FLOODED:
                sent = float(str(event.data["text"]).split()[1])
                latencies.append(time.monotonic() - sent)
            elif event.kind == "server-log" and event.server_id == "bench":
                if _bench_line(event.data["line"]) is not None:
                    break  # every message answered; the flood (if any) is cut short here
            elif event.kind == "disconnected" and event.server_id == "bench":
                raise RuntimeError(f"bench server failed: {event.data}")
    if not latencies:
        raise RuntimeError("no reply was published")
    return latencies


def _send(stream_lines: list[bytes], obj: Any) -> None:
    stream_lines.append((json.dumps(obj, separators=(",", ":")) + "\n").encode())


async def run_thin(workdir: Path, messages: int) -> float:
    db = Database(workdir / "thin.sqlite3")
    proc = await trio.lowlevel.open_process(
        [*SERVER, "--messages", str(messages)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin and proc.stdout and proc.stderr
    result: list[float] = []

    async def watch_stderr() -> None:
        assert proc.stderr
        buf = b""
        while True:
            data = await proc.stderr.receive_some(4096)
            if not data:
                return
            buf += data
            for line in buf.decode().splitlines():
                seconds = _bench_line(line)
                if seconds is not None:
                    result.append(seconds)
                    return

    out: list[bytes] = []
    _send(
        out,
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2024-11-05",
                "capabilities": {},
                "clientInfo": {"name": "thin"},
            },
        },
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_stderr)
        await proc.stdin.send_all(b"".join(out))
        buf = b""
        n = 0
        while not result:
            data = await proc.stdout.receive_some(65536)
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            out, batch = [], []
            for raw in lines:
                msg = json.loads(raw)
                method = msg.get("method")
                if msg.get("id") == 1 and "result" in msg and method is None:
                    _send(out, {"jsonrpc": "2.0", "method": "notifications/initialized"})
                    _send(
                        out,
                        {
                            "jsonrpc": "2.0",
                            "id": 2,
                            "method": "featureSets/update",
                            "params": {
                                "effectiveCapabilities": ["channels.register", "channels.incoming"]
                            },
                        },
                    )
                elif method == "channels/register":
                    results = [{"id": c["id"], "accepted": True} for c in msg["params"]["channels"]]
                    _send(out, {"jsonrpc": "2.0", "id": msg["id"], "result": {"results": results}})
                elif method == "channels/incoming":
                    results = []
                    for m in msg["params"]["messages"]:
                        key = f"{m['channelId']}\x00{m['messageId']}"
                        batch.append(
                            Append(
                                records=(_record(n, m),),
                                dedupe=("incoming", "bench", key),
                            )
                        )
                        n += 1
                        results.append({"messageId": m["messageId"], "accepted": True})
                    _send(out, {"jsonrpc": "2.0", "id": msg["id"], "result": {"results": results}})
            if batch:
                db.apply(batch)  # one transaction, committed before anything is answered
            if out:
                await proc.stdin.send_all(b"".join(out))
        nursery.cancel_scope.cancel()
    await proc.stdin.aclose()
    await proc.wait()
    db.close()
    return result[0]


def run_raw(workdir: Path, messages: int) -> float:
    conn = connect(workdir / "raw.sqlite3")
    rows = [
        (r.id, r.agent, r.role, r.created_at, encode_body(r.blocks, r.metadata))
        for r in (_record(i, _sample(i)) for i in range(messages))
    ]
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO messages (id, agent, role, created_at, body) VALUES (?, ?, ?, ?, ?)", rows
    )
    conn.execute("COMMIT")
    seconds = time.perf_counter() - start
    conn.close()
    return seconds


def _sample(i: int) -> dict[str, Any]:
    return {
        "channelId": "bench:#load",
        "messageId": f"b{i}",
        "author": {"id": "u", "name": "Load"},
        "timestamp": "2026-01-01T00:00:00Z",
        "content": [{"type": "text", "text": f"t=0.0 message {i}"}],
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(kind: str, messages: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if kind == "a":
            return {"seconds": (await run_mcplive(work, messages, ["--closed"]))[0]}
        if kind == "a'":
            return {"seconds": (await run_mcplive(work, messages, []))[0]}
        if kind == "b":
            return {"seconds": await run_thin(work, messages)}
        if kind == "c":
            return {"seconds": await trio.to_thread.run_sync(run_raw, work, messages)}
        if kind == "coalesce":
            return {"seconds": (await run_mcplive(work, messages, ["--closed", "--coalesce"]))[0]}
        if kind.startswith("replies-"):
            agents, sent, per_s, flood = kind.split("-")[1:]
            lat = await run_replies(work, int(agents), int(sent), float(per_s), int(flood))
            return {"latencies": lat}
        if kind == "latency":
            rate = ["--rate", "1000", "--window", "100000"]
            _, lat = await run_mcplive(work, messages, rate, latency=True)
            return {"latencies": lat}
    raise ValueError(kind)


async def in_fresh_process(kind: str, messages: int) -> dict[str, Any]:
    """Each measurement runs in a new interpreter, so no run inherits another's garbage."""
    argv = [sys.executable, "-m", "examples.bench", "--one", kind, "--messages", str(messages)]
    done = await trio.run_process(argv, capture_stdout=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def _p(values: list[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:7.1f} ms, p99 {pct(values, 0.99) * 1000:7.1f} ms"


def _ratio(loaded: list[float], alone: list[float]) -> str:
    p50 = pct(loaded, 0.5) / pct(alone, 0.5)
    p99 = pct(loaded, 0.99) / pct(alone, 0.99)
    return f"{p50:.2f}x / {p99:.2f}x (target <= 3x)"


async def replies_rows(flood: int) -> None:
    """(d) and (e): wake-to-reply latency, each measurement in a fresh process."""
    one = (await in_fresh_process("replies-1-10000-1000-0", 0))["latencies"]
    ten = (await in_fresh_process("replies-10-10000-1000-0", 0))["latencies"]
    print("(d) wake-to-reply, agents hearing one channel at 1000 msg/s for 10 s:")
    print(f"      1 agent:  {_p(one)}  ({len(one)} replies)")
    print(f"     10 agents: {_p(ten)}  ({len(ten)} replies)")
    print(f"     10 agents / 1 agent, p50 / p99: {_ratio(ten, one)}")
    alone = (await in_fresh_process("replies-1-300-20-0", 0))["latencies"]
    flooded = (await in_fresh_process(f"replies-1-300-20-{flood}", 0))["latencies"]
    print("(e) a healthy agent's wake-to-reply (20 msg/s for 15 s) while another server floods:")
    print(f"     alone:                  {_p(alone)}  ({len(alone)} replies)")
    print(f"     with {flood} pushes: {_p(flooded)}  ({len(flooded)} replies)")
    print(f"     flooded / alone, p50 / p99: {_ratio(flooded, alone)}")


async def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=10000)
    p.add_argument("--latency-messages", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=5, help="a, a', b alternate; medians shown")
    p.add_argument(
        "--flood", type=int, default=100_000, help="pushes the flooding server sends (row e)"
    )
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    n = args.messages
    if args.one:
        print(json.dumps(await measure(args.one, n)))
        return
    runs: dict[str, list[float]] = {"a": [], "a'": [], "b": []}
    for _ in range(args.rounds):
        for key in runs:
            runs[key].append((await in_fresh_process(key, n))["seconds"])
    c_s = (await in_fresh_process("c", n))["seconds"]
    lat = (await in_fresh_process("latency", args.latency_messages))["latencies"]
    coalesced = [(await in_fresh_process("coalesce", COALESCED))["seconds"] for _ in range(3)]
    a, a2, b = (n / statistics.median(runs[k]) for k in ("a", "a'", "b"))
    c = n / c_s
    print(f"messages: {n}, one per channels/incoming request, over a real stdio server")
    print(f"rounds: {args.rounds} (a, a', b alternating, each in a fresh process); medians; msg/s:")
    for key, values in runs.items():
        print(f"  {key:2s} {[round(n / s) for s in values]}")
    print(f"(a)  mcplive ingest: stored durably, wake decided (no turn): {a:10.0f} msg/s")
    print(f"(a') mcplive ingest with the agent woken, a turn per wake:   {a2:10.0f} msg/s")
    print(f"(b)  thinnest host (one task, json, batched transactions):   {b:10.0f} msg/s")
    print(f"(c)  raw executemany in one transaction:                     {c:10.0f} msg/s")
    print(f"a/b  = {a / b:.2f}   (target >= 0.5)")
    print(f"a'/b = {a2 / b:.2f}")
    print(f"b/c  = {b / c:.3f}")
    print(
        f"wake latency at 1000 msg/s offered ({len(lat)} messages, agent woken): "
        f"p50 {pct(lat, 0.5) * 1000:.1f} ms, p99 {pct(lat, 0.99) * 1000:.1f} ms, "
        f"mean {statistics.fmean(lat) * 1000:.1f} ms"
    )
    print(
        f"coalescing: {COALESCED} edits of one unread message (one subject), each stored and "
        f"acknowledged: {statistics.median(coalesced):.3f} s (median of 3)"
    )
    await replies_rows(args.flood)
    # marking header-shaped openings is linear: a block of 320,000 bytes with 40,000 openings
    bench_marking.report("marking", [bench_marking.block(40_000)], 40_000)


if __name__ == "__main__":
    trio.run(main)
