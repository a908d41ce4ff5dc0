"""Scale rows of the benchmark: many agents hearing one channel, many registered channels, and a
large stored history (search, first turn, rollback).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import trio

from actors import Host
from examples.bench import host as bh
from examples.bench.ingest import ThinRows, accepted_now
from examples.bench.wakes import first_call
from store import Append, Database, Reader, db_path

AGENT = "Bench"


async def _until_reported(
    host: Host, servers: set[str], want: str, on_line: Any = None
) -> dict[str, dict[str, str]]:
    """Read the trace until each of ``servers`` wrote a ``BENCH`` line holding ``want``; those
    lines' fields by server. ``on_line(server, fields)`` sees every ``BENCH`` line first."""
    found: dict[str, dict[str, str]] = {}
    async for event in host.trace(kinds={"server-log", "disconnected"}):
        sid = str(event.server_id)
        for fields in bh.reported(event):
            if on_line is not None:
                on_line(sid, fields)
            if want in fields and sid in servers:
                found[sid] = fields
        if len(found) == len(servers):
            return found
        if event.kind == "disconnected" and sid in servers and sid not in found:
            raise RuntimeError(f"bench server {sid} failed: {event.data}")
    raise RuntimeError("trace ended")


# -- agents hearing one channel ----------------------------------------------------------------


async def run_agents(workdir: Path, agents: int, messages: int) -> dict[str, float]:
    """``agents`` agents hear one closed channel (every message stored for each, its wake
    decided for each, no turn): the seconds taken, this process's CPU seconds until then, and
    the store's size on disk afterwards."""
    silent = bh.model(workdir, "silent", bh.SILENT)
    cfg = bh.config(
        workdir / "data",
        [bh.server("bench", "--closed", "--messages", str(messages))],
        [bh.agent(f"Agent{i}", silent) for i in range(agents)],
    )
    cpu = time.process_time()
    async with Host.open(cfg) as host:
        fields = (await _until_reported(host, {"bench"}, "seconds"))["bench"]
        cpu = time.process_time() - cpu
    return {
        "seconds": float(fields["seconds"]),
        "cpu": cpu,
        "bytes": bh.store_bytes(workdir / "data"),
    }


# -- registered channels -----------------------------------------------------------------------


async def run_channels(
    workdir: Path, servers: int, channels: int, messages: int
) -> dict[str, float]:
    """``servers`` servers register ``channels`` closed channels each (at once, once every one
    of them is connected) and then send ``messages`` each, spread over their channels; one
    agent hears them all. The registration time runs from the first ``channels/register`` sent
    to the last one answered; the ingest time is the slowest server's."""
    go = workdir / "go"
    args = ["--closed", "--channels", str(channels), "--messages", str(messages)]
    ids = [f"s{i}" for i in range(servers)]
    cfg = bh.config(
        workdir / "data",
        [bh.server(sid, *args, "--register-when", str(go)) for sid in ids],
        [bh.agent(AGENT, bh.model(workdir, "silent", bh.SILENT))],
    )
    ready: set[str] = set()
    registered: dict[str, dict[str, str]] = {}

    def on_line(sid: str, fields: dict[str, str]) -> None:
        if "registered" in fields:
            registered.setdefault(sid, fields)  # a server that reconnects registers again
        elif "ready" in fields:
            ready.add(sid)
            if len(ready) == servers:
                go.touch()

    async with Host.open(cfg) as host:
        reported = await _until_reported(host, set(ids), "seconds", on_line)
    accepted = sum(int(f["accepted"]) for f in registered.values())
    return {
        "register_s": max(float(f["answered_at"]) for f in registered.values())
        - min(float(f["sent_at"]) for f in registered.values()),
        "accepted": accepted,
        "seconds": max(float(f["seconds"]) for f in reported.values()),
    }


# -- a large stored history --------------------------------------------------------------------

NEEDLE = "zanzibar"
_WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hex "
    "every juicy plum near our old harbour and then go home for tea"
).split()


def _text(i: int, size: int) -> str:
    words = " ".join(_WORDS[(i * 7 + k) % len(_WORDS)] for k in range(14))
    if i in {size // 4, size // 2, 3 * size // 4}:
        words += f" {NEEDLE.title()}"  # a few matches, in other case than searched
    return f"message {i}: {words}"


def build_store(data_dir: Path, size: int, batch: int = 10_000) -> str:
    """Store ``size`` channel items for one agent through ``store.Database.apply`` (a
    transaction per ``batch``); the id of the 100th newest, to roll back to."""
    rows = ThinRows()
    rows.register([{"id": "bench:#load", "label": "load"}])
    target = ""
    at = accepted_now()
    with Database(db_path(data_dir)) as db:
        for start in range(0, size, batch):
            now = time.time()
            records = []
            for i in range(start, min(size, start + batch)):
                message = {
                    "channelId": "bench:#load",
                    "messageId": f"b{i}",
                    "author": {"id": "u", "name": "Load"},
                    "timestamp": "2026-01-01T00:00:00Z",
                    "content": [{"type": "text", "text": _text(i, size)}],
                }
                records.append(rows.record(message, at, now))
                if i == size - 100:
                    target = records[-1].id
            ops = [
                Append(records=tuple(records[k : k + 1000])) for k in range(0, len(records), 1000)
            ]
            db.apply(ops)
    return target


def time_search(data_dir: Path, budget_s: float = 10.0) -> tuple[float, int, int]:
    """The median time of ``Reader.search`` for :data:`NEEDLE` over three calls (fewer when
    they have taken ``budget_s`` already), how many messages matched and how many calls ran."""
    times: list[float] = []
    found = 0
    with Reader(db_path(data_dir)) as reader:
        while len(times) < 3 and sum(times) < budget_s:
            started = time.perf_counter()
            found = len(reader.search(NEEDLE))
            times.append(time.perf_counter() - started)
    return statistics.median(times), found, len(times)


async def run_store(workdir: Path, size: int) -> dict[str, Any]:
    """Build a store of ``size`` messages of one agent, then time a search, the host's opening,
    the agent's first turn (woken by one local message, to its model call) and a rollback of
    its hundred newest messages through ``Host.rollback``."""
    data = workdir / "data"
    started = time.perf_counter()
    target = build_store(data, size)
    built = time.perf_counter() - started
    search_s, found, searches = await trio.to_thread.run_sync(time_search, data)
    cfg = bh.config(data, [], [bh.agent(AGENT, bh.model(workdir, "says", bh.SAYS_INDEX))])
    started = time.perf_counter()
    async with Host.open(cfg) as host:
        opened = time.perf_counter() - started
        trace = host.trace(kinds={"tokens"})
        posted = time.time()
        await host.post_local(AGENT, "probe 1")
        first_turn = await first_call(trace, AGENT) - posted
        await host.run_until_idle()  # the turn ends before a rollback may start
        started = time.perf_counter()
        try:
            report = await host.rollback(AGENT, target)
        except Exception as exc:  # e.g. the host's own deadline for it: reported as a figure
            report = {"error": f"{type(exc).__name__}: {exc}"}
        rollback_s = time.perf_counter() - started
    return {
        "build_s": built,
        "search_s": search_s,
        "found": found,
        "searches": searches,
        "open_s": opened,
        "first_turn_s": first_turn,
        "rollback_s": rollback_s,
        "set_aside": int(report.get("set_aside", 0)),
        "rollback_error": str(report.get("error", "")),
    }
