"""A publish the host's stop cuts short says so in words, never in trio's.

An in-process toolkit server, joined to the real host by the toolkit's memory transport, sends
the echo of an agent's post (which the host holds until the post is answered) and never answers
the publish; the host stops while it waits. What the host then says of the post, in the
``published`` line and in the draft it keeps, names the stop. Real clock (the store writes in a
thread), a generous deadline, no timing asserts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.agent.speech import CUT_SHORT
from actors.serverkit import HostRequest, MCPLServer
from actors.transcript.lines import format_event
from tests.awaiting_server import transports
from tests.helpers import config, scripted

pytestmark = pytest.mark.slow

RULES = '[[rules]]\nwhen = "hello"\nsay = "Hi room."\n'


async def test_a_publish_cut_short_by_the_stop_says_so_in_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = MCPLServer("kit", request_timeout=3600)
    room = kit.channel("kit:room", label="#room", publish_target="root")
    held = trio.Event()

    @kit.answer_for("channels/publish")
    async def hold(request: HostRequest) -> Any:
        words = "".join(b.get("text", "") for b in request.params["content"])
        author = {"id": request.params["conversationId"], "name": "Ada"}
        kit.spawn(lambda: room.send(words, author=author))  # the echo, answered after the post
        held.set()
        await trio.sleep_forever()  # the post itself is never answered

    entry = {"id": "kit", "command": ["in-process"], "request_timeout_s": 3600}
    cfg = config(tmp_path, [entry], [{"name": "Ada", "model": scripted(tmp_path, "ada", RULES)}])
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            monkeypatch.setattr("actors.link.connection.open_transport", transports(nursery, kit))
            async with Host.open(cfg) as host:
                said = host.trace(kinds={"published", "speech-held"})
                await kit.granted("channels.incoming")
                await kit.registered.wait()
                await room.send("hello", author="bob")  # Ada answers "Hi room." into #room
                await held.wait()
            nursery.cancel_scope.cancel()
        lines = [format_event(e) or "" async for e in said]
    assert lines == [
        f"kit kit:room | Ada → Hi room. (unconfirmed: {CUT_SHORT})",
        f"Ada (kept as a draft [d1]: {CUT_SHORT}): Hi room.",
    ]
