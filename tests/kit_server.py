"""A server written with the toolkit, using every feature, driven by a test's control socket.

``python -m tests.kit_server --control-connect HOST:PORT [--ws]`` serves the host on stdio (or,
with ``--ws``, on a loopback websocket whose address it prints as ``LISTENING <url>``) and
connects to the test's control listener (:mod:`tests.lobby.control`): it reports what it
sees as ``{"event": ...}`` lines and runs ``{"cmd": ...}`` lines. ``--token T`` makes the websocket
refuse hosts that do not send ``T`` as a bearer token.

Events: ``granted`` {capabilities, sets} (pushEvents granted), ``grant`` (answer to ``grant``),
``publish`` {channel, agent, conversation, thread, targeted, text}, ``open``/``close``
{channel}, ``hook`` {agent, inference}, ``lifecycle`` {inference, phase}, ``rollback``
{featureSet, checkpoint}, ``render`` {key, notices}, ``done`` {cmd, result} or ``failed``
{cmd, kind, text} for each command. Commands: ``push`` {text, eventId?, coalesce?}, ``send``
{channel, text, author?, thread?}, ``infer`` {text, stream?}, ``declare`` (one more feature set and
``mcpl/manifestChanged``), ``grant``, ``defer`` {n} (a deferred coalesced notice),
``relabel`` {label} (``#room``), ``remove`` (``#threads``), ``model`` (``model/info``),
``share`` {text} (a push carrying a bulk reference to
:data:`SHARED`).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from typing import Any

import trio

from actors.serverkit import (
    BeforeInference,
    CheckpointNotFound,
    Injection,
    Lifecycle,
    MCPLServer,
    OpenRequest,
    Publish,
    Render,
    Rollback,
    ToolResult,
)

server = MCPLServer("kit", inference=True)
room = server.channel("kit:room", label="#room", publish_target="root")
threads = server.channel("kit:threads", label="#threads", publish_target="exact")
_checkpoints = itertools.count(1)
_known: set[str] = set()
#: the payload ``share`` references (served from the websocket's own origin)
SHARED = b"kit notes: " + bytes(range(32, 127)) * 40


class Control:
    """The connection to the test: events out, commands in."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.lock = trio.StrictFIFOLock()

    async def emit(self, event: dict[str, Any]) -> None:
        async with self.lock:
            await self.stream.send_all((json.dumps(event) + "\n").encode())


control: Control | None = None


async def emit(event: dict[str, Any]) -> None:
    if control is not None:
        await control.emit(event)


@server.tool()
def shout(text: str) -> str:
    """The text, upper-cased."""
    print(f"shouting {text}", flush=True)  # a stray print: kept off the protocol stream
    return text.upper()


@server.tool()
async def relay(text: str) -> str:
    """Push the text as an event while this call is still open."""
    result = await server.push_event(f"relayed: {text}")
    return f"relayed ({'accepted' if result.accepted else 'refused'})"


@server.tool()
def note(text: str) -> ToolResult:
    """Keep a note; every note is a new checkpoint."""
    n = next(_checkpoints)
    _known.add(f"cp-{n}")
    parent = f"cp-{n - 1}" if n > 1 else None
    state = {"checkpoint": f"cp-{n}", "parent": parent, "data": {"last": text}}
    return ToolResult(content=[{"type": "text", "text": f"noted {text}"}], state=state)


@server.on_publish
async def heard(publish: Publish) -> None:
    await emit(
        {
            "event": "publish",
            "channel": publish.channel_id,
            "agent": publish.agent,
            "conversation": publish.conversation_id,
            "thread": publish.thread_id,
            "targeted": publish.targeted,
            "text": publish.text,
        }
    )


@server.on_open
async def opened(request: OpenRequest) -> list[dict[str, Any]]:
    await emit({"event": "open", "channel": request.channel_id})
    return []


@server.on_close
async def closed(request: OpenRequest) -> None:
    await emit({"event": "close", "channel": request.channel_id})


@server.before_inference
async def hook(ctx: BeforeInference) -> list[Injection]:
    await emit({"event": "hook", "agent": ctx.agent, "inference": ctx.inference_id})
    return [Injection(content="kit context", position="beforeUser")]


@server.on_lifecycle
async def lifecycle(event: Lifecycle) -> None:
    await emit({"event": "lifecycle", "inference": event.inference_id, "phase": event.phase})


@server.on_rollback
async def rollback(request: Rollback) -> bool:
    await emit(
        {"event": "rollback", "featureSet": request.feature_set, "checkpoint": request.checkpoint}
    )
    if request.checkpoint not in _known:
        raise CheckpointNotFound(request.checkpoint)
    return True


@server.on_render
async def render(request: Render) -> str:
    await emit({"event": "render", "key": request.key, "notices": len(request.notices)})
    return "tally rendered: " + ", ".join(str(n.get("data", {}).get("n")) for n in request.notices)


@server.on_granted("pushEvents")
async def granted() -> None:
    grant = server.grant
    await emit(
        {
            "event": "granted",
            "capabilities": sorted(grant.capabilities),
            "sets": sorted(grant.enabled_sets),
        }
    )


async def run_command(cmd: dict[str, Any]) -> Any:
    kind = cmd.get("cmd")
    if kind == "push":
        return dict(
            await server.push_event(
                cmd["text"], event_id=cmd.get("eventId"), coalesce=cmd.get("coalesce")
            )
        )
    if kind == "send":
        channel = server.channels[cmd["channel"]]
        return await channel.send(
            cmd["text"], author=cmd.get("author", "bob"), thread_id=cmd.get("thread")
        )
    if kind == "infer":
        chunks: list[str] = []
        result = await server.infer(
            cmd["text"], stream=bool(cmd.get("stream")), on_chunk=chunks.append
        )
        return {"content": result.content, "chunks": chunks, "kept": list(result.chunks)}
    if kind == "declare":
        server.feature_set("kit.extra", description="one more", uses=["pushEvents"])
        await server.manifest_changed()
        return {"revision": server.manifest()["revision"]}
    if kind == "share":
        block = server.reference(SHARED, mime_type="text/plain", name="notes.txt")
        return dict(await server.push_event([{"type": "text", "text": cmd["text"]}, block]))
    if kind == "defer":
        coalesce = {"key": "tally", "deferred": True, "initial": True, "data": {"n": cmd["n"]}}
        return dict(await server.push_event(f"tally fallback {cmd['n']}", coalesce=coalesce))
    if kind == "relabel":
        await room.update(label=cmd["label"])
        return {"label": room.spec.label}
    if kind == "remove":
        await threads.remove()
        return {"channels": sorted(server.channels)}
    if kind == "model":
        return await server.model_info()
    if kind == "grant":
        return {
            "capabilities": sorted(server.grant.capabilities),
            "sets": sorted(server.grant.enabled_sets),
        }
    raise ValueError(f"unknown command {kind!r}")


async def command(cmd: dict[str, Any]) -> None:
    try:
        result = await run_command(cmd)
    except Exception as exc:
        await emit({"event": "failed", "cmd": cmd, "kind": type(exc).__name__, "text": str(exc)})
    else:
        await emit({"event": "done", "cmd": cmd, "result": result})


async def read_commands(stream: trio.SocketStream, nursery: trio.Nursery) -> None:
    buf = b""
    while data := await stream.receive_some(65536):
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                nursery.start_soon(command, json.loads(line))


async def main(address: str, ws: bool, token: str | None) -> None:
    global control
    host, port = address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    control = Control(stream)
    await emit({"event": "hello", "transport": "ws" if ws else "stdio"})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_commands, stream, nursery)
        if ws:
            url = await nursery.start(
                functools.partial(server.serve_websocket, "127.0.0.1", 0, token=token)
            )
            print(f"LISTENING {url}", flush=True)
        else:
            await server.serve_stdio()
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--control-connect", required=True)
    parser.add_argument("--ws", action="store_true")
    parser.add_argument("--token")
    args = parser.parse_args()
    try:
        trio.run(main, args.control_connect, args.ws, args.token)
    except KeyboardInterrupt:
        sys.exit(0)
