"""Servers that crash, stall, send garbage or flood; a host killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from store import Reader
from tests.helpers import (
    LOBBY,
    answered,
    interrupt,
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
)
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


async def test_crashed_server_is_reconnected_with_a_fresh_handshake(tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            lb.ctl.send({"cmd": "crash"})
            gone = await wait_trace(lb.stream, lambda e: e.kind == "disconnected", "disconnect")
            assert gone.data["retry_in_s"] >= 2.5
            second = await lb.listener.accept(timeout=60)
            await ready(second)
            assert received(second, "initialize")  # a fresh handshake on the new process
            second.send({"cmd": "push", "eventId": "after", "text": "back again"})
            await second.wait_for(answered("push/event", "eventId", "after"), "push after restart")
            await lb.host.run_until_idle()
            assert texts(without_notices(lb.host.history("Ada"))) == ["back again"]


async def test_unanswered_request_hits_its_deadline_while_other_agents_work(tmp_path: Path) -> None:
    stall = (
        '[[rules]]\nwhen = "stall"\ncalls = [{ tool = "lobby--stall", arguments = {} }]\n'
        'say = "gave up waiting"\n'
    )
    ping = '[[rules]]\nwhen = "ping"\nsay = "pong"\n'
    with trio.fail_after(90):
        async with running_lobby(
            tmp_path, {"Slow": stall, "Quick": ping}, request_timeout_s=4
        ) as lb:
            send_incoming(lb.ctl, "lobby:#general", "s1", "please stall")
            seen: list = []
            await wait_trace(
                lb.stream,
                lambda e: e.kind == "tool-call" and e.agent == "Slow",
                "stall call",
                seen,
            )
            # Quick's own turn for that first message is over before the ping arrives, so the
            # ping wakes a turn of its own (whose reply goes to #random)
            if not any(e.kind == "turn-end" and e.agent == "Quick" for e in seen):
                await wait_trace(
                    lb.stream,
                    lambda e: e.kind == "turn-end" and e.agent == "Quick",
                    "Quick's first turn",
                    seen,
                )
            send_incoming(lb.ctl, "lobby:#random", "p1", "ping")
            await wait_trace(
                lb.stream,
                lambda e: e.kind == "tool-result" and e.agent == "Slow",
                "stall deadline",
                seen,
            )
            kinds = [(e.kind, e.agent) for e in seen]
            # Quick answered while Slow's tool call was still pending
            assert kinds.index(("published", "Quick")) < kinds.index(("tool-result", "Slow"))
            await lb.host.run_until_idle()
            tool = next(m for m in lb.host.history("Slow") if m["role"] == "tool")
            result = tool["blocks"][0]
            assert result["is_error"] is True
            assert "no answer" in result["content"][0]["text"]
            await lb.ctl.wait_for(publish_received("gave up waiting"), "Slow's reply")
            assert ("lobby:#random", "pong") in publishes(lb.ctl)


async def test_garbage_and_oversized_lines_leave_the_connection_alive(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, max_line_bytes=2000) as lb:
            ctl = lb.ctl
            ctl.send({"cmd": "line", "text": "[lobby] this is a log line, not JSON"})
            ctl.send({"cmd": "line", "text": '{"id": 77, "method": "push/event", "params": {}}'})
            ctl.send(
                {
                    "cmd": "line",
                    "text":  # truncated JSON
                    '{"jsonrpc": "2.0", "id": 78, "method": "push/event"',
                }
            )
            ctl.send({"cmd": "line", "text": "x" * 5000})
            ctl.send({"cmd": "push", "eventId": "ok1", "text": "still fine"})
            await ctl.wait_for(answered("push/event", "eventId", "ok1"), "push after garbage")
            await lb.host.run_until_idle()
            seen: list = []
            notes = []
            async for e in lb.stream:
                seen.append(e)
                if e.kind == "diagnostic":
                    notes.append(e.data["text"])
                if e.kind == "push":
                    break
            assert any("not JSON" in n for n in notes)
            assert any('"jsonrpc": "2.0"' in n for n in notes)
            assert any("max_line_bytes" in n for n in notes)
            assert not any(e.kind == "disconnected" for e in seen)
            assert texts(without_notices(lb.host.history("Ada"))) == ["still fine"]
            refusal = [
                e for e in ctl.events if e["event"] == "received" and e["message"].get("id") == 77
            ]
            assert refusal and refusal[0]["message"]["error"]["code"] == -32600


async def test_a_flood_of_pushes_is_stored_once_each(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            lb.ctl.send({"cmd": "flood", "count": 1500, "text": "flood"})
            done = await lb.ctl.wait_for(
                lambda e: e["event"] == "flood_done", "flood done", timeout=100
            )
            await lb.host.run_until_idle()
            ids = [m["metadata"]["event_id"] for m in without_notices(lb.host.history("Ada"))]
            assert len(ids) == len(set(ids)) == done["accepted"]
            assert done["accepted"] >= 1  # refused ones were answered with an error, not lost


def _write_config(tmp_path: Path, address: str) -> Path:
    model = scripted(tmp_path, "a", "")
    path = tmp_path / "host.toml"
    cmd = ", ".join(f'"{c}"' for c in [*LOBBY, "--control-connect", address])
    path.write_text(
        f'[host]\ndata_dir = "data"\n\n[[servers]]\nid = "lobby"\ncommand = [{cmd}]\n\n'
        f'[[agents]]\nname = "Ada"\nmodel = "{model}"\n',
        encoding="utf-8",
    )
    return path


async def _push_all(ctl, ids: list[str]) -> None:
    for i in ids:
        ctl.send({"cmd": "push", "eventId": i, "text": f"event {i}"})
    for i in ids:
        answer = await ctl.wait_for(answered("push/event", "eventId", i), f"answer to {i}", since=0)
        assert answer["response"]["result"] == {"accepted": True}


async def test_acknowledged_items_survive_sigkill_and_retries_are_not_stored_twice(
    tmp_path: Path,
) -> None:
    ids = [f"k{i}" for i in range(40)]
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            path = _write_config(tmp_path, listener.address)
            argv = [sys.executable, "-m", "actors.cli", "run", str(path)]
            # the host starts the test lobby from the config's folder: it finds it through this
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = await trio.lowlevel.open_process(argv, env=env, stdout=subprocess.DEVNULL)
            try:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                await _push_all(ctl, ids)
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
            reader = Reader(tmp_path / "data" / "store.sqlite3")
            before = [m["metadata"]["event_id"] for m in without_notices(reader.history("Ada"))]
            assert sorted(before) == sorted(ids)  # every acknowledged item is durable
            # the server restarts with the host and retries the same events
            proc = await trio.lowlevel.open_process(argv, env=env, stdout=subprocess.DEVNULL)
            try:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                await _push_all(ctl, ids)
                ctl.send({"cmd": "push", "eventId": "fresh", "text": "new"})
                await ctl.wait_for(answered("push/event", "eventId", "fresh"), "fresh event")
            finally:
                await interrupt(proc)
            after = [m["metadata"]["event_id"] for m in without_notices(reader.history("Ada"))]
            assert sorted(after) == sorted([*ids, "fresh"])
            reader.close()


async def test_a_silent_server_is_detected_and_reconnected(tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with running_lobby(tmp_path, {"Ada": ""}, request_timeout_s=2) as lb:
            lb.ctl.send({"cmd": "hang"})
            await lb.ctl.wait_for(lambda e: e["event"] == "hung", "hung")
            result = await lb.host.execute_tool_call("Ada", "lobby--forecast", {"city": "Oslo"})
            assert result["is_error"] is True
            seen: list = []
            await wait_trace(lb.stream, lambda e: e.kind == "disconnected", "reconnect", seen)
            assert any(e.kind == "diagnostic" and "server silent" in e.data["text"] for e in seen)
            second = await lb.listener.accept(timeout=60)
            # the tools are listed once the host's new link is ready, not when the lobby is
            await ready(second, lb.host)
            again = await lb.host.execute_tool_call("Ada", "lobby--forecast", {"city": "Oslo"})
            assert again["is_error"] is False


async def test_publish_falls_back_to_the_notification_form(tmp_path: Path) -> None:
    rules = '[[rules]]\nwhen = "hello"\nsay = "hello back"\n'
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": rules}, "--publish-mode", "notification-only"
        ) as lb:
            send_incoming(lb.ctl, "lobby:#general", "h1", "hello")
            event = await wait_trace(lb.stream, lambda e: e.kind == "published", "publish")
            assert event.data["receipt"] == {"outcome": "unknown"}
            is_publish = publish_received()
            await lb.ctl.wait_for(
                lambda e: is_publish(e) and "id" not in e["message"], "the notification form"
            )
            forms = ["id" in m for m in received(lb.ctl, "channels/publish")]
            assert forms == [True, False]  # the request, refused; then the notification


async def test_leaving_the_host_is_bounded_with_a_request_outstanding(tmp_path: Path) -> None:
    stall = (
        '[[rules]]\nwhen = "stall"\ncalls = [{ tool = "lobby--stall", arguments = {} }]\n'
        'say = "never said"\n'
    )
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Slow": stall}, request_timeout_s=600) as lob:
            send_incoming(lob.ctl, "lobby:#general", "s1", "please stall")
            await lob.ctl.wait_for(
                lambda e: e["event"] == "received" and e["message"].get("method") == "tools/call",
                "the call the lobby never answers",
            )
            # leave while the agent's turn waits on a 600 s request
        # the host is closed: the lobby process was stopped and its control link ended
        await lob.ctl.wait_closed(timeout=30)
        assert "never said" not in str(lob.ctl.events)
