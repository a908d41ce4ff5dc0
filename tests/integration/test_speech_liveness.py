"""An agent's speech against the lobby server as a real stdio subprocess: pending speech parks only
its own agent, leaving the host is bounded with requests nobody answers, the typing indicator is
switched off however a turn ends, and streamed prose goes where its text is published.

Real clock, generous deadlines, order-only assertions; the lobby reports every message it
receives on its control socket and flags what the host sends wrong as ``error`` events.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.models.base import ModelReply, ModelRequest
from actors.trace import TraceEvent
from protocol.hooks import ModelInfo
from tests.helpers import (
    RecordingModel,
    agent_configs,
    config,
    incoming_answered,
    install,
    lobby,
    publish_received,
    publishes,
    ready,
    running_lobby,
    scripted,
    send_incoming,
    wait_trace,
)
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

#: Seconds the host gets to leave ``Host.open`` (the rest of a test has a generous deadline).
EXIT_S = 30
#: Answers every message: "got <its last word>".
ANSWER = "[[rules]]\nwhen = '(\\w+)\\W*$'\nsay = \"got {1}\"\n"
#: Several words, streamed word by word by the scripted model.
SAID = "alpha beta gamma delta"
SPEAK = f'[[rules]]\nwhen = "speak"\nsay = "{SAID}"\n'
HYBRID_SAY = "hi\n>>>#random over there"
HYBRID = '[[rules]]\nwhen = "speak"\nsay = "hi\\n>>>#random over there"\n'
OPEN_RANDOM = (
    '[[rules]]\nwhen = "open"\n'
    'calls = [{ tool = "channel_open", arguments = { channel_id = "lobby:#random" } }]\n'
    'say = "opened it"\n'
)


class AsideModel:
    """Streams a round's prose, then calls ``tool`` (a silencing one) in that same round; says
    nothing after the tool's result."""

    def __init__(self, tool: str) -> None:
        self.name = "aside"
        self.info = ModelInfo(
            id="aside-1", vendor="tests", context_window=8192, capabilities=("tools",)
        )
        self.tool = tool

    async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
        if request.messages and request.messages[-1].get("role") == "tool":
            return ModelReply(blocks=(), model=self.name)
        for piece in ("secret ", "plan"):
            if on_delta is not None:
                await on_delta(piece)
        arguments = {"content": "a private note"} if self.tool == "think" else {}
        use = {"type": "tool_use", "id": "call_1", "name": self.tool, "input": arguments}
        blocks = ({"type": "text", "text": "secret plan"}, use)
        return ModelReply(blocks=blocks, stop_reason="tool_use", model=self.name)


# ---- helpers ---------------------------------------------------------------------------------


def problems(ctl: Any) -> list[str]:
    """What the lobby flagged as the host's mistakes (``error`` events; ``problem`` too, should
    the lobby ever call them that)."""
    return [e.get("text", "") for e in ctl.events if e.get("event") in ("error", "problem")]


def is_received(method: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e["event"] == "received" and e["message"].get("method") == method


def received_at(ctl: Any, method: str) -> list[tuple[int, dict[str, Any]]]:
    """(position among the control events, params) of each ``method`` the lobby received."""
    return [
        (i, e["message"].get("params") or {})
        for i, e in enumerate(ctl.events)
        if e.get("event") == "received" and e["message"].get("method") == method
    ]


def typing_received(typing: bool) -> Callable[[dict[str, Any]], bool]:
    return lambda e: (
        is_received("channels/typing")(e) and e["message"]["params"]["typing"] is typing
    )


def streamed(ctl: Any) -> list[dict[str, Any]]:
    return [e for e in ctl.events if e.get("event") == "streamed"]


def of(agent: str, kind: str) -> Callable[[TraceEvent], bool]:
    return lambda e: e.kind == kind and e.agent == agent


def parked_or_started(agent: str) -> Callable[[TraceEvent], bool]:
    """The agent's wake was parked, or a turn of its started (which a parked wake must not)."""
    return lambda e: e.agent == agent and e.kind in ("wake-parked", "turn-start")


_barriers = itertools.count(1)


async def barrier(ctl: Any) -> None:
    """A round trip over the lobby's stdio and control socket: everything the host sent the
    lobby before it answered this (refused: it wakes nobody) is in ``ctl.events`` afterwards."""
    tag = f"barrier-{next(_barriers)}"
    send_incoming(ctl, "nowhere", tag, "sync")
    await ctl.wait_for(incoming_answered(tag), tag)


def assistant_texts(host: Host, agent: str) -> list[str]:
    return [
        "".join(b.get("text", "") for b in m["blocks"] if b.get("type") == "text")
        for m in host.history(agent)
        if m["role"] == "assistant"
    ]


# ---- 1. pending speech parks only its own agent (refs-and-headers I.3) -------------------------


async def test_pending_speech_parks_only_its_own_agent(tmp_path: Path) -> None:
    agents = {
        "A": {"model": scripted(tmp_path, "a", ANSWER), "servers": ["slow"]},
        "B": {"model": scripted(tmp_path, "b", ANSWER), "servers": ["quick"]},
    }
    seen: list[TraceEvent] = []
    with trio.fail_after(120) as deadline:
        async with open_control_listener() as l_slow, open_control_listener() as l_quick:
            servers = [
                lobby(l_slow.address, "--publish-mode", "never", sid="slow", request_timeout_s=600),
                lobby(l_quick.address, sid="quick"),
            ]
            async with Host.open(config(tmp_path, servers, agent_configs(tmp_path, agents))) as h:
                stream = h.trace()
                slow = await l_slow.accept()
                quick = await l_quick.accept()
                await ready(slow, h, "slow")
                await ready(quick, h, "quick")

                async def b_turn(word: str) -> None:
                    send_incoming(quick, "lobby:#general", f"b-{word}", word)
                    await quick.wait_for(publish_received(f"got {word}"), f"B's reply to {word}")
                    await wait_trace(stream, of("B", "turn-end"), f"B's turn for {word}", seen)

                # A's reply goes out and the slow lobby never answers it
                send_incoming(slow, "lobby:#general", "a1", "first")
                await wait_trace(stream, of("A", "turn-start"), "A's first turn", seen)
                await slow.wait_for(publish_received("got first"), "A's reply, never answered")
                # A's second message, in another channel (the first one's channel holds its
                # items back while the publish is unconfirmed): parked behind A's speech
                send_incoming(slow, "lobby:#random", "a2", "second")
                await slow.wait_for(incoming_answered("a2"), "A's second message taken")
                parked = await wait_trace(stream, parked_or_started("A"), "A parked", seen)
                assert parked.kind == "wake-parked", "A's second turn started at once"
                assert parked.data["unsettled"] == 1
                assert not any(of("A", "turn-end")(e) for e in seen)

                # B completes three turns while A stays parked
                for word in ("one", "two", "three"):
                    await b_turn(word)
                # aborting A's turn leaves its publish in flight: the wake stays parked
                assert await h.abort_turn("A") is True
                await wait_trace(stream, of("A", "turn-aborted"), "A's abort", seen)
                await b_turn("four")
                await barrier(quick)
                await barrier(slow)

                kinds = [(e.kind, e.agent) for e in seen]
                assert kinds.count(("turn-start", "A")) == 1  # A's second turn never started
                at_park = seen.index(parked)
                b_published = [
                    i
                    for i, e in enumerate(seen)
                    if e.kind == "published" and e.server_id == "quick"
                ]
                assert len(b_published) == 4
                assert all(i > at_park for i in b_published)
                assert publishes(quick) == [
                    ("lobby:#general", f"got {w}") for w in ("one", "two", "three", "four")
                ]
                # A's one publish was sent (and never answered); nothing after it
                assert publishes(slow) == [("lobby:#general", "got first")]
                assert not any(e.kind == "published" and e.agent == "A" for e in seen)
                assert problems(slow) == [] and problems(quick) == []
                # leaving is bounded even with A's publish and parked wake outstanding
                deadline.deadline = trio.current_time() + EXIT_S
        await slow.wait_closed(timeout=EXIT_S)
        await quick.wait_closed(timeout=EXIT_S)


async def test_a_parked_wake_runs_once_the_speech_settles(tmp_path: Path) -> None:
    """The other half of I.3: the unanswered publish runs out of time (3 s), the speech settles
    with that outcome, and the parked wake then runs its turn."""
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with running_lobby(
            tmp_path, {"A": ANSWER}, "--publish-mode", "never", request_timeout_s=3
        ) as lb:
            ctl = lb.ctl
            send_incoming(ctl, "lobby:#general", "a1", "first")
            await ctl.wait_for(publish_received("got first"), "A's reply, never answered")
            assert await lb.host.abort_turn("A") is True
            await wait_trace(lb.stream, of("A", "turn-aborted"), "the abort", seen)
            send_incoming(ctl, "lobby:#random", "a2", "second")
            parked = await wait_trace(lb.stream, parked_or_started("A"), "A parked", seen)
            assert parked.kind == "wake-parked", "A's second turn started at once"
            first = await wait_trace(lb.stream, of("A", "published"), "the publish's end", seen)
            assert first.data["text"] == "got first" and first.data["outcome"] != "delivered"
            second = await wait_trace(lb.stream, of("A", "turn-start"), "the parked turn", seen)
            await ctl.wait_for(publish_received("got second"), "A's second reply")
            assert second.channel_id == "lobby:#random"
            assert seen.index(parked) < seen.index(first) < seen.index(second)
            starts = [e for e in seen if of("A", "turn-start")(e)]
            assert len(starts) == 2 and starts[1] is second  # none between the park and it
            assert problems(ctl) == []


# ---- 2. leaving with a channels/open nobody answers -------------------------------------------


async def test_leaving_the_host_is_bounded_with_a_channel_open_outstanding(
    tmp_path: Path,
) -> None:
    with trio.fail_after(120) as deadline:
        async with running_lobby(
            tmp_path, {"Ada": OPEN_RANDOM}, "--open-mode", "never", request_timeout_s=600
        ) as lb:
            send_incoming(lb.ctl, "lobby:#general", "o1", "please open")
            await lb.ctl.wait_for(is_received("channels/open"), "the open the lobby never answers")
            [(_, params)] = received_at(lb.ctl, "channels/open")
            assert params["channelId"] == "lobby:#random"
            deadline.deadline = trio.current_time() + EXIT_S  # only the exit is left
        await lb.ctl.wait_closed(timeout=EXIT_S)
        assert publishes(lb.ctl) == []  # the turn never got past the open


# ---- 3. typing starts and stops however the turn ends ----------------------------------------


@pytest.mark.parametrize("ending", ["success", "failure", "abort"])
async def test_typing_starts_and_stops_however_the_turn_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    model: RecordingModel | None = None
    rules = ANSWER
    if ending == "failure":
        model = RecordingModel(mode="fail")
    elif ending == "abort":
        model = RecordingModel(mode="block-first", say="never said")
    if model is not None:
        install(monkeypatch, model)
        rules = ""
    with trio.fail_after(90):
        async with running_lobby(tmp_path, {"Ada": rules}) as lb:
            ctl = lb.ctl
            seen: list[TraceEvent] = []
            send_incoming(ctl, "lobby:#random", "t1", "type away")
            await ctl.wait_for(typing_received(True), "typing on")
            if ending == "abort":
                assert model is not None
                await model.entered.wait()
                assert await lb.host.abort_turn("Ada") is True
                await wait_trace(lb.stream, of("Ada", "turn-aborted"), "the abort", seen)
            elif ending == "failure":
                error = await wait_trace(lb.stream, of("Ada", "error"), "the failure", seen)
                assert error.data["where"] == "model"
            else:
                await ctl.wait_for(publish_received("got away"), "Ada's reply")
                await wait_trace(lb.stream, of("Ada", "turn-end"), "the turn", seen)
            await ctl.wait_for(typing_received(False), "typing off")
            await lb.host.run_until_idle()
            await barrier(ctl)

            typing = received_at(ctl, "channels/typing")
            assert {p["channelId"] for _, p in typing} == {"lobby:#random"}
            flags = [p["typing"] for _, p in typing]  # on (renewed every 7 s), then off once
            assert flags[0] is True and flags[-1] is False and flags.count(False) == 1
            said = [("lobby:#random", "got away")] if ending == "success" else []
            assert publishes(ctl) == said
            assert problems(ctl) == []


# ---- 4. stream events name the channel by its id; the outgoing stream ------------------------


async def test_stream_events_carry_a_plain_channel_id_and_the_stream_matches_the_post(
    tmp_path: Path,
) -> None:
    with trio.fail_after(90):
        async with running_lobby(tmp_path, {"Ada": SPEAK}) as lb:
            ctl = lb.ctl
            seen: list[TraceEvent] = []
            send_incoming(ctl, "lobby:#general", "s1", "speak please")
            await ctl.wait_for(publish_received(SAID), "Ada's reply")
            await wait_trace(lb.stream, of("Ada", "turn-end"), "the turn", seen)
            done = await ctl.wait_for(lambda e: e["event"] == "streamed", "the stream's complete")

            tokens = [e for e in seen if e.kind == "tokens"]
            assert len(tokens) > 1  # word by word
            for e in tokens:
                assert type(e.channel_id) is str and e.channel_id == "lobby:#general"
                assert e.server_id == "lobby" and e.agent == "Ada"
            assert "".join(e.data["delta"] for e in tokens) == SAID
            [inference] = {e.data["inference_id"] for e in tokens}

            chunks = received_at(ctl, "channels/outgoing/chunk")
            assert [p["index"] for _, p in chunks] == list(range(len(chunks)))
            assert {(p["inferenceId"], p["channelId"]) for _, p in chunks} == {
                (inference, "lobby:#general")
            }
            assert "".join(p["delta"] for _, p in chunks) == SAID
            completes = received_at(ctl, "channels/outgoing/complete")
            assert [(p["inferenceId"], p["channelId"]) for _, p in completes] == [
                (inference, "lobby:#general")
            ]
            assert completes[0][0] > max(i for i, _ in chunks)
            assert completes[0][1]["content"] == [{"type": "text", "text": SAID}]
            # the conversation of the stream is the one of the publish, hooks and lifecycle
            [(_, publish)] = received_at(ctl, "channels/publish")
            named = {p["conversationId"] for _, p in (*chunks, *completes)}
            assert named == {publish["conversationId"]} == {"agent:Ada"}
            assert (done["inferenceId"], done["channelId"], done["text"]) == (
                inference,
                "lobby:#general",
                SAID,
            )
            assert publishes(ctl) == [("lobby:#general", SAID)]

            # a turn woken by an unscoped push has no route: its tokens name no channel, and
            # nothing is streamed to any server
            await lb.host.run_until_idle()
            seen.clear()
            ctl.send({"cmd": "push", "eventId": "p1", "text": "speak up"})
            await wait_trace(lb.stream, of("Ada", "turn-end"), "the push's turn", seen)
            await lb.host.run_until_idle()
            await barrier(ctl)
            tokens = [e for e in seen if e.kind == "tokens"]
            assert len(tokens) > 1
            assert all(e.channel_id is None and e.server_id is None for e in tokens)
            assert "".join(e.data["delta"] for e in tokens) == SAID
            assert {e.data["inference_id"] for e in tokens} != {inference}
            assert received_at(ctl, "channels/outgoing/chunk") == chunks
            assert received_at(ctl, "channels/outgoing/complete") == completes
            assert len(streamed(ctl)) == 1
            assert publishes(ctl) == [("lobby:#general", SAID)]  # kept as a draft instead
            assert any(of("Ada", "speech-held")(e) for e in seen)
            assert problems(ctl) == []


# ---- 5. hybrid prose streams each segment to its own channel ----------------------------------


async def test_hybrid_prose_streams_each_segment_to_its_target(tmp_path: Path) -> None:
    agents = {"Ada": {"model": scripted(tmp_path, "ada", HYBRID), "prose_mode": "hybrid"}}
    with trio.fail_after(90):
        async with running_lobby(tmp_path, agents) as lb:
            ctl = lb.ctl
            seen: list[TraceEvent] = []
            send_incoming(ctl, "lobby:#general", "h1", "speak please")
            await ctl.wait_for(publish_received("hi"), "the reply in #general")
            await ctl.wait_for(publish_received("over there"), "the reply in #random")
            await wait_trace(lb.stream, of("Ada", "turn-end"), "the turn", seen)
            await lb.host.run_until_idle()
            await barrier(ctl)

            tokens = [e for e in seen if e.kind == "tokens"]
            [inference] = {e.data["inference_id"] for e in tokens}
            by_channel: dict[Any, str] = {}
            for e in tokens:
                assert e.channel_id is None or type(e.channel_id) is str
                by_channel[e.channel_id] = by_channel.get(e.channel_id, "") + e.data["delta"]
            assert set(by_channel) == {"lobby:#general", "lobby:#random"}
            assert by_channel["lobby:#general"].strip() == "hi"
            assert by_channel["lobby:#random"] == "over there"

            chunks = received_at(ctl, "channels/outgoing/chunk")
            assert [p["index"] for _, p in chunks] == list(range(len(chunks)))
            assert {p["inferenceId"] for _, p in chunks} == {inference}
            sent: dict[str, str] = {}
            for _, p in chunks:
                sent[p["channelId"]] = sent.get(p["channelId"], "") + p["delta"]
                assert ">" not in p["delta"] and "#random" not in p["delta"]
            assert sent["lobby:#general"].strip() == "hi"
            assert sent["lobby:#random"] == "over there"
            assert set(sent) == {"lobby:#general", "lobby:#random"}

            completes = received_at(ctl, "channels/outgoing/complete")
            assert sorted((p["inferenceId"], p["channelId"]) for _, p in completes) == [
                (inference, "lobby:#general"),
                (inference, "lobby:#random"),
            ]
            for at, p in completes:
                assert at > max(i for i, c in chunks if c["channelId"] == p["channelId"])
            texts = {p["channelId"]: p["content"] for _, p in completes}
            assert texts == {
                "lobby:#general": [{"type": "text", "text": "hi"}],
                "lobby:#random": [{"type": "text", "text": "over there"}],
            }
            assert sorted(publishes(ctl)) == [
                ("lobby:#general", "hi"),
                ("lobby:#random", "over there"),
            ]
            # the stored reply keeps the text as the agent wrote it, prefix and all
            assert assistant_texts(lb.host, "Ada") == [HYBRID_SAY]
            assert problems(ctl) == []


# ---- 6. a round silenced by its own tool call streams nothing --------------------------------


@pytest.mark.parametrize("tool", ["skip_reply", "think"])
async def test_a_silenced_round_closes_its_stream_with_nothing_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    """The stream is advisory and live: a round's text streams before its tool calls are known.
    When the round then calls ``skip_reply`` or ``think``, its prose is kept as a draft, and the
    stream's one ``complete`` says what was published: nothing."""
    monkeypatch.setattr("actors.host.make_model", lambda cfg: AsideModel(tool))
    with trio.fail_after(90):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            ctl = lb.ctl
            seen: list[TraceEvent] = []
            send_incoming(ctl, "lobby:#general", "q1", "anything to say?")
            await wait_trace(lb.stream, of("Ada", "turn-end"), "the turn", seen)
            await lb.host.run_until_idle()
            await barrier(ctl)
            held = [e for e in seen if of("Ada", "speech-held")(e)]
            assert [e.data["reason"] for e in held] == [f"silenced by {tool}"]
            assert publishes(ctl) == []
            chunks = [p for _, p in received_at(ctl, "channels/outgoing/chunk")]
            [(at, complete)] = received_at(ctl, "channels/outgoing/complete")
            assert chunks and all(i < at for i, _ in received_at(ctl, "channels/outgoing/chunk"))
            assert complete["content"] == []  # nothing of it was published
            assert complete["inferenceId"] == chunks[0]["inferenceId"]
            assert problems(ctl) == []
