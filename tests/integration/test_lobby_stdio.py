"""The host against the lobby server as a real stdio subprocess, driven over its control socket.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.messages import Status
from tests.helpers import (
    answered,
    incoming_answered,
    publish_received,
    publishes,
    received,
    running_lobby,
    send_incoming,
    texts,
    wait_trace,
    without_notices,
)

pytestmark = pytest.mark.slow

HELLO = """
[[rules]]
when = "(?i)\\\\bhello\\\\b"
say = "Hi there, hello to you!"

[[rules]]
when = "weather in (\\\\w+)"
calls = [{ tool = "lobby--forecast", arguments = { city = "{1}" } }]
say = "I looked up {1}."
"""


@pytest.mark.parametrize("form", ["object", "array"])
async def test_handshake_order_and_default_grant(tmp_path: Path, form: str) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, "--feature-sets-form", form) as lb:
            ctl = lb.ctl
            methods = [
                e["message"].get("method")
                for e in ctl.events
                if e["event"] == "received" and "method" in e["message"]
            ]
            assert methods[:3] == [
                "initialize",
                "notifications/initialized",
                "featureSets/update",
            ]
            init = received(ctl, "initialize")[0]
            assert init["params"]["protocolVersion"] == "2024-11-05"
            assert init["params"]["capabilities"]["experimental"]["mcpl"]["version"] == "0.5"
            update = received(ctl, "featureSets/update")[0]
            assert "id" in update  # the request form
            grant = set(update["params"]["effectiveCapabilities"])
            assert {"pushEvents", "channels.incoming", "channels.publish"} <= grant
            assert "contextHooks.beforeInference.inject.system" not in grant
            assert sorted(update["params"]["enabled"]) == ["lobby.chat", "lobby.events"]
            st = await lb.host.ctx.connections["lobby"].ask(Status(), timeout=5)
            assert st.ready and not st.mcp_only


async def test_featuresets_update_notification_fallback(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, "--fsu-mode", "notification-only") as lb:
            # the request form, refused, then the notification form (the host's link may be
            # ready before the lobby has reported receiving it)
            await lb.ctl.wait_for(
                lambda e: (
                    e["event"] == "received"
                    and e["message"].get("method") == "featureSets/update"
                    and "id" not in e["message"]
                ),
                "the notification form",
            )
            updates = received(lb.ctl, "featureSets/update")
            assert "id" in updates[0] and "id" not in updates[1]
            lb.ctl.send({"cmd": "push", "eventId": "e1", "text": "after fallback"})
            answer = await lb.ctl.wait_for(answered("push/event", "eventId", "e1"), "push answer")
            assert answer["response"]["result"] == {"accepted": True}
            await lb.host.run_until_idle()
            assert "after fallback" in texts(without_notices(lb.host.history("Ada")))


async def test_featuresets_update_never_answered_fails_the_handshake(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": ""}, "--fsu-mode", "never", request_timeout_s=2, wait_ready=False
        ) as lb:
            seen: list[Any] = []
            gone = await wait_trace(lb.stream, lambda e: e.kind == "disconnected", "gone", seen)
            # no receipt is no readiness: never "ready, MCP-only", but a failed link
            assert not [e for e in seen if e.kind in ("ready", "mcp-only")]
            assert gone.data["reason"] == (
                "the handshake timed out after 2s during featureSets/update"
            )
            assert gone.data["step"] == "featureSets/update"
            await lb.host.run_until_idle()
            assert without_notices(lb.host.history("Ada")) == []


async def test_push_is_stored_then_wakes_without_publishing(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": HELLO}) as lb:
            lb.ctl.send({"cmd": "push", "eventId": "e1", "text": "hello from the clock"})
            answer = await lb.ctl.wait_for(answered("push/event", "eventId", "e1"), "push answer")
            assert answer["response"]["result"] == {"accepted": True}
            held = await wait_trace(lb.stream, lambda e: e.kind == "speech-held", "the reply")
            assert held.agent == "Ada"
            await lb.host.run_until_idle()
            history = without_notices(lb.host.history("Ada"))
            assert history[0]["metadata"]["event_id"] == "e1"
            assert history[0]["metadata"]["server_id"] == "lobby"
            assert texts(history, "assistant") == ["Hi there, hello to you!"]
            assert publishes(lb.ctl) == []


async def test_incoming_reply_goes_to_its_channel_and_echo_does_not_wake(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": HELLO, "Grace": ""}) as lb:
            send_incoming(lb.ctl, "lobby:#random", "x1", "hello all")
            await lb.ctl.wait_for(publish_received(), "Ada's reply")
            # the echo of Ada's reply comes back as channels/incoming; it must not wake her
            await lb.ctl.wait_for(incoming_answered("out-1"), "the echo answered")
            await lb.host.run_until_idle()
            assert publishes(lb.ctl) == [("lobby:#random", "Hi there, hello to you!")]
            ada = without_notices(lb.host.history("Ada"))
            assert texts(ada, "assistant") == ["Hi there, hello to you!"]
            assert texts(ada, "user") == ["hello all"]  # the echo is not stored for its author
            grace = texts(lb.host.history("Grace"), "user")
            assert grace == ["hello all", "Hi there, hello to you!"]  # others hear it


async def test_a_trace_stream_of_some_kinds_sees_only_those(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": HELLO}) as lb:
            only = lb.host.trace(kinds={"incoming", "turn-end"})
            send_incoming(lb.ctl, "lobby:#general", "k1", "hello there")
            await wait_trace(lb.stream, lambda e: e.kind == "turn-end", "Ada's turn")
            await lb.host.run_until_idle()
            seen = []
            with trio.move_on_after(0):  # what the stream holds now, without waiting
                async for event in only:
                    seen.append(event.kind)
            # turn-start and the rest happened too, but this stream did not ask for them
            assert seen[:1] == ["incoming"] and set(seen) == {"incoming", "turn-end"}


async def test_agent_calls_an_mcpl_tool(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": HELLO}) as lb:
            host, ctl = lb.host, lb.ctl
            send_incoming(ctl, "lobby:#general", "w1", "weather in Oslo?")
            await ctl.wait_for(publish_received(), "Ada's reply")
            await host.run_until_idle()
            calls = received(ctl, "tools/call")
            assert calls[0]["params"] == {"name": "forecast", "arguments": {"city": "Oslo"}}
            roles = [m["role"] for m in without_notices(host.history("Ada"))]
            assert roles == ["user", "assistant", "tool", "assistant"]
            result = without_notices(host.history("Ada"))[2]["blocks"][0]
            assert result["type"] == "tool_result" and result["is_error"] is False
            assert "Forecast for Oslo" in result["content"][0]["text"]
            assert publishes(ctl) == [("lobby:#general", "I looked up Oslo.")]
            direct = await host.execute_tool_call("Ada", "lobby--forecast", {"city": "Rome"})
            assert direct == {
                "is_error": False,
                "content": [{"type": "text", "text": "Forecast for Rome: sunny, 21°C"}],
            }
            assert len(without_notices(host.history("Ada"))) == 4  # in-process calls are not stored


async def test_retried_items_are_stored_once_and_unknown_channels_refused(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            for _ in range(2):
                lb.ctl.send({"cmd": "push", "eventId": "dup", "text": "twice sent"})
                send_incoming(lb.ctl, "lobby:#general", "m-dup", "said twice")
            send_incoming(lb.ctl, "nowhere", "n1", "lost")
            answer = await lb.ctl.wait_for(incoming_answered("n1"), "refusal")
            assert answer["response"]["result"]["results"] == [
                {"messageId": "n1", "accepted": False, "reason": "unknown_channel"}
            ]
            await lb.host.run_until_idle()
            assert sorted(texts(without_notices(lb.host.history("Ada")))) == [
                "said twice",
                "twice sent",
            ]


async def test_closed_channel_stores_but_wakes_only_when_addressed(tmp_path: Path) -> None:
    with trio.fail_after(60):
        rules = '[[rules]]\nwhen = "."\nsay = "heard you"\n'
        async with running_lobby(tmp_path, {"Ada": rules}) as lb:
            host, ctl = lb.host, lb.ctl
            quiet = {
                "id": "lobby:#quiet",
                "type": "chat",
                "label": "quiet",
                "initiallyOpen": False,
                "capabilities": {"publish": {"target": "root"}},
            }
            ctl.send({"cmd": "register", "channels": [quiet]})
            await ctl.wait_for(answered("channels/register"), "registered", since=ctl.mark())
            send_incoming(ctl, "lobby:#quiet", "q1", "psst")
            await ctl.wait_for(answered("channels/incoming"), "q1 answered", since=ctl.mark())
            await host.run_until_idle()
            assert texts(without_notices(host.history("Ada"))) == ["psst"]
            assert publishes(ctl) == []
            send_incoming(ctl, "lobby:#quiet", "q2", "@Ada psst", tags=["chat:mention"])
            await ctl.wait_for(publish_received(), "reply to the mention")
            assert publishes(ctl) == [("lobby:#quiet", "heard you")]
            result = await host.execute_tool_call("Ada", "channel_list", {})
            assert "lobby / lobby:#quiet · quiet · closed" in result["content"][0]["text"]
            opened = await host.execute_tool_call(
                "Ada", "channel_open", {"channel_id": "lobby:#quiet"}
            )
            assert opened["is_error"] is False
            result = await host.execute_tool_call("Ada", "channel_list", {})
            assert "lobby / lobby:#quiet · quiet · open" in result["content"][0]["text"]
