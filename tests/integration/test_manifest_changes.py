"""Manifest changes (SPEC §17) over a real server: removals at once, additions never on trust."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from actors.link.connection import MANIFEST_FETCHES
from tests.helpers import answered, received, running_lobby, wait_trace

pytestmark = pytest.mark.slow

CHAT = {
    "lobby.chat": {
        "description": "chat",
        "uses": [
            "channels.register",
            "channels.publish",
            "channels.incoming",
            "channels.lifecycle",
        ],
    }
}
CHANNELS = {"register": True, "publish": True, "incoming": True, "lifecycle": True}


def receiving(method: str):
    """A control-event test: the lobby received a message of ``method`` from the host."""
    return lambda e: e["event"] == "received" and e["message"].get("method") == method


update_received = receiving("featureSets/update")
fetch_received = receiving("mcpl/manifest")


def lobby_manifest(**extra):
    return {"version": "0.5", "channels": dict(CHANNELS), "featureSets": dict(CHAT), **extra}


async def test_a_dropped_capability_is_revoked_before_the_receipt(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            lob.ctl.send({"cmd": "fsu_mode", "mode": "never"})  # the next receipt never comes
            mark = lob.ctl.mark()
            lob.ctl.send({"cmd": "manifest", "manifest": lobby_manifest()})  # pushEvents gone
            update = await lob.ctl.wait_for(update_received, "the update after it", since=mark)
            assert "pushEvents" not in update["message"]["params"]["effectiveCapabilities"]
            # no receipt has arrived, yet the revocation is already in force
            lob.ctl.send({"cmd": "push", "eventId": "late", "text": "after the change"})
            answer = await lob.ctl.wait_for(answered("push/event", "eventId", "late"), "late push")
            assert answer["response"]["error"]["code"] == -32002
            assert answer["response"]["error"]["data"] == {"capability": "pushEvents"}


async def test_an_added_capability_waits_for_the_operator(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            fuller = lobby_manifest(pushEvents=True, modelInfo=True)
            mark = lob.ctl.mark()
            lob.ctl.send({"cmd": "manifest", "manifest": fuller})
            event = await wait_trace(lob.stream, lambda e: e.kind == "manifest-changed", "receipt")
            impacts = {(i["impact"], i["subject"]): i["disposition"] for i in event.data["impacts"]}
            assert impacts[("capability-expansion-pending", "modelInfo")] == "decision-needed"
            assert "modelInfo" not in event.data["grant"]
            assert "pushEvents" in event.data["grant"]  # unchanged
            assert event.data["digest"].startswith("sha256:")
            update = await lob.ctl.wait_for(update_received, "the update", since=mark)
            assert "modelInfo" not in update["message"]["params"]["effectiveCapabilities"]
            assert "pushEvents" in update["message"]["params"]["effectiveCapabilities"]


async def test_a_configured_addition_is_granted_once_the_receipt_arrives(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": ""}, enabled_capabilities=["channels.*", "pushEvents", "tools"]
        ) as lob:
            # acknowledge: a channels.* leaf the lobby does not advertise at first
            fuller = lobby_manifest(pushEvents=True, channels={**CHANNELS, "acknowledge": True})
            mark = lob.ctl.mark()
            lob.ctl.send({"cmd": "manifest", "manifest": fuller})
            event = await wait_trace(lob.stream, lambda e: e.kind == "manifest-changed", "receipt")
            assert "channels.acknowledge" in event.data["grant"]
            impacts = {(i["impact"], i["subject"]): i["disposition"] for i in event.data["impacts"]}
            assert impacts[("capability-expansion-pending", "channels.acknowledge")] == "applied"
            update = await lob.ctl.wait_for(update_received, "the update", since=mark)
            assert "channels.acknowledge" in update["message"]["params"]["effectiveCapabilities"]


async def test_a_partly_invalid_manifest_still_applies_its_removals(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            broken = {
                "version": "0.5",
                "channels": {"register": True, "incoming": True, "bogus": {"x": 1}},
                "featureSets": {"lobby.chat": {"description": "", "uses": "not-a-list"}},
            }
            lob.ctl.send({"cmd": "manifest", "manifest": broken})
            event = await wait_trace(lob.stream, lambda e: e.kind == "manifest-changed", "receipt")
            revoked = {
                i["subject"] for i in event.data["impacts"] if i["impact"] == "capability-revoked"
            }
            assert {"pushEvents", "channels.publish", "channels.lifecycle"} <= revoked
            assert set(event.data["grant"]) <= {"channels.register", "channels.incoming", "tools"}
            degraded = {
                i["subject"] for i in event.data["impacts"] if i["impact"] == "feature-degraded"
            }
            assert degraded == {"lobby.chat", "lobby.events"}


async def test_a_burst_during_a_fetch_is_coalesced_into_one_more(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            lob.ctl.send({"cmd": "manifest_answers", "mode": "held"})  # fetch 1 stays in flight
            for _ in range(20):
                lob.ctl.send({"cmd": "manifest", "manifest": lobby_manifest(pushEvents=True)})
            # the host reads in order: once it answers this, it has read all 20 announcements
            lob.ctl.send({"cmd": "model_info"})
            await lob.ctl.wait_for(
                lambda e: e["event"] == "response" and e["method"] == "model/info", "model/info"
            )
            await lob.ctl.wait_for(fetch_received, "the first fetch")
            assert len(received(lob.ctl, "mcpl/manifest")) == 1  # the others wait for it
            mark = lob.ctl.mark()
            lob.ctl.send({"cmd": "manifest_answers", "mode": "at-once"})
            await lob.ctl.wait_for(fetch_received, "the second fetch", since=mark)
            await lob.host.run_until_idle()
            mark = lob.ctl.mark()
            lob.ctl.send({"cmd": "ping", "id": "sync"})  # what the lobby saw before it is recorded
            await lob.ctl.wait_for(lambda e: e["event"] == "pong", "pong", since=mark)
            assert len(received(lob.ctl, "mcpl/manifest")) == 2


async def test_spaced_announcements_beyond_the_rate_limit_are_dropped(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            outcomes = []
            for _ in range(MANIFEST_FETCHES + 1):
                lob.ctl.send({"cmd": "manifest", "manifest": lobby_manifest(pushEvents=True)})
                event = await wait_trace(
                    lob.stream,
                    lambda e: (
                        e.kind == "manifest-changed"
                        or (
                            e.kind == "diagnostic" and "dropped (a server defect)" in e.data["text"]
                        )
                    ),
                    "a receipt or a refusal",
                )
                outcomes.append(event.kind)
            assert outcomes == ["manifest-changed"] * MANIFEST_FETCHES + ["diagnostic"]
