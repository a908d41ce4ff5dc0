"""The wake gate applied by the agent, against the lobby server as a real stdio subprocess:
skipped pushes, debounce batches, gate decisions for the messages of one request, rate limits,
hot reload of the policy file, a broken file at start, the bounded wake buffer of a busy agent
(at and past its caps), and sleep.

Real clock, generous deadlines, order-only assertions: the test waits on trace events and on
the lobby's control events, never on the clock.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.config import load_config
from actors.errors import ConfigError
from actors.trace import TraceEvent
from protocol.receipts import Place, describe_place, hold_notice, sleep_announcement
from tests.helpers import (
    RecordingModel,
    RunningLobby,
    agent_configs,
    answered,
    config,
    drain_ready,
    incoming_answered,
    install,
    publish_received,
    publishes,
    running_lobby,
    scripted,
    send_incoming,
    texts,
    wait_trace,
)
from tests.lobby.control import LobbyControl

pytestmark = pytest.mark.slow

ANSWER_ALL = '[[rules]]\nwhen = "."\nsay = "heard you"\n'
SLEEPY = (
    '[[rules]]\nwhen = "(?i)nap"\ncalls = [{ tool = "sleep", arguments = { seconds = 3600 } }]\n'
    + ANSWER_ALL
)
ALICE = {"id": "alice", "name": "Alice"}
BOB = {"id": "bob", "name": "Bob"}


# ---- helpers ---------------------------------------------------------------------------------


def write_gate(path: Path, text: str, mtime: float | None = None) -> None:
    """Write a gate file; with ``mtime``, give it that modification time (seconds)."""
    path.write_text(text, encoding="utf-8")
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def mtime_of(path: Path) -> float:
    return path.stat().st_mtime


def gated(tmp_path: Path, rules: str, gate_text: str, name: str = "gate.toml") -> dict[str, Any]:
    """An agent entry: scripted ``rules`` and a gate file holding ``gate_text``."""
    gate = tmp_path / name
    write_gate(gate, gate_text)
    return {"model": scripted(tmp_path, "ada", rules), "gate": str(gate)}


def ada_events(seen: Iterable[TraceEvent], kinds: set[str]) -> list[TraceEvent]:
    return [e for e in seen if e.agent == "Ada" and e.kind in kinds]


def kinds_of(seen: Iterable[TraceEvent], kinds: set[str]) -> list[str]:
    return [e.kind for e in ada_events(seen, kinds)]


def is_kind(kind: str) -> Callable[[TraceEvent], bool]:
    return lambda e: e.kind == kind and e.agent == "Ada"


async def send_and_wait(
    ctl: LobbyControl, channel: str, message_id: str, text: str, **extra: Any
) -> dict[str, Any]:
    """One ``channels/incoming`` request, answered by the host before this returns."""
    send_incoming(ctl, channel, message_id, text, **extra)
    return await ctl.wait_for(incoming_answered(message_id), f"{message_id} answered")


_barriers = itertools.count(1)


async def settle(lb: RunningLobby, seen: list[TraceEvent]) -> list[TraceEvent]:
    """Wait until the host is idle (every wake told and handled, every turn and its speech
    settled) and the lobby has seen all the host sent it; the trace events since the last
    read, also added to ``seen``."""
    await lb.host.run_until_idle()
    await send_and_wait(lb.ctl, "nowhere", f"barrier-{next(_barriers)}", "sync")
    fresh = await drain_ready(lb.stream)
    seen.extend(fresh)
    return fresh


def notices(history: list[dict[str, Any]], kind: str) -> list[str]:
    return [
        m["blocks"][0]["text"]
        for m in history
        if (m.get("metadata") or {}).get("system") is True
        and (m.get("metadata") or {}).get("kind") == kind
    ]


# ---- 1. skip -------------------------------------------------------------------------------

SKIP_PUSHES = """
default = "always"

[[policies]]
name = "quiet-pushes"
behavior = "skip"
match = { scope = ["push"] }
"""


async def test_a_skipped_push_is_stored_but_wakes_nobody_and_chat_still_does(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        agent = gated(tmp_path, ANSWER_ALL, SKIP_PUSHES)
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            host, ctl = lb.host, lb.ctl
            seen: list[TraceEvent] = []
            ctl.send({"cmd": "push", "eventId": "e1", "text": "the clock struck nine"})
            answer = await ctl.wait_for(answered("push/event", "eventId", "e1"), "push answer")
            assert answer["response"]["result"] == {"accepted": True}
            fresh = await settle(lb, seen)
            [decision] = ada_events(fresh, {"gate-decision"})
            assert decision.data == {"wake": False, "policy": "quiet-pushes", "behavior": "skip"}
            assert ada_events(fresh, {"turn-start"}) == []
            # stored for the agent all the same
            assert texts(host.history("Ada"), "user") == ["the clock struck nine"]

            await send_and_wait(ctl, "lobby:#general", "m1", "anyone around?")
            await ctl.wait_for(publish_received("heard you"), "Ada's reply")
            await settle(lb, seen)

            order = [
                e.kind
                for e in seen
                if (e.kind == "incoming" and e.data.get("message_id") == "m1")
                or (e.agent == "Ada" and e.kind in {"gate-decision", "turn-start", "published"})
            ]
            assert order == ["gate-decision", "incoming", "turn-start", "published"]
            [start] = ada_events(seen, {"turn-start"})
            assert start.channel_id == "lobby:#general" and start.data["wakes"] == 1
            assert publishes(ctl) == [("lobby:#general", "heard you")]
            assert texts(host.history("Ada"), "user") == ["the clock struck nine", "anyone around?"]


# ---- 2. debounce ---------------------------------------------------------------------------

#: Long enough that the round trips of three messages fit in it on a loaded machine.
DEBOUNCE_MS = 1000
DEBOUNCE = f"""
[[policies]]
name = "calm"
behavior = {{ debounce_ms = {DEBOUNCE_MS} }}
match = {{ scope = ["incoming"] }}
"""


async def test_debounced_messages_make_one_batched_turn_whose_prose_is_held(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        agent = gated(tmp_path, ANSWER_ALL, DEBOUNCE)
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            ctl = lb.ctl
            seen: list[TraceEvent] = []
            for i, channel in enumerate(["lobby:#general", "lobby:#random", "lobby:#general"]):
                await send_and_wait(ctl, channel, f"d{i}", f"quick message {i}")
            # the batch comes due on the host's clock
            batch = await wait_trace(lb.stream, is_kind("gate-batch"), "the batch", seen)
            assert batch.data == {"policy": "calm", "count": 3}
            await wait_trace(lb.stream, is_kind("turn-end"), "the batched turn", seen)
            await settle(lb, seen)

            assert [e.data for e in ada_events(seen, {"gate-decision"})] == [
                {"wake": False, "policy": "calm", "behavior": "debounce"}
            ] * 3
            assert kinds_of(seen, {"gate-decision", "gate-batch", "turn-start", "speech-held"}) == [
                "gate-decision",
                "gate-decision",
                "gate-decision",
                "gate-batch",
                "turn-start",
                "speech-held",
            ]
            [start] = ada_events(seen, {"turn-start"})
            assert start.data["wakes"] == 3
            assert start.channel_id is None  # a batch names no conversation
            [held] = ada_events(seen, {"speech-held"})
            assert held.data["text"] == "heard you"
            assert ada_events(seen, {"published"}) == []
            assert publishes(ctl) == []


def chat(message_id: str, text: str, author: dict[str, str] = ALICE) -> dict[str, Any]:
    """One message of an ``incoming_batch``, in #general."""
    return {
        "channelId": "lobby:#general",
        "messageId": message_id,
        "author": author,
        "timestamp": "2026-01-01T00:00:00Z",
        "content": [{"type": "text", "text": text}],
        "tags": [],
    }


async def test_a_debounce_batch_counts_every_message_of_one_request(tmp_path: Path) -> None:
    """Three messages delivered in one ``channels/incoming`` request are three events for the
    debounce: the batch and its turn count three, as they do for three requests."""
    with trio.fail_after(60):
        agent = gated(tmp_path, ANSWER_ALL, DEBOUNCE)
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            host, ctl = lb.host, lb.ctl
            seen: list[TraceEvent] = []
            batch = [chat(f"b{i}", f"batched message {i}") for i in range(3)]
            ctl.send({"cmd": "incoming_batch", "messages": batch})
            await ctl.wait_for(incoming_answered("b0"), "the batch answered")
            gate_batch = await wait_trace(lb.stream, is_kind("gate-batch"), "the batch", seen)
            await wait_trace(lb.stream, is_kind("turn-end"), "the batched turn", seen)
            await settle(lb, seen)
            assert len(texts(host.history("Ada"), "user")) == 3
            assert gate_batch.data == {"policy": "calm", "count": 3}
            [start] = ada_events(seen, {"turn-start"})
            assert start.data["wakes"] == 3


# ---- the gate decides per message, also within one request --------------------------------

URGENT_ONLY = """
default = "skip"

[[policies]]
name = "urgent"
behavior = "always"
match = { filter = { type = "text", pattern = "urgent" } }
"""


@pytest.mark.parametrize(
    ("gate_text", "asleep", "batch"),
    [
        (URGENT_ONLY, False, [chat("u1", "urgent: the build is red"), chat("u2", "lol")]),
        (
            'default = "always"\nprivileged_authors = ["Bob"]\n',
            True,
            [chat("p1", "wake up, it is important", BOB), chat("p2", "meh")],
        ),
    ],
    ids=["filter", "privileged-while-asleep"],
)
async def test_a_message_that_wakes_is_not_hidden_by_a_later_one_in_the_same_request(
    tmp_path: Path, gate_text: str, asleep: bool, batch: list[dict[str, Any]]
) -> None:
    """The gate decides whether each stored item wakes the agent: a message that its policies
    (or its privileged author) let through wakes the agent even when the server delivered it
    together with a later one that they do not let through."""
    with trio.fail_after(60):
        agent = gated(tmp_path, ANSWER_ALL, gate_text)
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            host, ctl = lb.host, lb.ctl
            seen: list[TraceEvent] = []
            if asleep:
                slept = await host.execute_tool_call("Ada", "sleep", {"seconds": 3600})
                assert slept["is_error"] is False
            ctl.send({"cmd": "incoming_batch", "messages": batch})
            await ctl.wait_for(incoming_answered(batch[0]["messageId"]), "the batch answered")
            await settle(lb, seen)
            assert len(texts(host.history("Ada"), "user")) == 2  # both stored either way
            assert kinds_of(seen, {"turn-start"}) == ["turn-start"]
            assert publishes(ctl) == [("lobby:#general", "heard you")]


# ---- 3. rate limit -------------------------------------------------------------------------

RATE_LIMITED = """
[[policies]]
name = "one-a-day"
behavior = { rate_limit = { tokens = 1, refill_interval_ms = 86400000 } }
match = { scope = ["incoming"] }
"""


async def test_a_rate_limit_of_one_token_wakes_for_the_first_message_only(tmp_path: Path) -> None:
    with trio.fail_after(60):
        agent = gated(tmp_path, ANSWER_ALL, RATE_LIMITED)
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            host, ctl = lb.host, lb.ctl
            seen: list[TraceEvent] = []
            await send_and_wait(ctl, "lobby:#general", "r1", "first")
            await ctl.wait_for(publish_received("heard you"), "the first reply")
            await settle(lb, seen)

            await send_and_wait(ctl, "lobby:#general", "r2", "second")
            fresh = await settle(lb, seen)
            [decision] = ada_events(fresh, {"gate-decision"})
            assert decision.data == {"wake": False, "policy": "one-a-day", "behavior": "rate_limit"}
            assert decision.channel_id == "lobby:#general"
            assert kinds_of(seen, {"turn-start", "gate-decision"}) == [
                "turn-start",
                "gate-decision",
            ]
            assert publishes(ctl) == [("lobby:#general", "heard you")]
            assert texts(host.history("Ada"), "user") == ["first", "second"]


# ---- 4. hot reload -------------------------------------------------------------------------

SKIP_INCOMING = """
default = "always"

[[policies]]
name = "hush"
behavior = "skip"
match = { scope = ["incoming"] }
"""


async def test_the_gate_file_is_reloaded_and_a_broken_rewrite_keeps_the_old_policies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("actors.agent.gate.GATE_RELOAD_S", 0.05)
    with trio.fail_after(60):
        agent = gated(tmp_path, ANSWER_ALL, 'default = "always"\n')
        gate = Path(agent["gate"])
        start = mtime_of(gate)
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            host, ctl = lb.host, lb.ctl
            seen: list[TraceEvent] = []
            await send_and_wait(ctl, "lobby:#general", "h1", "before the change")
            await ctl.wait_for(publish_received("heard you"), "the first reply")
            await settle(lb, seen)

            # the file is watched (read off the loop): the change is in force once it is read
            write_gate(gate, SKIP_INCOMING, mtime=start + 10)
            reloaded = await wait_trace(lb.stream, is_kind("gate-reloaded"), "the reload", seen)
            assert reloaded.agent == "Ada" and reloaded.data["path"] == str(gate)
            await send_and_wait(ctl, "lobby:#general", "h2", "after the change")
            fresh = await settle(lb, seen)
            assert kinds_of(fresh, {"gate-reloaded", "gate-decision", "turn-start"}) == [
                "gate-decision",
            ]
            [decision] = ada_events(fresh, {"gate-decision"})
            assert decision.data == {"wake": False, "policy": "hush", "behavior": "skip"}

            write_gate(gate, "default = [not toml", mtime=start + 20)
            diagnostic = await wait_trace(lb.stream, is_kind("diagnostic"), "the refusal", seen)
            await send_and_wait(ctl, "lobby:#general", "h3", "after the breakage")
            fresh = await settle(lb, seen)
            order = {"gate-reloaded", "diagnostic", "gate-decision", "turn-start"}
            assert kinds_of(fresh, order) == ["gate-decision"]  # the broken file is told once
            assert "the old policies stay" in diagnostic.data["text"]
            assert str(gate) in diagnostic.data["text"]
            assert "\n" not in diagnostic.data["text"]
            [decision] = ada_events(fresh, {"gate-decision"})
            assert decision.data == {"wake": False, "policy": "hush", "behavior": "skip"}

            assert kinds_of(seen, {"turn-start"}) == ["turn-start"]
            assert publishes(ctl) == [("lobby:#general", "heard you")]
            assert texts(host.history("Ada"), "user") == [
                "before the change",
                "after the change",
                "after the breakage",
            ]


# ---- 5. a broken file at start -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("gate.toml", "default = [not toml", "toml:"),
        ("gate.toml", 'default = "sometimes"\n', "default: must be"),
        (
            "gate.toml",
            '[[policies]]\nname = "p"\nbehavior = { debounce_ms = 5 }\n',
            "policies[0].behavior.debounce_ms: must be from 100 to 300000",
        ),
        ("gate.json", '{"default": "skip", "default": "always"}', "json: duplicate key default"),
        ("missing.toml", None, "cannot read the gate file"),
    ],
    ids=["bad-toml", "bad-default", "bad-debounce", "json-duplicate", "missing"],
)
async def test_a_broken_gate_file_at_start_is_a_one_line_config_error(
    tmp_path: Path, name: str, text: str | None, says: str
) -> None:
    gate = tmp_path / name
    if text is not None:
        write_gate(gate, text)
    agents = agent_configs(tmp_path, {"Ada": {"model": scripted(tmp_path, "ada", ANSWER_ALL)}})
    agents[0]["gate"] = str(gate)
    cfg = config(tmp_path, [], agents)
    with pytest.raises(ConfigError) as caught:
        load_config(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"agents[Ada].gate: {gate}: ")
    assert says in message
    with pytest.raises(ConfigError) as again:
        async with Host.open(cfg):
            pass  # pragma: no cover - never reached
    assert str(again.value) == message


# ---- 6. the wake buffer of a busy agent (I.9) ----------------------------------------------

THREADS = {
    "id": "lobby:#threads",
    "type": "chat",
    "label": "threads",
    "capabilities": {"publish": {"target": "exact"}},
}
BUFFER_CAP = 100  # protocol.gate.MAX_BUFFERED
CONVERSATION_CAP = 32  # protocol.gate.MAX_CONVERSATIONS


@pytest.mark.parametrize(
    ("threads", "main"),
    [(0, BUFFER_CAP), (CONVERSATION_CAP, BUFFER_CAP), (CONVERSATION_CAP + 1, BUFFER_CAP)],
    ids=["at-the-buffer-cap", "at-the-conversation-cap", "past-the-conversation-cap"],
)
async def test_the_wakes_of_a_busy_agent_are_bounded_and_still_decide_the_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, main: int
) -> None:
    """While the first turn runs, ``threads`` messages each in its own thread, then ``main``
    in #random, each in its own request (one wake each). The buffer keeps the newest 100: the
    thread wakes are evicted, and their conversations still count for the next turn's route."""
    model = RecordingModel(say="noted")
    install(monkeypatch, model)
    with trio.fail_after(240):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            seen: list[TraceEvent] = []
            mark = ctl.mark()
            ctl.send({"cmd": "register", "channels": [THREADS]})
            await ctl.wait_for(answered("channels/register"), "registered", since=mark)
            release = model.hold()
            await send_and_wait(ctl, "lobby:#general", "first", "start a turn")
            await model.entered.wait()  # the first turn runs until released

            for i in range(threads):
                await send_and_wait(
                    ctl, "lobby:#threads", f"t{i}", f"in thread {i}", threadId=f"t{i}"
                )
            for i in range(main):
                await send_and_wait(ctl, "lobby:#random", f"r{i}", f"chatter {i}")
            # every wake was told to the agent (the lobby's next request is answered after
            # them), and handled (the agent's mailbox is first in, first out)
            await send_and_wait(ctl, "nowhere", "barrier", "sync")
            await host.execute_tool_call("Ada", "drafts", {"action": "list"})
            release.set()

            await ctl.wait_for(publish_received("noted"), "the first turn's reply")
            for which in ("first", "second"):
                await wait_trace(lb.stream, is_kind("turn-end"), f"the {which} turn", seen)
            await settle(lb, seen)

            first, second = ada_events(seen, {"turn-start"})
            assert first.data["wakes"] == 1
            assert second.data["wakes"] == threads + main  # the evicted ones are counted too
            history = host.history("Ada")
            held = [n for n in notices(history, "speech-notice") if n.startswith("[held]")]
            random = Place(server_id="lobby", channel_id="lobby:#random", label="random")
            if threads == 0:
                # exactly at the cap: one conversation, so the reply goes there
                assert second.channel_id == "lobby:#random"
                assert publishes(ctl) == [("lobby:#general", "noted"), ("lobby:#random", "noted")]
                assert held == []
                return
            # several conversations competed: the prose is kept as a draft
            assert second.channel_id is None
            assert publishes(ctl) == [("lobby:#general", "noted")]
            [draft] = ada_events(seen, {"speech-held"})
            assert draft.data["text"] == "noted" and draft.data["reason"] == "held"
            [notice] = held
            if threads > CONVERSATION_CAP:
                # more conversations competed than are listed: only #random is known
                assert notice == hold_notice([random], multiple_unknown=True)
                return
            # every evicted conversation is still listed, after the one still buffered
            competing = notice.split("Competing: ", 1)[1].split(". To send it", 1)[0].split("; ")
            assert competing[0] == describe_place(random)
            assert sorted(competing[1:]) == sorted(
                describe_place(
                    Place(
                        server_id="lobby",
                        channel_id="lobby:#threads",
                        label="threads",
                        thread_id=f"t{i}",
                    )
                )
                for i in range(threads)
            )
            assert "more conversations than can be listed" not in notice


# ---- 7. sleep ------------------------------------------------------------------------------

PRIVILEGED = 'default = "always"\nprivileged_authors = ["BOB"]\n'


async def test_sleep_lets_only_privileged_authors_wake_until_wake_ends_it(tmp_path: Path) -> None:
    with trio.fail_after(60):
        agent = gated(tmp_path, SLEEPY, PRIVILEGED)
        async with running_lobby(tmp_path, {"Ada": agent}) as lb:
            host, ctl = lb.host, lb.ctl
            seen: list[TraceEvent] = []
            announcement = sleep_announcement(3600)
            await send_and_wait(ctl, "lobby:#general", "s1", "time for a nap", author=ALICE)
            await ctl.wait_for(publish_received(announcement), "the announcement")
            fresh = await settle(lb, seen)
            [asleep] = ada_events(fresh, {"asleep"})
            assert asleep.data["seconds"] == 3600

            await send_and_wait(ctl, "lobby:#general", "s2", "are you there?", author=ALICE)
            fresh = await settle(lb, seen)
            [decision] = ada_events(fresh, {"gate-decision", "turn-start"})
            assert decision.data == {"wake": False, "policy": None, "behavior": "asleep"}

            # the file says BOB: privileged authors are compared ignoring case
            await send_and_wait(ctl, "lobby:#general", "s3", "wake up please", author=BOB)
            fresh = await settle(lb, seen)
            [bobs] = ada_events(fresh, {"gate-decision", "turn-start"})
            assert bobs.kind == "turn-start" and bobs.channel_id == "lobby:#general"

            # still asleep for everyone else
            await send_and_wait(ctl, "lobby:#general", "s4", "me again", author=ALICE)
            fresh = await settle(lb, seen)
            [decision] = ada_events(fresh, {"gate-decision", "turn-start"})
            assert decision.kind == "gate-decision" and decision.data["behavior"] == "asleep"

            woken = await host.execute_tool_call("Ada", "wake", {})
            assert woken == {"is_error": False, "content": [{"type": "text", "text": "Awake."}]}
            await send_and_wait(ctl, "lobby:#general", "s5", "good morning", author=ALICE)
            fresh = await settle(lb, seen)
            [alices] = ada_events(fresh, {"gate-decision", "turn-start"})
            assert alices.kind == "turn-start" and alices.channel_id == "lobby:#general"

            assert kinds_of(seen, {"asleep", "gate-decision", "turn-start", "awake"}) == [
                "turn-start",
                "asleep",
                "gate-decision",
                "turn-start",
                "gate-decision",
                "turn-start",
            ]
            assert publishes(ctl) == [
                ("lobby:#general", announcement),
                ("lobby:#general", "heard you"),
                ("lobby:#general", "heard you"),
            ]
            assert texts(host.history("Ada"), "user") == [
                "time for a nap",
                "are you there?",
                "wake up please",
                "me again",
                "good morning",
            ]
