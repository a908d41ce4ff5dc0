"""The loop guard in the AgentActor, on trio's MockClock: the agent's own posts and repeats of
them do not wake it (a repeat wakes it again once its window has passed), and the loop breaker
defers a channel's wakes after too many answered posts, until the channel has been quiet.

A host with three agents and no server; wakes are told to the agents directly, as the
connection actor tells them, and the agent's posts are told to its guard as its speech tells
them. Where the virtual time matters the agent's turns are held (``Host.hold``): a turn waits
on the store's thread, and the mock clock jumps meanwhile.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors import Host
from actors.agent.actor import AgentActor
from actors.messages import Wake
from actors.trace import TraceEvent
from actors.transcript.lines import format_event, level_of
from protocol.loops import LIMIT, QUIET_S, REPEAT_WINDOW_S
from protocol.receipts import Place
from tests.actors.test_agent_gate import TimedModel, ready_events
from tests.helpers import config, install, scripted

PLACE = Place(server_id="s1", channel_id="c1", label="#c1")
REPLY = "Tell me more about that."
_ids = itertools.count(1)


@pytest.fixture
def agents(monkeypatch: pytest.MonkeyPatch) -> dict[str, AgentActor]:
    """The agents of the next ``Host.open``, by name, each running a silent model."""
    made: dict[str, AgentActor] = {}

    class Kept(AgentActor):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            made[self.cfg.name] = self

    monkeypatch.setattr("actors.host.AgentActor", Kept)
    install(monkeypatch, TimedModel())  # type: ignore[arg-type]
    return made


def host_config(tmp_path: Path) -> dict[str, Any]:
    names = ("Ada", "Grace", "Hopper")
    agents = [{"name": n, "model": scripted(tmp_path, n.lower(), "")} for n in names]
    return config(tmp_path, [], agents)


def item(
    text: str = "hello", *, author: str = "Alice", author_id: str = "alice", **kw: Any
) -> Wake:
    return Wake(
        lane="incoming",
        server_id="s1",
        channel_id="c1",
        message_id=f"m{next(_ids)}",
        text=text,
        author=author,
        author_id=author_id,
        **kw,
    )


def of(events: list[TraceEvent], kind: str, agent: str = "Ada") -> list[TraceEvent]:
    return [e for e in events if e.kind == kind and e.agent == agent]


async def told(host: Host, agent: str, *wakes: Wake) -> None:
    for wake in wakes:
        await host.ctx.agents[agent].tell(wake)
    await host.run_until_idle()


async def test_own_posts_do_not_wake_their_agent_but_wake_the_others(
    tmp_path: Path, agents: dict[str, AgentActor], autojump_clock: trio.abc.Clock
) -> None:
    async with Host.open(host_config(tmp_path)) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        by_ada = item("a new thought", author="Ada", author_id="agent:Ada")
        by_her_account = item(
            "another thought", author="mcplive", author_id="bot-1", own_of=frozenset({"Ada"})
        )
        await told(host, "Ada", by_ada, by_her_account)
        await told(host, "Grace", by_ada, by_her_account)
        seen = ready_events(stream)
        assert of(seen, "turn-start") == []
        withheld = of(seen, "wake-withheld")
        assert [(e.data["reason"], e.data["author"]) for e in withheld] == [
            ("own", "Ada"),
            ("own", "mcplive"),
        ]
        assert (withheld[0].server_id, withheld[0].channel_id) == ("s1", "c1")
        assert of(seen, "wake-withheld", "Grace") == []
        assert [e.data["wakes"] for e in of(seen, "turn-start", "Grace")] == [1, 1]
        line = format_event(withheld[0])
        assert line == "  Ada not woken by Ada in s1 c1: its own post"


async def test_a_repeat_wakes_the_agent_again_once_its_window_has_passed(
    tmp_path: Path, agents: dict[str, AgentActor], autojump_clock: trio.abc.Clock
) -> None:
    async with Host.open(host_config(tmp_path)) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        ada = agents["Ada"]
        posted = trio.current_time()
        ada.loops.published(PLACE, REPLY)
        await trio.sleep_until(posted + REPEAT_WINDOW_S - 1)
        relayed = item("Relay:  tell me MORE about that.", author="Relay", author_id="relay")
        elsewhere = attrs.evolve(relayed, channel_id="c2")
        await told(host, "Ada", relayed)
        seen = ready_events(stream)
        assert [e.data["reason"] for e in of(seen, "wake-withheld")] == ["repeat"]
        assert of(seen, "turn-start") == []
        await told(host, "Ada", elsewhere)  # another channel: not a repeat of that post
        seen += ready_events(stream)
        assert len(of(seen, "turn-start")) == 1

        await trio.sleep_until(posted + REPEAT_WINDOW_S + 1)  # older than the window now
        await told(host, "Ada", relayed)
        seen += ready_events(stream)
        assert len(of(seen, "wake-withheld")) == 1
        assert len(of(seen, "turn-start")) == 2


async def test_the_breaker_defers_a_loop_until_the_channel_is_quiet(
    tmp_path: Path, agents: dict[str, AgentActor], autojump_clock: trio.abc.Clock
) -> None:
    async with Host.open(host_config(tmp_path)) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        ada = agents["Ada"]
        await host.hold("Ada")  # no turn runs: the clock moves only when the test sleeps
        await told(host, "Ada", item("hello Ada"))  # Alice starts it
        for n in range(LIMIT + 2):  # each post answered by the bot
            ada.loops.published(PLACE, f"my answer {n}")
            await told(host, "Ada", item(f"bot reply {n}", author="Bot", author_id="bot"))
        held = trio.current_time()
        await told(host, "Ada", item("bot on its own", author="Bot", author_id="bot"))
        seen = ready_events(stream)
        assert len(ada.buffer) == 1 + LIMIT  # the wakes waiting for the next turn
        [deferred] = of(seen, "wakes-deferred")
        assert deferred.data["answers"] == LIMIT + 1 and deferred.data["author"] == "Bot"
        assert [e.data["reason"] for e in of(seen, "wake-withheld")] == ["loop"] * 3
        assert format_event(deferred) == (
            "! Ada: wakes from s1 c1 deferred: 6 of its posts there were answered within "
            "60 s (a loop?); stored, not waking"
        )
        assert level_of(deferred) > level_of(of(seen, "wake-withheld")[0])
        assert of(seen, "wakes-resumed") == []

        await trio.sleep_until(held + QUIET_S - 1)  # not yet quiet long enough
        held = trio.current_time()
        await told(host, "Ada", item("bot again", author="Bot", author_id="bot"))
        seen += ready_events(stream)
        assert len(ada.buffer) == 1 + LIMIT and of(seen, "wakes-resumed") == []

        await trio.sleep_until(held + QUIET_S)
        await told(host, "Ada", item("bot after a while", author="Bot", author_id="bot"))
        seen += ready_events(stream)
        [resumed] = of(seen, "wakes-resumed")
        assert resumed.data == {"reason": "quiet", "held": 4}
        assert format_event(resumed) == (
            "· Ada: wakes from s1 c1 resumed (the channel was quiet; 4 deferred)"
        )
        assert len(ada.buffer) == 2 + LIMIT
        assert of(seen, "wakes-deferred", "Grace") == []

        await host.release("Ada")
        await host.run_until_idle()
        seen += ready_events(stream)
        [turn] = of(seen, "turn-start")
        assert turn.data["wakes"] == 2 + LIMIT


async def test_other_agents_answering_in_turn_are_one_partner(
    tmp_path: Path, agents: dict[str, AgentActor], autojump_clock: trio.abc.Clock
) -> None:
    """Grace answers each of Ada's posts first and Hopper second: for Ada's breaker both are
    one voice, so Hopper's item (which answers nothing) does not end the chain."""
    async with Host.open(host_config(tmp_path)) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        ada = agents["Ada"]
        await host.hold("Ada")  # no turn runs: the clock moves only when the test sleeps
        for n in range(LIMIT + 1):
            ada.loops.published(PLACE, f"my answer {n}")
            await told(
                host,
                "Ada",
                item(f"grace on {n}", author="Grace", author_id="agent:Grace"),
                item(f"hopper on {n}", author="Hopper", author_id="agent:Hopper"),
            )
        seen = ready_events(stream)
        [deferred] = of(seen, "wakes-deferred")
        assert deferred.data["answers"] == LIMIT + 1 and deferred.data["author"] == "Grace"
        assert len(ada.buffer) == 2 * LIMIT
        # a person speaks: the deferral ends, and her message wakes Ada
        await told(host, "Ada", item("what are you all talking about?"))
        seen += ready_events(stream)
        [resumed] = of(seen, "wakes-resumed")
        assert resumed.data == {"reason": "another voice", "held": 2}
        assert format_event(resumed).endswith("resumed (someone else spoke; 2 deferred)")
        assert len(ada.buffer) == 2 * LIMIT + 1


async def test_what_the_gate_keeps_from_waking_never_counts_for_the_breaker(
    tmp_path: Path, agents: dict[str, AgentActor], autojump_clock: trio.abc.Clock
) -> None:
    gate = tmp_path / "gate.toml"
    gate.write_text(
        '[[policies]]\nname = "no-bots"\nbehavior = "skip"\n'
        'match = { filter = { type = "text", pattern = "bot reply" } }\n',
        encoding="utf-8",
    )
    cfg = host_config(tmp_path)
    cfg["agents"][0]["gate"] = str(gate)
    async with Host.open(cfg) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        ada = agents["Ada"]
        for n in range(LIMIT + 3):
            ada.loops.published(PLACE, f"my answer {n}")
            await told(host, "Ada", item(f"bot reply {n}", author="Bot", author_id="bot"))
        seen = ready_events(stream)
        assert len(of(seen, "gate-decision")) == LIMIT + 3
        assert of(seen, "wakes-deferred") == [] and of(seen, "turn-start") == []
        assert ada.loops.breaker.answers(("s1", "c1")) == 0


async def test_a_person_talking_quickly_with_the_agent_is_never_deferred(
    tmp_path: Path, agents: dict[str, AgentActor], autojump_clock: trio.abc.Clock
) -> None:
    """Alice answers each of Ada's posts a few seconds after it, twelve times in a minute: a
    conversation at a person's pace, not a loop. The same answers at once trip the breaker."""
    async with Host.open(host_config(tmp_path)) as host:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        ada = agents["Ada"]
        await host.hold("Ada")  # no turn runs: the clock moves only when the test sleeps
        for n in range(12):
            ada.loops.published(PLACE, f"my answer {n}")
            await trio.sleep(4)  # she reads it and types a short line
            await told(host, "Ada", item(f"and what about {n}, Ada?"))
        seen = ready_events(stream)
        assert of(seen, "wakes-deferred") == [] and of(seen, "wake-withheld") == []
        assert len(ada.buffer) == 12
        for n in range(LIMIT + 1):  # a bot answering at once, in the same channel
            ada.loops.published(PLACE, f"my post {n}")
            await told(host, "Ada", item(f"bot reply {n}", author="Bot", author_id="bot"))
        assert len(of(ready_events(stream), "wakes-deferred")) == 1
