"""The silence row of the benchmark: how much of a silent turn's input the provider's prompt cache
serves.

One agent hears one channel of chatter it decides not to answer: every line wakes it (no gate)
and its model ends each turn on purpose with nothing to say. The model is the Anthropic provider
against the fake Messages API (:mod:`tests.fake_anthropic`) or the OpenAI-compatible provider
against the fake chat-completions server (:mod:`tests.fake_openai`), each on loopback HTTP with
its prompt cache on: the fake counts the cache reads from the bytes of the requests it is sent,
as its API does (the Anthropic one from the prefixes the request marks, the OpenAI one from the
longest prefix an earlier request shared), so anything that changes early in the prompt from one
turn to the next shows as a smaller share.

A chat server written with the toolkit (:mod:`actors.serverkit`) serves the channel over a
websocket in this process. With ``volatile`` it also has a context hook, granted
``inject.afterUser``, that injects a line which changes every turn (a clock) after the newest
message, where a server should put what changes: it leaves the history before it cached.

Each line is sent once the host is idle after the one before. The figures come from the store's
usage ledger (one row per turn, read once the host has closed): each turn's input tokens
(uncached, read from the cache, written to it) and whether it was silent; the share of a turn is
its cache reads over its whole input. The first turn has nothing to read; the figure is the share
over the turns after it.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import trio

from actors import Host
from actors.serverkit import BeforeInference, Injection, MCPLServer
from examples.bench.room import OneRoom
from store import db_path

CHANNEL = "chatter:#general"
PROVIDERS = ("anthropic", "openai")
PEOPLE = ("alice", "bob", "carol", "dave")
CHATTER = (
    "morning all, the coffee machine on three is fixed",
    "has anyone tried the new release of the parser yet?",
    "I pushed the fix for the flaky upload test, it was a race in the fixture",
    "lunch at noon? the place by the station reopened",
    "the build on main is green again",
    "reminder: the planning meeting moved to Thursday",
    "nice, the latency graphs look much flatter since Monday",
    "I will be offline this afternoon, back tomorrow",
)
SYSTEM_PROMPT = """\
You are Ada, a quiet regular of a busy engineering chat.

Most of what is said there is not for you: people talk among themselves about builds, lunch,
meetings and who is away. Answer only when someone asks you something, names you, or when you
know a fact that settles a question nobody else can; otherwise end your turn without saying
anything at all. Saying nothing is the usual, expected outcome of a turn, not a failure.

When you do answer, keep it short and plain: one or two sentences, no greetings, no sign-off,
no lists unless asked. Quote the line you answer when the channel is busy. Never repeat what
someone else already said, never answer a question that was already answered, and never
thank people for information you did not ask for. If you are unsure whether a message is meant
for you, stay silent: someone who wants your help will ask again and name you.

You can read the channel's history with your tools and look things up, but do not use tools to
decide whether to speak: reading the room is enough. Do not narrate what you are doing.
"""
#: What the fakes count as a silent turn's output (the APIs report a token or two).
SILENT_OUTPUT_TOKENS = 1


@attrs.frozen(kw_only=True)
class TurnRow:
    """One turn's row of the usage ledger."""

    phase: str
    silent: bool
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int

    @property
    def prompt(self) -> int:
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    @property
    def share(self) -> float:
        return self.cache_read_tokens / self.prompt if self.prompt else 0.0


@attrs.frozen(kw_only=True)
class Run:
    provider: str
    volatile: bool
    turns: tuple[TurnRow, ...]

    @property
    def share_after_first(self) -> float:
        """The cache-read share of the input of every turn but the first."""
        later = self.turns[1:]
        prompt = sum(t.prompt for t in later)
        return sum(t.cache_read_tokens for t in later) / prompt if prompt else 0.0


class ChatServer(OneRoom):
    """One channel of chatter; with ``volatile``, a clock injected after the newest message."""

    def __init__(self, *, volatile: bool) -> None:
        kit = MCPLServer("chatter", version="0", default_feature_sets=False)
        kit.feature_set(
            "chatter.chat",
            description="One chat channel.",
            uses=["channels.register", "channels.incoming", "channels.publish"],
        )
        if volatile:
            kit.feature_set(
                "chatter.clock",
                description="The time, after the newest message, before each inference.",
                uses=["contextHooks.beforeInference.inject.afterUser"],
            )
            self.ticks = itertools.count(1)
            kit.before_inference(self._clock)
        super().__init__(kit, CHANNEL)

    def _clock(self, ctx: BeforeInference) -> list[Injection]:
        tick = next(self.ticks)
        when = f"12:{tick // 60:02d}:{tick % 60:02d}"
        return [Injection(content=f"It is {when}, tick {tick}.", position="afterUser")]


@contextlib.asynccontextmanager
async def fake_api(provider: str, turns: int) -> AsyncIterator[tuple[str, Any]]:
    """The provider's fake on loopback, its prompt cache on, scripted with ``turns`` replies
    that say nothing: its base URL and script."""
    script: Any
    async with trio.open_nursery() as nursery:
        if provider == "anthropic":
            from tests import fake_anthropic as fake

            script = fake.FakeScript(
                [fake.Reply(output_tokens=SILENT_OUTPUT_TOKENS) for _ in range(turns)],
                prompt_cache=True,
            )
            url = await nursery.start(fake.serve_fake_anthropic, script)
        elif provider == "openai":
            from tests import fake_openai as fake_oa

            script = fake_oa.FakeScript(
                [fake_oa.Reply(completion_tokens=SILENT_OUTPUT_TOKENS) for _ in range(turns)],
                prompt_cache=True,
            )
            url = await nursery.start(fake_oa.serve_fake_openai, script)
        else:
            raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
        yield url, script
        nursery.cancel_scope.cancel()


def config(work: Path, provider: str, api: str, url: str, *, volatile: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    server: dict[str, Any] = {"id": "chatter", "url": url}
    if volatile:
        server["enabled_capabilities"] = [
            "channels.*",
            "contextHooks.beforeInference.inject.afterUser",
        ]
    model = "anthropic:claude-fake" if provider == "anthropic" else "openai:gpt-fake"
    return {
        "host": {"data_dir": str(work / "data")},
        "servers": [server],
        "agents": [
            {"name": "Ada", "model": model, "base_url": api, "system_prompt": SYSTEM_PROMPT}
        ],
    }


def ledger(data_dir: Path, agent: str) -> tuple[TurnRow, ...]:
    """The agent's rows of the usage ledger, oldest first (read only)."""
    uri = f"{db_path(data_dir).as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
        rows = db.execute(
            "SELECT phase, silent, input_tokens, cache_read_tokens, cache_write_tokens"
            " FROM usage WHERE agent = ? ORDER BY at, turn",
            (agent,),
        ).fetchall()
    return tuple(
        TurnRow(
            phase=str(phase),
            silent=bool(silent),
            input_tokens=int(i),
            cache_read_tokens=int(r),
            cache_write_tokens=int(w),
        )
        for phase, silent, i, r, w in rows
    )


async def run(work: Path, provider: str, turns: int, *, volatile: bool = False) -> Run:
    """``turns`` lines of chatter, each a silent turn of the agent on ``provider``."""
    server = ChatServer(volatile=volatile)
    lines = itertools.cycle(CHATTER)
    async with fake_api(provider, turns) as (api, script), trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        cfg = config(work, provider, api, url, volatile=volatile)
        async with Host.open(cfg, status_file=False) as host:
            await server.accepted.wait()
            for n in range(turns):
                author = PEOPLE[n % len(PEOPLE)]
                await server.room.send(next(lines), author={"id": author, "name": author})
                await host.run_until_idle()
        nursery.cancel_scope.cancel()
    if script.remaining:
        raise RuntimeError(f"{script.remaining} of {turns} turns did not call the model")
    return Run(provider=provider, volatile=volatile, turns=ledger(work / "data", "Ada"))


async def measure(work: Path, turns: int) -> dict[str, Any]:
    """Both providers, one after the other: ``{provider: {...}}``."""
    out: dict[str, Any] = {}
    for provider in PROVIDERS:
        one = await run(work / provider, provider, turns)
        out[provider] = {
            "turns": len(one.turns),
            "silent": sum(t.silent for t in one.turns),
            "share": one.share_after_first,
            "read": sum(t.cache_read_tokens for t in one.turns[1:]),
            "prompt": sum(t.prompt for t in one.turns[1:]),
        }
    return out
