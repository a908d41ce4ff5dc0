"""Shared pieces of the integration tests: configs, scripted models, trace waits."""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors import Host
from actors.host import TraceStream
from actors.models.base import ModelError, ModelReply, ModelRequest
from actors.trace import TraceEvent
from protocol.hooks import ModelInfo
from store.bodytext import without_header
from tests.lobby.control import ControlListener, LobbyControl, open_control_listener

# The lobby's own ids bare (m1, out-1), so tests can name them; by default each run tags them.
#: The local date and time that starts every line of the human transcript.
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def unstamped(text: str) -> list[str]:
    """The transcript's lines without their timestamps."""
    return [STAMP.sub("", line) for line in text.splitlines()]


LOBBY = [sys.executable, "-m", "tests.lobby", "--run-id", ""]


def lobby(address: str, *extra: str, sid: str = "lobby", **keys: Any) -> dict[str, Any]:
    return {"id": sid, "command": [*LOBBY, "--control-connect", address, *extra], **keys}


@asynccontextmanager
async def listening(cmd: list[str], env: dict[str, str] | None = None) -> AsyncIterator[str]:
    """A websocket server started as a subprocess that prints ``LISTENING <address>`` once it
    listens; yields the address, and kills the process at the end."""
    proc = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None
        buf = b""
        while b"\n" not in buf:
            chunk = await proc.stdout.receive_some(4096)
            assert chunk, "the server exited before listening"
            buf += chunk
        line = buf.split(b"\n", 1)[0].decode()
        assert line.startswith("LISTENING ")
        yield line.split(" ", 1)[1]
    finally:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


@asynccontextmanager
async def ws_lobby(*extra: str) -> AsyncIterator[str]:
    """A lobby serving websockets as a subprocess; yields its ws:// address."""
    async with listening([*LOBBY, "--ws", "127.0.0.1:0", *extra]) as address:
        yield address


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


@attrs.frozen
class Seen:
    """One model call as the model saw it (a copy: the agent appends to its list later)."""

    agent: str
    system: str
    messages: list[dict[str, Any]]


class RecordingModel:
    """A model (``actors.models.base.Model``) that records every request.

    ``mode``: ``reply`` answers ``say`` (nothing at all when ``say`` is empty); ``fail`` raises
    ``ModelError``; ``block-first`` blocks its first call until it is cancelled. After
    :meth:`hold`, the next call waits until the returned event is set. ``entered`` is set once a
    call waits.
    """

    def __init__(self, mode: str = "reply", say: str = "") -> None:
        self.name = "recorder"
        self.info = ModelInfo(
            id="recorder-1", vendor="tests", context_window=8192, capabilities=("tools",)
        )
        self.mode = mode
        self.say = say
        self.seen: list[Seen] = []
        self.entered = trio.Event()
        self._gate: trio.Event | None = None
        self._never = trio.Event()

    def hold(self) -> trio.Event:
        self._gate = trio.Event()
        return self._gate

    def calls(self, agent: str) -> list[Seen]:
        return [s for s in self.seen if s.agent == agent]

    async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
        messages = copy.deepcopy([dict(m) for m in request.messages])
        self.seen.append(Seen(request.agent, request.system, messages))
        if self.mode == "fail":
            raise ModelError("the provider is down")
        gate, self._gate = self._gate, None
        if self.mode == "block-first" and len(self.seen) == 1:
            gate = self._never
        if gate is not None:
            self.entered.set()
            await gate.wait()
        blocks = ({"type": "text", "text": self.say},) if self.say else ()
        return ModelReply(
            blocks=blocks, model=self.name, usage={"input_tokens": 11, "output_tokens": 3}
        )


async def hold_turn(
    ctl: Any, model: RecordingModel, channel: str, message_id: str, text: str
) -> trio.Event:
    """Wake the agent with one message and keep its turn inside the model (its context already
    read, so what arrives now waits for the next turn); setting the returned event lets the
    turn go on."""
    release = model.hold()
    send_incoming(ctl, channel, message_id, text)
    await model.entered.wait()
    return release


def install(monkeypatch: pytest.MonkeyPatch, model: RecordingModel) -> None:
    """Every agent of the next ``Host.open`` gets ``model``."""
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)


def is_header_notice(message: Mapping[str, Any]) -> bool:
    """The host's one-time notice explaining source headers."""
    meta = message.get("metadata") or {}
    return meta.get("system") is True and meta.get("kind") == "source-header-notice"


#: Host notices about an agent's own speech (stored after its turns).
SPEECH_NOTICES = frozenset({"delivered-receipt", "speech-notice", "coalesce-hidden"})


def is_speech_notice(message: Mapping[str, Any]) -> bool:
    meta = message.get("metadata") or {}
    return meta.get("system") is True and meta.get("kind") in SPEECH_NOTICES


def without_notices(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages, less the host's one-time notice about source headers and the notices and
    receipts about the agent's own speech."""
    return [m for m in messages if not is_header_notice(m) and not is_speech_notice(m)]


def texts(messages: list[dict[str, Any]], role: str | None = None) -> list[str]:
    """The text of each message (of ``role``), without its source header; the one-time notice
    about headers is left out."""
    out = []
    for m in without_notices(messages):
        if role is None or m["role"] == role:
            blocks = without_header(m["blocks"], m.get("metadata") or {})
            out.append(" ".join(b.get("text", "") for b in blocks if b.get("type") == "text"))
    return out


_pings = itertools.count(1)


async def barrier(ctl: Any) -> None:
    """Read the lobby's control events up to now: the lobby reports what it received before it
    answers, and its events keep their order, so once the pong of a ping sent now is read, every
    message the host already had answered is in ``ctl.events``."""
    ping = f"barrier-{next(_pings)}"
    mark = ctl.mark()
    ctl.send({"cmd": "ping", "id": ping})
    await ctl.wait_for(lambda e: e["event"] == "pong" and e["id"] == ping, ping, since=mark)


async def ready(ctl: Any, host: Host | None = None, sid: str = "lobby") -> None:
    """The lobby is ready and its channels are registered; with ``host``, the host's link to
    it (server ``sid``) is ready too (the host serves the lobby's requests from the moment its
    policy is sent, so the register may be answered before the host has listed the tools)."""
    await ctl.wait_for(lambda e: e["event"] == "ready", "lobby ready")
    # the lobby registers its channels right after it is ready
    await ctl.wait_for(
        lambda e: e["event"] == "response" and e["request"]["method"] == "channels/register",
        "channels registered",
    )
    if host is not None:
        await host_ready(host, sid)


async def host_ready(host: Host, sid: str) -> None:
    """Until the host's link to server ``sid`` is ready (now, or at its next ``ready`` event)."""
    stream = host.trace(kinds={"ready"})
    try:
        while not getattr(host.ctx.statuses.get(sid), "ready", False):
            await stream.__anext__()
    finally:
        await stream.aclose()


AgentSpec = str | dict[str, Any]  # scripted rules text, or the rest of an agent's entry


def agent_configs(tmp_path: Path, agents: Mapping[str, AgentSpec]) -> list[dict[str, Any]]:
    """Agent entries for :func:`config`: name → scripted rules text (written to a file named
    after the agent) or the rest of the agent's entry, e.g. ``{"model": "anthropic:x"}``."""
    out = []
    for name, spec in agents.items():
        if isinstance(spec, str):
            spec = {"model": scripted(tmp_path, name.lower(), spec)}
        out.append({"name": name, **spec})
    return out


@dataclass
class RunningLobby:
    host: Host
    ctl: LobbyControl  # the control connection of the first lobby process
    stream: TraceStream  # the host's trace, subscribed right after ``Host.open``
    listener: ControlListener  # ``accept()`` again after the lobby restarts


@asynccontextmanager
async def running_lobby(
    tmp_path: Path,
    agents: Mapping[str, AgentSpec],
    *lobby_args: str,
    wait_ready: bool = True,
    websocket: bool = False,
    host_keys: Mapping[str, Any] | None = None,
    **server_keys: Any,
) -> AsyncIterator[RunningLobby]:
    """A host with one lobby server (``lobby(address, *lobby_args, **server_keys)``: a stdio
    subprocess, or with ``websocket`` a subprocess serving a loopback websocket the host dials)
    and ``agents`` (see :func:`agent_configs`); the lobby's control connection is accepted and,
    unless ``wait_ready=False``, the lobby is :func:`ready`. ``host_keys`` are added to the
    config's ``[host]`` table."""
    async with open_control_listener() as listener, contextlib.AsyncExitStack() as stack:
        server = lobby(listener.address, *lobby_args, **server_keys)
        if websocket:
            args = ("--control-connect", listener.address, *lobby_args)
            url = await stack.enter_async_context(ws_lobby(*args))
            server = {"id": server["id"], "url": url, **server_keys}
        cfg = config(tmp_path, [server], agent_configs(tmp_path, agents))
        cfg["host"].update(host_keys or {})
        async with Host.open(cfg) as host:
            stream = host.trace()
            ctl = await listener.accept()
            if wait_ready:
                await ready(ctl, host, server["id"])
            yield RunningLobby(host=host, ctl=ctl, stream=stream, listener=listener)


def send_incoming(ctl: Any, channel: str, message_id: str, text: str, **extra: Any) -> Any:
    """Have the lobby send one ``channels/incoming`` message; ``extra`` adds e.g. ``tags``."""
    cmd = {"cmd": "incoming", "channelId": channel, "messageId": message_id, "text": text}
    return ctl.send({**cmd, **extra})


def publish_received(text: str | None = None) -> Callable[[dict[str, Any]], bool]:
    """Control-event predicate: the lobby received a ``channels/publish`` (whose first content
    block is ``text``, if given)."""
    return lambda e: (
        e["event"] == "received"
        and e["message"].get("method") == "channels/publish"
        and (text is None or e["message"]["params"]["content"][0]["text"] == text)
    )


def answered(
    method: str, key: str | None = None, value: Any = None
) -> Callable[[dict[str, Any]], bool]:
    """Control-event predicate: the host answered the lobby's ``method`` request (whose
    ``params[key]`` is ``value``, if ``key`` is given)."""
    return lambda e: (
        e["event"] == "response"
        and e["request"]["method"] == method
        and (key is None or e["request"]["params"][key] == value)
    )


def incoming_answered(message_id: str) -> Callable[[dict[str, Any]], bool]:
    """Control-event predicate: the host answered the ``channels/incoming`` carrying
    ``message_id`` (as its first message)."""
    return lambda e: (
        e["event"] == "response"
        and e["request"]["method"] == "channels/incoming"
        and e["request"]["params"]["messages"][0]["messageId"] == message_id
    )


def publishes(ctl: Any) -> list[tuple[str, str]]:
    out = []
    for m in received(ctl, "channels/publish"):
        p = m["params"]
        out.append((p["channelId"], " ".join(b.get("text", "") for b in p["content"])))
    return out


async def interrupt(proc: trio.Process) -> None:
    """Stop a host process as Ctrl-C does; kill it if it has not exited within 20 s."""
    proc.send_signal(signal.SIGINT)
    with trio.move_on_after(20):
        await proc.wait()
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def drain_ready(stream: Any) -> list[TraceEvent]:
    """The trace events already delivered to ``stream`` (a ``TraceStream``), without waiting
    for more."""
    out: list[TraceEvent] = []
    while True:
        before = len(out)
        with trio.move_on_after(0):  # the stream hands out at most 64 before it checkpoints
            async for event in stream:
                out.append(event)
        if len(out) == before:
            return out
