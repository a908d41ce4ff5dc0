"""The host against the lobby server as a real stdio subprocess, driven over its control socket.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors import Host
from examples.lobby_control import open_control_listener
from tests.helpers import config, lobby, publishes, ready, received, scripted, texts, wait_trace

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


def is_response(method: str, key: str | None = None, value: str | None = None):
    def pred(e):
        if e["event"] != "response" or e["request"]["method"] != method:
            return False
        return key is None or e["request"]["params"][key] == value

    return pred


@pytest.mark.parametrize("form", ["object", "array"])
async def test_handshake_order_and_default_grant(tmp_path: Path, form: str) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            cfg = config(
                tmp_path,
                [lobby(listener.address, "--feature-sets-form", form)],
                [{"name": "Ada", "model": scripted(tmp_path, "a", "")}],
            )
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ready(ctl)
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
                status = host.ctx.connections["lobby"]
                st = await status.ask(
                    __import__("actors.messages", fromlist=["Status"]).Status(), timeout=5
                )
                assert st.ready and not st.mcp_only


async def test_featuresets_update_notification_fallback(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            cfg = config(
                tmp_path,
                [lobby(listener.address, "--fsu-mode", "notification-only")],
                [{"name": "Ada", "model": scripted(tmp_path, "a", "")}],
            )
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ready(ctl)
                updates = received(ctl, "featureSets/update")
                assert "id" in updates[0] and "id" not in updates[1]
                ctl.send({"cmd": "push", "eventId": "e1", "text": "after fallback"})
                answer = await ctl.wait_for(
                    is_response("push/event", "eventId", "e1"), "push answer"
                )
                assert answer["response"]["result"] == {"accepted": True}
                await host.run_until_idle()
                assert "after fallback" in texts(host.history("Ada"))


async def test_featuresets_update_never_answered_runs_mcp_only(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            cfg = config(
                tmp_path,
                [lobby(listener.address, "--fsu-mode", "never", request_timeout_s=2)],
                [{"name": "Ada", "model": scripted(tmp_path, "a", "")}],
            )
            async with Host.open(cfg) as host:
                stream = host.trace()
                ctl = await listener.accept()
                event = await wait_trace(stream, lambda e: e.kind == "ready", "ready")
                assert event.data["mcp_only"] is True
                assert event.data["tools"] == ["forecast", "roll", "stall"]
                ctl.send({"cmd": "push", "eventId": "e1", "text": "refused"})
                answer = await ctl.wait_for(
                    is_response("push/event", "eventId", "e1"), "push answer"
                )
                assert answer["response"]["error"]["code"] == -32601
                await host.run_until_idle()
                assert host.history("Ada") == []


async def test_push_is_stored_then_wakes_without_publishing(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            cfg = config(
                tmp_path,
                [lobby(listener.address)],
                [{"name": "Ada", "model": scripted(tmp_path, "a", HELLO)}],
            )
            async with Host.open(cfg) as host:
                stream = host.trace()
                ctl = await listener.accept()
                await ready(ctl)
                ctl.send({"cmd": "push", "eventId": "e1", "text": "hello from the clock"})
                answer = await ctl.wait_for(
                    is_response("push/event", "eventId", "e1"), "push answer"
                )
                assert answer["response"]["result"] == {"accepted": True}
                held = await wait_trace(stream, lambda e: e.kind == "speech-held", "the reply")
                assert held.agent == "Ada"
                await host.run_until_idle()
                history = host.history("Ada")
                assert history[0]["metadata"]["event_id"] == "e1"
                assert history[0]["metadata"]["server_id"] == "lobby"
                assert texts(history, "assistant") == ["Hi there, hello to you!"]
                assert publishes(ctl) == []


async def test_incoming_reply_goes_to_its_channel_and_echo_does_not_wake(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            agents = [
                {"name": "Ada", "model": scripted(tmp_path, "a", HELLO)},
                {"name": "Grace", "model": scripted(tmp_path, "g", "")},
            ]
            cfg = config(tmp_path, [lobby(listener.address)], agents)
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ready(ctl)
                ctl.send(
                    {
                        "cmd": "incoming",
                        "channelId": "lobby:#random",
                        "messageId": "x1",
                        "text": "hello all",
                    }
                )
                await ctl.wait_for(
                    lambda e: (
                        e["event"] == "received"
                        and e["message"].get("method") == "channels/publish"
                    ),
                    "Ada's reply",
                )
                # the echo of Ada's reply comes back as channels/incoming; it must not wake her
                await ctl.wait_for(
                    lambda e: (
                        e["event"] == "response"
                        and e["request"]["method"] == "channels/incoming"
                        and e["request"]["params"]["messages"][0]["messageId"] == "out-1"
                    ),
                    "the echo answered",
                )
                await host.run_until_idle()
                assert publishes(ctl) == [("lobby:#random", "Hi there, hello to you!")]
                ada = host.history("Ada")
                assert texts(ada, "assistant") == ["Hi there, hello to you!"]
                assert texts(ada, "user") == ["hello all"]  # the echo is not stored for its author
                grace = texts(host.history("Grace"), "user")
                assert grace == ["hello all", "Hi there, hello to you!"]  # others hear it


async def test_agent_calls_an_mcpl_tool(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            cfg = config(
                tmp_path,
                [lobby(listener.address)],
                [{"name": "Ada", "model": scripted(tmp_path, "a", HELLO)}],
            )
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ready(ctl)
                ctl.send(
                    {
                        "cmd": "incoming",
                        "channelId": "lobby:#general",
                        "messageId": "w1",
                        "text": "weather in Oslo?",
                    }
                )
                await ctl.wait_for(
                    lambda e: (
                        e["event"] == "received"
                        and e["message"].get("method") == "channels/publish"
                    ),
                    "Ada's reply",
                )
                await host.run_until_idle()
                calls = received(ctl, "tools/call")
                assert calls[0]["params"] == {"name": "forecast", "arguments": {"city": "Oslo"}}
                roles = [m["role"] for m in host.history("Ada")]
                assert roles == ["user", "assistant", "tool", "assistant"]
                result = host.history("Ada")[2]["blocks"][0]
                assert result["type"] == "tool_result" and result["is_error"] is False
                assert "Forecast for Oslo" in result["content"][0]["text"]
                assert publishes(ctl) == [("lobby:#general", "I looked up Oslo.")]
                direct = await host.execute_tool_call("Ada", "lobby--forecast", {"city": "Rome"})
                assert direct == {
                    "is_error": False,
                    "content": [{"type": "text", "text": "Forecast for Rome: sunny, 21°C"}],
                }
                assert len(host.history("Ada")) == 4  # in-process calls are not stored


async def test_retried_items_are_stored_once_and_unknown_channels_refused(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            cfg = config(
                tmp_path,
                [lobby(listener.address)],
                [{"name": "Ada", "model": scripted(tmp_path, "a", "")}],
            )
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ready(ctl)
                for _ in range(2):
                    ctl.send({"cmd": "push", "eventId": "dup", "text": "twice sent"})
                    ctl.send(
                        {
                            "cmd": "incoming",
                            "channelId": "lobby:#general",
                            "messageId": "m-dup",
                            "text": "said twice",
                        }
                    )
                ctl.send(
                    {"cmd": "incoming", "channelId": "nowhere", "messageId": "n1", "text": "lost"}
                )
                answer = await ctl.wait_for(
                    lambda e: (
                        e["event"] == "response"
                        and e["request"]["method"] == "channels/incoming"
                        and e["request"]["params"]["messages"][0]["messageId"] == "n1"
                    ),
                    "refusal",
                )
                assert answer["response"]["result"]["results"] == [
                    {"messageId": "n1", "accepted": False, "reason": "unknown_channel"}
                ]
                await host.run_until_idle()
                assert sorted(texts(host.history("Ada"))) == ["said twice", "twice sent"]


async def test_closed_channel_stores_but_wakes_only_when_addressed(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            rules = '[[rules]]\nwhen = "."\nsay = "heard you"\n'
            cfg = config(
                tmp_path,
                [lobby(listener.address)],
                [{"name": "Ada", "model": scripted(tmp_path, "a", rules)}],
            )
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ready(ctl)
                ctl.send(
                    {
                        "cmd": "register",
                        "channels": [
                            {
                                "id": "lobby:#quiet",
                                "type": "chat",
                                "label": "quiet",
                                "initiallyOpen": False,
                            }
                        ],
                    }
                )
                await ctl.wait_for(is_response("channels/register"), "registered", since=ctl.mark())
                ctl.send(
                    {
                        "cmd": "incoming",
                        "channelId": "lobby:#quiet",
                        "messageId": "q1",
                        "text": "psst",
                    }
                )
                await ctl.wait_for(
                    is_response("channels/incoming"), "q1 answered", since=ctl.mark()
                )
                await host.run_until_idle()
                assert texts(host.history("Ada")) == ["psst"]
                assert publishes(ctl) == []
                ctl.send(
                    {
                        "cmd": "incoming",
                        "channelId": "lobby:#quiet",
                        "messageId": "q2",
                        "text": "@Ada psst",
                        "tags": ["chat:mention"],
                    }
                )
                await ctl.wait_for(
                    lambda e: (
                        e["event"] == "received"
                        and e["message"].get("method") == "channels/publish"
                    ),
                    "reply to the mention",
                )
                assert publishes(ctl) == [("lobby:#quiet", "heard you")]
                result = await host.execute_tool_call("Ada", "channel_list", {})
                assert "lobby / lobby:#quiet · quiet · closed" in result["content"][0]["text"]
                opened = await host.execute_tool_call(
                    "Ada", "channel_open", {"channel_id": "lobby:#quiet"}
                )
                assert opened["is_error"] is False
                result = await host.execute_tool_call("Ada", "channel_list", {})
                assert "lobby / lobby:#quiet · quiet · open" in result["content"][0]["text"]
