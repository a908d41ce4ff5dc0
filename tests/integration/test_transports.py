"""Websocket servers, an MCP-only server from PyPI, and a model over real loopback HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from actors import Host
from tests.fake_anthropic import (
    FakeScript,
    HttpError,
    Reply,
    serve_fake_anthropic,
    text_block,
    tool_use_block,
)
from tests.helpers import (
    config,
    publish_received,
    publishes,
    ready,
    received,
    running_lobby,
    scripted,
    send_incoming,
    texts,
    wait_trace,
    without_notices,
    ws_lobby,
)
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow


async def test_websocket_server_with_token(tmp_path: Path) -> None:
    rules = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hello over websockets."\n'
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            async with ws_lobby("--token", "s3cret", "--control-connect", listener.address) as url:
                server = {"id": "lobby", "url": url, "token": "s3cret"}
                cfg = config(
                    tmp_path, [server], [{"name": "Ada", "model": scripted(tmp_path, "a", rules)}]
                )
                async with Host.open(cfg) as host:
                    ctl = await listener.accept()
                    await ready(ctl, host)
                    send_incoming(ctl, "lobby:#general", "w1", "hello ws")
                    await ctl.wait_for(publish_received(), "reply over websocket")
                    await host.run_until_idle()
                    assert publishes(ctl) == [("lobby:#general", "Hello over websockets.")]
                    assert texts(host.history("Ada")) == ["hello ws", "Hello over websockets."]


async def test_websocket_wrong_token_is_refused_and_the_host_keeps_going(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with ws_lobby("--token", "right") as url:
            server = {"id": "lobby", "url": url, "token": "wrong"}
            cfg = config(
                tmp_path, [server], [{"name": "Ada", "model": scripted(tmp_path, "a", "")}]
            )
            async with Host.open(cfg) as host:
                stream = host.trace()
                event = await wait_trace(stream, lambda e: e.kind == "disconnected", "refusal")
                assert "wrong" not in str(event.data)  # the token is never logged
                await host.post_local("Ada", "still here")
                await host.run_until_idle()
                assert texts(host.history("Ada")) == ["still here"]


async def test_mcp_only_server_from_pypi(tmp_path: Path) -> None:
    rules = """
[[rules]]
when = "what time"
calls = [{ tool = "time--get_current_time", arguments = { timezone = "UTC" } }]
say = "Checked the clock."
"""
    with trio.fail_after(60):
        server = {"id": "time", "command": [sys.executable, "-m", "mcp_server_time"]}
        cfg = config(tmp_path, [server], [{"name": "Ada", "model": scripted(tmp_path, "a", rules)}])
        async with Host.open(cfg) as host:
            stream = host.trace()
            event = await wait_trace(stream, lambda e: e.kind == "ready", "ready")
            assert event.data["mcp_only"] is True
            assert "get_current_time" in event.data["tools"]
            await host.post_local("Ada", "what time is it?")
            await host.run_until_idle()
            history = without_notices(host.history("Ada"))  # less the receipt of the reply
            assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
            result = history[2]["blocks"][0]
            assert result["is_error"] is False
            assert "UTC" in result["content"][0]["text"]


async def test_agent_on_the_anthropic_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = FakeScript(
        [
            Reply(
                blocks=[tool_use_block("tu_1", "lobby--forecast", {"city": "Lima"})],
                stop_reason="tool_use",
            ),
            Reply(blocks=[text_block("Lima looks sunny.")]),
        ]
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_anthropic, script)
            monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
            monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
            async with running_lobby(tmp_path, {"Ada": {"model": "anthropic:claude-test"}}) as lb:
                send_incoming(lb.ctl, "lobby:#general", "a1", "weather in Lima?")
                await lb.ctl.wait_for(publish_received(), "reply")
                await lb.host.run_until_idle()
                assert publishes(lb.ctl) == [("lobby:#general", "Lima looks sunny.")]
                assert received(lb.ctl, "tools/call")[0]["params"]["arguments"] == {"city": "Lima"}
                first = script.requests[0].body
                assert first["model"] == "claude-test" and first["stream"] is True
                assert any(t["name"] == "lobby--forecast" for t in first["tools"])
                assert "weather in Lima?" in str(first["messages"])
            nursery.cancel_scope.cancel()


async def test_a_failing_model_is_visible_and_stored_as_a_failed_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a refused credential pauses the agent instead (tests/integration/test_model_failures.py)
    script = FakeScript(
        [HttpError(status=400, error_type="invalid_request_error", message="bad request")]
    )
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_anthropic, script)
            monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
            monkeypatch.setenv("ANTHROPIC_API_KEY", "wrong")
            cfg = config(tmp_path, [], [{"name": "Ada", "model": "anthropic:claude-test"}])
            async with Host.open(cfg) as host:
                stream = host.trace()
                await host.post_local("Ada", "hi")
                error = await wait_trace(stream, lambda e: e.kind == "error", "the failure")
                assert "400" in error.data["error"] and error.agent == "Ada"
                await host.run_until_idle()
                failed = host.history("Ada")[-1]
                assert failed["role"] == "system"
                assert failed["metadata"] == {"system": True, "kind": "turn-failed"}
                assert "400" in failed["blocks"][0]["text"]
            nursery.cancel_scope.cancel()
