"""A link's lines reach a real stdio server in the order they were sent, whether they went out
in the sender's step (``Link.write_now``, while the writer has nothing in hand) or through the
link's writer task. The server is ``cat``: it echoes every line back, so the order it read them
in is the order read back."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import trio
from trio.testing import wait_all_tasks_blocked

from actors.link.io import LinkIO, new_link
from actors.link.state import Link
from actors.link.transport import StdioTransport

GENEROUS_S = 60.0  # real processes: a bound against hanging, never a timing assertion


class Owner:
    def __init__(self) -> None:
        self.diagnostics: list[str] = []

    def diagnostic(self, text: str) -> None:
        self.diagnostics.append(text)


async def send(link: Link, line: str) -> str:
    """What the connection does with a line (``ConnectionActor.send_lines``); how it went."""
    if link.write_now([line]):
        return "now"
    await link.outbox_send.send([line])
    return "queued"


async def read_back(transport: StdioTransport, n: int) -> list[str]:
    lines: list[str] = []
    while len(lines) < n:
        item = await transport.receive()
        assert isinstance(item, str), item
        lines.append(item)
    return lines


async def cat_link(nursery: trio.Nursery) -> tuple[Link, StdioTransport, trio.Process]:
    proc = await trio.lowlevel.open_process(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    transport = StdioTransport(proc, 1 << 20, "cat")
    return new_link(transport), transport, proc


async def finish(link: Link, proc: trio.Process) -> None:
    """Let the writer write what is queued and stop, then end ``cat`` by closing its input."""
    link.outbox_send.close()
    await link.written.wait()
    assert proc.stdin is not None
    await proc.stdin.aclose()
    await proc.wait()


def writer_of(link: Link) -> LinkIO:
    owner = SimpleNamespace(diagnostic=Owner().diagnostic)
    return LinkIO(owner, lanes=None, requests=None, on_notification=lambda _l, _n: None)  # type: ignore[arg-type]


async def test_a_line_goes_out_at_once_only_while_the_writer_has_nothing_in_hand():
    with trio.fail_after(GENEROUS_S):
        async with trio.open_nursery() as nursery:
            link, transport, proc = await cat_link(nursery)
            assert not link.write_now(["before the writer runs"])  # nobody waits for lines
            link.outbox_send.send_nowait(["first"])
            nursery.start_soon(writer_of(link).writer, link)
            assert not link.write_now(["second"])  # "first" is still queued: it goes first
            await link.outbox_send.send(["second"])
            await wait_all_tasks_blocked()  # the writer wrote both and waits for more
            assert link.write_now(["third"])
            assert not link.write_now(["x" * 8192])  # too long to be sure of a whole write
            await link.outbox_send.send(["x" * 8192])
            assert await read_back(transport, 4) == ["first", "second", "third", "x" * 8192]
            await finish(link, proc)


async def test_lines_from_many_senders_arrive_in_the_order_sent():
    """Senders interleave; some lines go out at once, others wait behind queued ones (long
    lines always do), yet the server reads them all in the order they were sent."""
    sent: list[str] = []
    ways: set[str] = set()
    with trio.fail_after(GENEROUS_S):
        async with trio.open_nursery() as nursery:
            link, transport, proc = await cat_link(nursery)
            nursery.start_soon(writer_of(link).writer, link)
            await wait_all_tasks_blocked()

            async def sender(k: int) -> None:
                for i in range(60):
                    line = f"{k}:{i}:" + ("y" * 6000 if i % 7 == 0 else "")
                    sent.append(line)  # the order sent: no wait between this and the send
                    ways.add(await send(link, line))
                    if i % 3 == k % 3:
                        await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as senders:
                for k in range(4):
                    senders.start_soon(sender, k)
            assert await read_back(transport, len(sent)) == sent
            assert ways == {"now", "queued"}  # both ways were taken
            await finish(link, proc)
