"""A server written with the toolkit (``tests/kit_server.py``) against the real host, over stdio
and over a loopback websocket: real processes, the real clock, order-only asserts."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors import Host
from tests.helpers import config, scripted, texts, wait_trace
from tests.kit_server import SHARED
from tests.lobby.control import LobbyControl, open_control_listener

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("transport", ["stdio", "ws"])]

KIT = [sys.executable, "-m", "tests.kit_server"]
RULES = """
[[rules]]
when = "hello room"
say = "Hi room."

[[rules]]
when = "hello thread"
say = "Hi thread."

[[rules]]
when = "note (\\\\w+)"
calls = [{ tool = "kit--note", arguments = { text = "{1}" } }]
say = "Noted."
"""
ASSIST = '[[rules]]\nwhen = "2\\\\+2"\nsay = "The answer is four."\n'


@attrs.frozen
class Kit:
    host: Host
    ctl: LobbyControl


def event(name: str, **match: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda e: e.get("event") == name and all(e.get(k) == v for k, v in match.items())


async def run(ctl: LobbyControl, cmd: dict[str, Any]) -> dict[str, Any]:
    """Send one command; its ``done`` or ``failed`` event."""
    mark = ctl.mark()
    await ctl.send(cmd)
    return await ctl.wait_for(
        lambda e: e.get("event") in ("done", "failed") and e.get("cmd") == cmd,
        f"the answer to {cmd}",
        since=mark,
    )


@asynccontextmanager
async def kit(tmp_path: Path, transport: str, **server_keys: Any) -> AsyncIterator[Kit]:
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", RULES)}]
    async with open_control_listener() as listener:
        proc = None
        try:
            if transport == "ws":
                proc = await trio.lowlevel.open_process(
                    [*KIT, "--ws", "--control-connect", listener.address], stdout=subprocess.PIPE
                )
                assert proc.stdout is not None
                buf = b""
                while b"\n" not in buf:
                    chunk = await proc.stdout.receive_some(4096)
                    assert chunk, "the kit server exited before listening"
                    buf += chunk
                url = buf.split(b"\n", 1)[0].decode().split(" ", 1)[1]
                server = {"id": "kit", "url": url, **server_keys}
            else:
                server = {"id": "kit", "command": [*KIT, "--control-connect", listener.address]}
                server.update(server_keys)
            cfg = config(tmp_path, [server], agents)
            cfg["host"]["inference_model"] = scripted(tmp_path, "assist", ASSIST)
            async with Host.open(cfg) as host:
                ctl = await listener.accept()
                await ctl.wait_for(event("hello", transport=transport), "the kit server")
                # the host's own handshake is done (a turn started earlier may run without
                # the server: its lifecycle notices start only once the link is ready)
                await wait_trace(host.trace(), lambda e: e.kind == "ready", "the host ready")
                yield Kit(host, ctl)
        finally:
            if proc is not None:
                proc.kill()
                with trio.CancelScope(shield=True):
                    await proc.wait()


def pushed_texts(host: Host) -> list[str]:
    return [t for t in texts(host.history("Ada"), role="user") if "relayed" in t or "kit" in t]


async def test_pushes_tools_and_the_grant(tmp_path: Path, transport: str) -> None:
    with trio.fail_after(60):
        async with kit(tmp_path, transport) as k:
            granted = await k.ctl.wait_for(event("granted"), "pushEvents granted")
            assert "pushEvents" in granted["capabilities"] and "kit" in granted["sets"]
            # inject.system is never advertised, so the context set runs
            assert "kit.context" in granted["sets"] and "kit.inference" in granted["sets"]
            done = await run(k.ctl, {"cmd": "push", "text": "ping from kit", "eventId": "p1"})
            assert done["result"]["accepted"] is True and done["result"]["eventId"] == "p1"
            again = await run(k.ctl, {"cmd": "push", "text": "ping from kit", "eventId": "p1"})
            assert again["event"] == "done"  # a retry under the same id is stored once
            stream = k.host.trace()
            shout = await k.host.execute_tool_call("Ada", "kit--shout", {"text": "hi"})
            assert shout == {"is_error": False, "content": [{"type": "text", "text": "HI"}]}
            # the server pushes while the host's tools/call is still open; both complete
            relay = await k.host.execute_tool_call("Ada", "kit--relay", {"text": "x"})
            assert relay["content"] == [{"type": "text", "text": "relayed (accepted)"}]
            bad = await k.host.execute_tool_call("Ada", "kit--shout", {"text": 3})
            assert bad["is_error"] is True
            await k.host.run_until_idle()
            assert pushed_texts(k.host) == ["ping from kit", "relayed: x"]
            # RFC-006: the host advertised coalescing, so a coalesced push goes out
            cmd = {
                "cmd": "push",
                "text": "kit status 1",
                "coalesce": {"key": "status", "initial": True},
            }
            first = await run(k.ctl, cmd)
            assert first["result"]["coalesce"]["outcome"] == "first"
            await k.host.run_until_idle()
            seen = []
            with trio.move_on_after(0):
                async for ev in stream:
                    seen.append(ev)
            assert seen and not [e for e in seen if "not JSON" in str(e.data)]


async def test_channels_publish_names_the_agent_and_the_place(
    tmp_path: Path, transport: str
) -> None:
    with trio.fail_after(60):
        async with kit(tmp_path, transport) as k:
            await k.ctl.wait_for(event("granted"), "granted")
            sent = await run(k.ctl, {"cmd": "send", "channel": "kit:room", "text": "hello room"})
            assert sent["result"]["accepted"] is True
            room = await k.ctl.wait_for(event("publish", channel="kit:room"), "reply in #room")
            assert (room["agent"], room["conversation"], room["text"]) == (
                "Ada",
                "agent:Ada",
                "Hi room.",
            )
            assert room["targeted"] is True and room["thread"] is None  # the root, by name
            cmd = {"cmd": "send", "channel": "kit:threads", "text": "hello thread", "thread": "t1"}
            assert (await run(k.ctl, cmd))["result"]["accepted"] is True
            reply = await k.ctl.wait_for(event("publish", channel="kit:threads"), "in t1")
            assert (reply["thread"], reply["text"]) == ("t1", "Hi thread.")
            closed = await k.host.execute_tool_call(
                "Ada", "channel_close", {"channel_id": "kit:room"}
            )
            assert closed["is_error"] is False
            await k.ctl.wait_for(event("close", channel="kit:room"), "close")
            opened = await k.host.execute_tool_call(
                "Ada", "channel_open", {"channel_id": "kit:room"}
            )
            assert opened["is_error"] is False
            await k.ctl.wait_for(event("open", channel="kit:room"), "open")
            bad = await run(
                k.ctl, {"cmd": "send", "channel": "kit:room", "text": "x", "thread": "t"}
            )
            assert bad["event"] == "failed" and "root channel" in bad["text"]


async def test_hooks_lifecycle_and_inference(tmp_path: Path, transport: str) -> None:
    with trio.fail_after(60):
        async with kit(tmp_path, transport) as k:
            await k.ctl.wait_for(event("granted"), "granted")
            await k.host.post_local("Ada", "hello room")
            hook = await k.ctl.wait_for(event("hook", agent="Ada"), "beforeInference")
            iid = hook["inference"]
            await k.ctl.wait_for(event("lifecycle", inference=iid, phase="started"), "started")
            await k.ctl.wait_for(event("lifecycle", inference=iid, phase="completed"), "done")
            done = await run(k.ctl, {"cmd": "infer", "text": "what is 2+2?", "stream": True})
            result = done["result"]
            assert result["content"] == "The answer is four."
            assert "".join(result["chunks"]) == result["content"] and result["chunks"]
            assert result["kept"] == result["chunks"]


async def test_manifest_change_and_rollback(tmp_path: Path, transport: str) -> None:
    with trio.fail_after(60):
        async with kit(tmp_path, transport) as k:
            await k.ctl.wait_for(event("granted"), "granted")
            stream = k.host.trace()
            done = await run(k.ctl, {"cmd": "declare"})
            assert done["event"] == "done"
            async for ev in stream:
                if (
                    ev.kind == "manifest-changed"
                    and ev.data.get("digest") == done["result"]["revision"]
                ):
                    break
            grant = await run(k.ctl, {"cmd": "grant"})
            assert "kit.extra" in grant["result"]["sets"]
            for word in ("one", "two"):
                await k.host.post_local("Ada", f"note {word}")
                await k.host.run_until_idle()
            tool_results = [
                m
                for m in k.host.history("Ada")
                if m["role"] == "tool" and m["metadata"].get("checkpoints")
            ]
            to = tool_results[0]["id"]
            report = await k.host.rollback("Ada", to=to)
            seen = await k.ctl.wait_for(event("rollback"), "state/rollback")
            assert (seen["featureSet"], seen["checkpoint"]) == ("kit", "cp-1")
            assert [s["checkpoint"] for s in report["state"] if "checkpoint" in s] == ["cp-1"]


async def test_an_ungranted_push_is_refused_by_the_server_itself(
    tmp_path: Path, transport: str
) -> None:
    with trio.fail_after(60):
        async with kit(tmp_path, transport, disabled_capabilities=["pushEvents"]) as k:
            stream = k.host.trace()
            async for ev in stream:
                if ev.kind == "channel-registered":
                    break
            refused = await run(k.ctl, {"cmd": "push", "text": "not allowed"})
            assert refused["kind"] == "NotGranted"
            assert "pushEvents" in refused["text"] and "not granted" in refused["text"]
            sent = await run(k.ctl, {"cmd": "send", "channel": "kit:room", "text": "still here"})
            assert sent["result"]["accepted"] is True
            await k.host.run_until_idle()
            assert "not allowed" not in str(k.host.history("Ada"))


async def test_a_bulk_reference_is_fetched_from_the_servers_own_origin(
    tmp_path: Path, transport: str
) -> None:
    with trio.fail_after(60):
        async with kit(tmp_path, transport) as k:
            await k.ctl.wait_for(event("granted"), "granted")
            done = await run(k.ctl, {"cmd": "share", "text": "the notes"})
            if transport == "stdio":  # no origin a host could fetch from
                assert done["kind"] == "RuntimeError" and "websocket" in done["text"]
                return
            assert done["result"]["accepted"] is True
            await k.host.run_until_idle()
            stubs = [t for t in texts(k.host.history("Ada")) if "notes.txt" in t]
            ref_id = re.findall(r"\[(ref_[0-9a-z_]+)\]", stubs[0])[0]
            got = await k.host.execute_tool_call("Ada", "fetch_reference", {"ref_id": ref_id})
            assert got["is_error"] is False, got
            saved = list((tmp_path / "data" / "workspace" / "refs").iterdir())
            assert [p.read_bytes() for p in saved] == [SHARED]


async def test_channel_changes_deferred_notices_and_model_info(
    tmp_path: Path, transport: str
) -> None:
    with trio.fail_after(60):
        async with kit(tmp_path, transport) as k:
            await k.ctl.wait_for(event("granted"), "granted")
            stream = k.host.trace()
            assert (await run(k.ctl, {"cmd": "relabel", "label": "#lounge"}))["event"] == "done"
            assert (await run(k.ctl, {"cmd": "remove"}))["result"]["channels"] == ["kit:room"]
            seen = []
            async for ev in stream:
                if ev.kind in ("channel-registered", "channel-removed"):
                    seen.append((ev.kind, ev.channel_id, ev.data.get("label")))
                if ev.kind == "channel-removed":
                    break
            assert ("channel-registered", "kit:room", "#lounge") in seen
            assert seen[-1] == ("channel-removed", "kit:threads", None)
            model = await run(k.ctl, {"cmd": "model"})
            assert isinstance(model["result"]["id"], str)
            first = await run(k.ctl, {"cmd": "defer", "n": 1})
            assert first["result"]["coalesce"]["outcome"] == "first"
            await k.ctl.wait_for(event("render", key="tally"), "push/render")
            await k.host.run_until_idle()
            assert "tally rendered: 1" in texts(k.host.history("Ada"))
