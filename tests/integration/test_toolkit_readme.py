"""The README's first server, exactly as printed, run by ``mcplive`` as a user would run it: the
agent hears its push, calls its tool, and its reply is delivered into the server's channel and
echoed there in that first run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MCPLIVE = [sys.executable, "-m", "actors.cli"]
RULES = """
[[rules]]
when = "hello from demo"
calls = [{ tool = "demo--shout", arguments = { text = "hello" } }]
say = "Shouted."
"""


def _section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("## Writing an MCPL server", 1)[1].split("\n## ", 1)[0]


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", _section(), re.S)


def test_the_first_server_is_short_and_the_config_runs_it() -> None:
    server = _blocks("python")[0]
    assert len(server.strip().splitlines()) <= 40
    assert 'command = ["python", "demo_server.py"]' in _blocks("toml")[0]


def _echoed(seen: list[dict[str, Any]]) -> bool:
    """Whether the server has echoed a reply the host published (the same message id)."""
    published = {
        e["data"].get("receipt", {}).get("messageId") for e in seen if e["kind"] == "published"
    }
    return any(
        e["kind"] == "incoming" and e["data"].get("message_id") in published - {None} for e in seen
    )


async def test_the_readme_server_is_heard_its_tool_answers_and_the_reply_arrives(
    tmp_path: Path,
) -> None:
    (tmp_path / "demo_server.py").write_text(_blocks("python")[0], encoding="utf-8")
    (tmp_path / "rules.toml").write_text(RULES, encoding="utf-8")
    agent = '\n[[agents]]\nname = "Ada"\nmodel = "scripted:rules.toml"\n'
    (tmp_path / "mcplive.toml").write_text(_blocks("toml")[0] + agent, encoding="utf-8")
    env = dict(os.environ)
    # "python" in the config is the interpreter running these tests
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    seen: list[dict[str, Any]] = []
    with trio.fail_after(90):
        proc = await trio.lowlevel.open_process(
            [*MCPLIVE, "run", "mcplive.toml", "--json"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert proc.stdout is not None
        buf = b""
        try:
            while not _echoed(seen):
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, f"mcplive exited early: {seen}"
                buf += chunk
                *lines, rest = buf.split(b"\n")
                buf = rest
                seen.extend(json.loads(line) for line in lines if line.strip())
        finally:
            proc.send_signal(signal.SIGINT)
            await proc.wait()
    kinds = [e["kind"] for e in seen]
    assert kinds.index("channel-registered") < kinds.index("push")
    assert kinds.index("push") < kinds.index("tool-call") < kinds.index("tool-result")
    assert kinds.index("tool-result") < kinds.index("published")
    assert "speech-held" not in kinds  # the reply was not kept as a draft
    [push] = [e for e in seen if e["kind"] == "push"]
    [published] = [e for e in seen if e["kind"] == "published"]
    [echo] = [e for e in seen if e["kind"] == "incoming"]
    assert push["channel_id"] == published["channel_id"] == echo["channel_id"] == "demo:room"
    assert published["agent"] == "Ada" and published["data"]["outcome"] == "delivered"
    assert published["data"]["text"] == "Shouted."
    assert echo["data"]["message_id"] == published["data"]["receipt"]["messageId"]
    assert echo["data"]["author"] == "Ada" and echo["data"]["text"] == "Shouted."
    with trio.fail_after(60):
        history = await trio.run_process(
            [*MCPLIVE, "history", "--json"], cwd=tmp_path, env=env, capture_stdout=True
        )
    messages = [json.loads(line) for line in history.stdout.decode().splitlines()]
    pushes = [m for m in messages if m["metadata"].get("server_id") == "demo"]
    assert [b["text"] for b in pushes[0]["blocks"]] == [
        pushes[0]["metadata"]["source_header"],
        "hello from demo",
    ]
    assert pushes[0]["metadata"]["source_header"].startswith("[source: demo")
    results = [b for m in messages for b in m["blocks"] if b["type"] == "tool_result"]
    assert results == [
        {
            "type": "tool_result",
            "tool_use_id": results[0]["tool_use_id"],
            "content": [{"type": "text", "text": "HELLO"}],
            "is_error": False,
        }
    ]
    registered = [e for e in seen if e["kind"] == "channel-registered"]
    assert [(e["channel_id"], e["data"]) for e in registered] == [("demo:room", {"label": "#room"})]
