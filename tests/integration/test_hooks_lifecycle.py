"""Context hooks, the inference lifecycle, hook-time inference and ``model/info`` against the
lobby server as a real stdio subprocess, driven over its control socket.

Real clock, generous deadlines, order-only assertions. Where the test must see what the model
saw, a small recording model (``RecordingModel``) stands in for the agent's model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
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
    received,
    running_lobby,
    scripted,
    send_incoming,
    wait_trace,
    without_notices,
)
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi there!"\n'
#: What ``model`` says of the scripted model of an agent named Ada (``ada.toml``).
ADA_MODEL = {
    "id": "scripted:ada.toml",
    "vendor": "mcplive",
    "contextWindow": 200_000,
    "capabilities": ["tools"],
}
OBSERVE = "contextHooks.beforeInference.observe"
LIFECYCLE_KEYS = {"inferenceId", "conversationId", "turnIndex", "phase", "model", "usage"}
INJECT_SYSTEM = "contextHooks.beforeInference.inject.system"


# ---- helpers ---------------------------------------------------------------------------------


def lobby_errors(ctl: Any) -> list[str]:
    """The host protocol mistakes the lobby reported."""
    return [e.get("text", "") for e in ctl.events if e.get("event") == "error"]


def hook_params(ctl: Any) -> list[dict[str, Any]]:
    return [m["params"] for m in received(ctl, "context/beforeInference")]


def lifecycle(ctl: Any) -> list[dict[str, Any]]:
    return [m["params"] for m in received(ctl, "inference/lifecycle")]


def phases_by_inference(ctl: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in lifecycle(ctl):
        out.setdefault(p["inferenceId"], []).append(p["phase"])
    return out


def lifecycle_seen(ctl: Any, phase: str, n: int = 1) -> Callable[[dict[str, Any]], bool]:
    """Control-event predicate: the lobby has received ``n`` (or more) lifecycle ``phase``s."""
    return lambda e: (
        e["event"] == "received"
        and e["message"].get("method") == "inference/lifecycle"
        and sum(p["phase"] == phase for p in lifecycle(ctl)) >= n
    )


_barriers = itertools.count(1)


async def barrier(ctl: Any) -> None:
    """A round trip over the lobby's stdio and control socket: everything the host sent the
    lobby before it answered this (refused: it wakes nobody) is in ``ctl.events`` afterwards."""
    tag = f"barrier-{next(_barriers)}"
    send_incoming(ctl, "nowhere", tag, "sync")
    await ctl.wait_for(incoming_answered(tag), tag)


def responses(ctl: Any, method: str) -> list[dict[str, Any]]:
    """The host's answers to the lobby's ``method`` requests, oldest first."""
    return [
        e["response"]
        for e in ctl.events
        if e.get("event") == "response" and e.get("method") == method
    ]


def text_blocks(message: dict[str, Any]) -> list[str]:
    return [b["text"] for b in message["blocks"] if b.get("type") == "text"]


# ---- 1. who gets the hook and what it carries -------------------------------------------------


@pytest.mark.parametrize("observe", [False, True], ids=["inject-only", "observer"])
async def test_hook_params_user_message_ids_model_and_channels(
    tmp_path: Path, observe: bool
) -> None:
    masks = {} if observe else {"disabled_capabilities": [OBSERVE]}
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": HELLO}, "--context", **masks) as lb:
            ctl = lb.ctl
            grant = received(ctl, "featureSets/update")[0]["params"]["effectiveCapabilities"]
            assert (OBSERVE in grant) is observe
            send_incoming(ctl, "lobby:#random", "m1", "hello there")
            await ctl.wait_for(publish_received("Hi there!"), "Ada's reply")
            await lb.host.run_until_idle()
            await barrier(ctl)
            [params] = hook_params(ctl)
            assert params["userMessage"] == ("hello there" if observe else None)
            assert isinstance(params["inferenceId"], str) and params["inferenceId"]
            assert params["conversationId"] == "agent:Ada"
            assert params["turnIndex"] == 0
            assert params["model"] == ADA_MODEL
            channels = params["channels"]
            assert channels["incoming"] == {"channelId": "lobby:#random", "messageId": "m1"}
            assert channels["defaultOutgoing"] == {"channelId": "lobby:#random"}
            # the hook is about the same inference the lifecycle reports
            assert {p["inferenceId"] for p in lifecycle(ctl)} == {params["inferenceId"]}
            assert publishes(ctl) == [("lobby:#random", "Hi there!")]
            # one conversation id for the agent: the hook's, the lifecycle's and the publish's
            [publish] = received(ctl, "channels/publish")
            ids = {p["conversationId"] for p in lifecycle(ctl)} | {params["conversationId"]}
            assert ids == {publish["params"]["conversationId"]} == {"agent:Ada"}
            assert lobby_errors(ctl) == []


# ---- 2. injections: authorized per position, placed, introduced, never stored -----------------


#: A capability mask granting everything the lobby advertises, system injection included
#: (only a literal entry grants it).
GRANT_ALL = ["*", "*.*", "*.*.*", "*.*.*.*", INJECT_SYSTEM]


@pytest.mark.parametrize("system", ["denied", "granted"])
async def test_injections_are_authorized_per_position_and_placed_around_the_user_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, system: str
) -> None:
    model = RecordingModel(say="noted")
    install(monkeypatch, model)
    injections = [
        {"namespace": "ns.before", "position": "beforeUser", "content": "BEFORE-TEXT"},
        {
            "namespace": "ns.after",
            "position": "afterUser",
            "content": [{"type": "text", "text": "AFTER-TEXT"}],
        },
        {"namespace": "ns.sys", "position": "system", "content": "SYSTEM-TEXT"},
    ]
    masks = {"enabled_capabilities": GRANT_ALL} if system == "granted" else {}
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, "--context", **masks) as lb:
            ctl = lb.ctl
            # the lobby advertises system injection; only the explicit mask grants it
            grant = received(ctl, "featureSets/update")[0]["params"]["effectiveCapabilities"]
            assert (INJECT_SYSTEM in grant) is (system == "granted")
            # a first turn without injections, so the context has history before the newest
            ctl.send({"cmd": "hook", "mode": "answer", "injections": []})
            await ctl.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set")
            send_incoming(ctl, "lobby:#general", "m1", "first message")
            await ctl.wait_for(publish_received("noted"), "the first reply")
            await wait_trace(lb.stream, lambda e: e.kind == "turn-end", "the first turn")
            await lb.host.run_until_idle()

            mark = ctl.mark()
            ctl.send({"cmd": "hook", "mode": "answer", "injections": injections})
            await ctl.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set", since=mark)
            send_incoming(ctl, "lobby:#general", "m2", "second message")
            seen: list[Any] = []
            await wait_trace(lb.stream, lambda e: e.kind == "turn-end", "the second turn", seen)
            await ctl.wait_for(publish_received("noted"), "the second reply", since=mark)
            dropped = [e for e in seen if e.kind == "injection-dropped"]
            if system == "denied":
                [drop] = dropped
                assert drop.server_id == "lobby" and drop.agent == "Ada"
                assert drop.data["index"] == 2 and drop.data["position"] == "system"
                assert INJECT_SYSTEM in drop.data["reason"]
            else:
                assert dropped == []
            await lb.host.run_until_idle()

            assert len(model.seen) == 2
            first, second = model.seen
            assert all("[context from" not in t for m in first.messages for t in text_blocks(m))
            msgs = without_notices(list(second.messages))
            roles = [m["role"] for m in msgs]
            assert roles == ["user", "assistant", "user", "user", "user"]
            assert text_blocks(msgs[0])[-1] == "first message"
            assert text_blocks(msgs[2]) == ["[context from lobby · ns.before]", "BEFORE-TEXT"]
            assert text_blocks(msgs[3])[-1] == "second message"
            assert text_blocks(msgs[4]) == ["[context from lobby · ns.after]", "AFTER-TEXT"]
            # a system injection never lands among the messages; granted, it ends the prompt
            assert all("SYSTEM-TEXT" not in t for m in msgs for t in text_blocks(m))
            if system == "denied":
                assert "SYSTEM-TEXT" not in second.system
                assert second.system == first.system
            else:
                assert second.system.startswith(first.system)
                assert second.system.endswith("[context from lobby · ns.sys]\nSYSTEM-TEXT")
            # injections are for one inference only: never stored
            stored = [t for m in lb.host.history("Ada") for t in text_blocks(m)]
            assert not any("TEXT" in t or "[context from" in t for t in stored)
            assert publishes(ctl) == [("lobby:#general", "noted")] * 2
            await barrier(ctl)
            assert lobby_errors(ctl) == []


async def test_scripted_rules_match_the_incoming_message_not_an_after_user_injection(
    tmp_path: Path,
) -> None:
    injections = [{"namespace": "ns", "position": "afterUser", "content": "Topic: board games."}]
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": HELLO}, "--context") as lb:
            ctl = lb.ctl
            ctl.send({"cmd": "hook", "mode": "answer", "injections": injections})
            await ctl.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set")
            send_incoming(ctl, "lobby:#general", "m1", "hello there")
            await wait_trace(lb.stream, lambda e: e.kind == "turn-end", "Ada's turn")
            await lb.host.run_until_idle()
            await barrier(ctl)
            assert received(ctl, "context/beforeInference")  # the hook did run
            assert publishes(ctl) == [("lobby:#general", "Hi there!")]


async def test_an_injection_with_invalid_content_is_dropped_and_the_valid_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(say="noted")
    install(monkeypatch, model)
    injections = [
        {"namespace": "ns.one", "position": "beforeUser", "content": "KEEP-ONE"},
        {"namespace": "ns.bad", "position": "beforeUser", "content": [{"type": "text", "text": 4}]},
        {"namespace": "ns.two", "position": "afterUser", "content": "KEEP-TWO"},
        {"namespace": "ns.worse", "position": "afterUser", "content": [{"type": 5}]},
    ]
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, "--context") as lb:
            ctl = lb.ctl
            ctl.send({"cmd": "hook", "mode": "answer", "injections": injections})
            await ctl.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set")
            send_incoming(ctl, "lobby:#general", "m1", "the message")
            seen: list[Any] = []
            await wait_trace(lb.stream, lambda e: e.kind == "turn-end", "Ada's turn", seen)
            dropped = [e.data for e in seen if e.kind == "injection-dropped"]
            assert [d["index"] for d in dropped] == [1, 3]
            assert "text" in dropped[0]["reason"]
            assert "not a content block" in dropped[1]["reason"]
            [call] = model.seen
            msgs = call.messages
            assert [text_blocks(m) for m in msgs if "[context from" in text_blocks(m)[0]] == [
                ["[context from lobby · ns.one]", "KEEP-ONE"],
                ["[context from lobby · ns.two]", "KEEP-TWO"],
            ]
            assert text_blocks(msgs[1])[-1] == "the message"  # between the two kept ones
            await barrier(ctl)
            assert lobby_errors(ctl) == []


# ---- 3. a silent hook server delays only its own agent ---------------------------------------


async def test_silent_hook_server_delays_only_its_agent_and_fails_open(tmp_path: Path) -> None:
    a_rules = '[[rules]]\nwhen = "hello"\nsay = "A answers"\n'
    b_rules = '[[rules]]\nwhen = "ping"\nsay = "pong"\n'
    agents = {
        "A": {"model": scripted(tmp_path, "a", a_rules), "servers": ["slow"]},
        "B": {"model": scripted(tmp_path, "b", b_rules), "servers": ["quick"]},
    }
    with trio.fail_after(60):
        async with open_control_listener() as l_slow, open_control_listener() as l_quick:
            servers = [
                lobby(l_slow.address, "--context", sid="slow", hook_timeout_s=2),
                lobby(l_quick.address, sid="quick"),
            ]
            async with Host.open(config(tmp_path, servers, agent_configs(tmp_path, agents))) as h:
                stream = h.trace()
                slow = await l_slow.accept()
                quick = await l_quick.accept()
                await ready(slow, h, "slow")
                await ready(quick, h, "quick")
                slow.send({"cmd": "hook", "mode": "never"})
                await slow.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set")

                send_incoming(slow, "lobby:#general", "a1", "hello A")
                # A's turn has started and the slow lobby holds its hook unanswered
                await slow.wait_for(
                    lambda e: e["event"] == "hook_reply" and e["mode"] == "never", "hook held"
                )
                send_incoming(quick, "lobby:#general", "b1", "ping B")
                await quick.wait_for(publish_received("pong"), "B's reply")

                seen: list[Any] = []
                await wait_trace(
                    stream, lambda e: e.kind == "turn-end" and e.agent == "A", "A's turn", seen
                )
                order = [(e.kind, e.agent or e.server_id) for e in seen]
                assert ("published", "B") in order
                assert order.index(("published", "B")) < order.index(("turn-end", "A"))
                failed = [e for e in seen if e.kind == "hook-failed"]
                assert [e.server_id for e in failed] == ["slow"]
                assert failed[0].agent == "A"
                # fail-open: after giving up on the hook, A still answered
                assert order.index(("hook-failed", "A")) < order.index(("published", "A"))
                assert order.index(("published", "A")) < order.index(("turn-end", "A"))
                await slow.wait_for(publish_received("A answers"), "A's reply")
                assert publishes(slow) == [("lobby:#general", "A answers")]
                assert publishes(quick) == [("lobby:#general", "pong")]
                assert len(received(slow, "context/beforeInference")) == 1
                assert received(quick, "context/beforeInference") == []  # no hooks advertised
                await barrier(slow)
                await barrier(quick)
                assert lobby_errors(slow) == [] and lobby_errors(quick) == []


# ---- 4. the inference lifecycle -------------------------------------------------------------


@pytest.mark.parametrize("assist", [False, True], ids=["no-modelInfo", "modelInfo"])
async def test_lifecycle_started_then_one_completed_per_turn(tmp_path: Path, assist: bool) -> None:
    extra = ("--context", "--assist") if assist else ("--context",)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": HELLO}, *extra) as lb:
            ctl = lb.ctl
            grant = received(ctl, "featureSets/update")[0]["params"]["effectiveCapabilities"]
            assert ("modelInfo" in grant) is assist
            for n, mid in enumerate(("m1", "m2"), 1):
                send_incoming(ctl, "lobby:#general", mid, f"hello #{n}")
                await ctl.wait_for(lifecycle_seen(ctl, "completed", n), f"turn {n} completed")
                await lb.host.run_until_idle()
            await barrier(ctl)

            events = lifecycle(ctl)
            phases = phases_by_inference(ctl)
            assert list(phases.values()) == [["started", "completed"], ["started", "completed"]]
            hooks = hook_params(ctl)
            assert [h["inferenceId"] for h in hooks] == list(phases)
            for p in events:
                assert p["conversationId"] == "agent:Ada"
                assert p["turnIndex"] == list(phases).index(p["inferenceId"])
                assert set(p) <= LIFECYCLE_KEYS  # ids, phase, model, usage: never content
                assert ("usage" in p) is (p["phase"] == "completed")
                if assist:
                    assert p["model"] == ADA_MODEL
                else:
                    assert "model" not in p
            for p in events:
                if p["phase"] == "completed":
                    assert set(p["usage"]) == {"inputTokens", "outputTokens"}
            # each turn: started, then its hook, then its reply, then completed
            order = [
                (e["message"].get("method"), e["message"].get("params", {}).get("phase"))
                for e in ctl.events
                if e["event"] == "received"
                and e["message"].get("method")
                in ("inference/lifecycle", "context/beforeInference", "channels/publish")
            ]
            turn = [
                ("inference/lifecycle", "started"),
                ("context/beforeInference", None),
                ("channels/publish", None),
                ("inference/lifecycle", "completed"),
            ]
            assert order == turn + turn
            assert publishes(ctl) == [("lobby:#general", "Hi there!")] * 2
            await barrier(ctl)
            assert lobby_errors(ctl) == []


async def test_lifecycle_failed_once_when_the_model_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(mode="fail", say="noted")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, "--context") as lb:
            ctl = lb.ctl
            send_incoming(ctl, "lobby:#general", "m1", "anyone?")
            await ctl.wait_for(lifecycle_seen(ctl, "failed"), "failed")
            await lb.host.run_until_idle()
            await barrier(ctl)
            assert list(phases_by_inference(ctl).values()) == [["started", "failed"]]
            assert all("usage" not in p for p in lifecycle(ctl))
            assert len(model.seen) == 1
            assert publishes(ctl) == []
            assert lobby_errors(ctl) == []


@pytest.mark.parametrize("where", ["model", "hook"])
async def test_lifecycle_aborted_once_then_the_next_wake_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    model = RecordingModel(mode="block-first" if where == "model" else "reply", say="back again")
    install(monkeypatch, model)
    with trio.fail_after(60):
        # a long hook deadline: in the "hook" case only the abort ends the wait
        async with running_lobby(tmp_path, {"Ada": ""}, "--context", hook_timeout_s=50) as lb:
            ctl = lb.ctl
            assert await lb.host.abort_turn("Ada") is False  # nothing runs yet
            if where == "hook":
                ctl.send({"cmd": "hook", "mode": "never"})
                await ctl.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set")
            send_incoming(ctl, "lobby:#general", "m1", "take your time")
            await ctl.wait_for(lifecycle_seen(ctl, "started"), "started")
            if where == "model":
                await model.entered.wait()  # the model call is under way and will not return
            else:
                await ctl.wait_for(lambda e: e["event"] == "hook_reply", "the hook held")
            assert await lb.host.abort_turn("Ada") is True
            await wait_trace(lb.stream, lambda e: e.kind == "turn-aborted", "turn aborted")
            await ctl.wait_for(lifecycle_seen(ctl, "aborted"), "aborted")

            if where == "hook":
                mark = ctl.mark()
                ctl.send({"cmd": "hook", "mode": "answer"})
                await ctl.wait_for(lambda e: e["event"] == "hook_mode", "answering", since=mark)
            send_incoming(ctl, "lobby:#general", "m2", "are you there?")
            await ctl.wait_for(publish_received("back again"), "the next reply")
            await ctl.wait_for(lifecycle_seen(ctl, "completed"), "completed")
            await lb.host.run_until_idle()  # the aborted hook is not left waiting
            await barrier(ctl)
            phases = list(phases_by_inference(ctl).values())
            assert phases == [["started", "aborted"], ["started", "completed"]]
            assert [p["turnIndex"] for p in lifecycle(ctl)] == [0, 0, 1, 1]
            assert all("usage" not in p for p in lifecycle(ctl) if p["phase"] != "completed")
            assert len(model.seen) == (2 if where == "model" else 1)
            assert publishes(ctl) == [("lobby:#general", "back again")]
            assert lobby_errors(ctl) == []


async def test_an_aborted_turn_releases_its_hook(tmp_path: Path) -> None:
    helper = scripted(tmp_path, "helper", '[[rules]]\nwhen = "summarize"\nsay = "A summary."\n')
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path,
            {"Ada": ""},
            "--context",
            "--assist",
            hook_timeout_s=50,
            inference_models={"lobby.assist": helper},
        ) as lb:
            ctl = lb.ctl
            ctl.send({"cmd": "hook", "mode": "never"})
            await ctl.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set")
            send_incoming(ctl, "lobby:#general", "m1", "take your time")
            await ctl.wait_for(lambda e: e["event"] == "hook_reply", "the hook held")
            assert await lb.host.abort_turn("Ada") is True
            await wait_trace(lb.stream, lambda e: e.kind == "turn-aborted", "turn aborted")
            await ctl.wait_for(lifecycle_seen(ctl, "aborted"), "aborted")
            # no hook of a running turn is in flight any more: the server may ask again
            ctl.send({"cmd": "infer", "messages": [{"role": "user", "content": "summarize"}]})
            served = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["method"] == "inference/request",
                "the inference answer",
            )
            assert served["response"].get("result", {}).get("content") == "A summary.", served


# ---- 5. a hook must not start inference ------------------------------------------------------


async def test_inference_request_inside_a_hook_is_refused_and_the_turn_goes_on(
    tmp_path: Path,
) -> None:
    helper = scripted(tmp_path, "helper", '[[rules]]\nwhen = "summarize"\nsay = "A summary."\n')
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path,
            {"Ada": HELLO},
            "--context",
            "--assist",
            inference_models={"lobby.assist": helper},
        ) as lb:
            ctl = lb.ctl
            ctl.send({"cmd": "hook", "mode": "infer-first"})
            await ctl.wait_for(lambda e: e["event"] == "hook_mode", "hook mode set")
            send_incoming(ctl, "lobby:#general", "m1", "hello")
            refused = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["method"] == "inference/request",
                "the refusal",
            )
            assert refused["response"]["error"]["code"] == -32600
            await ctl.wait_for(publish_received("Hi there!"), "Ada's reply")
            await ctl.wait_for(lifecycle_seen(ctl, "completed"), "completed")
            steps = [
                e["event"] if e["event"] == "hook_reply" else e["method"]
                for e in ctl.events
                if e["event"] == "hook_reply"
                or (e["event"] == "response" and e["method"] == "inference/request")
            ]
            # the hook was answered after the refusal, then the turn went on
            assert steps == ["inference/request", "hook_reply"]
            reply = next(e for e in ctl.events if e["event"] == "hook_reply")
            assert "result" in reply
            await lb.host.run_until_idle()

            # outside a hook the same request is served: the refusal was the hook's
            mark = ctl.mark()
            ctl.send({"cmd": "infer", "messages": [{"role": "user", "content": "summarize"}]})
            served = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["method"] == "inference/request",
                "the served request",
                since=mark,
            )
            assert served["response"]["result"]["content"] == "A summary."
            assert publishes(ctl) == [("lobby:#general", "Hi there!")]
            await barrier(ctl)
            assert lobby_errors(ctl) == []


# ---- 6. model/info ---------------------------------------------------------------------------


@pytest.mark.parametrize("granted", [True, False], ids=["granted", "denied"])
async def test_model_info_answers_only_when_granted(tmp_path: Path, granted: bool) -> None:
    masks = {} if granted else {"disabled_capabilities": ["modelInfo"]}
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, "--assist", **masks) as lb:
            ctl = lb.ctl
            ctl.send({"cmd": "model_info"})
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["method"] == "model/info", "model/info"
            )
            response = event["response"]
            if granted:
                assert response["result"] == ADA_MODEL
                assert "error" not in response
            else:
                assert "result" not in response
                assert response["error"]["code"] == -32002
            assert len(responses(ctl, "model/info")) == 1
            await barrier(ctl)
            assert lobby_errors(ctl) == []
