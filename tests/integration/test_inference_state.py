"""Server-initiated inference (``inference/request``, ``inference/chunk``) and state rollback
(``state/rollback``, ``Host.rollback``, ``mcplive rollback``) against the real lobby server.

Real lobby subprocesses over stdio driven through their control sockets, a real SQLite store in
``tmp_path``, the real clock with generous deadlines; assertions are about order, never time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from tests.fake_anthropic import (
    FakeScript,
    Reply,
    serve_fake_anthropic,
    text_block,
    tool_use_block,
)
from tests.helpers import (
    LOBBY,
    AgentSpec,
    agent_configs,
    barrier,
    config,
    is_header_notice,
    lobby,
    publish_received,
    ready,
    received,
    running_lobby,
    scripted,
    send_incoming,
    wait_trace,
    without_notices,
)
from tests.lobby.control import ControlListener, LobbyControl, open_control_listener

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

MCPLIVE = [sys.executable, "-m", "actors.cli"]

ASSIST = '[[rules]]\nwhen = "(?i)summari[sz]e"\nsay = "Alice and Bob talked about board games."\n'
ANSWER = "Alice and Bob talked about board games."

NOTES = r"""
[[rules]]
when = "^note (\\w+)$"
calls = [{ tool = "lobby--note", arguments = { text = "{1}" } }]
say = "noted {1}"
"""


def route(tmp_path: Path, name: str, say: str) -> str:
    """A scripted model spec answering every inference request with ``say``."""
    return scripted(tmp_path, name, f'[[rules]]\nwhen = "."\nsay = {json.dumps(say)}\n')


# ---- helpers ------------------------------------------------------------------------------------


@asynccontextmanager
async def lobbies(
    tmp_path: Path,
    servers: Mapping[str, tuple[tuple[str, ...], Mapping[str, Any]]],
    agents: Mapping[str, AgentSpec],
    **host_keys: Any,
) -> AsyncIterator[tuple[Host, dict[str, LobbyControl]]]:
    """A host with one stdio lobby per entry of ``servers`` (id → (lobby args, server keys)),
    each on its own control listener so every control connection is known to be its server's;
    every lobby is :func:`ready` before the body runs."""
    async with AsyncExitStack() as stack:
        listeners = {
            sid: await stack.enter_async_context(open_control_listener()) for sid in servers
        }
        ctls: dict[str, LobbyControl] = {}

        async def close_controls() -> None:
            for ctl in ctls.values():
                await ctl.aclose()

        stack.push_async_callback(close_controls)  # after the host (and its lobbies) stopped
        entries = [
            lobby(listeners[sid].address, *args, sid=sid, **keys)
            for sid, (args, keys) in servers.items()
        ]
        cfg = config(tmp_path, entries, agent_configs(tmp_path, agents))
        cfg["host"].update(host_keys)
        host = await stack.enter_async_context(Host.open(cfg))
        for sid, listener in listeners.items():
            ctls[sid] = await listener.accept()
        for sid, ctl in ctls.items():
            await ready(ctl, host, sid)
        yield host, ctls


def infer_answered(text: str) -> Any:
    """Control-event predicate: the host answered the lobby's inference request whose first
    message is ``text``."""
    return lambda e: (
        e["event"] == "response"
        and e["method"] == "inference/request"
        and e["request"]["params"]["messages"][0]["content"] == text
    )


async def infer(ctl: LobbyControl, text: str, **extra: Any) -> dict[str, Any]:
    """Have the lobby send one ``inference/request`` (one user message ``text``) and return the
    control event reporting the host's answer: ``request`` and ``response``."""
    mark = ctl.mark()
    ctl.send({"cmd": "infer", "messages": [{"role": "user", "content": text}], **extra})
    return await ctl.wait_for(infer_answered(text), f"the answer to {text!r}", since=mark)


async def raw_request(ctl: LobbyControl, rid: str, method: str, params: Any) -> dict[str, Any]:
    """Have the lobby send exactly this request; the control event reporting the answer."""
    mark = ctl.mark()
    message = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    ctl.send({"cmd": "raw", "message": message})
    return await ctl.wait_for(
        lambda e: e["event"] == "response" and e["request"]["id"] == rid,
        f"the answer to {rid}",
        since=mark,
    )


def lobby_errors(ctl: LobbyControl) -> list[str]:
    """Host protocol mistakes the lobby noticed."""
    return [e["text"] for e in ctl.events if e["event"] == "error"]


def check_result(result: Mapping[str, Any]) -> None:
    assert result["finishReason"] == "end_turn"
    usage = result["usage"]
    assert set(usage) == {"inputTokens", "outputTokens"}
    assert all(type(usage[k]) is int and usage[k] >= 0 for k in usage)
    assert usage["outputTokens"] > 0


async def add_note(host: Host, ctl: LobbyControl, word: str, message_id: str) -> dict[str, Any]:
    """A chat message makes Ada call ``lobby--note`` once; returns the lobby's ``notes`` event
    for the checkpoint that call made."""
    mark = ctl.mark()
    send_incoming(ctl, "lobby:#general", message_id, f"note {word}")
    await ctl.wait_for(publish_received(f"noted {word}"), f"Ada noted {word}", since=mark)
    await host.run_until_idle()
    return await ctl.wait_for(
        lambda e: e["event"] == "notes" and e["cause"] == "note" and e["notes"][-1] == word,
        f"the notebook after {word}",
        since=mark,
    )


def recorded_at(history: list[dict[str, Any]], checkpoint: str) -> str:
    """The id of the stored tool-result message that recorded ``checkpoint``."""
    found = [
        m["id"]
        for m in history
        if m["role"] == "tool"
        and any(c["checkpoint"] == checkpoint for c in m["metadata"].get("checkpoints", ()))
    ]
    assert len(found) == 1, f"{checkpoint} recorded by {found}"
    return found[0]


def later_ids(history: list[dict[str, Any]], to: str) -> list[str]:
    """The ids stored after message ``to``, speech receipts included (a rollback sets those
    aside too), the one-time header notice left out."""
    ids = [m["id"] for m in history if not is_header_notice(m)]
    return ids[ids.index(to) + 1 :]


def is_marker(message: Mapping[str, Any]) -> bool:
    return message["role"] == "system" and message["metadata"].get("kind") == "rollback"


def rollbacks_received(ctl: LobbyControl) -> list[dict[str, Any]]:
    return [m["params"] for m in received(ctl, "state/rollback")]


async def rollback_seen(ctl: LobbyControl, mark: int) -> dict[str, Any]:
    """The lobby's ``notes`` event for the rollback it handled after ``mark``."""
    return await ctl.wait_for(
        lambda e: e["event"] == "notes" and e["cause"] == "rollback", "the rollback", since=mark
    )


async def set_rollback_mode(ctl: LobbyControl, mode: str) -> None:
    mark = ctl.mark()
    ctl.send({"cmd": "rollback_mode", "mode": mode})
    await ctl.wait_for(
        lambda e: e["event"] == "rollback_mode" and e["mode"] == mode, f"mode {mode}", since=mark
    )


def notes_entry(requested: str, checkpoint: str, *, forward: bool) -> dict[str, Any]:
    return {
        "server": "lobby",
        "feature_set": "lobby.notes",
        "requested": requested,
        "checkpoint": checkpoint,
        "success": True,
        "rolled_forward": forward,
    }


# ---- 1-2: inference/request, unstreamed and streamed ---------------------------------------------


async def test_unstreamed_inference_request_is_answered_by_the_routed_model(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        routes = {"lobby.assist": scripted(tmp_path, "assist", ASSIST)}
        async with running_lobby(tmp_path, {"Ada": ""}, "--assist", inference_models=routes) as lb:
            event = await infer(lb.ctl, "Please summarize the chat", maxTokens=200)
            assert event["request"]["params"]["stream"] is False
            assert "error" not in event["response"], event["response"]
            result = event["response"]["result"]
            assert result["content"] == ANSWER
            assert result["model"] == "scripted:assist.toml"
            check_result(result)
            traced = await wait_trace(
                lb.stream, lambda e: e.kind == "inference-request", "the inference trace"
            )
            assert traced.server_id == "lobby"
            assert traced.data["model"] == "scripted:assist.toml"
            assert traced.data["streamed"] is False
            assert received(lb.ctl, "inference/chunk") == []
            assert lobby_errors(lb.ctl) == []
            # the agent's history is not where a server's inference goes
            assert without_notices(lb.host.history("Ada")) == []


async def test_streamed_inference_sends_ordered_chunks_before_the_result(tmp_path: Path) -> None:
    with trio.fail_after(60):
        routes = {"lobby.assist": scripted(tmp_path, "assist", ASSIST)}
        async with running_lobby(tmp_path, {"Ada": ""}, "--assist", inference_models=routes) as lb:
            ctl = lb.ctl
            event = await infer(ctl, "summarize, streaming", stream=True)
            rid = event["request"]["id"]
            result = event["response"]["result"]
            assert result["content"] == ANSWER
            assert result["model"] == "scripted:assist.toml"
            check_result(result)
            # the wire order as the lobby read it: every chunk, then the response
            wire = [
                e["message"]
                for e in ctl.events
                if e["event"] == "received"
                and (
                    e["message"].get("method") == "inference/chunk"
                    or (e["message"].get("id") == rid and "method" not in e["message"])
                )
            ]
            chunks = [m["params"] for m in wire[:-1]]
            assert "result" in wire[-1] and wire[-1]["id"] == rid
            assert all(m.get("method") == "inference/chunk" for m in wire[:-1])
            assert len(chunks) == len(ANSWER.split()) > 1  # word by word
            assert [c["requestId"] for c in chunks] == [rid] * len(chunks)
            assert [c["index"] for c in chunks] == list(range(len(chunks)))
            assert "".join(c["delta"] for c in chunks) == result["content"]
            assert lobby_errors(ctl) == []

            # two streamed requests at once: each has its own requestId and its own count
            mark = ctl.mark()
            texts = ("summarize one", "summarize two")
            for text in texts:
                ctl.send(
                    {
                        "cmd": "infer",
                        "messages": [{"role": "user", "content": text}],
                        "stream": True,
                    }
                )
            both = [await ctl.wait_for(infer_answered(t), t, since=mark) for t in texts]
            rids = [e["request"]["id"] for e in both]
            assert len({rid, *rids}) == 3
            later = [m["params"] for m in received(ctl, "inference/chunk")][len(chunks) :]
            assert {c["requestId"] for c in later} == set(rids)
            for event, one in zip(both, rids, strict=True):
                mine = [c for c in later if c["requestId"] == one]
                assert [c["index"] for c in mine] == list(range(len(mine)))
                assert "".join(c["delta"] for c in mine) == event["response"]["result"]["content"]
            assert lobby_errors(ctl) == []


def assist_manifest(uses: list[str]) -> dict[str, Any]:
    """The lobby's manifest with ``lobby.assist`` declaring ``uses``."""
    return {
        "version": "0.5",
        "pushEvents": True,
        "channels": {"register": True, "publish": True, "incoming": True, "lifecycle": True},
        "inferenceRequest": {"streaming": True},
        "modelInfo": True,
        "featureSets": {
            "lobby.chat": {
                "description": "chat",
                "uses": [
                    "channels.register",
                    "channels.publish",
                    "channels.incoming",
                    "channels.lifecycle",
                ],
            },
            "lobby.events": {"description": "events", "uses": ["pushEvents"]},
            "lobby.assist": {"description": "assist", "uses": uses},
        },
    }


async def test_streaming_not_granted_answers_unstreamed(tmp_path: Path) -> None:
    with trio.fail_after(60):
        routes = {"lobby.assist": scripted(tmp_path, "assist", ASSIST)}
        async with running_lobby(
            tmp_path,
            {"Ada": ""},
            "--assist",
            inference_models=routes,
            disabled_capabilities=["inferenceRequest.streaming"],
        ) as lb:
            ctl = lb.ctl
            update = received(ctl, "featureSets/update")[-1]["params"]
            grant = update["effectiveCapabilities"]
            assert "inferenceRequest" in grant and "inferenceRequest.streaming" not in grant
            # lobby.assist as the lobby declares it uses the denied streaming capability, so
            # the whole feature set is off (SPEC §6.4): a request for it is refused
            refused = await infer(ctl, "summarize while the set is off", stream=True)
            assert refused["response"]["error"]["code"] == -32001
            assert refused["response"]["error"]["data"] == {"featureSet": "lobby.assist"}
            # a lobby whose lobby.assist asks only for unstreamed inference is served, and a
            # request that still asks for a stream is answered whole
            ctl.send({"cmd": "manifest", "manifest": assist_manifest(["inferenceRequest"])})
            changed = await wait_trace(
                lb.stream, lambda e: e.kind == "manifest-changed", "the new manifest"
            )
            assert "inferenceRequest.streaming" not in changed.data["grant"]
            event = await infer(ctl, "summarize, please stream", stream=True)
            assert event["request"]["params"]["stream"] is True
            result = event["response"]["result"]
            assert result["content"] == ANSWER
            check_result(result)
            assert received(ctl, "inference/chunk") == []
            assert lobby_errors(ctl) == []


# ---- 3-5: routing, budgets, refusals ------------------------------------------------------------


async def test_routing_exact_over_pattern_then_host_default_else_refused(tmp_path: Path) -> None:
    exact = route(tmp_path, "exact", "from the exact route")
    pattern = route(tmp_path, "pattern", "from the pattern route")
    default = route(tmp_path, "default", "from the host default")
    with trio.fail_after(60):
        servers = {
            # the pattern comes first: the exact name must still win
            "both": (
                ("--assist",),
                {"inference_models": {"lobby.*": pattern, "lobby.assist": exact}},
            ),
            "pat": (("--assist",), {"inference_models": {"lobby.*": pattern}}),
            "none": (("--assist",), {}),
        }
        async with lobbies(tmp_path, servers, {"Ada": ""}) as (_, ctls):
            answers = {sid: await infer(ctl, f"hello from {sid}") for sid, ctl in ctls.items()}
            both = answers["both"]["response"]["result"]
            assert (both["content"], both["model"]) == (
                "from the exact route",
                "scripted:exact.toml",
            )
            pat = answers["pat"]["response"]["result"]
            assert (pat["content"], pat["model"]) == (
                "from the pattern route",
                "scripted:pattern.toml",
            )
            error = answers["none"]["response"]["error"]
            assert error["code"] == -32603
            assert "no model" in error["message"] and "inference_model" in error["message"]
            assert "result" not in answers["none"]["response"]
            # the route holds: the same server is answered by the same model again
            assert (await infer(ctls["both"], "and again"))["response"]["result"]["content"] == (
                "from the exact route"
            )
    with trio.fail_after(60):
        servers = {
            "routed": (("--assist",), {"inference_models": {"lobby.assist": exact}}),
            "plain": (("--assist",), {}),
        }
        async with lobbies(tmp_path, servers, {"Ada": ""}, inference_model=default) as (_, ctls):
            plain = (await infer(ctls["plain"], "who answers me?"))["response"]["result"]
            assert (plain["content"], plain["model"]) == (
                "from the host default",
                "scripted:default.toml",
            )
            routed = (await infer(ctls["routed"], "and me?"))["response"]["result"]
            assert (routed["content"], routed["model"]) == (
                "from the exact route",
                "scripted:exact.toml",
            )


async def test_each_server_has_its_own_hourly_budget(tmp_path: Path) -> None:
    model = scripted(tmp_path, "assist", ASSIST)
    with trio.fail_after(60):
        keys = {"inference_models": {"lobby.assist": model}, "inference_requests_per_hour": 2}
        servers = {"a": (("--assist",), keys), "b": (("--assist",), keys)}
        async with lobbies(tmp_path, servers, {"Ada": ""}) as (_, ctls):
            first = [await infer(ctls["a"], f"summarize {i}") for i in (1, 2, 3)]
            assert [e["response"]["result"]["content"] for e in first[:2]] == [ANSWER, ANSWER]
            error = first[2]["response"]["error"]
            assert error["code"] == -32603
            assert "budget" in error["message"]
            assert error["data"]["reason"] == "budget"
            assert "result" not in first[2]["response"]
            # b's budget is its own: both of its requests are answered after a ran dry
            other = [await infer(ctls["b"], f"summarize b{i}") for i in (1, 2)]
            assert [e["response"]["result"]["content"] for e in other] == [ANSWER, ANSWER]
            # and a stays refused
            assert (await infer(ctls["a"], "summarize 4"))["response"]["error"]["code"] == -32603
            assert lobby_errors(ctls["a"]) == lobby_errors(ctls["b"]) == []


async def test_malformed_and_undeclared_requests_are_refused_and_the_lobby_stays(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        routes = {"lobby.assist": scripted(tmp_path, "assist", ASSIST)}
        async with running_lobby(tmp_path, {"Ada": ""}, "--assist", inference_models=routes) as lb:
            ctl = lb.ctl
            watched = lb.host.trace(kinds={"inference-request", "disconnected"})
            missing = await raw_request(
                ctl, "no-messages", "inference/request", {"featureSet": "lobby.assist"}
            )
            error = missing["response"]["error"]
            assert error["code"] == -32602 and "messages" in error["message"]
            roles = await raw_request(
                ctl,
                "bad-role",
                "inference/request",
                {"featureSet": "lobby.assist", "messages": [{"role": "robot", "content": "x"}]},
            )
            error = roles["response"]["error"]
            assert error["code"] == -32602 and "messages[0].role" in error["message"]
            zero = await infer(ctl, "summarize in no tokens", maxTokens=0)
            error = zero["response"]["error"]
            assert error["code"] == -32602 and "maxTokens" in error["message"]
            unknown = await infer(ctl, "summarize elsewhere", featureSet="lobby.nowhere")
            error = unknown["response"]["error"]
            assert error["code"] == -32003
            assert error["data"] == {"featureSet": "lobby.nowhere"}
            good = await infer(ctl, "summarize after all that")
            assert good["response"]["result"]["content"] == ANSWER
            assert lobby_errors(ctl) == []
            seen: list[Any] = []
            with trio.move_on_after(0):  # what the stream holds now, without waiting
                async for e in watched:
                    seen.append(e.kind)
            assert seen == ["inference-request"]  # only the good one ran a model; no disconnect


# ---- 6-7: rollback -----------------------------------------------------------------------------


async def test_rollback_exact_then_forward_tracks_the_current_checkpoint(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": NOTES}, "--notes") as lb:
            host, ctl = lb.host, lb.ctl
            made = [
                await add_note(host, ctl, word, f"n{i}")
                for i, word in enumerate(("alpha", "beta", "gamma"), 1)
            ]
            assert [(e["current"], e["parent"], e["notes"]) for e in made] == [
                ("cp-1", None, ["alpha"]),
                ("cp-2", "cp-1", ["alpha", "beta"]),
                ("cp-3", "cp-2", ["alpha", "beta", "gamma"]),
            ]
            before = without_notices(host.history("Ada"))
            ids = [m["id"] for m in before]
            assert [m["role"] for m in before] == ["user", "assistant", "tool", "assistant"] * 3
            to = recorded_at(before, "cp-1")
            assert ids.index(to) == 2
            assert before[2]["metadata"]["checkpoints"] == [
                {
                    "server": "lobby",
                    "feature_set": "lobby.notes",
                    "checkpoint": "cp-1",
                    "parent": None,
                }
            ]

            # 1. exact: back at cp-1
            later = later_ids(host.history("Ada"), to)
            assert len(later) == 9 + 3  # three turns' messages after cp-1, and their receipts
            mark = ctl.mark()
            report = await host.rollback("Ada", to=to)
            seen = await rollback_seen(ctl, mark)
            assert rollbacks_received(ctl) == [{"featureSet": "lobby.notes", "checkpoint": "cp-1"}]
            assert (seen["current"], seen["notes"]) == ("cp-1", ["alpha"])
            assert report == {
                "to": to,
                "set_aside": len(later),
                "state": [notes_entry("cp-1", "cp-1", forward=False)],
            }
            after = without_notices(host.history("Ada"))
            assert [m["id"] for m in after[:-1]] == ids  # nothing deleted
            marker = after[-1]
            assert is_marker(marker)
            assert marker["metadata"]["to"] == to
            assert marker["metadata"]["set_aside"] == later
            assert marker["metadata"]["state"] == report["state"]

            # the next note builds on cp-1: the lobby and the host agree where the notebook is
            delta = await add_note(host, ctl, "delta", "n4")
            assert (delta["current"], delta["parent"], delta["notes"]) == (
                "cp-4",
                "cp-1",
                ["alpha", "delta"],
            )

            # 2. forward: the lobby answers with a new checkpoint
            await set_rollback_mode(ctl, "forward")
            mark = ctl.mark()
            report = await host.rollback("Ada", to=to)
            seen = await rollback_seen(ctl, mark)
            assert (seen["current"], seen["parent"], seen["notes"]) == ("cp-5", "cp-1", ["alpha"])
            assert report["set_aside"] == 5  # delta's four messages and its receipt
            assert report["state"] == [notes_entry("cp-1", "cp-5", forward=True)]
            assert rollbacks_received(ctl)[-1] == {
                "featureSet": "lobby.notes",
                "checkpoint": "cp-1",
            }

            # 3. cp-5 is current now, so going back to where cp-1 was current asks for cp-1 again
            await set_rollback_mode(ctl, "exact")
            mark = ctl.mark()
            report = await host.rollback("Ada", to=to)
            seen = await rollback_seen(ctl, mark)
            assert seen["current"] == "cp-1"
            assert report == {
                "to": to,
                "set_aside": 0,
                "state": [notes_entry("cp-1", "cp-1", forward=False)],
            }
            assert len(rollbacks_received(ctl)) == 3

            # 4. and once cp-1 is current, the same rollback asks the lobby for nothing
            report = await host.rollback("Ada", to=to)
            assert report == {"to": to, "set_aside": 0, "state": []}
            await barrier(ctl)
            assert len(rollbacks_received(ctl)) == 3
            final = without_notices(host.history("Ada"))
            assert sum(is_marker(m) for m in final) == 4
            assert set(ids) <= {m["id"] for m in final}
            assert lobby_errors(ctl) == []


async def test_the_next_turn_does_not_see_set_aside_messages(
    tmp_path: Path, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = FakeScript()
    for i, word in enumerate(("alpha", "beta", "gamma"), 1):
        script.add(
            Reply(
                blocks=[tool_use_block(f"toolu_{i}", "lobby--note", {"text": word})],
                stop_reason="tool_use",
            ),
            Reply(blocks=[text_block(f"noted {word}")]),
        )
    script.add(Reply(blocks=[text_block("I remember alpha")]))
    base_url = await nursery.start(serve_fake_anthropic, script)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    with trio.fail_after(60):
        agents = {"Ada": {"model": "anthropic:claude-test"}}
        async with running_lobby(tmp_path, agents, "--notes") as lb:
            host, ctl = lb.host, lb.ctl
            for i, word in enumerate(("alpha", "beta", "gamma"), 1):
                await add_note(host, ctl, word, f"n{i}")
            seen_before = json.dumps(script.requests[-1].body["messages"])
            assert "note beta" in seen_before and "noted beta" in seen_before
            to = recorded_at(without_notices(host.history("Ada")), "cp-1")
            await host.rollback("Ada", to=to)

            mark = ctl.mark()
            send_incoming(ctl, "lobby:#general", "n4", "what do you remember?")
            await ctl.wait_for(publish_received("I remember alpha"), "Ada's answer", since=mark)
            await host.run_until_idle()
            seen = json.dumps(script.requests[-1].body["messages"])
            assert "note alpha" in seen and "toolu_1" in seen  # up to the rollback point
            assert "what do you remember?" in seen
            for gone in ("noted alpha", "beta", "gamma", "toolu_2", "rolled back"):
                assert gone not in seen, gone
            assert script.remaining == 0


async def test_rollback_to_an_unknown_message_is_refused_and_stores_nothing(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": NOTES}, "--notes") as lb:
            host, ctl = lb.host, lb.ctl
            for i, word in enumerate(("alpha", "beta"), 1):
                await add_note(host, ctl, word, f"n{i}")
            before = without_notices(host.history("Ada"))
            with pytest.raises(ValueError, match="Ada has no message 'no-such-id'"):
                await host.rollback("Ada", to="no-such-id")
            assert without_notices(host.history("Ada")) == before
            await barrier(ctl)
            assert rollbacks_received(ctl) == []
            # a message set aside by a rollback is no longer a place to go back to
            report = await host.rollback("Ada", to=recorded_at(before, "cp-1"))
            assert report["set_aside"] == 5 + 2  # with the two turns' receipts
            stored = without_notices(host.history("Ada"))
            with pytest.raises(ValueError, match="has no message"):
                await host.rollback("Ada", to=before[-1]["id"])
            assert without_notices(host.history("Ada")) == stored
            await barrier(ctl)
            assert len(rollbacks_received(ctl)) == 1


async def test_a_checkpoint_the_restarted_server_lost_is_reported_per_server(
    tmp_path: Path,
) -> None:
    with trio.fail_after(90):
        async with running_lobby(tmp_path, {"Ada": NOTES}, "--notes") as lb:
            host = lb.host
            for i, word in enumerate(("alpha", "beta"), 1):
                await add_note(host, lb.ctl, word, f"n{i}")
            lb.ctl.send({"cmd": "crash"})
            await wait_trace(lb.stream, lambda e: e.kind == "disconnected", "the crash")
            second = await lb.listener.accept(timeout=60)
            await ready(second, host)  # a new process: its notebook is empty
            before = without_notices(host.history("Ada"))
            to = recorded_at(before, "cp-1")
            later = later_ids(host.history("Ada"), to)
            report = await host.rollback("Ada", to=to)
            await barrier(second)
            assert rollbacks_received(second) == [
                {"featureSet": "lobby.notes", "checkpoint": "cp-1"}
            ]
            [entry] = report["state"]
            assert {k: entry[k] for k in ("server", "feature_set", "requested")} == {
                "server": "lobby",
                "feature_set": "lobby.notes",
                "requested": "cp-1",
            }
            assert "-32005" in entry["error"]
            assert "success" not in entry and "checkpoint" not in entry
            # the context rollback happened all the same
            assert report["set_aside"] == len(later) == 5 + 2  # with the two turns' receipts
            after = without_notices(host.history("Ada"))
            assert [m["id"] for m in after[:-1]] == [m["id"] for m in before]
            assert is_marker(after[-1])
            assert after[-1]["metadata"]["set_aside"] == later
            assert after[-1]["metadata"]["state"] == report["state"]


# ---- 8: mcplive rollback -----------------------------------------------------------------------


def toml_config(tmp_path: Path, address: str) -> Path:
    """The config of a run like the rollback tests, as a TOML file the CLI reads."""
    rules = tmp_path / "ada.toml"
    rules.write_text(NOTES, encoding="utf-8")
    command = [*LOBBY, "--control-connect", address, "--notes"]
    path = tmp_path / "host.toml"
    path.write_text(
        f"[host]\ndata_dir = {json.dumps(str(tmp_path / 'data'))}\n\n"
        f'[[servers]]\nid = "lobby"\ncommand = {json.dumps(command)}\n'
        f"env = {{ PYTHONPATH = {json.dumps(str(ROOT))} }}\n\n"  # the test lobby, from this folder
        f'[[agents]]\nname = "Ada"\nmodel = {json.dumps(f"scripted:{rules}")}\n',
        encoding="utf-8",
    )
    return path


async def mcplive(
    listener: ControlListener, cwd: Path, *args: str
) -> tuple[subprocess.CompletedProcess[bytes], LobbyControl]:
    """Run ``mcplive ARGS``; its lobby's control connection, read until the lobby exited."""
    done: list[subprocess.CompletedProcess[bytes]] = []

    async def run() -> None:
        done.append(
            await trio.run_process(
                [*MCPLIVE, *args], cwd=cwd, capture_stdout=True, capture_stderr=True, check=False
            )
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        ctl = await listener.accept(timeout=30)
    await ctl.wait_closed(timeout=30)
    await ctl.aclose()
    return done[0], ctl


async def test_cli_rollback_prints_the_outcome_and_refuses_unknown_ids(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            cfg = toml_config(tmp_path, listener.address)
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ready(ctl, host)
                for i, word in enumerate(("alpha", "beta"), 1):
                    await add_note(host, ctl, word, f"n{i}")
                everything = host.history("Ada")
                history = without_notices(everything)
            await ctl.aclose()
            ids = [m["id"] for m in history]
            cp1, cp2 = recorded_at(history, "cp-1"), recorded_at(history, "cp-2")

            # an unknown id: one readable line on stderr, nothing stored
            bad, lobby_ctl = await mcplive(
                listener, tmp_path, "rollback", "Ada", "--to", "nope", "--config", str(cfg)
            )
            err = bad.stderr.decode()
            assert bad.returncode == 1, err
            assert err.count("\n") == 1 and "Traceback" not in err
            assert err.startswith("mcplive: rollback refused:") and "'nope'" in err
            assert rollbacks_received(lobby_ctl) == []

            # to cp-2's message: the notebook is already there, only the context moves
            ok, lobby_ctl = await mcplive(
                listener, tmp_path, "rollback", "Ada", "--to", cp2, "--config", str(cfg)
            )
            out = ok.stdout.decode()
            assert ok.returncode == 0, out + ok.stderr.decode()
            # the reply to the second note, and its receipt
            assert out.splitlines() == [f"· Ada: rolled back to {cp2}; 2 later messages set aside"]
            assert rollbacks_received(lobby_ctl) == []

            # to cp-1's message: the new lobby process never had cp-1, which is reported
            lost, lobby_ctl = await mcplive(
                listener, tmp_path, "rollback", "Ada", "--to", cp1, "--config", str(cfg)
            )
            out = lost.stdout.decode()
            assert lost.returncode == 1, out + lost.stderr.decode()
            lines = out.splitlines()
            first_set_aside = later_ids(everything, cp1)[:-2]  # not the two set aside before
            assert lines[0] == (
                f"· Ada: rolled back to {cp1}; {len(first_set_aside)} later messages set aside"
            )
            assert len(first_set_aside) == 4 + 1  # and the first reply's receipt
            assert lines[1].startswith("  lobby / lobby.notes: not rolled back to cp-1: -32005")
            assert len(lines) == 2
            assert rollbacks_received(lobby_ctl) == [
                {"featureSet": "lobby.notes", "checkpoint": "cp-1"}
            ]

        shown = await trio.run_process(
            [*MCPLIVE, "history", "--json", "--data-dir", str(tmp_path / "data")],
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
        )
        stored = without_notices([json.loads(line) for line in shown.stdout.decode().splitlines()])
        assert [m["id"] for m in stored[: len(ids)]] == ids  # nothing deleted
        markers = [m for m in stored if is_marker(m)]
        assert [m["metadata"]["to"] for m in markers] == [cp2, cp1]
        assert markers[1]["metadata"]["set_aside"] == later_ids(everything, cp1)[:-2]


async def test_an_in_process_tool_call_moves_the_current_checkpoint(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": NOTES}, "--notes") as lb:
            host, ctl = lb.host, lb.ctl
            for i, word in enumerate(("alpha", "beta"), 1):
                await add_note(host, ctl, word, f"n{i}")
            mark = ctl.mark()
            direct = await host.execute_tool_call("Ada", "lobby--note", {"text": "aside"})
            assert direct["is_error"] is False and "state" not in direct
            aside = await ctl.wait_for(
                lambda e: e["event"] == "notes" and e["cause"] == "note", "the aside", since=mark
            )
            assert (aside["current"], aside["notes"]) == ("cp-3", ["alpha", "beta", "aside"])
            # the conversation goes back to where cp-2 was current: the notebook must follow,
            # since the server's state is at cp-3 now, whoever made that call
            to = recorded_at(without_notices(host.history("Ada")), "cp-2")
            report = await host.rollback("Ada", to=to)
            await barrier(ctl)
            assert rollbacks_received(ctl) == [{"featureSet": "lobby.notes", "checkpoint": "cp-2"}]
            assert report["state"] == [notes_entry("cp-2", "cp-2", forward=False)]
