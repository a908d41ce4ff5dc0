"""Agents on the ``openai:`` provider, as an operator runs them: a real Host (real store in a temp
dir) with the bundled lobby as a real subprocess, the model behind the fake chat-completions
server on loopback HTTP.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.models import openai as openai_model
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from tests.fake_openai import (
    FakeScript,
    HttpError,
    Raw,
    Reply,
    Silent,
    ToolCall,
    serve_fake_openai,
)
from tests.helpers import publish_received, running_lobby, send_incoming, wait_trace

pytestmark = pytest.mark.slow

REAL_KEY = "sk-real-openai-key-never-for-others"
ROUTER_KEY = "sk-for-this-endpoint"


def of(agent: str, kind: str) -> Any:
    return lambda e: e.agent == agent and e.kind == kind


def said(host: Any, agent: str) -> list[dict[str, Any]]:
    return [m for m in host.history(agent) if m["role"] == "assistant"]


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    # the operator's real OpenAI key is in the environment; no test endpoint may receive it
    monkeypatch.setenv("OPENAI_API_KEY", REAL_KEY)
    monkeypatch.setenv("ROUTER_KEY", ROUTER_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.mark.parametrize("api_key_env", ["ROUTER_KEY", None])
async def test_an_openai_agent_converses_with_the_lobby(
    tmp_path: Path, api_key_env: str | None
) -> None:
    script = FakeScript(
        [
            Reply(
                text="Let me look.",
                tool_calls=[
                    ToolCall(id="call_1", name="lobby--forecast", arguments={"city": "Lima"})
                ],
                prompt_tokens=300,
                completion_tokens=12,
            ),
            Reply(
                text="Lima looks sunny.",
                prompt_tokens=400,
                cached_tokens=256,
                completion_tokens=6,
            ),
        ]
    )
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            ada: dict[str, Any] = {
                "model": "openai:gpt-test",
                "base_url": base_url,
                "max_tokens": 2000,
                "temperature": 0.3,
            }
            if api_key_env is not None:
                ada["api_key_env"] = api_key_env
            async with running_lobby(tmp_path, {"Ada": ada}, "--context") as lb:
                send_incoming(lb.ctl, "lobby:#general", "u1", "weather in Lima?")
                await lb.ctl.wait_for(publish_received("Lima looks sunny."), "the reply")
                used = await wait_trace(lb.stream, of("Ada", "turn-usage"), "usage", seen)
                await lb.host.run_until_idle()

                # two calls: the tool's answer went back as a tool message after its call
                first, second = (r.body for r in script.requests)
                assert [t["function"]["name"] for t in first["tools"]].count("lobby--forecast") == 1
                assert (first["max_tokens"], first["temperature"]) == (2000, 0.3)
                assert any("weather in Lima?" in str(m["content"]) for m in first["messages"])
                calls = [m for m in second["messages"] if m.get("tool_calls")]
                assert [c["id"] for c in calls[-1]["tool_calls"]] == ["call_1"]
                answers = [m for m in second["messages"] if m["role"] == "tool"]
                assert [a["tool_call_id"] for a in answers] == ["call_1"]
                assert "Lima" in answers[0]["content"]

                # stored as the Anthropic provider's replies are, usage included
                replies = said(lb.host, "Ada")
                assert [m["metadata"]["stop_reason"] for m in replies] == ["tool_use", "end_turn"]
                assert replies[0]["blocks"][1]["input"] == {"city": "Lima"}
                assert replies[1]["metadata"]["usage"] == {
                    "input_tokens": 144,
                    "output_tokens": 6,
                    "cache_read_input_tokens": 256,
                    "cache_creation_input_tokens": 0,
                }
                assert format_event(used) == (
                    "· Ada: turn used 444 in, 18 out, cache 256 read, 0 written tokens"
                )

                # the credential went only where the operator sent it
                for request in script.requests:
                    assert REAL_KEY not in repr(request)
                    if api_key_env is None:
                        assert "authorization" not in request.headers
                    else:
                        assert request.headers["authorization"] == f"Bearer {ROUTER_KEY}"
            nursery.cancel_scope.cancel()


async def test_a_refused_key_pauses_the_openai_agent_with_one_line(tmp_path: Path) -> None:
    script = FakeScript(
        [
            HttpError(
                status=401,
                message="Incorrect API key provided",
                error_type="invalid_request_error",
                code="invalid_api_key",
            )
        ]
    )
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            ada = {"model": "openai:gpt-test", "base_url": base_url, "api_key_env": "ROUTER_KEY"}
            async with running_lobby(tmp_path, {"Ada": ada}) as lb:
                await lb.host.post_local("Ada", "first")
                paused = await wait_trace(lb.stream, of("Ada", "agent-paused"), "pause", seen)
                line = format_event(paused)
                assert line is not None and "\n" not in line
                assert line.startswith(
                    "! Ada paused: openai refused the credential (HTTP 401 invalid_request_error: "
                    "Incorrect API key provided)"
                )
                assert "fix the key (ROUTER_KEY)" in line
                await lb.host.post_local("Ada", "second")
                await lb.host.run_until_idle()
                assert len(script.requests) == 1  # no call while paused
                assert not any(e.kind == "error" and e.agent == "Ada" for e in seen)

                script.add(Reply(text="back"))
                assert await lb.host.resume("Ada") is True
                await wait_trace(lb.stream, of("Ada", "turn-end"), "the resumed turn", seen)
                await lb.host.run_until_idle()
                assert said(lb.host, "Ada")[-1]["blocks"] == [{"type": "text", "text": "back"}]
            nursery.cancel_scope.cancel()


async def test_a_malformed_stream_fails_the_turn_and_stores_no_reply(tmp_path: Path) -> None:
    good_start = '{"choices": [{"index": 0, "delta": {"content": "Half a rep"}}]}'
    script = FakeScript(
        [
            Raw(lines=[f"data: {good_start}", "data: {this is not json", "data: [DONE]"]),
            Reply(text="A whole reply."),
        ]
    )
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            ada = {"model": "openai:gpt-test", "base_url": base_url}
            async with running_lobby(tmp_path, {"Ada": ada}) as lb:
                await lb.host.post_local("Ada", "hello")
                error = await wait_trace(lb.stream, of("Ada", "error"), "the failure", seen)
                await lb.host.run_until_idle()
                assert error.data["where"] == "model"
                assert error.data["error"].startswith("openai: malformed stream: ")
                assert len(script.requests) == 1  # a malformed stream is not retried
                assert said(lb.host, "Ada") == []  # nothing of the half reply is stored
                failed = [m for m in lb.host.history("Ada") if m["role"] == "system"]
                assert any("turn failed: openai: malformed" in str(m["blocks"]) for m in failed)

                # the agent goes on: the next wake gets a whole reply
                await lb.host.post_local("Ada", "again")
                await wait_trace(lb.stream, of("Ada", "turn-end"), "the next turn", seen)
                await lb.host.run_until_idle()
                assert [m["blocks"] for m in said(lb.host, "Ada")] == [
                    [{"type": "text", "text": "A whole reply."}]
                ]
            nursery.cancel_scope.cancel()


async def test_a_server_routes_inference_to_an_openai_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the host's inference routes use the provider's default endpoint, moved here by the
    # environment (with the default key, as the provider's own tools do)
    script = FakeScript([Reply(text="A haiku about rain.")])
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            monkeypatch.setenv("OPENAI_BASE_URL", base_url)
            routes = {"lobby.*": "openai:gpt-mini"}
            async with running_lobby(
                tmp_path, {"Ada": ""}, "--assist", inference_models=routes
            ) as lb:
                text = "Please write about rain"
                lb.ctl.send(
                    {
                        "cmd": "infer",
                        "messages": [{"role": "user", "content": text}],
                        "maxTokens": 64,
                    }
                )
                event = await lb.ctl.wait_for(
                    lambda e: e["event"] == "response" and e["method"] == "inference/request",
                    "the inference answer",
                )
                assert event["response"]["result"]["content"] == "A haiku about rain."
                [request] = script.requests
                assert (request.body["model"], request.body["max_tokens"]) == ("gpt-mini", 64)
                assert request.headers["authorization"] == f"Bearer {REAL_KEY}"
            nursery.cancel_scope.cancel()


async def test_parallel_calls_run_as_one_round_and_answer_in_call_order(tmp_path: Path) -> None:
    calls = [
        ToolCall(id="call_a", name="lobby--forecast", arguments={"city": "Lima"}),
        ToolCall(id="call_b", name="lobby--forecast", arguments={"city": "Oslo"}),
    ]
    script = FakeScript([Reply(tool_calls=calls), Reply(text="Both looked up.")])
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            ada = {"model": "openai:gpt-test", "base_url": base_url}
            async with running_lobby(tmp_path, {"Ada": ada}, "--context") as lb:
                send_incoming(lb.ctl, "lobby:#general", "u1", "Lima and Oslo?")
                await lb.ctl.wait_for(publish_received("Both looked up."), "the reply")
                await lb.host.run_until_idle()
                assert len(script.requests) == 2
                sent = script.requests[1].body["messages"]
                [asking] = [i for i, m in enumerate(sent) if m.get("tool_calls")]
                answers = sent[asking + 1 : asking + 3]
                assert [(a["role"], a["tool_call_id"]) for a in answers] == [
                    ("tool", "call_a"),
                    ("tool", "call_b"),
                ]
                assert "Lima" in answers[0]["content"] and "Oslo" in answers[1]["content"]
                stored = [m for m in lb.host.history("Ada") if m["role"] == "tool"]
                assert [b["tool_use_id"] for b in stored[-1]["blocks"]] == ["call_a", "call_b"]
            nursery.cancel_scope.cancel()


async def test_a_model_that_never_answers_fails_the_turn_in_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the provider's wait for a silent server, shortened (its default is minutes)
    monkeypatch.setattr(openai_model, "IDLE_TIMEOUT_S", 0.2)
    script = FakeScript([Silent()] * 5 + [Reply(text="Here now.")])
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            ada = {"model": "openai:gpt-test", "base_url": base_url}
            async with running_lobby(tmp_path, {"Ada": ada}) as lb:
                await lb.host.post_local("Ada", "hello?")
                error = await wait_trace(lb.stream, of("Ada", "error"), "the failure", seen)
                assert error.data["error"] == (
                    "openai: no answer within 0.2s (gave up after 5 attempts)"
                )
                retries = [e for e in seen if e.kind == "model-retry" and e.agent == "Ada"]
                assert [e.data["attempt"] for e in retries] == [1, 2, 3, 4]
                await lb.host.run_until_idle()
                assert said(lb.host, "Ada") == []
                await lb.host.post_local("Ada", "still there?")
                await wait_trace(lb.stream, of("Ada", "turn-end"), "the next turn", seen)
                await lb.host.run_until_idle()
                assert said(lb.host, "Ada")[-1]["blocks"] == [{"type": "text", "text": "Here now."}]
            nursery.cancel_scope.cancel()


async def test_an_agent_whose_model_reads_text_only_is_sent_a_note_for_an_image(
    tmp_path: Path,
) -> None:
    """``images = false``: a photo in a message reaches that agent's model as a short note, while
    an agent with images on gets the picture."""
    script = FakeScript([Reply(text="ok"), Reply(text="ok")])
    photo = {
        "channelId": "lobby:#general",
        "messageId": "p1",
        "author": {"id": "alice", "name": "Alice"},
        "timestamp": "2026-01-01T00:00:00Z",
        "content": [
            {"type": "text", "text": "look at this"},
            {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
        ],
        "tags": [],
    }
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            agents = {
                "Ada": {"model": "openai:text-only", "base_url": base_url, "images": False},
                "Grace": {"model": "openai:vision", "base_url": base_url},
            }
            async with running_lobby(tmp_path, agents) as lb:
                lb.ctl.send({"cmd": "incoming_batch", "messages": [photo]})
                await lb.ctl.wait_for(publish_received("ok"), "one reply")
                await lb.ctl.wait_for(publish_received("ok"), "the other")
                await lb.host.run_until_idle()
            nursery.cancel_scope.cancel()
    sent = {r.body["model"]: json.dumps(r.body["messages"]) for r in script.requests}
    assert "image_url" not in sent["text-only"]
    assert "[image (image/png) not shown: this model reads text only]" in sent["text-only"]
    assert "look at this" in sent["text-only"]
    assert "data:image/png;base64,iVBORw0KGgo=" in sent["vision"]
