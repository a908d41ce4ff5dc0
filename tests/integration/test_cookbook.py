"""The toolkit's cookbook (``examples/cookbook/``), each server run as it is printed: a real
subprocess on loopback under a real host (:meth:`actors.Host.open`) with scripted agents.

Real clock with generous deadlines, order-only asserts: the tests wait on trace events.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.host import TraceStream
from actors.trace import TraceEvent
from tests.helpers import config, listening, scripted, texts, wait_trace

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
COOKBOOK = ROOT / "examples" / "cookbook"
SERVERS = ("webhook.py", "reminders.py", "toolbox.py", "relay.py")
MAX_LINES = 120
DEADLINE = 60


def command(name: str, *args: str) -> list[str]:
    return [sys.executable, str(COOKBOOK / name), *args]


def environment(**extra: str) -> dict[str, str]:
    """This interpreter's environment, finding this checkout's ``actors``, and ``extra``."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def kind(name: str, **match: Any) -> Callable[[TraceEvent], bool]:
    """A trace event of kind ``name`` whose ``agent``/``channel_id`` and data match."""

    def pred(e: TraceEvent) -> bool:
        fields = {"agent": e.agent, "channel_id": e.channel_id, **e.data}
        return e.kind == name and all(fields.get(k) == v for k, v in match.items())

    return pred


async def found(
    stream: TraceStream, pred: Callable[[TraceEvent], bool], what: str, seen: list[TraceEvent]
) -> TraceEvent:
    """The first event matching ``pred``: among those already ``seen``, else the next one."""
    for event in seen:
        if pred(event):
            return event
    return await wait_trace(stream, pred, what, seen)


async def echoed(stream: TraceStream, agent: str, text: str, seen: list[TraceEvent]) -> str:
    """Wait for ``agent``'s ``text`` to be published and echoed back; the channel."""
    published = await found(
        stream, kind("published", agent=agent, text=text), f"{agent}: {text}", seen
    )
    assert published.data["outcome"] == "delivered", published
    message_id = published.data["receipt"]["messageId"]
    echo = await found(stream, kind("incoming", message_id=message_id), f"the echo of {text}", seen)
    assert echo.channel_id == published.channel_id and echo.data["author"] == agent
    assert published.channel_id is not None
    return published.channel_id


@pytest.mark.parametrize("name", SERVERS)
def test_each_server_is_short_and_uses_only_the_toolkit(name: str) -> None:
    source = (COOKBOOK / name).read_text(encoding="utf-8")
    assert len(source.splitlines()) < MAX_LINES
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    ours = {n for n in imported if n.split(".")[0] not in sys.stdlib_module_names}
    assert ours <= {"trio", "actors.serverkit"}, name
    guide = (ROOT / "docs" / "serverkit" / "cookbook.md").read_text(encoding="utf-8")
    assert f"examples/cookbook/{name}" in guide


# -- a webhook ---------------------------------------------------------------------------------


async def post(port: int, path: str, body: bytes, **headers: str) -> int:
    """One HTTP/1.1 POST to the server's port; the status."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
        head += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


async def test_a_webhook_delivery_is_answered_in_its_channel(tmp_path: Path) -> None:
    rules = '[[rules]]\nwhen = "build (\\\\d+) failed"\nsay = "Looking at build {1}."\n'
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", rules)}]
    env = environment(HOOK_SECRET="s3cret")
    seen: list[TraceEvent] = []
    with trio.fail_after(DEADLINE):
        async with listening(command("webhook.py", "--port", "0"), env) as url:
            port = int(url.rstrip("/").rpartition(":")[2])
            cfg = config(tmp_path, [{"id": "hooks", "url": url}], agents)
            async with Host.open(cfg) as host:
                stream = host.trace()
                await wait_trace(stream, kind("channel-registered"), "#alerts", seen)
                body = json.dumps({"text": "build 512 failed", "author": "ci"}).encode()
                assert await post(port, "/hook", body) == 401  # no secret
                assert await post(port, "/hook", b"", X_Hook_Secret="s3cret") == 400
                status = await post(
                    port, "/hook", body, X_Hook_Secret="s3cret", X_Delivery_Id="d-1"
                )
                assert status == 202
                delivered = await found(
                    stream, kind("incoming", message_id="hook-d-1"), "the delivery", seen
                )
                assert delivered.data["author"] == "ci"
                assert delivered.channel_id == "hooks:alerts"
                channel = await echoed(stream, "Ada", "Looking at build 512.", seen)
    assert channel == "hooks:alerts"


# -- reminders with a state of their own -------------------------------------------------------

REMINDERS = """
[[rules]]
when = "Reminder: (.*)"
say = "Done: {1}."

[[rules]]
when = "remind me later to (.*)"
calls = [{ tool = "reminders--remind", arguments = { text = "{1}", minutes = 600 } }]
say = "{result}"
"""


async def test_reminders_are_posted_when_due_and_kept_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    book = state / "reminders.json"
    book.write_text(json.dumps([{"id": "r1", "due": 0, "text": "water the plants"}]))
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", REMINDERS)}]
    server = {"id": "reminders", "command": command("reminders.py", "--state", str(state))}
    cfg = config(tmp_path, [server], agents)
    seen: list[TraceEvent] = []
    with trio.fail_after(DEADLINE):
        async with Host.open(cfg) as host:  # a reminder due while the server was stopped
            stream = host.trace()
            reminder = await found(
                stream, kind("incoming", message_id="rem-r1"), "the due reminder", seen
            )
            assert reminder.data["text"] == "Reminder: water the plants"
            await echoed(stream, "Ada", "Done: water the plants.", seen)
            await host.post_local("Ada", "remind me later to call mum")
            await found(stream, kind("tool-result", agent="Ada"), "the tool's answer", seen)
            await host.run_until_idle()
            said = texts(host.history("Ada"), role="assistant")
    assert said[-1].startswith("I will post it at ")
    [kept] = json.loads(book.read_text())  # the posted one is gone, the new one kept
    assert kept["text"] == "call mum" and kept["due"] > 0
    # time passes while nothing runs: the next start posts it
    book.write_text(json.dumps([{**kept, "due": 0}]))
    seen = []
    with trio.fail_after(DEADLINE):
        async with Host.open(cfg) as host:
            stream = host.trace()
            await found(stream, kind("incoming", message_id=f"rem-{kept['id']}"), "call mum", seen)
            await echoed(stream, "Ada", "Done: call mum.", seen)
    assert json.loads(book.read_text()) == []


# -- a plain tool server -----------------------------------------------------------------------


async def test_the_tool_server_answers_an_agent(tmp_path: Path) -> None:
    rules = (
        '[[rules]]\nwhen = "how far is (\\\\d+) km"\n'
        'calls = [{ tool = "toolbox--convert", arguments = { value = 42, unit = "km" } }]\n'
        'say = "{result}"\n'
    )
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", rules)}]
    cfg = config(tmp_path, [{"id": "toolbox", "command": command("toolbox.py")}], agents)
    with trio.fail_after(DEADLINE):
        async with Host.open(cfg) as host:
            await wait_trace(host.trace(), kind("ready"), "the toolbox")
            await host.post_local("Ada", "how far is 42 km?")
            await host.run_until_idle()
            said = texts(host.history("Ada"), role="assistant")
            words = await host.execute_tool_call(
                "Ada", "toolbox--word_count", {"text": "one two three"}
            )
            days = await host.execute_tool_call(
                "Ada", "toolbox--days_between", {"start": "2024-02-28", "end": "2024-03-01"}
            )
            bad = await host.execute_tool_call(
                "Ada", "toolbox--days_between", {"start": "soon", "end": "2024-03-01"}
            )
    assert said[-1] == "42 km = 26.10 mi"
    assert words == {"is_error": False, "content": [{"type": "text", "text": "3"}]}
    assert days["content"] == [{"type": "text", "text": "2 days"}]
    assert bad["is_error"] is True and "YYYY-MM-DD" in bad["content"][0]["text"]


# -- a relay between two channels --------------------------------------------------------------


async def test_the_relay_passes_each_post_to_the_other_channel(tmp_path: Path) -> None:
    ada = (
        '[[rules]]\nwhen = "tell the kitchen: (.*)"\n'
        'calls = [{ tool = "channel_publish", arguments = '
        '{ channel_id = "relay:front", content = "{1}" } }]\n'
    )
    grace = '[[rules]]\nwhen = "we need bread"\nsay = "On it."\n'
    agents = [
        {"name": "Ada", "model": scripted(tmp_path, "ada", ada)},
        {"name": "Grace", "model": scripted(tmp_path, "grace", grace)},
    ]
    cfg = config(tmp_path, [{"id": "relay", "command": command("relay.py")}], agents)
    seen: list[TraceEvent] = []
    with trio.fail_after(DEADLINE):
        async with Host.open(cfg) as host:
            stream = host.trace()
            await wait_trace(stream, kind("ready"), "the relay", seen)
            await host.post_local("Ada", "tell the kitchen: we need bread")
            assert await echoed(stream, "Ada", "we need bread", seen) == "relay:front"
            passed = await found(
                stream,
                kind("incoming", channel_id="relay:kitchen", text="[from #front] we need bread"),
                "the post passed on to #kitchen",
                seen,
            )
            assert passed.data["author"] == "Ada"
            assert await echoed(stream, "Grace", "On it.", seen) == "relay:kitchen"
            back = await found(
                stream,
                kind("incoming", channel_id="relay:front", text="[from #kitchen] On it."),
                "the answer passed back to #front",
                seen,
            )
            assert back.data["author"] == "Grace"
