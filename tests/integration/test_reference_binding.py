"""References bound to every server that delivered them (seed references-bound-to-servers;
refs-and-headers.md sections A, B, C and "Decisions for mcplive").

Everything is real: websocket lobbies as subprocesses (``--ws --files``: the lobby serves its own
files over plain HTTP on its websocket port, so its references are on its own origin, and it
reports every file request with its ``Authorization`` header), the stdio lobby (a server with no
address), the loopback origin of ``tests/origin.py`` (an origin no server is on), and
``tool_server``: a small MCPL websocket server defined here whose one tool, ``give``, answers
with the references its arguments name. It shares its port with a ``tests/origin.Origin``, so
those references are on its own origin and every request for them, with its ``Authorization``,
is counted. The lobby has no tool whose result carries a reference; this server is the least
that gives the tool-result lanes (an agent's own call, an in-process call) a server on the
uri's origin.

Two server entries that dial one websocket lobby at different paths (``/a``, ``/b``) are two
servers on one origin; each session's control connection is told apart by a probe notification
(:func:`controls_by_server`).

Waits are on protocol events (the host's answer to a push, a trace event, a control ``pong``
after the lobby's ``http`` event), never on sleeps; assertions are about order and content.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from actors import Host
from actors.references.registry import LookupRefs
from actors.trace import TraceEvent
from tests.helpers import (
    RecordingModel,
    Seen,
    config,
    incoming_answered,
    lobby,
    ready,
    received,
    scripted,
    ws_lobby,
)
from tests.http_head import ReplayStream, RequestHead, read_head
from tests.lobby.control import ControlListener, LobbyControl, open_control_listener
from tests.lobby.server import LobbyFile, builtin_files, now_iso
from tests.origin import Origin, Route, serve_origin

pytestmark = pytest.mark.slow

FILES = builtin_files()
BOARD: LobbyFile = FILES["board.png"]
NOTES: LobbyFile = FILES["notes.txt"]

#: A scripted agent that fetches the first reference it is shown, through its own dispatch.
FETCH_RULE = r"""
[[rules]]
when = "\\[(ref_[0-9a-z]+_[0-9a-z]{4})\\]"
calls = [{ tool = "fetch_reference", arguments = { ref_id = "{1}" } }]
"""
REF_ID = re.compile(r"\[(ref_[0-9a-z]+_[0-9a-z]{4})\]")
FETCH_OFFER = "fetch with fetch_reference"
#: A capability mask granting everything a lobby advertises, system injection included.
GRANT_ALL = ["*", "*.*", "*.*.*", "*.*.*.*", "contextHooks.beforeInference.inject.system"]

_tags = itertools.count(1)


# ---- servers -----------------------------------------------------------------------------------


def http_of(ws_url: str) -> str:
    """The origin of a lobby's websocket address, where it serves its files."""
    return ws_url.replace("ws://", "http://", 1).rstrip("/")


#: A tool of the tool server: its arguments → its result.
Tool = Callable[[Mapping[str, Any]], dict[str, Any]]


def give(args: Mapping[str, Any]) -> dict[str, Any]:
    """``{"refs": [{"uri", "size", "mime"?, "name"?, "digest"?}], "error"?: bool}`` → a text
    block and one ``resource`` per entry; ``isError`` as asked."""
    failed = bool(args.get("error"))
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "it failed" if failed else "here you are"}
    ]
    for ref in args.get("refs", []):
        block = {
            "type": "resource",
            "uri": ref["uri"],
            "mimeType": ref.get("mime", "text/plain"),
            "sizeBytes": ref["size"],
            "name": ref.get("name", ref["uri"].rsplit("/", 1)[-1]),
        }
        if "digest" in ref:
            block["digest"] = ref["digest"]
        content.append(block)
    return {"content": content, "isError": failed}


TOOL_MANIFEST = {
    "version": "0.5",
    "featureSets": {
        "refs.tools": {"description": "Tools whose results carry references.", "uses": ["tools"]}
    },
}


class ToolServer:
    """An MCPL websocket server with tools, and an HTTP origin on the same port.

    A connection that asks for a websocket upgrade is an MCPL session (initialize, the
    featureSets/update receipt, tools/list, tools/call, ping); any other request is answered by
    ``origin`` (``tests/origin.Origin``: its routes, its request log)."""

    def __init__(self, origin: Origin, tools: Mapping[str, Tool]) -> None:
        self.origin = origin
        self.tools = dict(tools)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return self.origin.ws_url("/mcpl")

    async def connection(self, stream: trio.SocketStream) -> None:
        raw, head = b"", None
        with trio.move_on_after(30):
            raw, head = await read_head(stream)
        replay = ReplayStream(stream, raw)
        if head is None or not RequestHead(head).is_websocket_upgrade():
            if head is None:
                with trio.CancelScope(shield=True):
                    await replay.aclose()
                return
            await self.origin._connection(replay)  # type: ignore[arg-type]
            return
        try:
            async with trio.open_nursery() as nursery:
                request = await trio_websocket.wrap_server_stream(nursery, replay)
                ws = await request.accept()
                await self._session(ws)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await replay.aclose()

    async def _session(self, ws: trio_websocket.WebSocketConnection) -> None:
        while True:
            try:
                msg = json.loads(await ws.get_message())
            except trio_websocket.ConnectionClosed:
                return
            if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
                continue  # notifications and answers need nothing from us
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
            try:
                reply["result"] = self._answer(msg["method"], msg.get("params") or {})
            except LookupError:
                reply["error"] = {"code": -32601, "message": f"Method not found: {msg['method']}"}
            try:
                await ws.send_message(json.dumps(reply))
            except trio_websocket.ConnectionClosed:
                return

    def _answer(self, method: str, params: Mapping[str, Any]) -> Any:
        if method == "initialize":
            return {
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {}, "experimental": {"mcpl": TOOL_MANIFEST}},
                "serverInfo": {"name": "reference-tools", "version": "1"},
            }
        if method == "featureSets/update":
            return {"accepted": True}
        if method == "ping":
            return {}
        if method == "tools/list":
            return {
                "tools": [
                    {"name": n, "description": f"{n}", "inputSchema": {"type": "object"}}
                    for n in self.tools
                ]
            }
        if method == "tools/call":
            name, args = params["name"], dict(params.get("arguments") or {})
            self.calls.append((name, args))
            return self.tools[name](args)
        raise LookupError(method)


@asynccontextmanager
async def tool_server(tools: Mapping[str, Tool] | None = None) -> AsyncIterator[ToolServer]:
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        server = ToolServer(Origin(listeners[0].socket.getsockname()[1]), tools or {"give": give})
        await nursery.start(trio.serve_listeners, server.connection, listeners)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


# ---- content -----------------------------------------------------------------------------------


def resource(uri: str, f: LobbyFile) -> dict[str, Any]:
    return {
        "type": "resource",
        "uri": uri,
        "mimeType": f.mime_type,
        "sizeBytes": f.size,
        "digest": f.digest,
        "name": f.name,
    }


def media(kind: str, uri: str, f: LobbyFile, disposition: str | None = "ref") -> dict[str, Any]:
    """A uri-form image or audio block (claims of the file served at ``uri``)."""
    block: dict[str, Any] = {
        "type": kind,
        "uri": uri,
        "mimeType": f.mime_type if kind == "image" else "audio/wav",
        "sizeBytes": f.size,
        "digest": f.digest,
        "name": f"{kind}-{f.name}",
    }
    if disposition is not None:
        block["disposition"] = disposition
    return block


def give_args(uri: str, f: LobbyFile = BOARD, **extra: Any) -> dict[str, Any]:
    """``give`` arguments for one reference with the claims of ``f``."""
    ref = {"uri": uri, "size": f.size, "mime": f.mime_type, "name": f.name, "digest": f.digest}
    return {"refs": [ref], **extra}


def toml_value(value: Any) -> str:
    """A value written as TOML (strings, integers, booleans, lists, tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # these strings need no escape TOML lacks
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    items = ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items())
    return "{ " + items + " }"


def call_rule(when: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """A scripted rule: on a body matching ``when``, call ``tool`` with ``arguments``."""
    call = {"tool": tool, "arguments": dict(arguments)}
    return f"[[rules]]\nwhen = {toml_value(when)}\ncalls = [{toml_value(call)}]\n"


# ---- driving the lobby -------------------------------------------------------------------------


def push_answered(event_id: str) -> Callable[[dict[str, Any]], bool]:
    return lambda e: (
        e["event"] == "response"
        and e["request"]["method"] == "push/event"
        and e["request"]["params"]["eventId"] == event_id
    )


async def push(ctl: LobbyControl, content: list[dict[str, Any]]) -> str:
    """The lobby sends a push/event with this content; returns its event id once the host has
    stored it."""
    event_id = f"ev-{next(_tags)}"
    params = {
        "featureSet": "lobby.events",
        "eventId": event_id,
        "timestamp": now_iso(),
        "payload": {"content": content},
        "tags": [],
    }
    message = {"jsonrpc": "2.0", "id": event_id, "method": "push/event", "params": params}
    ctl.send({"cmd": "raw", "message": message})
    answer = await ctl.wait_for(push_answered(event_id), f"the host's answer to {event_id}")
    assert answer["response"].get("result") == {"accepted": True}, answer
    return event_id


async def share(ctl: LobbyControl, f: LobbyFile, uri: str | None = None) -> str:
    """The lobby's ``share``: a push/event with a reference to one of its files (``uri``: point
    the reference elsewhere); returns its event id once the host has stored it."""
    event_id = f"share-{next(_tags)}"
    cmd: dict[str, Any] = {"cmd": "share", "file": f.name, "text": "Look.", "eventId": event_id}
    if uri is not None:
        cmd["uri"] = uri
    ctl.send(cmd)
    answer = await ctl.wait_for(push_answered(event_id), f"the host's answer to {event_id}")
    assert answer["response"].get("result") == {"accepted": True}, answer
    return event_id


async def incoming(ctl: LobbyControl, content: list[dict[str, Any]]) -> str:
    """The lobby sends one channels/incoming message with this content to #general; returns
    its message id once the host has stored it."""
    message_id = f"msg-{next(_tags)}"
    message = {
        "channelId": "lobby:#general",
        "messageId": message_id,
        "author": {"id": "alice", "name": "Alice"},
        "timestamp": now_iso(),
        "content": content,
        "tags": [],
    }
    ctl.send({"cmd": "incoming_batch", "messages": [message]})
    answer = await ctl.wait_for(incoming_answered(message_id), f"the answer to {message_id}")
    assert answer["response"]["result"]["results"][0]["accepted"] is True, answer
    return message_id


async def lobby_http(ctl: LobbyControl) -> list[dict[str, Any]]:
    """Every plain HTTP request the lobby has answered so far: a ``ping`` round trip comes
    after the ``http`` event of any request the host has already seen answered."""
    tag = next(_tags)
    ctl.send({"cmd": "ping", "id": tag})
    await ctl.wait_for(lambda e: e["event"] == "pong" and e["id"] == tag, "pong")
    return [e for e in ctl.events if e["event"] == "http"]


async def controls_by_server(
    host: Host, listener: ControlListener, count: int
) -> dict[str, LobbyControl]:
    """Accept ``count`` lobby sessions (all dialling ``listener``) and tell which configured
    server each is: each sends a notification the host ignores with a diagnostic naming it."""
    controls = [await listener.accept() for _ in range(count)]
    out: dict[str, LobbyControl] = {}
    for i, ctl in enumerate(controls):
        await ready(ctl)
        method = f"whoami/{next(_tags)}-{i}"
        ctl.send({"cmd": "raw", "message": {"jsonrpc": "2.0", "method": method}})
        event = await trace_event(
            host,
            lambda e, m=method: (
                e.kind == "diagnostic" and e.data.get("text") == f"notification {m} ignored"
            ),
            f"the host's note of {method}",
        )
        assert event.server_id is not None and event.server_id not in out
        out[event.server_id] = ctl
    return out


# ---- reading the host --------------------------------------------------------------------------


async def trace_event(host: Host, pred: Callable[[TraceEvent], bool], what: str) -> TraceEvent:
    """The first trace event (recent ones replayed) matching ``pred``."""
    stream = host.trace()
    try:
        async for event in stream:
            if pred(event):
                return event
    finally:
        await stream.aclose()
    raise AssertionError(f"trace ended before {what}")


async def trace_until(
    host: Host, pred: Callable[[TraceEvent], bool], what: str
) -> list[TraceEvent]:
    """Every trace event (recent ones replayed) up to and including the first matching
    ``pred``."""
    seen: list[TraceEvent] = []

    def keep(event: TraceEvent) -> bool:
        seen.append(event)
        return pred(event)

    await trace_event(host, keep, what)
    return seen


def stored(host: Host, key: str, value: str, agent: str = "Ada") -> dict[str, Any]:
    """The one stored message whose metadata ``key`` is ``value``."""
    [message] = [m for m in host.history(agent) if m["metadata"].get(key) == value]
    return message


def stubs(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in blocks if "ref_id" in b]


def ref_of(stub_text: str) -> str:
    found = REF_ID.match(stub_text)
    assert found is not None, stub_text
    return found.group(1)


def counter_of(ref_id: str) -> int:
    """The counter part of a reference id (A.4: it only grows, one per new record)."""
    return int(ref_id.split("_")[1], 36)


def last_tool_result(host: Host, agent: str = "Ada") -> dict[str, Any]:
    tools = [m for m in host.history(agent) if m["role"] == "tool"]
    assert tools, "no tool result stored"
    [result] = tools[-1]["blocks"]
    assert result["type"] == "tool_result"
    return result


async def bound_to(host: Host, ref_id: str) -> tuple[str, ...]:
    """The servers the registry holds for a reference, in delivery order."""
    [view] = await host.ctx.references.ask(LookupRefs(ref_ids=(ref_id,)), timeout=10)
    assert view is not None, f"{ref_id} is not registered"
    return tuple(view.server_ids)


async def fetch_reference(host: Host, ref_id: str) -> dict[str, Any]:
    result: dict[str, Any] = await host.execute_tool_call(
        "Ada", "fetch_reference", {"ref_id": ref_id}
    )
    return result


def saved(result: Mapping[str, Any]) -> dict[str, Any]:
    """The answer of a successful fetch_reference."""
    assert result["is_error"] is False, result
    [block] = result["content"]
    answer: dict[str, Any] = json.loads(block["text"])
    return answer


def refusal(result: Mapping[str, Any]) -> str:
    assert result["is_error"] is True, result
    [block] = result["content"]
    text: str = block["text"]
    return text


def third_party(uri_origin: str, dialed: str) -> str:
    return f"third-party origin ({uri_origin} != dialed {dialed}); not fetched by this host"


def texts_of(request: Seen) -> list[str]:
    """Every text the model was shown: the system prompt and each text block."""
    out = [request.system]
    for m in request.messages:
        out += [b["text"] for b in m.get("blocks", ()) if b.get("type") == "text"]
    return out


# ---- 1. each lane binds to its server ----------------------------------------------------------


@pytest.mark.parametrize("lane", ["push", "incoming"])
async def test_push_and_channel_references_are_bound_to_the_server_that_sent_them(
    tmp_path: Path, lane: str
) -> None:
    """Two servers on one origin (one lobby dialled at /a and /b, each with its own token) each
    send the content of one lane: a resource, a uri-form image and audio with a disposition, and
    a uri-form image without one (not a reference). Each reference's stub offers the fetch, the
    history holds no reference's uri, and fetch_reference dials the sender, with its token."""
    provenance = "attachment on push event" if lane == "push" else "attachment on channel message"
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            async with ws_lobby("--files", "--control-connect", listener.address) as url:
                http = http_of(url)
                servers = [
                    {"id": "lobby-a", "url": f"{url}/a", "token": "tok-a"},
                    {"id": "lobby-b", "url": f"{url}/b", "token": "tok-b"},
                ]
                agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
                async with Host.open(config(tmp_path, servers, agents)) as host:
                    ctls = await controls_by_server(host, listener, 2)
                    uris: dict[str, dict[str, str]] = {}
                    keys: dict[str, str] = {}
                    for sid in ("lobby-b", "lobby-a"):
                        base = f"{http}/files/board.png?lane={lane}&from={sid}"
                        uris[sid] = {
                            "resource": f"{http}/files/notes.txt?lane={lane}&from={sid}",
                            "image": f"{base}&form=image",
                            "audio": f"{base}&form=audio",
                            "plain": f"{base}&form=plain",
                        }
                        u = uris[sid]
                        content = [
                            {"type": "text", "text": f"three references from {sid}"},
                            resource(u["resource"], NOTES),
                            media("image", u["image"], BOARD),
                            media("audio", u["audio"], BOARD),
                            media("image", u["plain"], BOARD, disposition=None),
                        ]
                        if lane == "push":
                            keys[sid] = await push(ctls[sid], content)
                        else:
                            keys[sid] = await incoming(ctls[sid], content)
                    await host.run_until_idle()

                    history = host.history("Ada")
                    dump = json.dumps(history)
                    meta_key = "event_id" if lane == "push" else "message_id"
                    refs: dict[str, list[str]] = {}
                    for sid in ("lobby-a", "lobby-b"):
                        message = stored(host, meta_key, keys[sid])
                        assert message["metadata"]["server_id"] == sid
                        found = stubs(message["blocks"])
                        assert len(found) == 3, message["blocks"]
                        for block in found:
                            assert block["text"].endswith(f" — {provenance} — {FETCH_OFFER}")
                            assert block["text"].startswith(f"[{block['ref_id']}] ")
                        refs[sid] = [b["ref_id"] for b in found]
                        assert message["metadata"]["references"] == refs[sid]
                        # the uri-form image without a disposition is a URL image, not a stub
                        plain = [b for b in message["blocks"] if b.get("type") == "image"]
                        assert plain == [{"type": "image", "uri": uris[sid]["plain"]}]
                        for form in ("resource", "image", "audio"):
                            assert uris[sid][form] not in dump, form
                        assert "reference" not in {b.get("type") for b in message["blocks"]}
                        for ref_id in refs[sid]:
                            assert await bound_to(host, ref_id) == (sid,)
                    assert len(set(refs["lobby-a"] + refs["lobby-b"])) == 6

                    ctl = ctls["lobby-a"]
                    assert await lobby_http(ctl) == []  # nothing was fetched on arrival
                    for sid in ("lobby-a", "lobby-b"):
                        for ref_id, form in zip(
                            refs[sid], ("resource", "image", "audio"), strict=True
                        ):
                            before = len(await lobby_http(ctl))
                            answer = saved(await fetch_reference(host, ref_id))
                            assert answer["path"].startswith(f"refs/{ref_id}.")
                            requests = (await lobby_http(ctl))[before:]
                            assert len(requests) == 1, requests
                            [request] = requests
                            expected = uris[sid][form].removeprefix(http).split("?")[0]
                            assert request["path"] == expected and request["status"] == 200
                            assert request["authorization"] == f"Bearer tok-{sid[-1]}"


async def test_a_context_injection_is_bound_to_the_server_whose_answer_carried_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two hook servers on one origin: h1, listed first, answers with no injection; h2 injects a
    resource (beforeUser), a uri-form image (afterUser) and audio (system), each with a
    disposition. Each stub names h2, offers the fetch and is bound to h2 alone; fetch_reference
    sends h2's token; no uri reaches the model or the store."""
    model = RecordingModel()
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            async with ws_lobby(
                "--files", "--context", "--control-connect", listener.address
            ) as url:
                http = http_of(url)
                servers = [
                    {"id": "h1", "url": f"{url}/h1", "token": "tok-h1"},
                    {
                        "id": "h2",
                        "url": f"{url}/h2",
                        "token": "tok-h2",
                        "enabled_capabilities": GRANT_ALL,
                    },
                ]
                agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
                async with Host.open(config(tmp_path, servers, agents)) as host:
                    ctls = await controls_by_server(host, listener, 2)
                    uris = {
                        "resource": f"{http}/files/notes.txt?injected=resource",
                        "image": f"{http}/files/board.png?injected=image",
                        "audio": f"{http}/files/board.png?injected=audio",
                    }
                    injections = [
                        {
                            "namespace": "refs",
                            "position": "beforeUser",
                            "content": [resource(uris["resource"], NOTES)],
                        },
                        {
                            "namespace": "refs",
                            "position": "afterUser",
                            "content": [media("image", uris["image"], BOARD)],
                        },
                        {
                            "namespace": "refs",
                            "position": "system",
                            "content": [media("audio", uris["audio"], BOARD)],
                        },
                    ]
                    for sid, answer in (("h1", []), ("h2", injections)):
                        mark = ctls[sid].mark()
                        ctls[sid].send({"cmd": "hook", "mode": "answer", "injections": answer})
                        await ctls[sid].wait_for(
                            lambda e: e["event"] == "hook_mode", "hook mode set", since=mark
                        )
                    await host.post_local("Ada", "go")
                    await trace_event(host, lambda e: e.kind == "turn-end", "Ada's turn")
                    await host.run_until_idle()

                    # both were asked; only h2's answer carried anything
                    for sid in ("h1", "h2"):
                        await lobby_http(ctls[sid])  # a round trip: the hook's events are in
                        assert len(received(ctls[sid], "context/beforeInference")) == 1, sid
                    [request] = model.seen
                    shown = texts_of(request)
                    found = [line for t in shown for line in t.splitlines() if REF_ID.match(line)]
                    assert len(found) == 3, shown
                    for text in found:
                        assert text.endswith(f" — injected by h2 before inference — {FETCH_OFFER}")
                    names = {"resource": "notes.txt", "image": "image-board.png"}
                    names["audio"] = "audio-board.png"
                    by_form = {
                        form: next(t for t in found if t.split("] ", 1)[1].startswith(name + " "))
                        for form, name in names.items()
                    }
                    # at each position: the resource before the user's message, the image
                    # after it, the audio at the end of the system prompt
                    placed = [
                        [b["text"] for b in m["blocks"] if b.get("type") == "text"]
                        for m in request.messages
                    ]
                    intro = "[context from h2 · refs]"
                    at = placed.index([intro, by_form["resource"]])
                    assert placed[at + 1][-1] == "go"
                    assert placed[at + 2] == [intro, by_form["image"]]
                    assert len(placed) == at + 3
                    assert request.system.endswith(f"{intro}\n{by_form['audio']}")
                    assert not any("[context from h1" in t or "by h1" in t for t in shown)
                    ref_ids = [ref_of(t) for t in found]
                    everything = json.dumps([shown, host.history("Ada")])
                    for uri in uris.values():
                        assert uri not in everything
                    for ref_id in ref_ids:
                        assert await bound_to(host, ref_id) == ("h2",)

                    ctl = ctls["h1"]
                    assert await lobby_http(ctl) == []
                    for ref_id in ref_ids:
                        before = len(await lobby_http(ctl))
                        saved(await fetch_reference(host, ref_id))
                        requests = (await lobby_http(ctl))[before:]
                        assert [r["authorization"] for r in requests] == ["Bearer tok-h2"]


# ---- 2. an in-process call ---------------------------------------------------------------------


async def test_an_in_process_call_registers_a_success_without_fetching_and_a_failure_not_at_all(
    tmp_path: Path,
) -> None:
    """``Host.execute_tool_call`` of an MCPL tool: a successful result's reference is bound to
    the server (its stub offers the fetch, fetch_reference later dials it) but nothing is
    fetched, though its claimed size is within the eager limit; a failed result keeps only its
    text and registers nothing (the next reference takes the very next id)."""
    with trio.fail_after(60):
        async with tool_server() as tools:
            tools.origin.route("/first.png", Route(body=BOARD.data))
            tools.origin.route("/failed.png", Route(body=BOARD.data))
            tools.origin.route("/next.png", Route(body=BOARD.data))
            servers = [{"id": "tools", "url": tools.url, "token": "tok-tools"}]
            agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
            async with Host.open(config(tmp_path, servers, agents)) as host:
                await trace_event(host, lambda e: e.kind == "ready", "the server ready")
                first = await host.execute_tool_call(
                    "Ada", "tools--give", give_args(tools.origin.url("/first.png"))
                )
                assert first["is_error"] is False
                text, stub = first["content"]
                assert text == {"type": "text", "text": "here you are"}
                assert stub["text"] == (
                    f"[{stub['ref_id']}] board.png — image/png, {BOARD.size}B claimed — "
                    f"from tool result — {FETCH_OFFER}"
                )
                assert await bound_to(host, stub["ref_id"]) == ("tools",)

                failed = await host.execute_tool_call(
                    "Ada", "tools--give", give_args(tools.origin.url("/failed.png"), error=True)
                )
                assert failed == {
                    "is_error": True,
                    "content": [{"type": "text", "text": "it failed"}],
                }
                after = await host.execute_tool_call(
                    "Ada", "tools--give", give_args(tools.origin.url("/next.png"))
                )
                next_id = after["content"][1]["ref_id"]
                assert counter_of(next_id) == counter_of(stub["ref_id"]) + 1
                await host.run_until_idle()
                assert tools.origin.requests == []  # in process: nothing fetched eagerly
                assert [c[0] for c in tools.calls] == ["give"] * 3
                assert host.history("Ada") == []  # an in-process call is not stored

                answer = saved(await fetch_reference(host, stub["ref_id"]))
                assert answer["path"] == f"refs/{stub['ref_id']}.png"
                assert [(r.path, r.authorization) for r in tools.origin.requests] == [
                    ("/first.png", "Bearer tok-tools")
                ]


# ---- 3. fetch_reference through the agent's own dispatch ----------------------------------------


async def test_fetch_reference_by_the_agent_on_origin_off_origin_and_from_an_unknown_server(
    tmp_path: Path,
) -> None:
    """A scripted agent fetches the reference of each push it gets. On the sender's origin: one
    request with that server's token, the file saved under the workspace, the tool result
    naming it. On another origin, and from a stdio server (no address): the exact refusals,
    with nothing dialed."""
    with trio.fail_after(60):
        async with (
            serve_origin() as elsewhere,
            open_control_listener() as ws_listener,
            open_control_listener() as stdio_listener,
            ws_lobby("--files", "--control-connect", ws_listener.address) as url,
        ):
            http = http_of(url)
            elsewhere.route("/board.png", Route(body=BOARD.data))
            servers = [
                {"id": "lobby", "url": url, "token": "tok-lobby"},
                lobby(stdio_listener.address, sid="relay"),
            ]
            agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", FETCH_RULE)}]
            async with Host.open(config(tmp_path, servers, agents)) as host:
                ctl = await ws_listener.accept()
                relay = await stdio_listener.accept()
                await ready(ctl)
                await ready(relay)

                # on the lobby's own origin
                event = await share(ctl, BOARD)
                await host.run_until_idle()
                [stub] = stubs(stored(host, "event_id", event)["blocks"])
                ref_id = stub["ref_id"]
                result = last_tool_result(host)
                assert result["is_error"] is False
                answer = json.loads(result["content"][0]["text"])
                assert answer == {
                    "path": f"refs/{ref_id}.png",
                    "bytes": BOARD.size,
                    "mime_type": "image/png",
                    "digest_verified": True,
                }
                workspace = tmp_path / "data" / "workspace"
                assert (workspace / answer["path"]).read_bytes() == BOARD.data
                [request] = await lobby_http(ctl)
                assert request["path"] == "/files/board.png" and request["status"] == 200
                assert request["authorization"] == "Bearer tok-lobby"

                # on another origin
                await share(ctl, BOARD, uri=elsewhere.url("/board.png"))
                await host.run_until_idle()
                result = last_tool_result(host)
                assert result["is_error"] is True
                assert result["content"] == [
                    {"type": "text", "text": third_party(elsewhere.origin, http)}
                ]

                # from a server the host holds no address for (its uri on the lobby's origin)
                await push(relay, [resource(f"{http}/files/notes.txt", NOTES)])
                await host.run_until_idle()
                result = last_tool_result(host)
                assert result["is_error"] is True
                assert result["content"] == [{"type": "text", "text": "unknown server: relay"}]

                assert elsewhere.requests == []
                assert len(await lobby_http(ctl)) == 1  # still only the first fetch
                assert sorted(p.name for p in (workspace / "refs").iterdir()) == [f"{ref_id}.png"]
                calls = [m for m in host.history("Ada") if m["role"] == "assistant"]
                assert [b["name"] for m in calls for b in m["blocks"]] == ["fetch_reference"] * 3


# ---- 4. two servers delivering one uri ---------------------------------------------------------


@pytest.mark.parametrize("order", ["relay-first", "server-first"])
async def test_the_server_on_the_uris_origin_is_dialed_with_its_token_eager_limit_and_budget(
    tmp_path: Path, order: str
) -> None:
    """A relay (a websocket lobby on its own origin) pushes, twice, a uri on the tool server's
    origin; the tool server delivers it too (in process), in either order. The agent's own call
    then fetches it eagerly through the tool server: with its token, under its eager limit (the
    relay's would refuse), charged to its budget (spent: its next fetch is refused), the relay's
    budget untouched. Each server is listed once, in delivery order."""
    with trio.fail_after(60):
        async with (
            tool_server() as tools,
            open_control_listener() as listener,
            ws_lobby("--files", "--control-connect", listener.address) as relay_url,
        ):
            tools.origin.route("/shared.png", Route(body=BOARD.data))
            tools.origin.route("/other.png", Route(body=BOARD.data))
            shared = tools.origin.url("/shared.png")
            servers = [
                {
                    "id": "relay",
                    "url": relay_url,
                    "token": "tok-relay",
                    "eager_limit_bytes": 1,
                    "fetch_budget_bytes": BOARD.size,
                },
                {
                    "id": "tools",
                    "url": tools.url,
                    "token": "tok-tools",
                    "fetch_budget_bytes": BOARD.size,
                },
            ]
            rules = call_rule("^give$", "tools--give", give_args(shared))
            agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", rules)}]
            async with Host.open(config(tmp_path, servers, agents)) as host:
                relay = await listener.accept()
                await ready(relay)
                await trace_event(
                    host, lambda e: e.kind == "ready" and e.server_id == "tools", "tools ready"
                )
                deliverers = ["relay", "tools"] if order == "relay-first" else ["tools", "relay"]

                async def deliver(uri: str) -> str:
                    """Both servers deliver ``uri`` in ``order`` (the relay twice); its id."""
                    seen: list[str] = []
                    for sid in deliverers:
                        if sid == "relay":
                            for _ in range(2):
                                event = await share(relay, BOARD, uri=uri)
                                await host.run_until_idle()
                                [stub] = stubs(stored(host, "event_id", event)["blocks"])
                                assert stub["text"].endswith(f" — {FETCH_OFFER}")
                                seen.append(stub["ref_id"])
                        else:
                            result = await host.execute_tool_call(
                                "Ada", "tools--give", give_args(uri)
                            )
                            stub = result["content"][1]
                            assert stub["text"].endswith(f" — {FETCH_OFFER}")
                            seen.append(stub["ref_id"])
                    assert len(set(seen)) == 1  # one record for the uri
                    assert await bound_to(host, seen[0]) == tuple(deliverers)  # each once
                    return seen[0]

                ref_id = await deliver(shared)
                assert tools.origin.requests == []

                # the agent's own call: the eager pass dials the tool server
                await host.post_local("Ada", "give")
                await host.run_until_idle()
                result = last_tool_result(host)
                assert result["is_error"] is False
                text = result["content"][1]["text"]
                assert text.startswith(f"[{ref_id}] ")
                assert text.endswith(f" — from tool result — saved: refs/{ref_id}.png")
                path = tmp_path / "data" / "workspace" / "refs" / f"{ref_id}.png"
                assert path.read_bytes() == BOARD.data
                assert [(r.path, r.authorization) for r in tools.origin.requests] == [
                    ("/shared.png", "Bearer tok-tools")
                ]
                assert await bound_to(host, ref_id) == tuple(deliverers)

                # the fetch was charged to the tool server: its budget is spent for the next
                # uri both deliver ...
                other = await deliver(tools.origin.url("/other.png"))
                refused = refusal(await fetch_reference(host, other))
                assert refused == (
                    f"per-server fetch budget exhausted ({BOARD.size}/{BOARD.size} bytes)"
                )
                assert len(tools.origin.requests) == 1
                # ... and the relay's is untouched: a fetch of its own file goes through
                assert await lobby_http(relay) == []
                own = await share(relay, BOARD)
                await host.run_until_idle()
                [stub] = stubs(stored(host, "event_id", own)["blocks"])
                saved(await fetch_reference(host, stub["ref_id"]))
                [request] = await lobby_http(relay)
                assert request["authorization"] == "Bearer tok-relay"


async def test_of_two_servers_on_the_uris_origin_the_first_to_deliver_is_dialed(
    tmp_path: Path,
) -> None:
    """One lobby dialled at /a and /b (two servers, one origin, two tokens). A uri shared by a
    and then b is fetched with a's token; one shared by b and then a, with b's."""
    with trio.fail_after(60):
        async with open_control_listener() as listener:
            async with ws_lobby("--files", "--control-connect", listener.address) as url:
                http = http_of(url)
                servers = [
                    {"id": "a", "url": f"{url}/a", "token": "tok-a"},
                    {"id": "b", "url": f"{url}/b", "token": "tok-b"},
                ]
                agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
                async with Host.open(config(tmp_path, servers, agents)) as host:
                    ctls = await controls_by_server(host, listener, 2)
                    for first, second in (("a", "b"), ("b", "a")):
                        uri = f"{http}/files/board.png?first={first}"
                        ids = []
                        for sid in (first, second):
                            event = await share(ctls[sid], BOARD, uri=uri)
                            await host.run_until_idle()
                            [stub] = stubs(stored(host, "event_id", event)["blocks"])
                            ids.append(stub["ref_id"])
                        assert ids[0] == ids[1]
                        assert await bound_to(host, ids[0]) == (first, second)
                        before = len(await lobby_http(ctls["a"]))
                        saved(await fetch_reference(host, ids[0]))
                        requests = (await lobby_http(ctls["a"]))[before:]
                        assert [r["authorization"] for r in requests] == [f"Bearer tok-{first}"]


async def test_no_server_on_the_origin_first_servers_refusal_and_a_stdio_server_passed_over(
    tmp_path: Path,
) -> None:
    """A stdio server (no address) and a websocket lobby deliver uris on a third origin, in
    either order: the first server's refusal is the answer ("unknown server: relay" when the
    stdio server came first, the origin check's when the lobby did) and nothing is dialed. A uri
    on the lobby's origin that the stdio server delivered first is refused while the stdio
    server is its only one, and fetched through the lobby once the lobby delivers it too."""
    with trio.fail_after(60):
        async with (
            serve_origin() as elsewhere,
            open_control_listener() as ws_listener,
            open_control_listener() as stdio_listener,
            ws_lobby("--files", "--control-connect", ws_listener.address) as url,
        ):
            http = http_of(url)
            servers = [
                {"id": "lobby", "url": url, "token": "tok-lobby"},
                lobby(stdio_listener.address, sid="relay"),
            ]
            agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
            async with Host.open(config(tmp_path, servers, agents)) as host:
                ctl = await ws_listener.accept()
                relay = await stdio_listener.accept()
                await ready(ctl)
                await ready(relay)

                async def deliver(sid: str, uri: str, f: LobbyFile = BOARD) -> str:
                    if sid == "relay":
                        event = await push(relay, [resource(uri, f)])
                    else:
                        event = await share(ctl, f, uri=uri)
                    await host.run_until_idle()
                    [stub] = stubs(stored(host, "event_id", event)["blocks"])
                    assert stub["text"].endswith(f" — {FETCH_OFFER}")
                    return str(stub["ref_id"])

                expected = {
                    ("relay", "lobby"): "unknown server: relay",
                    ("lobby", "relay"): third_party(elsewhere.origin, http),
                }
                for (first, second), message in expected.items():
                    uri = elsewhere.url(f"/{first}-first.png")
                    ref_id = await deliver(first, uri)
                    assert await deliver(second, uri) == ref_id
                    assert await bound_to(host, ref_id) == (first, second)
                    assert refusal(await fetch_reference(host, ref_id)) == message
                assert elsewhere.requests == []

                # a server with no address is passed over once one on the origin delivers
                uri = f"{http}/files/notes.txt"
                ref_id = await deliver("relay", uri, NOTES)
                assert refusal(await fetch_reference(host, ref_id)) == "unknown server: relay"
                assert await lobby_http(ctl) == []
                assert await deliver("lobby", uri, NOTES) == ref_id
                assert await bound_to(host, ref_id) == ("relay", "lobby")
                answer = saved(await fetch_reference(host, ref_id))
                assert answer["path"] == f"refs/{ref_id}.txt"
                [request] = await lobby_http(ctl)
                assert request["path"] == "/files/notes.txt"
                assert request["authorization"] == "Bearer tok-lobby"
                assert elsewhere.requests == []


# ---- 5. the eager pass on an agent's own tool call ----------------------------------------------


async def test_the_eager_pass_fetches_small_references_under_the_servers_eager_limit(
    tmp_path: Path,
) -> None:
    """The agent's own call of a tool whose result carries four references, from a server whose
    eager limit is 100 bytes: one claiming 40 bytes is fetched before the result is stored for
    the model (its stub names the saved file); one claiming 101 is not (the default limit would
    take it); one claiming 40 but sending 150 is abandoned at the limit; one on another origin
    is never fetched, whatever its size."""
    small, liar = b"s" * 40, b"l" * 150
    with trio.fail_after(60):
        async with tool_server() as tools, serve_origin() as elsewhere:
            tools.origin.route(
                "/small.txt", Route(body=small, headers={"Content-Type": "text/plain"})
            )
            tools.origin.route("/large.txt", Route(body=small))
            tools.origin.route("/liar.txt", Route(body=liar))
            elsewhere.route("/far.txt", Route(body=small))
            refs = [
                (tools.origin.url("/small.txt"), 40),
                (tools.origin.url("/large.txt"), 101),
                (tools.origin.url("/liar.txt"), 40),
                (elsewhere.url("/far.txt"), 40),
            ]
            args = {"refs": [{"uri": u, "size": n} for u, n in refs]}
            rules = call_rule("^go$", "tools--give", args)
            servers = [
                {"id": "tools", "url": tools.url, "token": "tok-tools", "eager_limit_bytes": 100}
            ]
            agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", rules)}]
            async with Host.open(config(tmp_path, servers, agents)) as host:
                await trace_event(host, lambda e: e.kind == "ready", "the server ready")
                await host.post_local("Ada", "go")
                await host.run_until_idle()
                result = last_tool_result(host)
                assert result["is_error"] is False
                texts = [b["text"] for b in stubs(result["content"])]
                ids = [ref_of(t) for t in texts]
                assert texts[0].endswith(f" — from tool result — saved: refs/{ids[0]}.txt")
                for text in texts[1:]:
                    assert text.endswith(f" — from tool result — {FETCH_OFFER}")
                path = tmp_path / "data" / "workspace" / "refs" / f"{ids[0]}.txt"
                assert path.read_bytes() == small
                assert sorted((r.path, r.authorization) for r in tools.origin.requests) == [
                    ("/liar.txt", "Bearer tok-tools"),
                    ("/small.txt", "Bearer tok-tools"),
                ]
                assert elsewhere.requests == []
                # only the liar's eager fetch failed; the others were not eligible: never tried
                events = await trace_until(
                    host, lambda e: e.kind == "turn-end" and e.agent == "Ada", "Ada's turn"
                )
                notes = [
                    e.data["text"]
                    for e in events
                    if e.kind == "diagnostic" and e.data.get("text", "").startswith("eager fetch")
                ]
                assert len(notes) == 1, notes
                [note] = notes
                prefix = (
                    f"eager fetch of {ids[2]} failed: aborted: actual bytes exceeded ceiling at "
                )
                assert note.startswith(prefix), notes
                # the stored result is what the model was shown in the round after the call
                rounds = [m["role"] for m in host.history("Ada")]
                assert rounds == ["user", "assistant", "tool"]
