"""The capability mask and feature-set selection, applied to a real server's traffic."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.helpers import answered, received, running_lobby, wait_trace

pytestmark = pytest.mark.slow


async def push_answer(lob, event_id: str, **extra):
    lob.ctl.send({"cmd": "push", "eventId": event_id, "text": "tick", **extra})
    event = await lob.ctl.wait_for(answered("push/event", "eventId", event_id), event_id)
    return event["response"]


async def test_a_disabled_feature_set_is_refused_with_32001(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": ""}, disabled_feature_sets=["lobby.events"]
        ) as lob:
            update = received(lob.ctl, "featureSets/update")[0]["params"]
            assert update["enabled"] == ["lobby.chat"]
            assert update["disabled"] == ["lobby.events"]
            answer = await push_answer(lob, "e1")
            assert answer["error"]["code"] == -32001
            assert answer["error"]["data"] == {"featureSet": "lobby.events"}
            unknown = await push_answer(lob, "e2", featureSet="lobby.nope")
            assert unknown["error"]["code"] == -32003
            assert unknown["error"]["data"] == {"featureSet": "lobby.nope"}
            await lob.host.run_until_idle()
            assert lob.host.history("Ada") == []


async def test_a_denied_capability_is_never_granted_and_refused_with_32002(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": ""}, disabled_capabilities=["pushEvents", "tools"]
        ) as lob:
            update = received(lob.ctl, "featureSets/update")[0]["params"]
            assert "pushEvents" not in update["effectiveCapabilities"]
            assert "channels.incoming" in update["effectiveCapabilities"]
            answer = await push_answer(lob, "e1")
            assert answer["error"]["code"] == -32002
            assert answer["error"]["data"] == {"capability": "pushEvents"}
            # tools were not granted: none is offered to the agent
            result = await lob.host.execute_tool_call("Ada", "lobby--forecast", {"city": "X"})
            assert result["is_error"] is True
            assert not received(lob.ctl, "tools/list")


async def test_an_enabled_mask_grants_only_what_it_matches(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": ""}, enabled_capabilities=["channels.*", "tools"]
        ) as lob:
            update = received(lob.ctl, "featureSets/update")[0]["params"]
            granted = set(update["effectiveCapabilities"])
            assert granted == {
                "channels.register",
                "channels.publish",
                "channels.incoming",
                "channels.lifecycle",
                "channels.streaming",
                "channels.typing",
                "tools",
            }
            answer = await push_answer(lob, "e1")
            assert answer["error"]["data"] == {"capability": "pushEvents"}
            ok = await lob.host.execute_tool_call("Ada", "lobby--forecast", {"city": "Oslo"})
            assert ok["is_error"] is False


async def test_removed_methods_get_32601_and_denied_notifications_are_dropped(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": ""}, disabled_capabilities=["channels.register"]
        ) as lob:
            for i, method in enumerate(("context/afterInference", "featureSets/changed")):
                req = {"jsonrpc": "2.0", "id": f"old{i}", "method": method, "params": {}}
                lob.ctl.send({"cmd": "raw", "message": req})
                answer = await lob.ctl.wait_for(
                    lambda e, i=i: e["event"] == "response" and e["request"].get("id") == f"old{i}",
                    method,
                )
                assert answer["response"]["error"]["code"] == -32601
            added = {"id": "lobby:#sneaky", "type": "chat", "label": "sneaky"}
            note = {"jsonrpc": "2.0", "method": "channels/changed", "params": {"added": [added]}}
            lob.ctl.send({"cmd": "raw", "message": note})
            seen: list = []
            await wait_trace(
                lob.stream,
                lambda e: e.kind == "diagnostic" and "channels/changed dropped" in e.data["text"],
                "the dropped notification",
                seen,
            )
            listed = await lob.host.execute_tool_call("Ada", "channel_list", {})
            assert "sneaky" not in listed["content"][0]["text"]
