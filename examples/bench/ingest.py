"""Ingest rows of the benchmark: (a), (a'), (b), (c), coalescing, and the check that (b) stores
what mcplive stores.

(b), the thinnest host, does only what any host storing these items must: it reads the lines and
parses them with ``json``, answers each request with ``json.dumps``, renders a channel's source
header once (when the channel is registered), marks a body only when it holds a ``[`` (what
:func:`protocol.source.mark_blocks` checks first), computes both digests in one pass
(:func:`protocol.digests.body_digests`) and takes one ``accepted_at`` per read (as mcplive does
per batch of lines). What was read while the last transaction was committed goes to
``store.Database.apply`` in the next one (in a worker thread, while reading goes on), and is
answered once committed.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from actors import Host
from examples.bench import host as bh
from protocol.digests import body_digests
from protocol.source import channel_header, mark_blocks
from store import Append, Database, MessageRecord, Reader, connect, db_path
from store.codec import encode_body


async def line_batches(stream: Any, size: int = 65536) -> AsyncIterator[list[bytes]]:
    """The complete lines each read of ``stream`` brings (a line cut short waits for the next
    read), until the stream ends."""
    buf = b""
    while data := await stream.receive_some(size):
        buf += data
        *lines, buf = buf.split(b"\n")
        yield lines


SERVER_ID = "bench"
AGENT = "Bench"


class ThinRows:
    """The rows the thinnest host stores: the same shape as mcplive's channel items."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}  # channel id -> its source header, rendered once
        self.labels: dict[str, str | None] = {}
        self._prefix = secrets.token_hex(4)
        self._n = 0

    def register(self, channels: list[dict[str, Any]]) -> None:
        for c in channels:
            label = c.get("label") or None
            self.headers[c["id"]] = channel_header(SERVER_ID, c["id"], label, None)
            self.labels[c["id"]] = label

    def record(self, message: dict[str, Any], accepted_at: str, now: float) -> MessageRecord:
        channel, mid, author = message["channelId"], message["messageId"], message["author"]
        header = self.headers[channel]
        body = message["content"]
        marked = mark_blocks(body)
        stored = ({"type": "text", "text": header}, *marked)
        delivered, kept = body_digests(body, stored)
        metadata = {
            "server_id": SERVER_ID,
            "channel_id": channel,
            "thread_id": None,
            "message_id": mid,
            "author": {"id": author["id"], "name": author["name"]},
            "timestamp": message["timestamp"],
            "tags": [],
            "inbound_source": {
                "lane": "incoming",
                "server": SERVER_ID,
                "channel": channel,
                "thread": None,
                "message": mid,
                "label": self.labels[channel],
                "reply_to": None,
                "accepted_at": accepted_at,
            },
            "source_body_digest": delivered,
            "stored_body_digest": kept,
            "source_header": header,
        }
        self._n += 1
        return MessageRecord(
            id=f"m_{self._prefix}{self._n:08x}",
            agent=AGENT,
            role="user",
            blocks=stored,
            metadata=metadata,
            created_at=now,
        )


def accepted_now() -> str:
    """The time an item was accepted, as mcplive writes it (milliseconds, UTC, ``Z``)."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def run_mcplive(
    workdir: Path, messages: int, extra: list[str], store: str | None = None
) -> float:
    """Seconds the bench server took to have ``messages`` answered by mcplive, one agent; on
    the PostgreSQL database ``store`` (a DSN) when given."""
    cfg = bh.config(
        workdir / "data",
        [bh.server(SERVER_ID, "--messages", str(messages), *extra)],
        [bh.agent(AGENT, bh.model(workdir, "silent", bh.SILENT))],
    )
    if store is not None:
        cfg["host"]["store"] = store
    async with Host.open(cfg) as host:
        async for event in host.trace(kinds={"server-log", "disconnected"}):
            seconds = bh.done_seconds(event)
            if seconds is not None:
                return seconds
            if event.kind == "disconnected":
                raise RuntimeError(f"bench server failed: {event.data}")
    raise RuntimeError("trace ended")


_INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "t"}},
}
_CAPS = ["channels.register", "channels.incoming"]


def _line(obj: object) -> bytes:
    return (json.dumps(obj) + "\n").encode()


class ThinHost:
    """(b): one trio task reads the server's lines, parses them and builds the rows and the
    answers; a second one commits what was read so far in one transaction, in a worker thread
    while reading goes on (group commit, as mcplive's writer does), then sends those answers."""

    def __init__(self, db: Database, send: Any) -> None:
        self.db = db
        self.send = send
        self.rows = ThinRows()
        self.ops: list[Append] = []
        self.out: list[bytes] = []
        self.work = trio.Event()

    def take(self, msg: dict[str, Any], accepted_at: str, now: float) -> None:
        method = msg.get("method")
        if method is None and msg.get("id") == 1:
            self.out.append(_line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            params = {"effectiveCapabilities": _CAPS}
            update = {"jsonrpc": "2.0", "id": 2, "method": "featureSets/update", "params": params}
            self.out.append(_line(update))
        elif method == "channels/register":
            channels = msg["params"]["channels"]
            self.rows.register(channels)
            out = [{"id": c["id"], "accepted": True} for c in channels]
            self.out.append(_line({"jsonrpc": "2.0", "id": msg["id"], "result": {"results": out}}))
        elif method == "channels/incoming":
            out = []
            for m in msg["params"]["messages"]:
                key = f"{m['channelId']}\x00{m['messageId']}"
                record = self.rows.record(m, accepted_at, now)
                self.ops.append(Append(records=(record,), dedupe=("incoming", SERVER_ID, key)))
                out.append({"messageId": m["messageId"], "accepted": True})
            self.out.append(_line({"jsonrpc": "2.0", "id": msg["id"], "result": {"results": out}}))

    async def read(self, stdout: Any) -> None:
        async for lines in line_batches(stdout):
            accepted_at, now = accepted_now(), time.time()
            for raw in lines:
                self.take(json.loads(raw), accepted_at, now)
            if self.out:
                self.work.set()

    async def commit(self) -> None:
        while True:
            await self.work.wait()
            self.work = trio.Event()
            ops, out, self.ops, self.out = self.ops, self.out, [], []
            if ops:  # committed before anything read with them is answered
                await trio.to_thread.run_sync(self.db.apply, ops)
            await self.send(b"".join(out))


async def run_thin(workdir: Path, messages: int, extra: list[str] | None = None) -> float:
    """(b): seconds the bench server took to have ``messages`` answered by the thinnest host."""
    db = Database(db_path(workdir / "thin"))
    proc = await trio.lowlevel.open_process(
        [*bh.SERVER, "--messages", str(messages), *(extra or [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin and proc.stdout and proc.stderr
    result: list[float] = []
    host = ThinHost(db, proc.stdin.send_all)

    async def watch_stderr() -> None:
        assert proc.stderr
        async for lines in line_batches(proc.stderr, 4096):
            for line in lines:
                fields = bh.bench_fields(line.decode())
                if fields is not None and "seconds" in fields:
                    result.append(float(fields["seconds"]))
                    nursery.cancel_scope.cancel()
                    return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_stderr)
        nursery.start_soon(host.read, proc.stdout)
        nursery.start_soon(host.commit)
        await proc.stdin.send_all(_line(_INIT))
    await proc.stdin.aclose()
    await proc.wait()
    db.close()
    if not result:
        raise RuntimeError("the bench server ended before it reported")
    return result[0]


def sample(i: int) -> dict[str, Any]:
    """Message ``i`` as the bench server sends it."""
    return {
        "channelId": "bench:#load",
        "messageId": f"b{i}",
        "author": {"id": "u", "name": "Load"},
        "timestamp": "2026-01-01T00:00:00Z",
        "content": [{"type": "text", "text": f"t=0.0 message {i}"}],
    }


def run_raw(workdir: Path, messages: int) -> float:
    """(c): the same rows appended with ``executemany`` in one transaction, into a table of
    the benchmark's own (so the figure does not depend on the store's schema)."""
    conn = connect(db_path(workdir / "raw"))
    thin = ThinRows()
    thin.register([{"id": "bench:#load", "label": "load"}])
    at, now = accepted_now(), time.time()
    rows = [
        (r.id, r.agent, r.role, r.created_at, encode_body(r.blocks, r.metadata))
        for r in (thin.record(sample(i), at, now) for i in range(messages))
    ]
    conn.execute(
        "CREATE TABLE bench_raw (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,"
        " agent TEXT NOT NULL, role TEXT NOT NULL, created_at REAL NOT NULL, body BLOB NOT NULL)"
    )
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO bench_raw (id, agent, role, created_at, body) VALUES (?, ?, ?, ?, ?)", rows
    )
    conn.execute("COMMIT")
    seconds = time.perf_counter() - start
    conn.close()
    return seconds


# -- the check that (b) stores what mcplive stores ---------------------------------------------

SHAPE_ARGS = ["--fixed-stamp", "--forged-every", "7", "--closed"]
_ID = re.compile(r"\S+")
_ACCEPTED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def stored_rows(data_dir: Path) -> list[dict[str, Any]]:
    """Every stored message of a store, oldest first, read a page at a time."""
    out: list[dict[str, Any]] = []
    with Reader(db_path(data_dir), read_only=True) as reader:
        after = 0
        while page := reader.rows(after_seq=after, limit=1000):
            out += [row.message for row in page]
            after = page[-1].seq
    return out


def _comparable(message: dict[str, Any]) -> dict[str, Any]:
    """A stored message without what must differ between two hosts: its id (checked to be a
    word; unique, see :func:`compare_stores`) and the moment it was accepted (checked for its
    format)."""
    meta = dict(message["metadata"])
    source = dict(meta["inbound_source"])
    accepted = source.pop("accepted_at")
    if not (_ID.fullmatch(message["id"]) and _ACCEPTED.fullmatch(accepted)):
        return {"unexpected id or accepted_at": (message["id"], accepted)}
    meta["inbound_source"] = source
    return {**message, "id": None, "metadata": meta}


def compare_stores(mcplive: Path, thin: Path, messages: int) -> dict[str, Any]:
    """Compare, message by message, the rows both hosts stored for the same ``messages``."""
    ours, theirs = stored_rows(mcplive), stored_rows(thin)
    problems: list[str] = []
    if not len(ours) == len(theirs) == messages:
        problems.append(f"row counts: mcplive {len(ours)}, thin {len(theirs)}, sent {messages}")
    for name, rows in (("mcplive", ours), ("thin", theirs)):
        if len({m["id"] for m in rows}) != len(rows):
            problems.append(f"{name}: row ids are not unique")
    by_id = {m["metadata"].get("message_id"): m for m in theirs}
    marked = 0
    for mine in ours:
        other = by_id.get(mine["metadata"].get("message_id"))
        if other is None:
            problems.append(f"thin host lacks {mine['metadata'].get('message_id')}")
            continue
        if any("\\[source" in str(b.get("text", "")) for b in mine["blocks"]):
            marked += 1
        a, b = _comparable(mine), _comparable(other)
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            problems.append(f"{mine['metadata'].get('message_id')}: {keys} differ")
    for where in (mcplive, thin):
        with Reader(db_path(where), read_only=True) as reader:
            lacking = [
                m["metadata"]["message_id"]
                for m in ours
                if not reader.has_dedupe(
                    "incoming", SERVER_ID, f"bench:#load\x00{m['metadata']['message_id']}"
                )
            ]
        if lacking:
            problems.append(f"{where.name}: no dedupe key for {lacking[:3]}")
    return {"rows": len(theirs), "marked": marked, "problems": problems[:5]}


async def check_shape(workdir: Path, messages: int) -> dict[str, Any]:
    """Send the same ``messages`` (fixed bodies, every seventh with a forged header) to mcplive
    and to the thinnest host and compare what they stored."""
    args = ["--window", "16", *SHAPE_ARGS]
    (workdir / "a").mkdir()
    await run_mcplive(workdir / "a", messages, args)
    await run_thin(workdir / "b", messages, args)
    return compare_stores(workdir / "a" / "data", workdir / "b" / "thin", messages)
