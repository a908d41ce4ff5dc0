"""Shared pieces of the integration tests: configs, scripted models, trace waits."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from actors.trace import TraceEvent

LOBBY = [sys.executable, "-m", "examples.lobby_server"]


def lobby(address: str, *extra: str, sid: str = "lobby", **keys: Any) -> dict[str, Any]:
    return {"id": sid, "command": [*LOBBY, "--control-connect", address, *extra], **keys}


def scripted(tmp_path: Path, name: str, rules: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(rules, encoding="utf-8")
    return f"scripted:{path}"


def config(
    tmp_path: Path, servers: list[dict[str, Any]], agents: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"host": {"data_dir": str(tmp_path / "data")}, "servers": servers, "agents": agents}


async def wait_trace(
    stream: Any, pred: Callable[[TraceEvent], bool], what: str, seen: list[TraceEvent] | None = None
) -> TraceEvent:
    """The next trace event matching ``pred``; every event read is appended to ``seen``."""
    async for event in stream:
        if seen is not None:
            seen.append(event)
        if pred(event):
            return event
    raise AssertionError(f"trace ended before {what}")


def received(ctl: Any, method: str) -> list[dict[str, Any]]:
    """Messages of ``method`` the lobby received from the host, oldest first."""
    return [
        e["message"]
        for e in ctl.events
        if e.get("event") == "received" and e["message"].get("method") == method
    ]


def texts(messages: list[dict[str, Any]], role: str | None = None) -> list[str]:
    out = []
    for m in messages:
        if role is None or m["role"] == role:
            out.append(" ".join(b.get("text", "") for b in m["blocks"] if b.get("type") == "text"))
    return out


async def ready(ctl: Any) -> None:
    await ctl.wait_for(lambda e: e["event"] == "ready", "lobby ready")
    # the lobby registers its channels right after it is ready
    await ctl.wait_for(
        lambda e: e["event"] == "response" and e["request"]["method"] == "channels/register",
        "channels registered",
    )


def publishes(ctl: Any) -> list[tuple[str, str]]:
    out = []
    for m in received(ctl, "channels/publish"):
        p = m["params"]
        out.append((p["channelId"], " ".join(b.get("text", "") for b in p["content"])))
    return out


__all__ = ["trio"]
