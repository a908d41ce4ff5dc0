"""The community row of the benchmark: tokens per useful reply in a scripted conversation that
five agents hear, with no gate (every line wakes every agent) against ``gate = "community"``
(a line wakes only the agent it addresses; the rest waits for that agent's next turn).

A chat server written with the toolkit (:mod:`actors.serverkit`) serves one channel,
``community:#general``, over a websocket in this process, and echoes what the agents publish
there (as chat servers do). The conversation (:func:`conversation`) is ``lines`` lines from
four people: every ``ADDRESS_EVERY``-th line addresses one agent in turn, by ``@name``, by its
name or by an alias; the others are chatter that names no agent. Each line is sent once the
host is idle after the one before (every turn it woke has ended and every echo is stored), so
both runs see the same conversation, line by line, whatever the machine's speed.

Each agent's scripted model (``scripted:<rules.toml>``) answers a line that names it and says
nothing otherwise; it reports what it read and wrote as usage (a token per four characters), a
silent turn included. From the host's trace: the tokens of every turn (``turn-usage``: input
plus output), the turns that said nothing (output 0), and the replies published
(``published``, delivered). Tokens per useful reply is the run's total over its replies.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import attrs
import trio

from actors import Host
from actors.serverkit import MCPLServer, Publish
from examples.bench.room import OneRoom
from protocol.echoes import FROM_SELF

CHANNEL = "community:#general"
#: The agents, each with the aliases it answers to besides its name.
AGENTS: dict[str, tuple[str, ...]] = {
    "Ada": (),
    "Grace": ("Hopper",),
    "Linus": (),
    "Barbara": ("Babs",),
    "Edsger": (),
}
PEOPLE = ("alice", "bob", "carol", "dave")
#: One line in this many addresses an agent.
ADDRESS_EVERY = 4
CHATTER = (
    "morning all, the coffee machine on three is fixed",
    "has anyone tried the new release of the parser yet?",
    "I pushed the fix for the flaky upload test, it was a race in the fixture",
    "lunch at noon? the place by the station reopened",
    "the build on main is green again",
    "reminder: the planning meeting moved to Thursday",
    "I am reading the design doc for the cache layer, some good ideas in there",
    "does the staging database still need the migration from last week?",
    "nice, the latency graphs look much flatter since Monday",
    "I will be offline this afternoon, back tomorrow",
    "who broke the docs site? the search box is gone",
    "never mind, it was my browser cache",
)
QUESTIONS = (
    "can you review the retry logic in the uploader?",
    "what do you think of splitting the config module?",
    "could you summarise the thread about the cache layer?",
    "is the migration safe to run on staging today?",
    "any idea why the nightly job took twice as long?",
)
REPLY = "Noted. I will look into it and report back here."


def _rules(name: str, aliases: tuple[str, ...]) -> str:
    words = "|".join((name, *aliases))
    return f"[[rules]]\nwhen = '(?i)\\b({words})\\b'\nsay = {REPLY!r}\n"


@attrs.frozen
class Line:
    author: str
    text: str
    addressed: str | None  # the agent it addresses, or None for chatter


def conversation(lines: int) -> list[Line]:
    """The scripted conversation: every ``ADDRESS_EVERY``-th line addresses the next agent
    (by ``@name``, ``Name,`` or an alias, in turn), the others are chatter."""
    names = itertools.cycle(AGENTS)
    chatter = itertools.cycle(CHATTER)
    questions = itertools.cycle(QUESTIONS)
    out = []
    for i in range(lines):
        author = PEOPLE[i % len(PEOPLE)]
        if i % ADDRESS_EVERY != ADDRESS_EVERY - 1:
            out.append(Line(author, next(chatter), None))
            continue
        name = next(names)
        # the askers take turns, so no agent answers one person often enough to look like a
        # loop to the host (which withholds such wakes, see ``wake-withheld``)
        author = PEOPLE[(i // ADDRESS_EVERY) % len(PEOPLE)]
        form = (i // ADDRESS_EVERY) % 3
        aliases = AGENTS[name]
        if form == 0:
            text = f"@{name.lower()} {next(questions)}"
        elif form == 1 or not aliases:
            text = f"{name}, {next(questions)}"
        else:
            text = f"{aliases[0]}: {next(questions)}"
        out.append(Line(author, text, name))
    return out


class ChatServer(OneRoom):
    """One channel; what an agent publishes is echoed into it."""

    def __init__(self) -> None:
        super().__init__(MCPLServer("community", version="0"), CHANNEL)
        self.room.on_publish(self._heard)
        self.heard = 0
        self.echoed = 0  # echoes the host has answered (stored)

    async def _heard(self, publish: Publish) -> None:
        # echoed here rather than with Publish.echo, so that the run knows when it is stored
        self.heard += 1
        await self.room.send(
            list(publish.content),
            author=publish.author,
            message_id=publish.message_id,
            thread_id=publish.thread_id,
            tags=(FROM_SELF,),
        )
        self.echoed += 1


@attrs.define
class Run:
    """What one run of the conversation cost and said."""

    gate: str  # "none" or "community"
    lines: int = 0
    addressed: int = 0
    answered: int = 0  # addressed lines the agent addressed replied to
    turns: int = 0
    silent: int = 0  # turns that said nothing
    replies: int = 0  # replies published (delivered)
    input_tokens: int = 0
    output_tokens: int = 0
    unanswered: list[str] = attrs.Factory(list)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def per_reply(self) -> float:
        return self.tokens / self.replies if self.replies else float("inf")

    @property
    def silent_share(self) -> float:
        return self.silent / self.turns if self.turns else 0.0


def config(work: Path, url: str, gate: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    agents = []
    for name, aliases in AGENTS.items():
        rules = work / f"{name.lower()}.toml"
        rules.write_text(_rules(name, aliases), encoding="utf-8")
        agent: dict[str, Any] = {"name": name, "model": f"scripted:{rules}"}
        if aliases:
            agent["aliases"] = list(aliases)
        if gate == "community":
            agent["gate"] = "community"
        agents.append(agent)
    return {
        "host": {"data_dir": str(work / "data")},
        "servers": [{"id": "community", "url": url}],
        "agents": agents,
    }


async def _settle(host: Host, server: ChatServer, published: list[Any]) -> None:
    """Return once the host is idle and every reply it published has been echoed and stored
    (the echo is sent after the publish is answered, so one idle moment may come before it)."""
    while True:
        await host.run_until_idle()
        if server.echoed == server.heard == len(published):
            return
        await trio.sleep(0.001)


async def run(work: Path, gate: str, lines: int) -> Run:
    """The conversation of ``lines`` lines with every agent on ``gate`` ("none" or
    "community")."""
    if gate not in ("none", "community"):
        raise ValueError(f"gate must be 'none' or 'community', not {gate!r}")
    result = Run(gate=gate)
    server = ChatServer()
    usage: list[Any] = []
    published: list[Any] = []
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        async with Host.open(config(work, url, gate), status_file=False) as host:
            await server.accepted.wait()

            async def watch() -> None:
                async for event in host.trace(kinds={"turn-usage", "published"}):
                    if event.kind == "turn-usage":
                        usage.append(event)
                    elif event.data.get("outcome") == "delivered":
                        published.append(event)

            nursery.start_soon(watch)
            for line in conversation(lines):
                before = len(published)
                await server.room.send(line.text, author={"id": line.author, "name": line.author})
                await _settle(host, server, published)
                result.lines += 1
                if line.addressed is not None:
                    result.addressed += 1
                    if any(e.agent == line.addressed for e in published[before:]):
                        result.answered += 1
                    else:
                        result.unanswered.append(f"{line.addressed}: {line.text}")
            for event in usage:
                result.turns += 1
                result.input_tokens += int(event.data.get("input_tokens") or 0)
                output = int(event.data.get("output_tokens") or 0)
                result.output_tokens += output
                result.silent += output == 0
            result.replies = len(published)
        nursery.cancel_scope.cancel()
    return result


async def compare(work: Path, lines: int) -> dict[str, Any]:
    """Both runs, one after the other: ``{"none": ..., "community": ...}`` as dicts."""
    out: dict[str, Any] = {}
    for gate in ("none", "community"):
        one = await run(work / gate, gate, lines)
        out[gate] = {
            **attrs.asdict(one),
            "tokens": one.tokens,
            "per_reply": one.per_reply,
            "silent_share": one.silent_share,
        }
    return out
