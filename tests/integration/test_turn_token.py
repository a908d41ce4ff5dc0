"""Turns take the host one after another: three agents woken by one message answer it in
turn (each agent's model call comes before the next agent's turn starts). The bundled lobby
as a real subprocess; real clock, generous deadlines, order-only assertions."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.trace import TraceEvent
from tests.helpers import running_lobby, send_incoming, wait_trace

pytestmark = pytest.mark.slow

#: A later turn reads the replies of the agents before it: the newest line may be one of theirs.
HELLO = '[[rules]]\nwhen = "(?i)hello|hi from"\nsay = "Hi from {name}."\n'
NAMES = ("Ada", "Grace", "Lin")


async def test_agents_woken_together_take_their_turns_one_after_another(tmp_path: Path) -> None:
    agents = {name: HELLO.replace("{name}", name) for name in NAMES}
    seen: list[TraceEvent] = []
    with trio.fail_after(20):
        async with running_lobby(tmp_path, agents) as lb:
            lb.host.ctx.turns.max_wait = 60  # on a slow machine no waiter may give up
            lb.host.ctx.turns.turn_share_after = 60  # nor a slow turn hand its place over
            send_incoming(lb.ctl, "lobby:#general", "h1", "hello everyone")
            for _ in NAMES:
                await wait_trace(lb.stream, lambda e: e.kind == "published", "a reply", seen)
    said = {e.agent: e.data["text"] for e in seen if e.kind == "published"}
    assert said == {name: f"Hi from {name}." for name in NAMES}
    events = [e for e in seen if e.kind in ("turn-start", "tokens")]
    starts = [e.agent for e in events if e.kind == "turn-start"]
    assert sorted(starts) == sorted(NAMES)
    # between an agent's turn-start and its model's first tokens, no other turn starts
    running: str | None = None
    for e in events:
        if e.kind == "turn-start":
            assert running is None, f"{e.agent}'s turn started while {running}'s was working"
            running = e.agent
        elif e.agent == running:
            running = None
