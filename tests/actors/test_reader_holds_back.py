"""A connection's reader under contention: while others need the host, a flooding server's
requests stay unread in its own transport once ``SHARED_QUEUE`` of them wait for the dispatcher
(instead of up to ``REQUEST_QUEUE_CAP`` parsed ones); the reader never holds back while the
host awaits an answer from that server, since the answer may be behind the backlog.

The reader runs over a memory transport with a stand-in owner; nothing takes the queue unless
the test does (the dispatcher's part)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from actors.kernel import Work
from actors.link.io import REQUEST_QUEUE_CAP, SHARED_QUEUE, LinkIO, new_link
from actors.link.state import READ_BATCH
from protocol.fairness import SHARED_SLICE
from tests.vector_server import MemoryTransport

BACKLOG = 300


class Context:
    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.last_read: dict[str, float] = {}

    def contended(self, server_id: str) -> bool:
        return self.shared

    def ingest_slice(self, server_id: str, full: int) -> int:
        return min(full, SHARED_SLICE) if self.shared else full


class Owner:
    sid = "flood"

    def __init__(self, shared: bool) -> None:
        self.ctx = Context(shared)
        self.cfg = SimpleNamespace(max_line_bytes=1 << 20)
        self.work = Work()
        self.diagnostics: list[str] = []

    def diagnostic(self, text: str) -> None:
        self.diagnostics.append(text)


def push(n: int) -> str:
    params = {"featureSet": "load", "eventId": f"e{n}", "payload": {"n": n}}
    return json.dumps({"jsonrpc": "2.0", "id": n, "method": "push/event", "params": params})


async def flooded_reader(
    nursery: trio.Nursery, shared: bool, lines: list[str]
) -> tuple[Any, Owner, trio.MemorySendChannel[str]]:
    """A ready link whose server has written ``lines`` (all of them, at once), its reader
    started, and the server's side of the transport (for what it writes next)."""
    to_host, from_server = trio.open_memory_channel[str](len(lines) + 16)
    to_server, _ = trio.open_memory_channel[str](16)
    link = new_link(MemoryTransport(to_server, from_server))
    link.decided = link.admitting = link.ready = True
    owner = Owner(shared)
    io = LinkIO(owner, lanes=None, requests=None, on_notification=lambda _l, _n: None)  # type: ignore[arg-type]
    for line in lines:
        to_host.send_nowait(line)
    nursery.start_soon(io.reader, link)
    await trio.testing.wait_all_tasks_blocked()
    return link, owner, to_host


async def test_contended_the_reader_stops_parsing_past_the_shared_queue(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with trio.open_nursery() as nursery:
        link, owner, _ = await flooded_reader(nursery, True, [push(n) for n in range(BACKLOG)])
        queued = len(link.requests)
        assert SHARED_QUEUE <= queued < SHARED_QUEUE + READ_BATCH
        assert owner.work.count == queued  # parsed and counted: only what is queued
        # the dispatcher's part: each take lets the reader read on, a little at a time
        taken: list[Any] = []
        while len(taken) < BACKLOG:
            taken += await link.requests.take(SHARED_SLICE)
            await trio.testing.wait_all_tasks_blocked()
            assert len(link.requests) < SHARED_QUEUE + READ_BATCH
        assert [r.id for r in taken] == list(range(BACKLOG))  # nothing lost, in order
        nursery.cancel_scope.cancel()


async def test_alone_the_reader_reads_the_whole_backlog(autojump_clock: trio.abc.Clock) -> None:
    async with trio.open_nursery() as nursery:
        link, _, _ = await flooded_reader(nursery, False, [push(n) for n in range(BACKLOG)])
        assert len(link.requests) == BACKLOG <= REQUEST_QUEUE_CAP
        nursery.cancel_scope.cancel()


async def test_an_answer_behind_the_held_back_backlog_still_arrives(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The host asks the server something while the reader holds back; the server's answer
    comes after its backlog. Holding back until the dispatcher drained the queue would stall
    every caller awaiting that server (a publish awaiting its receipt holds the channel's
    possible echoes, so the dispatcher may be the one waiting)."""
    async with trio.open_nursery() as nursery:
        lines = [push(n) for n in range(BACKLOG)]
        link, _, server = await flooded_reader(nursery, True, lines)
        held = len(link.requests)
        assert held < BACKLOG
        rid, _line = link.session.send_request("ping", {}, now=trio.current_time(), timeout=30)
        answers = link.expect(rid)
        # the server answers after the backlog still unread: a new arrival the reader must reach
        with trio.fail_after(5):
            await server.send(json.dumps({"jsonrpc": "2.0", "id": rid, "result": {}}))
            answer = await answers.receive()
        assert answer.unwrap() == {}
        assert len(link.requests) == BACKLOG  # it read on past the shared queue to reach it
        nursery.cancel_scope.cancel()
