"""The bundled example lobby (``examples/lobby/server.py``) as a newcomer runs it on its own:
``python server.py``, a stdio subprocess driven here by a raw JSON-RPC host side. What it
declares, how it echoes an agent's post, its notebook and rollback, and its context line; its
script and its photo run in the bundled config (``tests/integration/test_cli.py``,
``tests/integration/test_example_rerun.py``)."""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from examples.lobby.server import STATUS
from tests.test_lobby_server import ALL_CAPS, CHAT_USES, TIMEOUT, Lobby, stdio_process

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lobby"
#: What the issue allows the example: it is read as a tutorial, not as the tests' machinery.
MAX_LINES = 600
CONTEXT_CAPS = [
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.beforeUser",
    "inferenceLifecycle",
]


def test_the_example_is_small() -> None:
    lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in EXAMPLE.glob("*.py"))
    assert lines <= MAX_LINES


def test_the_example_imports_the_toolkit_and_nothing_else_of_mcplive() -> None:
    for path in EXAMPLE.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
        ours = {name for name in imported if name.split(".")[0] not in sys.stdlib_module_names}
        assert ours <= {"trio", "actors.serverkit"}, path


@asynccontextmanager
async def example_process() -> AsyncIterator[Lobby]:
    """``python server.py`` in the example's folder, as the host starts it over stdio."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    async with stdio_process([sys.executable, "server.py"], cwd=EXAMPLE, env=env) as lobby:
        yield lobby


async def started(lobby: Lobby) -> dict[str, Any]:
    """The handshake, granting everything the lobby uses; the ``mcpl`` manifest it showed."""
    init = await lobby.handshake({"effectiveCapabilities": [*ALL_CAPS, *CONTEXT_CAPS]})
    manifest: dict[str, Any] = init["capabilities"]["experimental"]["mcpl"]
    return manifest


async def test_the_example_declares_its_sets_channels_and_tools() -> None:
    with trio.fail_after(TIMEOUT):
        async with example_process() as lobby:
            manifest = await started(lobby)
            sets = manifest["featureSets"]
            assert set(sets) == {"lobby.chat", "lobby.events", "lobby.context", "lobby.notes"}
            assert sorted(sets["lobby.chat"]["uses"]) == sorted(CHAT_USES)
            assert sets["lobby.notes"]["rollback"] is True
            listing = await lobby.request("tools/list")
            assert [t["name"] for t in listing["result"]["tools"]] == ["forecast", "roll", "note"]
            forecast = await lobby.request(
                "tools/call", {"name": "forecast", "arguments": {"city": "Lima"}}
            )
            assert forecast["result"]["content"][0]["text"] == "Forecast for Lima: sunny, 21°C"
            assert await lobby.close_stdin_and_wait() == 0
            assert lobby.stray == []


async def test_a_post_is_echoed_under_the_agent_with_this_runs_id() -> None:
    with trio.fail_after(TIMEOUT):
        async with example_process() as lobby:
            await started(lobby)
            content = [{"type": "text", "text": "hi all"}]
            params = {
                "channelId": "lobby:#random",
                "content": content,
                "conversationId": "agent:Ada",
            }
            reply = await lobby.request("channels/publish", params)
            message_id = reply["result"]["messageId"]
            assert reply["result"]["delivered"] is True and message_id.endswith("-out-1")
            echo = await lobby.server_request("channels/incoming")
            [message] = echo["params"]["messages"]
            assert message["messageId"] == message_id
            assert message["author"] == {"id": "agent:Ada", "name": "Ada"}
            assert message["content"] == content
            await lobby.answer(echo, {"results": [{"messageId": message_id, "accepted": True}]})
            assert await lobby.close_stdin_and_wait() == 0
            assert f"ids made up by this run start with {message_id.split('-')[0]}-" in (
                lobby.stderr_text()
            )


async def test_the_notebook_rolls_back_to_a_notes_checkpoint() -> None:
    async def note(lobby: Lobby, text: str) -> dict[str, Any]:
        call = await lobby.request("tools/call", {"name": "note", "arguments": {"text": text}})
        result: dict[str, Any] = call["result"]
        return result

    with trio.fail_after(TIMEOUT):
        async with example_process() as lobby:
            await started(lobby)
            first = await note(lobby, "Alice won")
            assert first["state"] == {
                "checkpoint": "cp-1",
                "parent": None,
                "data": {"notes": ["Alice won"]},
            }
            second = await note(lobby, "Bob brings snacks")
            assert second["state"]["parent"] == "cp-1"
            back = await lobby.request(
                "state/rollback", {"featureSet": "lobby.notes", "checkpoint": "cp-1"}
            )
            assert "error" not in back, back
            third = await note(lobby, "Ticket to Ride next")
            assert third["content"] == [
                {"type": "text", "text": "notes: Alice won; Ticket to Ride next"}
            ]
            assert third["state"]["parent"] == "cp-1"
            unknown = await lobby.request(
                "state/rollback", {"featureSet": "lobby.notes", "checkpoint": "cp-9"}
            )
            assert unknown["error"]["code"] == -32005
            assert await lobby.close_stdin_and_wait() == 0


async def test_the_context_line_comes_before_each_inference() -> None:
    with trio.fail_after(TIMEOUT):
        async with example_process() as lobby:
            await started(lobby)
            hook = await lobby.request(
                "context/beforeInference",
                {"inferenceId": "i1", "conversationId": "agent:Ada", "userMessage": "hi"},
            )
            assert hook["result"]["featureSet"] == "lobby.context"
            assert hook["result"]["contextInjections"] == [
                {"namespace": "lobby", "position": "beforeUser", "content": STATUS}
            ]
            assert await lobby.close_stdin_and_wait() == 0
