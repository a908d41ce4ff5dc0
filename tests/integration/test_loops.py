"""Servers written to loop, against the real host: an agent whose scripted rule matches its own
reply is woken by one person's message and must not answer itself for ever.

``tests/looping_server.py`` (a subprocess on the toolkit) answers every post with a new message
under a new id: the agent's words under the agent's author (``own``), the agent's words under
the relay's author (``relay``), or a new text of a bot's (``bot``). A chat server in this
process (``tests.chat_servers``) echoes a post under the host's account with the id the publish
was confirmed with, then posts again under that account.

Real clock, generous deadlines, order-only assertions: the tests wait on trace events, never on
the clock.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.host import TraceStream
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from protocol.loops import LIMIT
from tests.chat_servers import DiscordServer, running_chat
from tests.helpers import config, drain_ready, scripted, texts, wait_trace

pytestmark = pytest.mark.slow

LOOPING = [sys.executable, "-m", "tests.looping_server"]
REPLY = "Tell me more about that."
#: The agent answers everything, its own words included.
ANSWER_ALL = f'[[rules]]\nwhen = "."\nsay = "{REPLY}"\n'
ROOM = "loop:#room"


def of(seen: list[TraceEvent], kind: str, agent: str = "Ada") -> list[TraceEvent]:
    return [e for e in seen if e.kind == kind and e.agent == agent]


def turns(seen: list[TraceEvent], agent: str = "Ada") -> int:
    return len(of(seen, "turn-start", agent))


@asynccontextmanager
async def looping(tmp_path: Path, mode: str) -> AsyncIterator[tuple[Host, TraceStream]]:
    """A host with Ada (answering everything) and the looping server in ``mode``, once the
    server is ready and its room registered."""
    server = {"id": "loop", "command": [*LOOPING, mode]}
    agent = {"name": "Ada", "model": scripted(tmp_path, "ada", ANSWER_ALL)}
    async with Host.open(config(tmp_path, [server], [agent])) as host:
        stream = host.trace()
        kinds = {"ready", "channel-registered"}
        while kinds:
            event = await wait_trace(stream, lambda e: e.kind in kinds, "the looping server")
            kinds.discard(event.kind)
        yield host, stream


async def say(host: Host, text: str) -> None:
    """Alice's message into the room, answered once the host has stored it."""
    result = await host.execute_tool_call("Ada", "loop--say", {"text": text})
    assert result["is_error"] is False, result


def withheld_or_past(limit: int, seen: list[TraceEvent]) -> Callable[[TraceEvent], bool]:
    """The first wake withheld from Ada, or her turn past ``limit`` (the guard failed)."""
    return lambda e: (e.kind == "wake-withheld" and e.agent == "Ada") or turns(seen) > limit


async def test_a_server_echoing_under_the_agents_author_gets_one_turn(tmp_path: Path) -> None:
    """The loop of issue 36: the echo comes back under ``agent:Ada`` and a new id."""
    with trio.fail_after(60):
        async with looping(tmp_path, "own") as (host, stream):
            seen: list[TraceEvent] = []
            await say(host, "hello there")
            await wait_trace(stream, withheld_or_past(3, seen), "the echo withheld", seen)
            await host.run_until_idle()
            seen += await drain_ready(stream)
            assert turns(seen) <= 3
            assert turns(seen) == 1 and len(of(seen, "published")) == 1
            [withheld] = of(seen, "wake-withheld")
            assert withheld.data == {"reason": "own", "author": "Ada"}
            assert withheld.channel_id == ROOM
            # stored all the same: Ada reads her echo with her next turn
            assert texts(host.history("Ada"), role="user") == ["hello there", REPLY]


async def test_a_server_relaying_the_agents_words_under_its_own_author(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with looping(tmp_path, "relay") as (host, stream):
            seen: list[TraceEvent] = []
            await say(host, "hello there")
            await wait_trace(stream, withheld_or_past(3, seen), "the relay withheld", seen)
            await host.run_until_idle()
            seen += await drain_ready(stream)
            assert turns(seen) == 1
            [withheld] = of(seen, "wake-withheld")
            assert withheld.data == {"reason": "repeat", "author": "Relay"}
            assert texts(host.history("Ada"), role="user") == ["hello there", f"Ada: {REPLY}"]


async def test_a_bot_answering_every_post_trips_the_breaker(tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with looping(tmp_path, "bot") as (host, stream):
            seen: list[TraceEvent] = []
            await say(host, "hello there")
            await wait_trace(
                stream,
                lambda e: (
                    (e.kind == "wakes-deferred" and e.agent == "Ada") or turns(seen) > 2 * LIMIT
                ),
                "the breaker tripped",
                seen,
            )
            await host.run_until_idle()
            seen += await drain_ready(stream)
            # Alice's message, then one turn per bot reply up to the limit
            assert turns(seen) == 1 + LIMIT and len(of(seen, "published")) == 1 + LIMIT
            [deferred] = of(seen, "wakes-deferred")
            assert deferred.channel_id == ROOM and deferred.data["answers"] == LIMIT + 1
            assert format_event(deferred) == (
                f"! Ada: wakes from loop {ROOM} deferred: {LIMIT + 1} of its posts there "
                "were answered within 60 s (a loop?); stored, not waking"
            )
            assert [e.data["reason"] for e in of(seen, "wake-withheld")] == ["loop"]
            replies = [t for t in texts(host.history("Ada"), role="user") if "bot reply" in t]
            assert len(replies) == LIMIT + 1  # the deferred reply is stored all the same

            # Alice speaks again: the deferral ends and she is answered; the bot loops again,
            # and the breaker trips again at the limit
            mark = len(seen)
            await say(host, "are you still there?")
            await wait_trace(
                stream,
                lambda e: len(of(seen[mark:], "wakes-deferred")) == 1 or turns(seen) > 4 * LIMIT,
                "the breaker tripped again",
                seen,
            )
            await host.run_until_idle()
            seen += await drain_ready(stream)
            [resumed] = of(seen, "wakes-resumed")
            assert resumed.data == {"reason": "another voice", "held": 1}
            assert [e.kind for e in seen[mark:] if e.agent == "Ada"].index("wakes-resumed") < [
                e.kind for e in seen[mark:] if e.agent == "Ada"
            ].index("turn-start")
            assert turns(seen) == 2 * (1 + LIMIT)
            assert len(of(seen, "wakes-deferred")) == 2


# -- an account learnt from an echo -----------------------------------------------------------

OWN_ACCOUNT = {"id": "bot-1", "name": "mcplive"}  # the host's account, as the server names it


class EchoingServer(DiscordServer):
    """Echoes every post under :data:`OWN_ACCOUNT` with the id its answer names; ``echoed`` is
    set once the host has answered the echo."""

    def __init__(self) -> None:
        super().__init__()
        self.echoed = trio.Event()

    async def answer(self, method: str, params: Mapping[str, Any]) -> Any:
        result = await super().answer(method, params)
        if method == "channels/publish":
            echo = self.message(
                params["channelId"], result["messageId"], params["content"], author=OWN_ACCOUNT
            )
            self.spawn(self._echo, echo)
        return result

    async def _echo(self, echo: dict[str, Any]) -> None:
        await self.incoming(echo)
        self.echoed.set()


async def test_an_account_that_echoed_a_post_wakes_its_agent_no_more(tmp_path: Path) -> None:
    server = EchoingServer()
    room = DiscordServer.ROOM
    with trio.fail_after(60):
        async with running_chat(tmp_path, server, agents=("Ada", "Grace")) as host:
            stream = host.trace()
            posted = await host.execute_tool_call(
                "Ada", "channel_publish", {"content": "a first post", "channel_id": room}
            )
            assert posted["is_error"] is False, posted
            await server.echoed.wait()
            # the same account again, under a new id and with new words
            await server.say(room, "later-1", "something else entirely", author=OWN_ACCOUNT)
            await host.run_until_idle()
            seen = await drain_ready(stream)
            [withheld] = of(seen, "wake-withheld")
            assert withheld.data == {"reason": "own", "author": "mcplive"}
            assert turns(seen) == 0
            assert turns(seen, "Grace") == 1  # it is not Grace's account
            assert "something else entirely" in texts(host.history("Ada"), role="user")
