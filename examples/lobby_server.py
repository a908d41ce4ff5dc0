"""A small MCPL server: a chat lobby with two channels, scripted people and push events.

Run it with ``python -m examples.lobby_server [options]`` (``--help`` lists the options).

The lobby is an independent peer for mcplive: it speaks JSON-RPC 2.0 on its own, using only the
standard library, trio and trio_websocket, so that it catches the host's mistakes instead of
sharing them.

* stdio (default): newline-delimited JSON-RPC on stdin/stdout, logs on stderr, exits on stdin EOF.
* ``--ws HOST:PORT``: a websocket server, one JSON-RPC object per text frame; every connection is
  an independent session. ``LISTENING ws://HOST:PORT`` is the first stdout line.
* Ids the lobby makes up (scripted messages ``m1``…, clock events ``e1``…, posts ``out-1``…)
  carry a random tag per process (``--run-id``), e.g. ``k3xq-m1``: a second run's messages are
  new to a host that kept the first run's. The photo Alice shares keeps one id (``share-board``)
  across runs, so a second run shows the host skipping it as already stored.
* ``--control-connect HOST:PORT``: every session dials a test-side control socket and exchanges
  JSON lines with it: events about what the lobby saw, commands telling it what to send
  (see ``examples/lobby_control.py`` for the test side).

Channels: #general and #random declare ``capabilities.publish.target: "root"`` (RFC-011); the
``register`` control command can add channels declaring ``"exact"`` or no target. A
``channels/publish`` request's ``threadId`` is honoured exactly or refused: absent is legacy
(the root, no ``threadId`` in the result), ``null`` is the root of a declared channel, a string
is a thread of an ``exact`` channel that exists (seen on one of the lobby's incoming messages,
or declared by the ``threads`` command). A refusal is the result ``{delivered: false, reason}``
with nothing posted; a publish notification carrying ``threadId`` is refused as a problem. The
``publish_echo_thread`` command makes results omit or falsify their ``threadId`` echo. Echoes of
posts in a thread carry its id. A post is logged and echoed under the agent that spoke: the
author an ``"agent:<name>"`` ``conversationId`` names (``publish_author``), else the host's
own account. ``channels/outgoing/chunk``/``complete`` (``channels.streaming``)
and ``channels/typing`` notifications are checked (known channel; one index counter per
inference, from 0; one complete per inferenceId and channel; ``threadId`` only on a channel with
a declared target); each complete reports the streamed text as a ``streamed`` control event.
``--open-mode never`` (or the ``open_mode`` command) leaves ``channels/open`` unanswered.
``--channels N`` registers N more channels once ready (``lobby:#c1`` … ``lobby:#cN``, label
``cN``), in ``channels/register`` requests of at most 100, and reports how many the host
accepted (and why it refused the others) as a ``channels`` control event.

Opt-in features, each adding one feature set to the manifest:

* ``--context``: ``lobby.context`` answers ``context/beforeInference`` with a short status line
  and watches ``inference/lifecycle``.
* ``--assist``: ``lobby.assist`` asks the host for inferences (``inference/request``, streamed or
  not) and for ``model/info``, when the control socket tells it to.
* ``--notes``: ``lobby.notes`` adds a ``note`` tool whose results carry checkpoints, and answers
  ``state/rollback``.

``--files`` (with ``--ws``): the websocket port also answers plain HTTP/1.1 ``GET /files/<name>``
for a small built-in set of files (``board.png``, ``notes.txt``), so the lobby can hand the host
references (RFC-005 ``resource`` content blocks) on its own origin. Each connection's request
head is read first: a websocket upgrade is replayed to trio_websocket and becomes a session as
usual, anything else gets one HTTP answer and is closed. The ``share`` control command (and,
in the default script, Alice) sends a ``push/event`` carrying such a reference; every HTTP
request served is reported to the live sessions' control sockets as an ``http`` event.

Event coalescing (RFC-006): the host's ``capabilities.experimental.mcpl.eventCoalescing`` in
``initialize`` (``true`` or an object of leaves) is recorded and reported as a ``coalescing``
control event. The ``push``, ``share``, ``incoming`` (with an ``eventId``) and ``incoming_batch``
commands may carry a ``coalesce`` member; it is sent only if the host advertised every leaf it
uses (the lane's ``pushEvents``/``channelsIncoming``, ``deferred``, ``channelScopedPush`` for a
``channelId``), else the event goes out without it (a ``coalesce_withheld`` event), unless the
command says ``"force": true``. ``push/render`` requests are checked (advertised, granted, known
channel, key, notices oldest first ending with the latest ``eventId``, integer ``dropped``) and
answered as the ``render_mode`` command says: ``result`` (the default: the given content, or a
text such as ``2 updates: {"n":1}, {"n":2}; 0 dropped``), ``empty``, ``error`` (-32603),
``never``, or ``slow`` (the result after ``delaySeconds``); each is reported as a ``render``
event. The lobby never sends ``inference/request`` while handling a render. The coalesce
outcome in the host's answers is logged; an admitted coalesced occurrence whose answer lacks
one (on a lane the host advertised) is a problem.
"""

from __future__ import annotations

import copy
import datetime as dt
import hmac
import itertools
import json
import math
import os
import random
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import trio
import trio_websocket

from examples.lobby_link import (
    ControlLink,
    InputError,
    _open_control,
)
from examples.lobby_options import (  # noqa: F401
    RUN_ID_ALPHABET,
    RUN_ID_CHARS,
    LobbyOptions,
    _host_port_arg,
    _positive_float,
    build_parser,
    display_host,
    new_run_id,
    parse_args,
    split_host_port,
)
from examples.lobby_words import (  # noqa: F401
    AGENT_PREFIX,
    ASSIST_FEATURE_SET,
    CHANNEL_OPEN_FAILED,
    CHECKPOINT_NOT_FOUND,
    CHIME,
    COALESCE_LEAVES,
    COALESCE_OUTCOMES,
    DEFAULT_INJECTIONS,
    DEFAULT_RENDER_DELAY,
    ECHO_THREAD_MODES,
    FINISH_REASONS,
    HOOK_FEATURE_SET,
    HOOK_MODES,
    HOOK_PATHS,
    HOST_AUTHOR,
    INFER_FIRST_MESSAGES,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIFECYCLE_PHASES,
    MAX_AGENT_NAME_CHARS,
    MAX_COALESCE_KEY_BYTES,
    MAX_LINE_BYTES,
    MAX_RETRIES,
    MAX_TRACKED,
    MCPL_METHODS,
    METHOD_NOT_FOUND,
    MIN_RETRY_WINDOW_MS,
    MODES,
    NOT_READY,
    NOTES_FEATURE_SET,
    NOTES_TXT,
    OPEN_MODES,
    PEOPLE,
    PROTOCOL_VERSION,
    PUBLISH_TARGETS,
    REGISTER_CHUNK,
    RENDER_MODES,
    RETRIED_METHODS,
    RETRY_DELAY,
    ROLLBACK_MODES,
    SCRIPT_LINES,
    SERVER_NAME,
    SERVER_VERSION,
    SHARE_EVENT_ID,
    SHARE_FILE,
    SHARE_TEXT,
    UNKNOWN_CHANNEL,
    UNKNOWN_FEATURE_SET,
    LobbyFile,
    _fold,
    _png,
    builtin_files,
    channel_descriptor,
    channel_label,
    digest_of,
    dumps,
    log,
    now_iso,
    publish_author,
    publish_target,
    read_coalescing,
    read_timestamp,
    render_summary,
    short,
    text_of,
    valid_id,
    valid_thread,
)

FEATURE_SETS: dict[str, dict[str, Any]] = {
    "lobby.chat": {
        "description": "Chat in the lobby channels #general and #random.",
        "uses": [
            "channels.register",
            "channels.publish",
            "channels.incoming",
            "channels.lifecycle",
            "channels.streaming",
            "channels.typing",
        ],
    },
    "lobby.events": {
        "description": "Ambient lobby events, such as the clock chiming.",
        "uses": ["pushEvents"],
    },
}

# Feature sets that only exist when their command-line flag is given (LobbyOptions field name).
OPTIONAL_FEATURE_SETS: dict[str, tuple[str, dict[str, Any]]] = {
    "lobby.context": (
        "context",
        {
            "description": "Lobby status (who is online, the current topic) before each inference.",
            "uses": [
                "contextHooks.beforeInference.observe",
                "contextHooks.beforeInference.inject.beforeUser",
                "contextHooks.beforeInference.inject.afterUser",
                "inferenceLifecycle",
            ],
        },
    ),
    "lobby.assist": (
        "assist",
        {
            "description": "The lobby asks the host's model for help, e.g. to summarize the chat.",
            "uses": ["inferenceRequest", "inferenceRequest.streaming", "modelInfo"],
        },
    ),
    "lobby.notes": (
        "notes",
        {
            "description": "A shared lobby notebook; every note is a checkpoint to roll back to.",
            "uses": ["tools"],
            "rollback": True,
        },
    ),
}


def feature_sets(options: LobbyOptions) -> dict[str, dict[str, Any]]:
    """The declared feature sets: the two default ones plus those the flags switch on."""
    sets = dict(FEATURE_SETS)
    for name, (flag, decl) in OPTIONAL_FEATURE_SETS.items():
        if getattr(options, flag):
            sets[name] = decl
    return sets


def manifest(options: LobbyOptions) -> dict[str, Any]:
    declared = feature_sets(options)
    feature_sets_value: Any
    if options.feature_sets_form == "array":
        feature_sets_value = [
            {"name": name, **copy.deepcopy(decl)} for name, decl in declared.items()
        ]
        version = "0.4"
    else:
        feature_sets_value = {name: copy.deepcopy(decl) for name, decl in declared.items()}
        version = "0.5"
    result: dict[str, Any] = {
        "version": version,
        "pushEvents": True,
        "channels": {
            "register": True,
            "publish": True,
            "incoming": True,
            "lifecycle": True,
            "streaming": True,
            "typing": True,
        },
    }
    if options.context:
        result["contextHooks"] = {
            "beforeInference": {
                "observe": True,
                "inject": {"system": True, "beforeUser": True, "afterUser": True},
            }
        }
        result["inferenceLifecycle"] = True
    if options.assist:
        result["inferenceRequest"] = {"streaming": True}
        result["modelInfo"] = True
    result["featureSets"] = feature_sets_value
    return result


def path_matches(pattern: str, path: str) -> bool:
    """A granted pattern covers a path: equal segment counts, ``*`` is one whole segment."""
    pat, segs = pattern.split("."), path.split(".")
    return len(pat) == len(segs) and all(p in ("*", s) for p, s in zip(pat, segs, strict=True))


def is_granted(granted: list[str], path: str) -> bool:
    return any(path_matches(p, path) for p in granted)


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_json(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


NO_REPLY = object()  # a handler result meaning "deliberately never answer"
LEGACY = object()  # a publish without threadId: lands at the channel root, no echo of a place


class TransportClosed(Exception):
    pass


# --------------------------------------------------------------------------------------------
# transports


class StdioTransport:
    """Newline-delimited JSON-RPC on a pair of trio streams (stdin/stdout in production)."""

    kind = "stdio"

    def __init__(self, receive_stream: trio.abc.ReceiveStream, send_stream: trio.abc.SendStream):
        self._in = receive_stream
        self._out = send_stream
        self._buf = bytearray()
        self._scan_from = 0
        self._discarding = False
        self._eof = False

    async def receive(self) -> str | None:
        """The next non-blank line, None at EOF; raises InputError for an unreadable one."""
        while True:
            nl = self._buf.find(b"\n", self._scan_from)
            if nl >= 0:
                raw = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                self._scan_from = 0
                if self._discarding:
                    self._discarding = False
                    continue
                line = self._decode(raw)
                if line.strip():
                    return line
                continue
            if self._eof:
                if self._buf and not self._discarding:
                    raw = bytes(self._buf)
                    self._buf.clear()
                    line = self._decode(raw)
                    if line.strip():
                        return line
                return None
            self._scan_from = len(self._buf)
            if len(self._buf) > MAX_LINE_BYTES:
                size = len(self._buf)
                self._buf.clear()
                self._scan_from = 0
                if not self._discarding:
                    self._discarding = True
                    raise InputError(f"line longer than {MAX_LINE_BYTES} bytes ({size}+), skipped")
            try:
                data = await self._in.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                self._eof = True
            else:
                self._buf += data

    @staticmethod
    def _decode(raw: bytes) -> str:
        try:
            return raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            raise InputError(f"line is not UTF-8 ({exc}): {short(repr(raw))}") from None

    async def send(self, text: str) -> None:
        try:
            await self._out.send_all((text + "\n").encode("utf-8"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportClosed(str(exc)) from exc


class WsTransport:
    """One JSON-RPC object per websocket text frame; binary frames are ignored."""

    kind = "ws"

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self._ws = ws

    async def receive(self) -> str | None:
        while True:
            try:
                message = await self._ws.get_message()
            except trio_websocket.ConnectionClosed:
                return None
            if isinstance(message, str):
                if message.strip():
                    return message
                continue
            log(f"ignoring a binary frame of {len(message)} bytes")

    async def send(self, text: str) -> None:
        try:
            await self._ws.send_message(text)
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(repr(exc)) from exc


# --------------------------------------------------------------------------------------------


class _NoControl:
    def emit(self, event: dict[str, Any]) -> None:
        pass


# --------------------------------------------------------------------------------------------
# files (--files): plain HTTP downloads on the websocket port

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT = 30.0  # seconds for a connection to send its request head
WS_HANDSHAKE_TIMEOUT = 60.0  # as trio_websocket.serve_websocket's connect timeout
WS_CLOSE_TIMEOUT = 60.0  # as its disconnect timeout


class LobbyFiles:
    """The files one websocket listener serves, its origin, and the controls to report to."""

    def __init__(self, base_url: str, files: dict[str, LobbyFile] | None = None) -> None:
        self.base_url = base_url  # e.g. http://127.0.0.1:8765, no trailing slash
        self.files = files if files is not None else builtin_files()
        self.controls: set[ControlLink] = set()  # of the live sessions

    def url(self, name: str) -> str:
        return f"{self.base_url}/files/{name}"

    def reference(self, name: str, uri: str | None = None) -> dict[str, Any]:
        """The ``resource`` content block for one of our files; KeyError if unknown."""
        f = self.files[name]
        return {
            "type": "resource",
            "uri": uri if uri is not None else self.url(name),
            "mimeType": f.mime_type,
            "sizeBytes": f.size,
            "digest": f.digest,
            "name": f.name,
        }

    def emit(self, event: dict[str, Any]) -> None:
        for control in list(self.controls):
            control.emit(event)


class ReplayStream(trio.abc.Stream):
    """A stream whose first reads return bytes already taken from the wrapped one."""

    def __init__(self, stream: trio.SocketStream, buffered: bytes) -> None:
        self.stream = stream
        self._buffered = bytearray(buffered)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._buffered:
            await trio.lowlevel.checkpoint()
            n = len(self._buffered) if max_bytes is None else max_bytes
            data = bytes(self._buffered[:n])
            del self._buffered[:n]
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()

    def __repr__(self) -> str:  # trio_websocket shows it as the request's remote end
        try:
            addr, port, *_ = self.stream.socket.getpeername()
        except OSError:
            return "<closed connection>"
        return f"{addr}:{port}"


class RequestHead:
    """The request line and headers of one HTTP/1.1 request."""

    def __init__(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise ValueError(f"bad request line {short(lines[0])}")
        self.method, self.target, self.version = parts
        self.headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ValueError(f"bad header line {short(line)}")
            self.headers.append((name.lower(), value.strip()))

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def path(self) -> str:
        target = self.target.partition("?")[0].partition("#")[0]
        if "://" in target:  # absolute-form
            target = "/" + target.partition("://")[2].partition("/")[2]
        return target

    def is_websocket_upgrade(self) -> bool:
        return any(
            key == "upgrade" and "websocket" in [t.strip().lower() for t in value.split(",")]
            for key, value in self.headers
        )


async def read_head(stream: trio.abc.ReceiveStream) -> tuple[bytes, bytes | None]:
    """Everything read so far, and the request head (None: too long, or the peer went away)."""
    buf = bytearray()
    while True:
        end = buf.find(b"\r\n\r\n")
        if 0 <= end <= MAX_HEAD_BYTES:
            return bytes(buf), bytes(buf[:end])
        if end > MAX_HEAD_BYTES or len(buf) > MAX_HEAD_BYTES:
            return bytes(buf), None
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        if not data:
            return bytes(buf), None
        buf += data


def http_response(
    status: int, reason: str, body: bytes, headers: list[tuple[str, str]] | None = None
) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers or ()]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


REASONS = {400: "Bad Request", 431: "Request Header Fields Too Large"}


async def answer_http(
    stream: trio.SocketStream,
    head: RequestHead | None,
    files: LobbyFiles,
    label: str,
    *,
    refuse: int = 431,
) -> None:
    """Answer one plain HTTP request and report it; without a head, refuse it (400 or 431)."""
    if head is None:
        status, reason, body, headers = refuse, REASONS[refuse], b"", []
        method = path = authorization = None
    else:
        method, path = head.method, head.path
        authorization = head.header("authorization")
        name = path.removeprefix("/files/") if path.startswith("/files/") else None
        headers = []
        if method != "GET":
            status, reason, body = 405, "Method Not Allowed", b"only GET\n"
            headers.append(("Allow", "GET"))
        elif name is None or name not in files.files:
            status, reason, body = 404, "Not Found", b"no such file\n"
        else:
            f = files.files[name]
            status, reason, body = 200, "OK", f.data
            headers.append(("Content-Type", f.mime_type))
    if status != 200:
        headers.append(("Content-Type", "text/plain"))
    log(f"{label}: HTTP {method} {path} -> {status} (authorization: {short(authorization)})")
    files.emit(
        {
            "event": "http",
            "method": method,
            "path": path,
            "status": status,
            "authorization": authorization,
        }
    )
    try:
        await stream.send_all(http_response(status, reason, body, headers))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        log(f"{label}: HTTP answer not sent: {exc!r}")


# --------------------------------------------------------------------------------------------
# the session


class _Pending:
    __slots__ = ("done", "response")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: dict[str, Any] | None = None


class _OutStream:
    """One (inferenceId, channelId) pair of channels/outgoing/*: its deltas and its place."""

    __slots__ = ("completed", "deltas", "thread")

    def __init__(self, thread: Any) -> None:
        self.deltas: list[str] = []
        self.thread = thread  # the first message's threadId, LEGACY when it had none
        self.completed = False


class Session:
    """One connection to a host: the lobby's whole conversation with it."""

    def __init__(
        self,
        transport: StdioTransport | WsTransport,
        options: LobbyOptions,
        control: ControlLink | None = None,
        label: str = "",
        files: LobbyFiles | None = None,
    ) -> None:
        self.transport = transport
        self.options = options
        self.files = files  # --files: what the listener serves over plain HTTP
        self.control: ControlLink | _NoControl = control or _NoControl()
        self._control_link = control
        self.label = label
        self.manifest_override: dict[str, Any] | None = None  # set by the "manifest" command
        self.fsu_mode_override: str | None = None  # set by the "fsu_mode" command
        self.initialized = False  # the initialize request was answered
        self.got_initialized = False  # notifications/initialized arrived
        self.ready = False
        self.hung = False
        self._awaiting_initialized = False
        self.granted: list[str] | None = None  # effectiveCapabilities of the last update
        self.channels: dict[str, dict[str, Any]] = {
            d["id"]: d for d in (channel_descriptor("general"), channel_descriptor("random"))
        }
        self.open_channels: set[str] = set(self.channels)
        # RFC-011: the threads each channel has (seen on our incoming messages or declared by
        # the "threads" command), and how a publish result echoes the threadId it honoured
        self.threads: dict[str, set[str]] = {}
        self.echo_thread_mode = "echo"  # set by the "publish_echo_thread" command
        self.open_mode = options.open_mode  # set by the "open_mode" command
        # channels/outgoing/*: the next chunk index per inference (one counter across all
        # channels) and the stream of each (inferenceId, channelId) pair
        self._next_index: dict[str, int] = {}
        self._out_streams: dict[tuple[str, str], _OutStream] = {}
        self._pending: dict[int | str, _Pending] = {}
        self._next_id = 1
        self._out_counter = itertools.count(1)
        self._msg_counter = itertools.count(1)
        self._event_counter = itertools.count(1)
        self._share_counter = itertools.count(1)
        self._out_send, self._out_recv = trio.open_memory_channel[str](math.inf)
        self._followups: list[Callable[[], object]] = []  # run right after the current reply
        self._tasks: trio.Nursery | None = None
        self._work_scope: trio.CancelScope | None = None
        self._current_rid: Any = None  # the id of the request being handled
        # --context: how hooks are answered (the "hook" command) and the lifecycle seen so far
        self.hook_mode = "answer"
        self.hook_injections: list[Any] | None = None  # None: DEFAULT_INJECTIONS
        self.hook_feature_set = HOOK_FEATURE_SET
        self._inferences: dict[str, str] = {}  # inferenceId -> "started" | "ended"
        # --assist: our streaming inference/request ids -> chunks received so far
        self._streams: dict[int | str, list[Any]] = {}
        # --notes: the notebook, a checkpoint tree
        self.checkpoints: dict[str, dict[str, Any]] = {}  # name -> {"parent", "notes"}
        self.current_checkpoint: str | None = None
        self.rollback_mode = "exact"  # set by the "rollback_mode" command
        self._checkpoint_counter = itertools.count(1)
        # RFC-006: the host's eventCoalescing advertisement (as sent, and as leaves) and how
        # push/render requests are answered (the "render_mode" command)
        self.coalescing_advertised: Any = None
        self.coalescing, _ = read_coalescing(None)
        self.render_mode = "result"
        self.render_content: list[Any] | None = None  # None: a summary of the notices
        self.render_delay = DEFAULT_RENDER_DELAY

    # ---- logging ---------------------------------------------------------------------------------

    def log(self, text: str) -> None:
        log(f"{self.label}: {text}" if self.label else text)

    def problem(self, text: str) -> None:
        """Something the host did wrong (or that went wrong here): stderr plus a control event."""
        self.log(f"ERROR: {text}")
        self.control.emit({"event": "error", "text": text})

    # ---- structure -------------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as outer:
            commands = trio.CancelScope()
            if self._control_link is not None:
                outer.start_soon(self._control_writer)
                outer.start_soon(self._control_reader, commands)
            await self._work()
            if self.hung:
                await trio.sleep_forever()
            commands.cancel()
            if self._control_link is not None:
                self._control_link.finish()  # the last events still go out
            outer.cancel_scope.deadline = trio.current_time() + 1.0

    async def _control_writer(self) -> None:
        assert self._control_link is not None
        await self._control_link.run_writer()

    async def _work(self) -> None:
        async with trio.open_nursery() as work:
            self._work_scope = work.cancel_scope
            work.start_soon(self._writer)
            async with trio.open_nursery() as tasks:
                self._tasks = tasks
                await self._reader()
                tasks.cancel_scope.cancel()
            self._tasks = None
            # The host closed its side: let whatever is queued reach it, briefly.
            self._out_send.close()
            work.cancel_scope.deadline = trio.current_time() + 2.0

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._tasks is not None:
            self._tasks.start_soon(fn, *args)

    async def _writer(self) -> None:
        async for text in self._out_recv:
            try:
                await self.transport.send(text)
            except TransportClosed as exc:
                self.log(f"transport closed while writing: {exc}")
                if self._work_scope is not None:
                    self._work_scope.cancel()
                return

    async def _reader(self) -> None:
        while True:
            try:
                text = await self.transport.receive()
            except InputError as exc:
                self.problem(str(exc))
                continue
            if text is None:
                self.log("the host closed the connection")
                return
            try:
                message = json.loads(text)
            except (ValueError, RecursionError) as exc:
                self.problem(f"malformed JSON from the host ({exc!r}): {short(text)}")
                continue
            try:
                self.on_message(message)
            except Exception as exc:  # never die on bad input
                self.problem(f"internal error handling {short(message)}: {exc!r}")
            # Let the writer and the request tasks run between lines of a burst.
            await trio.lowlevel.checkpoint()

    # ---- output ----------------------------------------------------------------------------------

    def send_line(self, text: str) -> None:
        try:
            self._out_send.send_nowait(text)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def send(self, message: Any) -> None:
        self.send_line(dumps(message))

    def reply(self, rid: Any, result: Any) -> None:
        self.send({"jsonrpc": "2.0", "id": rid, "result": result})

    def reply_error(self, rid: Any, error: RpcError) -> None:
        self.send({"jsonrpc": "2.0", "id": rid, "error": error.to_json()})

    # ---- dispatch --------------------------------------------------------------------------------

    def on_message(self, msg: Any) -> None:
        self.control.emit({"event": "received", "message": msg})
        if self._awaiting_initialized:
            self._awaiting_initialized = False
            is_initialized = (
                isinstance(msg, dict)
                and msg.get("method") == "notifications/initialized"
                and "id" not in msg
            )
            if not is_initialized:
                self.problem(
                    "expected notifications/initialized right after initialize, got " + short(msg)
                )
        if isinstance(msg, list):
            self.problem("JSON-RPC batches are not supported: " + short(msg))
            self.reply_error(None, RpcError(INVALID_REQUEST, "Batches are not supported"))
            return
        if not isinstance(msg, dict):
            self.problem("not a JSON-RPC object: " + short(msg))
            self.reply_error(None, RpcError(INVALID_REQUEST, "Invalid Request"))
            return
        has_id = "id" in msg
        if msg.get("jsonrpc") != "2.0":
            self.problem('message without "jsonrpc": "2.0": ' + short(msg))
            if has_id and "method" in msg:
                rid = msg["id"] if valid_id(msg["id"]) else None
                self.reply_error(rid, RpcError(INVALID_REQUEST, 'jsonrpc must be "2.0"'))
            return
        if "method" in msg:
            method = msg["method"]
            if not isinstance(method, str):
                self.problem("method is not a string: " + short(msg))
                if has_id:
                    rid = msg["id"] if valid_id(msg["id"]) else None
                    self.reply_error(rid, RpcError(INVALID_REQUEST, "method must be a string"))
                return
            if has_id:
                if not valid_id(msg["id"]):
                    self.problem("request id must be a string or an integer: " + short(msg))
                    self.reply_error(None, RpcError(INVALID_REQUEST, "Invalid request id"))
                    return
                self.on_request(msg)
            else:
                self.on_notification(msg)
        elif has_id and ("result" in msg or "error" in msg):
            self.on_response(msg)
        else:
            self.problem("neither a request, a notification nor a response: " + short(msg))
            if has_id and valid_id(msg["id"]):
                self.reply_error(msg["id"], RpcError(INVALID_REQUEST, "Invalid Request"))

    def on_request(self, msg: dict[str, Any]) -> None:
        method: str = msg["method"]
        rid = msg["id"]
        params = msg.get("params", {})
        if not self.initialized and method not in ("initialize", "ping"):
            self.problem(f"{method} request before initialize")
        try:
            if self.options.mcp_only and method in MCPL_METHODS:
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
            handler = self.REQUEST_HANDLERS.get(method)
            if handler is None:
                self.log(f"unknown method {method!r} -> -32601")
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            self._current_rid = rid
            result = handler(self, params)
        except RpcError as err:
            self._followups.clear()
            self.reply_error(rid, err)
            return
        if result is not NO_REPLY:
            self.reply(rid, result)
        self._run_followups()

    def _run_followups(self) -> None:
        followups, self._followups = self._followups, []
        for followup in followups:
            followup()

    def on_notification(self, msg: dict[str, Any]) -> None:
        method: str = msg["method"]
        params = msg.get("params") or {}
        if not isinstance(params, dict):
            self.problem(f"{method} notification with non-object params: {short(msg)}")
            return
        if method == "notifications/initialized":
            self._on_initialized()
        elif method == "notifications/cancelled":
            self.log(f"host cancelled request {params.get('requestId')!r}")
        elif self.options.mcp_only and method in MCPL_METHODS:
            self.log(f"ignoring MCPL notification {method} (--mcp-only)")
        elif method == "featureSets/update":
            self._on_fsu_notification(params)
        elif method == "channels/publish":
            self._on_publish_notification(params)
        elif method == "inference/lifecycle":
            self._on_lifecycle(params)
        elif method == "inference/chunk":
            self._on_chunk(params)
        elif method == "channels/outgoing/chunk":
            self._on_outgoing_chunk(params)
        elif method == "channels/outgoing/complete":
            self._on_outgoing_complete(params)
        elif method == "channels/typing":
            self._on_typing(params)
        else:
            self.log(f"ignoring notification {method}")

    def on_response(self, msg: dict[str, Any]) -> None:
        rid = msg["id"]
        slot = self._pending.pop(rid, None) if valid_id(rid) else None
        if slot is None:
            self.problem("response to an unknown request id: " + short(msg))
            return
        if "result" in msg and "error" in msg:
            self.problem("response with both result and error: " + short(msg))
        err = msg.get("error")
        if "error" in msg and not (
            isinstance(err, dict) and type(err.get("code")) is int and "message" in err
        ):
            self.problem("malformed error object: " + short(msg))
        slot.response = msg
        slot.done.set()

    # ---- handshake -------------------------------------------------------------------------------

    def _initialize(self, params: dict[str, Any]) -> Any:
        if self.initialized:
            self.problem("initialize received twice")
            raise RpcError(INVALID_REQUEST, "Already initialized")
        if not isinstance(params.get("protocolVersion"), str):
            self.problem("initialize without a protocolVersion: " + short(params))
        client = params.get("clientInfo")
        caps = params.get("capabilities")
        host_mcpl = None
        if isinstance(caps, dict) and isinstance(caps.get("experimental"), dict):
            host_mcpl = caps["experimental"].get("mcpl")
        self.log(f"initialize from {short(client)}; host manifest: {short(host_mcpl)}")
        self._record_coalescing(host_mcpl)
        self.initialized = True
        self._awaiting_initialized = True
        capabilities: dict[str, Any] = {"tools": {}}
        if not self.options.mcp_only:
            capabilities["experimental"] = {"mcpl": manifest(self.options)}
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": capabilities,
            "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
        }

    def _record_coalescing(self, host_mcpl: Any) -> None:
        """Keep the host's RFC-006 advertisement; the coalesce members we may send follow it."""
        advertised = host_mcpl.get("eventCoalescing") if isinstance(host_mcpl, dict) else None
        self.coalescing_advertised = advertised
        self.coalescing, problems = read_coalescing(advertised)
        for text in problems:
            self.problem(f"initialize: {text}")
        on = [leaf for leaf in COALESCE_LEAVES if self.coalescing[leaf]]
        self.log(f"event coalescing advertised: {', '.join(on) or 'nothing'}")
        self.control.emit(
            {"event": "coalescing", "advertised": advertised, "leaves": dict(self.coalescing)}
        )

    def _on_initialized(self) -> None:
        if self.got_initialized:
            self.problem("notifications/initialized received twice")
            return
        self.got_initialized = True
        self.log("client initialized")
        if self.options.stray_stdout:
            if self.transport.kind == "stdio":
                self.send_line("[lobby] client initialized")
            else:
                self.log("--stray-stdout only applies to stdio")
        if self.options.mcp_only:
            self._become_ready()

    def _check_update(self, params: dict[str, Any]) -> None:
        for key in ("effectiveCapabilities", "deniedCapabilities", "enabled", "disabled"):
            value = params.get(key)
            if value is not None and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                raise RpcError(INVALID_PARAMS, f"{key} must be an array of strings")
        both = set(params.get("effectiveCapabilities") or ()) & set(
            params.get("deniedCapabilities") or ()
        )
        if both:
            raise RpcError(INVALID_PARAMS, f"paths both granted and denied: {sorted(both)}")

    def _receipt(self, params: dict[str, Any]) -> dict[str, Any]:
        granted = list(params.get("effectiveCapabilities") or [])
        enabled = params.get("enabled")
        disabled = set(params.get("disabled") or ())
        unavailable = []
        for name, decl in feature_sets(self.options).items():
            if name in disabled or (enabled is not None and name not in enabled):
                continue  # the host chose that; not a degradation
            missing = [u for u in decl["uses"] if not is_granted(granted, u)]
            if missing:
                unavailable.append(
                    {"featureSet": name, "missingCapabilities": missing, "effect": "disabled"}
                )
        receipt: dict[str, Any] = {"accepted": True}
        if unavailable:
            receipt["mode"] = "degraded"
            receipt["unavailableFeatures"] = unavailable
        return receipt

    def _feature_sets_update(self, params: dict[str, Any]) -> Any:
        mode = self.fsu_mode_override or self.options.fsu_mode
        if mode == "notification-only":
            self.log("featureSets/update request refused (--fsu-mode notification-only)")
            raise RpcError(METHOD_NOT_FOUND, "Method not found: featureSets/update")
        try:
            self._check_update(params)
        except RpcError as err:
            self.problem(f"malformed featureSets/update: {err.message}")
            raise
        self.granted = list(params.get("effectiveCapabilities") or [])
        self.log(f"featureSets/update request: granted {self.granted}")
        self._followups.append(self._become_ready)
        if mode == "never":
            self.log("not answering featureSets/update (--fsu-mode never)")
            return NO_REPLY
        return self._receipt(params)

    def _on_fsu_notification(self, params: dict[str, Any]) -> None:
        try:
            self._check_update(params)
        except RpcError as err:
            self.problem(f"malformed featureSets/update notification: {err.message}")
            return
        if "effectiveCapabilities" in params:
            self.granted = list(params["effectiveCapabilities"])
        self.log(f"featureSets/update notification: {short(params)}")
        self._become_ready()

    def _become_ready(self) -> None:
        if self.ready:
            return
        self.ready = True
        self.log("ready")
        self.control.emit({"event": "ready"})
        lobby = [channel_descriptor("general"), channel_descriptor("random")]
        self.request("channels/register", {"channels": lobby})
        if self.options.channels > 0:
            self._register_extra(self.options.channels)
        if self.options.effective_script == "default":
            self.spawn(self._script)

    def _register_extra(self, count: int) -> None:
        """Register ``count`` more channels, in requests of at most ``REGISTER_CHUNK``; once
        every one is answered, report the outcome as a ``channels`` control event."""
        extra = [channel_descriptor(f"c{i}") for i in range(1, count + 1)]
        for desc in extra:
            self.channels[desc["id"]] = desc
        chunks = [extra[i : i + REGISTER_CHUNK] for i in range(0, count, REGISTER_CHUNK)]
        outcome: dict[str, Any] = {"accepted": 0, "refused": [], "answered": 0}

        def answered(response: dict[str, Any] | None) -> None:
            result = (response or {}).get("result")
            for entry in result.get("results", []) if isinstance(result, dict) else []:
                if isinstance(entry, dict) and entry.get("accepted") is True:
                    outcome["accepted"] += 1
                elif isinstance(entry, dict):
                    outcome["refused"].append(
                        {"id": entry.get("id"), "reason": entry.get("reason")}
                    )
            outcome["answered"] += 1
            if outcome["answered"] == len(chunks):
                self.log(f"{outcome['accepted']} of {count} extra channels registered")
                event = {"event": "channels", "accepted": outcome["accepted"]}
                self.control.emit({**event, "refused": outcome["refused"]})

        for chunk in chunks:
            self.request("channels/register", {"channels": chunk}, on_answer=answered)

    def allows(self, path: str) -> bool:
        return self.granted is None or is_granted(self.granted, path)

    # ---- requests from the host ------------------------------------------------------------------

    def _ping(self, params: dict[str, Any]) -> Any:
        return {}

    def _mcpl_manifest(self, params: dict[str, Any]) -> Any:
        if self.manifest_override is not None:
            return self.manifest_override
        return manifest(self.options)

    def _tools_list(self, params: dict[str, Any]) -> Any:
        if self.options.notes:
            return {"tools": [*TOOLS, NOTE_TOOL]}
        return {"tools": TOOLS}

    def _tools_call(self, params: dict[str, Any]) -> Any:
        name = params.get("name")
        args = params.get("arguments")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise RpcError(INVALID_PARAMS, "arguments must be an object")
        if name == "forecast":
            city = args.get("city")
            if not isinstance(city, str) or not city.strip():
                raise RpcError(INVALID_PARAMS, "forecast needs a city (string)")
            text = f"Forecast for {city}: sunny, 21°C"
        elif name == "roll":
            sides = args.get("sides", 6)
            if type(sides) is not int or not 1 <= sides <= 1_000_000:
                raise RpcError(INVALID_PARAMS, "roll needs sides: an integer from 1 to 1000000")
            text = str(random.randint(1, sides))
        elif name == "stall":
            self.log("stall called: never answering")
            return NO_REPLY
        elif name == "note" and self.options.notes:
            return self._note(params, args)
        else:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name!r}")
        self.log(f"tool {name}({short(args)}) -> {text}")
        return {"content": [{"type": "text", "text": text}], "isError": False}

    # ---- lobby.notes: the notebook ---------------------------------------------------------------

    def _current_notes(self) -> list[str]:
        if self.current_checkpoint is None:
            return []
        return list(self.checkpoints[self.current_checkpoint]["notes"])

    def _new_checkpoint(self, parent: str | None, notes: list[str], cause: str) -> str:
        name = f"cp-{next(self._checkpoint_counter)}"
        self.checkpoints[name] = {"parent": parent, "notes": list(notes)}
        self.current_checkpoint = name
        self._notes_changed(cause)
        return name

    def _notes_changed(self, cause: str) -> None:
        current = self.current_checkpoint
        parent = self.checkpoints[current]["parent"] if current is not None else None
        notes = self._current_notes()
        self.log(f"notebook at {current} (parent {parent}, {cause}): {notes}")
        self.control.emit(
            {"event": "notes", "current": current, "parent": parent, "notes": notes, "cause": cause}
        )

    def _note(self, params: dict[str, Any], args: dict[str, Any]) -> Any:
        text = args.get("text")
        if not isinstance(text, str) or not text.strip():
            raise RpcError(INVALID_PARAMS, "note needs a text (non-empty string)")
        hinted = params.get("checkpoint")
        if hinted is not None and hinted != self.current_checkpoint:
            self.log(f"note: the host names checkpoint {hinted!r}; notebook is at the current one")
        parent = self.current_checkpoint
        notes = [*self._current_notes(), text]
        name = self._new_checkpoint(parent, notes, "note")
        return {
            "content": [{"type": "text", "text": "notes: " + "; ".join(notes)}],
            "isError": False,
            "state": {"checkpoint": name, "parent": parent, "data": {"notes": list(notes)}},
        }

    def _state_rollback(self, params: dict[str, Any]) -> Any:
        feature_set = params.get("featureSet")
        if not isinstance(feature_set, str):
            raise RpcError(INVALID_PARAMS, "featureSet must be a string")
        if feature_set != NOTES_FEATURE_SET or not self.options.notes:
            raise RpcError(UNKNOWN_FEATURE_SET, "Unknown feature set", {"featureSet": feature_set})
        checkpoint = params.get("checkpoint")
        if not isinstance(checkpoint, str):
            raise RpcError(INVALID_PARAMS, "checkpoint must be a string")
        target = self.checkpoints.get(checkpoint)
        if target is None:
            self.log(f"state/rollback to unknown checkpoint {checkpoint!r}")
            raise RpcError(CHECKPOINT_NOT_FOUND, "Checkpoint not found", {"checkpoint": checkpoint})
        if self.rollback_mode == "forward":
            name = self._new_checkpoint(checkpoint, target["notes"], "rollback")
            self.log(f"state/rollback to {checkpoint}: forward, as {name}")
            return {"checkpoint": name, "success": True}
        self.current_checkpoint = checkpoint
        self.log(f"state/rollback to {checkpoint}: exact")
        self._notes_changed("rollback")
        return {"checkpoint": checkpoint, "success": True}

    # ---- lobby.context: hooks and the inference lifecycle ----------------------------------------

    def _hook_result(self) -> dict[str, Any]:
        injections = (
            self.hook_injections if self.hook_injections is not None else DEFAULT_INJECTIONS
        )
        return {
            "featureSet": self.hook_feature_set,
            "contextInjections": copy.deepcopy(injections),
        }

    def _context_before_inference(self, params: dict[str, Any]) -> Any:
        if not self.options.context:
            self.problem("context/beforeInference sent to a lobby without hooks (no --context)")
            raise RpcError(METHOD_NOT_FOUND, "Method not found: context/beforeInference")
        rid = self._current_rid
        inference_id = params.get("inferenceId")
        if not isinstance(inference_id, str) or not inference_id:
            raise RpcError(INVALID_PARAMS, "inferenceId must be a non-empty string")
        user_message = params.get("userMessage")
        if user_message is not None and not isinstance(user_message, str):
            raise RpcError(INVALID_PARAMS, "userMessage must be a string or null")
        turn = params.get("turnIndex")
        if turn is not None and (type(turn) is not int or turn < 0):
            raise RpcError(INVALID_PARAMS, "turnIndex must be a non-negative integer")
        if self.granted is not None:
            if not any(is_granted(self.granted, path) for path in HOOK_PATHS):
                self.problem(f"context/beforeInference {inference_id} without any hook grant")
            observe = "contextHooks.beforeInference.observe"
            if user_message is not None and not is_granted(self.granted, observe):
                self.problem(
                    f"context/beforeInference {inference_id} carries the user's message, "
                    f"but {observe} is not granted"
                )
        mode = self.hook_mode
        self.log(
            f"context/beforeInference {inference_id} (turn {turn}, mode {mode}): "
            + short(user_message)
        )
        event: dict[str, Any] = {
            "event": "hook_reply",
            "requestId": rid,
            "inferenceId": inference_id,
            "mode": mode,
        }
        if mode == "never":
            self.control.emit(event)
            return NO_REPLY
        if mode == "error":
            err = RpcError(INTERNAL_ERROR, "Internal error", {"reason": "hook mode 'error'"})
            self.control.emit({**event, "error": err.to_json()})
            raise err
        result = self._hook_result()
        if mode == "infer-first":

            def answer(response: dict[str, Any] | None) -> None:
                outcome = "no answer" if response is None else short(response, 120)
                self.log(f"context/beforeInference {inference_id}: answering after {outcome}")
                self.reply(rid, result)
                self.control.emit({**event, "result": result})

            ask = {
                "featureSet": ASSIST_FEATURE_SET,
                "messages": copy.deepcopy(INFER_FIRST_MESSAGES),
            }
            if self._infer(ask, answer) is None:
                self.log(f"context/beforeInference {inference_id}: could not ask; not answering")
            return NO_REPLY
        self.control.emit({**event, "result": result})
        return result

    def _on_lifecycle(self, params: dict[str, Any]) -> None:
        inference_id = params.get("inferenceId")
        phase = params.get("phase")
        self.log(f"inference/lifecycle {inference_id}: {phase}")
        if not self.options.context:
            self.problem("inference/lifecycle sent to a lobby that did not advertise it")
            return
        if self.granted is not None and not is_granted(self.granted, "inferenceLifecycle"):
            self.problem(f"inference/lifecycle {inference_id} without the inferenceLifecycle grant")
        if not isinstance(inference_id, str) or phase not in LIFECYCLE_PHASES:
            self.problem("malformed inference/lifecycle: " + short(params))
            return
        if "content" in params or "messages" in params:
            self.problem(f"inference/lifecycle {inference_id} carries content")
        if "usage" in params and phase != "completed":
            self.problem(f"inference/lifecycle {inference_id} carries usage on {phase}")
        if "model" in params and self.granted is not None:
            if not is_granted(self.granted, "modelInfo"):
                self.problem(f"inference/lifecycle {inference_id} carries model without modelInfo")
        seen = self._inferences.get(inference_id)
        if phase == "started":
            if seen is not None:
                self.problem(f"inference/lifecycle {inference_id}: started again")
            self._inferences[inference_id] = "started"
        elif seen is None:
            self.problem(f"inference/lifecycle {inference_id}: {phase} without started")
            self._inferences[inference_id] = "ended"
        elif seen == "ended":
            self.problem(f"inference/lifecycle {inference_id}: a second terminal phase ({phase})")
        else:
            self._inferences[inference_id] = "ended"
        while len(self._inferences) > 10_000:
            del self._inferences[next(iter(self._inferences))]

    # ---- lobby.assist: inferences the lobby asks for ---------------------------------------------

    def _infer(
        self,
        params: dict[str, Any],
        on_answer: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> dict[str, Any] | None:
        """Send inference/request; a streaming one collects its inference/chunk notifications."""
        streaming = params.get("stream") is True
        rid: Any = None

        def done(response: dict[str, Any] | None) -> None:
            chunks = self._streams.pop(rid, None) if streaming else None
            if chunks is not None:
                self.log(f"inference/request #{rid}: {len(chunks)} chunk(s) before the answer")
            if on_answer is not None:
                on_answer(response)

        request = self.request("inference/request", params, on_answer=done)
        if request is not None:
            rid = request["id"]
            if streaming:
                self._streams[rid] = []
        return request

    def _on_chunk(self, params: dict[str, Any]) -> None:
        rid: Any = params.get("requestId")
        index = params.get("index")
        chunks = self._streams.get(rid) if valid_id(rid) else None
        if chunks is None:
            self.problem("inference/chunk for no streaming inference/request: " + short(params))
            return
        if type(index) is not int or index != len(chunks):
            self.problem(f"inference/chunk #{rid}: index {index!r}, expected {len(chunks)}")
        chunks.append(params.get("delta"))
        self.log(f"inference/chunk #{rid} [{index}]: {short(params.get('delta'))}")

    def _known_channel(self, params: dict[str, Any]) -> str:
        cid = params.get("channelId")
        if not isinstance(cid, str):
            raise RpcError(INVALID_PARAMS, "channelId must be a string")
        if cid not in self.channels:
            raise RpcError(UNKNOWN_CHANNEL, "Unknown channel", {"channelId": cid})
        return cid

    def _note_thread(self, cid: Any, thread: Any) -> None:
        """A thread of a channel exists from now on (a publish may target it)."""
        if isinstance(cid, str) and isinstance(thread, str) and thread:
            self.threads.setdefault(cid, set()).add(thread)

    def _place(self, cid: str, params: dict[str, Any]) -> tuple[Any, str | None]:
        """Where a publish lands (RFC-011): ``(place, None)`` or ``(None, why it is refused)``.

        The place is LEGACY (no threadId: the root, as before RFC-011), None (the root, asked
        for) or a thread id. Never redirected: what cannot land exactly there is refused.
        """
        if "threadId" not in params:
            return LEGACY, None
        thread = params["threadId"]
        if not valid_thread(thread):
            return None, f"invalid threadId {short(thread, 60)}"
        target = publish_target(self.channels[cid])
        if target is None:
            return None, "the channel declares no publish target"
        if thread is None:
            return None, None
        if target == "root":
            return None, "the channel has no threads (target root)"
        if thread not in self.threads.get(cid, ()):
            return None, f"unknown thread {thread!r}"
        return thread, None

    def _deliver(self, params: dict[str, Any]) -> tuple[str | None, Any, str | None]:
        """Post a message the host published: log it and queue its echo (sent after the reply).

        Returns ``(messageId, place, None)``, or ``(None, None, reason)`` when it is refused
        and nothing is posted. A malformed publish raises RpcError.
        """
        cid = self._known_channel(params)
        content = params.get("content")
        if not isinstance(content, list):
            raise RpcError(INVALID_PARAMS, "content must be an array of content blocks")
        place, reason = self._place(cid, params)
        if reason is not None:
            return None, None, reason
        thread = place if isinstance(place, str) else None
        message_id = self.options.make_id("out-", next(self._out_counter))
        where = f" [{thread}]" if thread is not None else ""
        author = publish_author(params.get("conversationId"))
        self.log(f"{channel_label(cid)}{where} <- {author['name']}: {text_of(content)}")
        if not self.options.no_echo:
            message: dict[str, Any] = {
                "channelId": cid,
                "messageId": message_id,
                "author": author,
                "timestamp": now_iso(),
                "content": content,
                "tags": [],
            }
            if thread is not None:
                message["threadId"] = thread
            echo = {"messages": [message]}
            self._followups.append(lambda: self.request("channels/incoming", echo))
        return message_id, place, None

    def _channels_publish(self, params: dict[str, Any]) -> Any:
        mode = self.options.publish_mode
        if mode == "notification-only":
            self.log("channels/publish request refused (--publish-mode notification-only)")
            raise RpcError(METHOD_NOT_FOUND, "Method not found: channels/publish")
        if mode == "never":
            self.log(f"not answering channels/publish (--publish-mode never): {short(params)}")
            return NO_REPLY
        message_id, place, reason = self._deliver(params)
        if reason is not None:
            self.log(f"channels/publish refused, nothing posted: {reason}")
            return {"delivered": False, "reason": reason}
        result: dict[str, Any] = {"delivered": True, "messageId": message_id}
        if place is not LEGACY:
            if self.echo_thread_mode == "echo":
                result["threadId"] = place
            elif self.echo_thread_mode == "wrong":
                result["threadId"] = f"{place}-wrong" if isinstance(place, str) else "wrong"
            self.log(f"publish {message_id}: threadId echo {self.echo_thread_mode}")
        return result

    def _on_publish_notification(self, params: dict[str, Any]) -> None:
        if self.options.publish_mode == "never":
            self.log(f"ignoring channels/publish (--publish-mode never): {short(params)}")
            return
        if "threadId" in params:
            # RFC-011: a publish carrying threadId must be a request; nothing is posted
            self.problem(
                f"channels/publish notification carries threadId {short(params['threadId'], 60)}"
                " (a targeted publish must be a request); refused, nothing posted"
            )
            return
        try:
            self._deliver(params)
        except RpcError as err:
            self._followups.clear()
            self.problem(f"bad channels/publish notification: {err.message}")
            return
        self._run_followups()

    def _channels_open(self, params: dict[str, Any]) -> Any:
        if self.open_mode == "never":
            self.log(f"not answering channels/open (open mode never): {short(params)}")
            return NO_REPLY
        cid = params.get("channelId")
        if isinstance(cid, str) and cid in self.channels:
            desc = self.channels[cid]
        else:
            wanted = params.get("address")
            desc = None
            if isinstance(wanted, str):
                name = wanted.removeprefix("lobby:").removeprefix("#")
                desc = self.channels.get(f"lobby:#{name}")
            if desc is None:
                raise RpcError(
                    CHANNEL_OPEN_FAILED,
                    "Channel open failed",
                    {"channelId": cid, "address": wanted, "reason": "no such lobby channel"},
                )
        self.open_channels.add(desc["id"])
        self.log(f"channel {desc['id']} opened")
        return {"channel": desc}

    def _channels_close(self, params: dict[str, Any]) -> Any:
        cid = self._known_channel(params)
        self.open_channels.discard(cid)
        self.log(f"channel {cid} closed")
        return {"closed": True}

    def _channels_list(self, params: dict[str, Any]) -> Any:
        return {"channels": list(self.channels.values())}

    # ---- channels/outgoing/* and channels/typing -------------------------------------------------

    def _thread_problem(self, cid: str, params: dict[str, Any]) -> str | None:
        """What is wrong with the threadId of a stream or typing notification, if anything."""
        if "threadId" not in params:
            return None
        thread = params["threadId"]
        if not valid_thread(thread):
            return f"invalid threadId {short(thread, 60)}"
        target = publish_target(self.channels[cid])
        if target is None:
            return f"threadId {short(thread, 60)} on a channel without a declared publish target"
        if target == "root" and thread is not None:
            return f"thread {thread!r} on a channel without threads (target root)"
        return None

    def _outgoing_pair(self, method: str, params: dict[str, Any]) -> tuple[str, str] | None:
        """Check what every channels/outgoing/* carries; its (inferenceId, channelId) if usable."""
        if self.granted is not None and not is_granted(self.granted, "channels.streaming"):
            self.problem(f"{method} without the channels.streaming grant")
        inference_id = params.get("inferenceId")
        cid = params.get("channelId")
        if not isinstance(inference_id, str) or not inference_id:
            self.problem(f"{method}: inferenceId must be a non-empty string: {short(params)}")
            return None
        if not isinstance(cid, str) or cid not in self.channels:
            self.problem(f"{method} {inference_id}: unknown channel {short(cid)}")
            return None
        why = self._thread_problem(cid, params)
        if why is not None:
            self.problem(f"{method} {inference_id} on {cid}: {why}")
        return inference_id, cid

    def _out_stream(self, method: str, pair: tuple[str, str], params: dict[str, Any]) -> _OutStream:
        """The pair's stream (a new one on its first message); its place must not change."""
        thread = params.get("threadId", LEGACY)
        stream = self._out_streams.get(pair)
        if stream is None:
            stream = self._out_streams[pair] = _OutStream(thread)
            while len(self._out_streams) > MAX_TRACKED:
                del self._out_streams[next(iter(self._out_streams))]
        elif stream.thread is not thread and stream.thread != thread:
            before = "none" if stream.thread is LEGACY else short(stream.thread, 60)
            now = "none" if thread is LEGACY else short(thread, 60)
            self.problem(
                f"{method} {pair[0]} on {pair[1]}: threadId {now}, the stream had {before}"
            )
        return stream

    def _on_outgoing_chunk(self, params: dict[str, Any]) -> None:
        method = "channels/outgoing/chunk"
        index = params.get("index")
        delta = params.get("delta")
        self.log(
            f"{method} {short(params.get('inferenceId'), 60)} "
            f"{channel_label(params.get('channelId'))} [{short(index, 20)}]: {short(delta)}"
        )
        pair = self._outgoing_pair(method, params)
        if pair is None:
            return
        inference_id, cid = pair
        expected = self._next_index.get(inference_id, 0)
        if type(index) is not int or index != expected:
            self.problem(f"{method} {inference_id} on {cid}: index {index!r}, expected {expected}")
        self._next_index[inference_id] = index + 1 if type(index) is int else expected + 1
        while len(self._next_index) > MAX_TRACKED:
            del self._next_index[next(iter(self._next_index))]
        if not isinstance(delta, str):
            self.problem(f"{method} {inference_id} on {cid}: delta must be a string")
        stream = self._out_stream(method, pair, params)
        if stream.completed:
            self.problem(f"{method} {inference_id} on {cid}: a chunk after the complete")
        if isinstance(delta, str):
            stream.deltas.append(delta)

    def _on_outgoing_complete(self, params: dict[str, Any]) -> None:
        method = "channels/outgoing/complete"
        pair = self._outgoing_pair(method, params)
        if pair is None:
            return
        inference_id, cid = pair
        content = params.get("content")
        if not (
            isinstance(content, list)
            and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content)
        ):
            self.problem(f"{method} {inference_id} on {cid}: content must be a list of blocks")
            content = []
        known = pair in self._out_streams
        stream = self._out_stream(method, pair, params)
        if stream.completed:
            self.problem(f"{method} {inference_id} on {cid}: a second complete")
            return
        stream.completed = True
        streamed = "".join(stream.deltas)
        final = "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
        verdict = "same text" if streamed == final else "texts differ"
        if not known:
            verdict = "no chunks came before it"
        by = publish_author(params.get("conversationId"))["name"]
        self.log(
            f"{method} {inference_id} {channel_label(cid)} by {by}: streamed {short(streamed)!r}, "
            f"complete {short(final)!r} ({verdict})"
        )
        self.control.emit(
            {"event": "streamed", "inferenceId": inference_id, "channelId": cid, "text": streamed}
        )

    def _on_typing(self, params: dict[str, Any]) -> None:
        cid = params.get("channelId")
        typing = params.get("typing")
        where = f" [{short(params['threadId'], 60)}]" if "threadId" in params else ""
        self.log(f"channels/typing {channel_label(cid)}{where}: {short(typing, 20)}")
        if self.granted is not None and not is_granted(self.granted, "channels.typing"):
            self.problem("channels/typing without the channels.typing grant")
        if not isinstance(cid, str) or cid not in self.channels:
            self.problem(f"channels/typing: unknown channel {short(cid)}")
            return
        if not isinstance(typing, bool):
            self.problem(f"channels/typing on {cid}: typing must be a boolean, got {short(typing)}")
        why = self._thread_problem(cid, params)
        if why is not None:
            self.problem(f"channels/typing on {cid}: {why}")

    # ---- RFC-006: push/render -------------------------------------------------------------------

    def _render_problems(self, params: dict[str, Any]) -> list[str]:
        """What is wrong with a push/render request (its shape, and whether it may come at all)."""
        problems = []
        if not self.coalescing["deferred"]:
            problems.append("the host did not advertise eventCoalescing.deferred")
        if self.granted is not None and not is_granted(self.granted, "pushEvents"):
            problems.append("without the pushEvents grant")
        feature_set = params.get("featureSet")
        if not isinstance(feature_set, str) or not feature_set:
            problems.append(f"featureSet must be a non-empty string, got {short(feature_set, 60)}")
        if "channelId" in params:
            cid = params["channelId"]
            if not isinstance(cid, str) or cid not in self.channels:
                problems.append(f"unknown channel {short(cid, 60)}")
        if "key" not in params:
            problems.append("no key")
        else:
            key = params["key"]
            if not isinstance(key, str) or not key:
                problems.append(f"key must be a non-empty string, got {short(key, 60)}")
            elif len(key.encode("utf-8")) > MAX_COALESCE_KEY_BYTES:
                problems.append(f"key longer than {MAX_COALESCE_KEY_BYTES} bytes")
        event_id = params.get("eventId")
        if not isinstance(event_id, str) or not event_id:
            problems.append(f"eventId must be a non-empty string, got {short(event_id, 60)}")
        notices = params.get("notices")
        if not isinstance(notices, list) or not notices:
            problems.append(f"notices must be a non-empty list, got {short(notices, 60)}")
            notices = []
        previous: dt.datetime | None = None
        for i, notice in enumerate(notices):
            if not isinstance(notice, dict):
                problems.append(f"notice {i} is not an object: {short(notice, 60)}")
                continue
            nid = notice.get("eventId")
            if not isinstance(nid, str) or not nid:
                problems.append(f"notice {i}: eventId must be a non-empty string")
            stamp = read_timestamp(notice.get("timestamp"))
            if stamp is None:
                problems.append(
                    f"notice {i}: unreadable timestamp {short(notice.get('timestamp'))}"
                )
                continue
            if previous is not None and stamp < previous:
                problems.append(
                    f"notices are not oldest first: notice {i} ({notice['timestamp']}) is older "
                    "than the one before it"
                )
            previous = stamp
        if notices and isinstance(notices[-1], dict) and notices[-1].get("eventId") != event_id:
            problems.append(
                f"eventId {short(event_id, 60)} is not the latest notice's "
                f"({short(notices[-1].get('eventId'), 60)})"
            )
        dropped = params.get("dropped")
        if type(dropped) is not int or dropped < 0:
            problems.append(f"dropped must be a non-negative integer, got {short(dropped, 60)}")
        return problems

    def _push_render(self, params: dict[str, Any]) -> Any:
        """Render a deferred batch (RFC-006 §5) as the render mode says. Never asks for an
        inference meanwhile (§10.3)."""
        rid = self._current_rid
        for text in self._render_problems(params):
            self.problem(f"push/render: {text}")
        mode = self.render_mode
        notices = params.get("notices")
        count = len(notices) if isinstance(notices, list) else 0
        self.log(
            f"push/render {short(params.get('key'), 60)} ({count} notices, "
            f"{short(params.get('dropped'), 20)} dropped): mode {mode}"
        )
        event: dict[str, Any] = {
            "event": "render",
            "requestId": rid,
            "params": params,
            "mode": mode,
        }
        if mode == "never":
            self.control.emit(event)
            return NO_REPLY
        if mode == "error":
            err = RpcError(INTERNAL_ERROR, "Internal error", {"reason": "render mode 'error'"})
            self.control.emit({**event, "error": err.to_json()})
            raise err
        if mode == "empty":
            content: list[Any] = []
        elif self.render_content is not None:
            content = copy.deepcopy(self.render_content)
        else:
            content = [{"type": "text", "text": render_summary(notices, params.get("dropped"))}]
        result = {"content": content}
        if mode == "slow":
            self.control.emit({**event, "result": result, "delaySeconds": self.render_delay})
            self.spawn(self._answer_later, rid, result, self.render_delay)
            return NO_REPLY
        self.control.emit({**event, "result": result})
        return result

    async def _answer_later(self, rid: Any, result: Any, delay: float) -> None:
        await trio.sleep(delay)
        self.log(f"push/render #{rid}: answering after {delay} s")
        self.reply(rid, result)

    REQUEST_HANDLERS: ClassVar[dict[str, Callable[[Session, dict[str, Any]], Any]]] = {
        "initialize": _initialize,
        "ping": _ping,
        "tools/list": _tools_list,
        "tools/call": _tools_call,
        "featureSets/update": _feature_sets_update,
        "mcpl/manifest": _mcpl_manifest,
        "channels/publish": _channels_publish,
        "channels/open": _channels_open,
        "channels/close": _channels_close,
        "channels/list": _channels_list,
        "context/beforeInference": _context_before_inference,
        "state/rollback": _state_rollback,
        "push/render": _push_render,
    }

    # ---- requests to the host --------------------------------------------------------------------

    def _allocate_id(self) -> int:
        while self._next_id in self._pending:
            self._next_id += 1
        rid = self._next_id
        self._next_id += 1
        return rid

    def _send_request(
        self, method: str, params: Any, raw: dict[str, Any] | None
    ) -> tuple[dict[str, Any], _Pending]:
        if raw is not None:
            request, rid = raw, raw["id"]
        else:
            rid = self._allocate_id()
            request = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        slot = _Pending()
        self._pending[rid] = slot
        self.send(request)
        return request, slot

    def request(
        self,
        method: str,
        params: Any,
        *,
        raw: dict[str, Any] | None = None,
        on_answer: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> dict[str, Any] | None:
        """Send one of our requests right now; its answer (and any retry) is awaited in a task.

        Sending synchronously keeps the wire order equal to the order of decisions, e.g. the
        ``channels/register`` request goes out right after the featureSets/update receipt.
        Returns the request sent (None when the session is over).
        """
        if self._tasks is None:
            self.log(f"not sending {method}: the session is over")
            return None
        first = self._send_request(method, params, raw)
        self._tasks.start_soon(self._complete, method, params, raw, first, on_answer)
        return first[0]

    async def _complete(
        self,
        method: str,
        params: Any,
        raw: dict[str, Any] | None,
        first: tuple[dict[str, Any], _Pending],
        on_answer: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> dict[str, Any] | None:
        """Wait for the host's answer to a sent request, retrying -32002; report it."""
        attempts = 1
        request, slot = first
        while True:
            rid = request["id"]
            with trio.move_on_after(self.options.request_timeout):
                await slot.done.wait()
            if self._pending.get(rid) is slot:
                del self._pending[rid]
            response = slot.response
            if response is None:
                self.log(f"{method} #{rid}: no answer after {self.options.request_timeout} s")
                self.control.emit(
                    {
                        "event": "response",
                        "method": method,
                        "request": request,
                        "response": None,
                        "timedOut": True,
                        "attempts": attempts,
                    }
                )
                if on_answer is not None:
                    on_answer(None)
                return None
            error = response.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            if (
                raw is None
                and method in RETRIED_METHODS
                and code == NOT_READY
                and attempts <= MAX_RETRIES
            ):
                self.log(f"{method} #{rid}: host not ready (-32002), retrying")
                await trio.sleep(RETRY_DELAY)
                attempts += 1
                request, slot = self._send_request(method, params, None)
                continue
            self.control.emit(
                {
                    "event": "response",
                    "method": method,
                    "request": request,
                    "response": response,
                    "attempts": attempts,
                }
            )
            self._check_answer(method, request, response)
            if on_answer is not None:
                on_answer(response)
            return response

    def _check_answer(self, method: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        params = request.get("params") or {}
        if "error" in response:
            self.log(f"{method} #{request.get('id')}: error {short(response['error'])}")
            return
        result = response.get("result")
        if method == "push/event":
            if not (isinstance(result, dict) and isinstance(result.get("accepted"), bool)):
                self.problem("push/event answer lacks a boolean 'accepted': " + short(result))
                return
            verdict = "accepted" if result["accepted"] else f"declined ({result.get('reason')})"
            verdict += self._coalesce_outcome(
                f"push/event {params.get('eventId')}", "pushEvents", params, result
            )
            self.log(f"push/event {params.get('eventId')}: {verdict}")
        elif method in ("channels/register", "channels/incoming"):
            key, items = (
                ("id", params.get("channels"))
                if method == "channels/register"
                else ("messageId", params.get("messages"))
            )
            results = result.get("results") if isinstance(result, dict) else None
            if not isinstance(results, list) or not all(
                isinstance(r, dict) and key in r and isinstance(r.get("accepted"), bool)
                for r in results
            ):
                self.problem(f"{method} answer is not itemized: {short(result)}")
                return
            if isinstance(items, list) and len(results) != len(items):
                self.problem(
                    f"{method} answer has {len(results)} results for {len(items)} items: "
                    + short(result)
                )
            sent = items if isinstance(items, list) and len(items) == len(results) else None
            verdicts = ", ".join(
                f"{r[key]}={'ok' if r['accepted'] else r.get('reason', 'refused')}"
                + (
                    self._coalesce_outcome(f"{method} {r[key]}", "channelsIncoming", sent[i], r)
                    if method == "channels/incoming" and sent is not None
                    else ""
                )
                for i, r in enumerate(results)
            )
            self.log(f"{method}: {verdicts}")
        elif method == "inference/request":
            usage = result.get("usage") if isinstance(result, dict) else None
            if not (
                isinstance(result, dict)
                and isinstance(result.get("content"), str)
                and isinstance(result.get("model"), str)
                and result.get("finishReason") in FINISH_REASONS
                and isinstance(usage, dict)
                and all(type(usage.get(k)) is int for k in ("inputTokens", "outputTokens"))
            ):
                self.problem("inference/request answer is malformed: " + short(result))
                return
            self.log(
                f"inference/request: {result['model']} ({result['finishReason']}): "
                + short(result["content"])
            )
        elif method == "model/info":
            caps = result.get("capabilities") if isinstance(result, dict) else None
            if not (
                isinstance(result, dict)
                and isinstance(result.get("id"), str)
                and isinstance(result.get("vendor"), str)
                and type(result.get("contextWindow")) is int
                and isinstance(caps, list)
                and all(isinstance(c, str) for c in caps)
            ):
                self.problem("model/info answer is malformed: " + short(result))
                return
            self.log(f"model/info: {result['vendor']} {result['id']}")

    def _coalesce_outcome(self, what: str, lane: str, sent: Any, result: dict[str, Any]) -> str:
        """The host's ``coalesce`` result for one occurrence, as a log suffix; checked (RFC-006:
        present whenever a coalesced occurrence was admitted, on a lane the host advertised)."""
        carried = isinstance(sent, dict) and "coalesce" in sent
        if "coalesce" not in result:
            if carried and result.get("accepted") is True and self.coalescing[lane]:
                self.problem(f"{what}: admitted with coalesce, but the answer has no outcome")
            return ""
        member = result["coalesce"]
        outcome = member.get("outcome") if isinstance(member, dict) else None
        prior = member.get("priorEventId") if isinstance(member, dict) else None
        if outcome not in COALESCE_OUTCOMES or not (prior is None or isinstance(prior, str)):
            self.problem(f"{what}: malformed coalesce result {short(member)}")
        if not carried:
            self.log(f"{what}: a coalesce result for an occurrence sent without coalesce")
        return f" (coalesce {outcome}" + (f", prior {prior}" if prior is not None else "") + ")"

    def _coalesce_missing(self, coalesce: Any, lane: str) -> list[str]:
        """The advertisement leaves a ``coalesce`` member uses that the host did not advertise."""
        needed = [lane]
        if isinstance(coalesce, dict):
            if coalesce.get("deferred") not in (None, False):
                needed.append("deferred")
            if coalesce.get("channelId") is not None:
                needed.append("channelScopedPush")
        return [leaf for leaf in needed if not self.coalescing[leaf]]

    def _coalesced(self, target: dict[str, Any], force: bool, lane: str, method: str) -> Any:
        """``target`` (push params or an incoming message) as it may be sent: without its
        ``coalesce`` member if the host did not advertise what it uses (unless forced)."""
        if "coalesce" not in target or force:
            return target
        missing = self._coalesce_missing(target["coalesce"], lane)
        if not missing:
            return target
        ident = {k: target[k] for k in ("eventId", "messageId") if k in target}
        self.log(
            f"{method} {short(ident)}: coalesce withheld, the host did not advertise "
            f"eventCoalescing {', '.join(missing)}; sent plain"
        )
        self.control.emit(
            {
                "event": "coalesce_withheld",
                "method": method,
                **ident,
                "coalesce": target["coalesce"],
                "missing": missing,
            }
        )
        return {k: v for k, v in target.items() if k != "coalesce"}

    @staticmethod
    def _force(cmd: dict[str, Any]) -> bool:
        """A command's ``force``: send coalesce members the host did not advertise."""
        force = cmd.get("force", False)
        if not isinstance(force, bool):
            raise TypeError("force must be a boolean")
        return force

    def _coalesce_args(self, cmd: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
        """A command's optional ``coalesce`` object and ``force`` flag."""
        coalesce = cmd.get("coalesce")
        if coalesce is not None and not isinstance(coalesce, dict):
            raise TypeError("coalesce must be an object")
        return coalesce, self._force(cmd)

    def _event_params(
        self,
        event_id: str,
        text: str,
        *,
        tags: list[Any] | None = None,
        origin: Any = None,
        feature_set: str = "lobby.events",
        extra_content: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        content = [{"type": "text", "text": text}, *(extra_content or ())]
        params: dict[str, Any] = {
            "featureSet": feature_set,
            "eventId": event_id,
            "timestamp": now_iso(),
            "payload": {"content": content},
            "tags": list(tags) if tags is not None else [],
        }
        if origin is not None:
            params["origin"] = origin
        return params

    def _chat_message(
        self,
        channel_id: str,
        message_id: str,
        text: str,
        author: Any = None,
        tags: list[Any] | None = None,
        thread_id: Any = None,
        event_id: str | None = None,
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "channelId": channel_id,
            "messageId": message_id,
            "author": author if author is not None else dict(PEOPLE[0]),
            "timestamp": now_iso(),
            "content": [{"type": "text", "text": text}],
            "tags": list(tags) if tags is not None else [],
        }
        if thread_id is not None:
            message["threadId"] = thread_id
        if event_id is not None:
            message["eventId"] = event_id  # RFC-006: this occurrence (a create or an edit)
        return message

    # ---- scripted people -------------------------------------------------------------------------

    async def _script(self) -> None:
        channel_ids = ("lobby:#general", "lobby:#random")
        for tick in itertools.count(1):
            await trio.sleep(self.options.interval)
            person = PEOPLE[(tick - 1) % 2]
            cid = channel_ids[((tick - 1) // 2) % 2]
            text, tags = SCRIPT_LINES[(tick - 1) % len(SCRIPT_LINES)]
            if self.allows("channels.incoming"):
                message = self._chat_message(
                    cid,
                    self.options.make_id("m", next(self._msg_counter)),
                    text,
                    dict(person),
                    tags,
                )
                self.log(f"{channel_label(cid)} {person['name']}: {text}")
                self.request("channels/incoming", {"messages": [message]})
            else:
                self.log("channels.incoming not granted; the people keep quiet")
            if tick == 2 and self.files is not None:
                # half a tick after Bob's question, so the photo is the newest thing Ada sees
                self.spawn(self._share_photo)
            if tick % 3 == 0:
                if self.allows("pushEvents"):
                    n = next(self._event_counter)
                    origin = {"mcplChannelId": "lobby:#general"} if n % 2 == 0 else None
                    event_id = self.options.make_id("e", n)
                    params = self._event_params(event_id, CHIME, origin=origin)
                    self.log(f"push/event {event_id}: {CHIME}")
                    self.request("push/event", params)
                else:
                    self.log("pushEvents not granted; the clock stays silent")

    async def _share_photo(self) -> None:
        await trio.sleep(self.options.interval / 2)
        if self.allows("pushEvents"):
            self.log(f"push/event {SHARE_EVENT_ID}: {SHARE_TEXT}")
            self.request("push/event", self._share_params(SHARE_EVENT_ID, SHARE_FILE, SHARE_TEXT))
        else:
            self.log("pushEvents not granted; Alice keeps her photo")

    def _share_params(
        self,
        event_id: str,
        name: str,
        text: str,
        *,
        uri: str | None = None,
        tags: list[Any] | None = None,
        origin: Any = None,
        feature_set: str = "lobby.events",
    ) -> dict[str, Any]:
        """A push/event whose content is the text plus a reference to one of our files."""
        if self.files is None:
            raise ValueError("no files to share: start the lobby with --ws and --files")
        if name not in self.files.files:
            raise ValueError(f"unknown file {name!r}; known: {sorted(self.files.files)}")
        reference = self.files.reference(name, uri)
        return self._event_params(
            event_id,
            text,
            tags=tags,
            origin=origin,
            feature_set=feature_set,
            extra_content=[reference],
        )

    # ---- control commands ------------------------------------------------------------------------

    async def _control_reader(self, scope: trio.CancelScope) -> None:
        assert self._control_link is not None
        with scope:
            async for cmd in self._control_link.commands():
                if isinstance(cmd, InputError):
                    self.problem(str(cmd))
                    continue
                try:
                    self.on_command(cmd)
                except (KeyError, TypeError, ValueError) as exc:
                    self.problem(f"bad control command {short(cmd)}: {exc!r}")
            self.log("control connection closed")

    def on_command(self, cmd: Any) -> None:
        if not isinstance(cmd, dict) or not isinstance(cmd.get("cmd"), str):
            raise ValueError("a command is an object with a string 'cmd'")
        name = cmd["cmd"]
        if name == "crash":
            log("crash requested: exiting with code 1")
            os._exit(1)
        if name == "ping":
            self.control.emit({"event": "pong", "id": cmd.get("id")})
            return
        if self.hung or self._tasks is None:
            self.log(f"ignoring control command {name!r}: not serving")
            return
        if name == "hang":
            self.log("hang requested: no more reading or answering")
            self.hung = True
            self.control.emit({"event": "hung"})
            if self._work_scope is not None:
                self._work_scope.cancel()
        elif name == "incoming":  # RFC-006: an edit is a new eventId, same messageId and key
            coalesce, force = self._coalesce_args(cmd)
            event_id = cmd.get("eventId")
            if event_id is not None and not (isinstance(event_id, str) and event_id):
                raise TypeError("eventId must be a non-empty string")
            message = self._chat_message(
                cmd["channelId"],
                cmd["messageId"],
                cmd["text"],
                cmd.get("author"),
                cmd.get("tags"),
                cmd.get("threadId"),
                event_id,
            )
            if coalesce is not None:
                message["coalesce"] = coalesce
            message = self._coalesced(message, force, "channelsIncoming", "channels/incoming")
            self._note_thread(message["channelId"], message.get("threadId"))
            self.request("channels/incoming", {"messages": [message]})
        elif name == "incoming_batch":  # messages as given (eventId and coalesce included)
            messages = cmd["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages must be a list")
            force = self._force(cmd)
            messages = [
                self._coalesced(m, force, "channelsIncoming", "channels/incoming")
                if isinstance(m, dict)
                else m
                for m in messages
            ]
            for m in messages:
                if isinstance(m, dict):
                    self._note_thread(m.get("channelId"), m.get("threadId"))
            self.request("channels/incoming", {"messages": messages})
        elif name == "threads":  # RFC-011: threads of a channel that a publish may target
            cid = cmd["channelId"]
            threads = cmd["threads"]
            if not isinstance(cid, str):
                raise TypeError("channelId must be a string")
            if not isinstance(threads, list) or not all(isinstance(t, str) and t for t in threads):
                raise TypeError("threads must be a list of non-empty strings")
            for thread in threads:
                self._note_thread(cid, thread)
            known = sorted(self.threads.get(cid, ()))
            self.log(f"threads of {cid}: {known}")
            self.control.emit({"event": "threads", "channelId": cid, "threads": known})
        elif name == "publish_echo_thread":  # how a publish result echoes its threadId
            mode = cmd["mode"]
            if mode not in ECHO_THREAD_MODES:
                raise ValueError(f"mode must be one of {ECHO_THREAD_MODES}")
            self.echo_thread_mode = mode
            self.log(f"publish results: threadId echo {mode}")
            self.control.emit({"event": "publish_echo_thread", "mode": mode})
        elif name == "open_mode":  # how later channels/open requests are answered
            mode = cmd["mode"]
            if mode not in OPEN_MODES:
                raise ValueError(f"mode must be one of {OPEN_MODES}")
            self.open_mode = mode
            self.log(f"channels/open mode: {mode}")
            self.control.emit({"event": "open_mode", "mode": mode})
        elif name == "push":
            coalesce, force = self._coalesce_args(cmd)
            params = self._event_params(
                cmd["eventId"],
                cmd["text"],
                tags=cmd.get("tags"),
                origin=cmd.get("origin"),
                feature_set=cmd.get("featureSet", "lobby.events"),
            )
            if coalesce is not None:
                params["coalesce"] = coalesce
            self.request("push/event", self._coalesced(params, force, "pushEvents", "push/event"))
        elif name == "share":  # a push/event carrying a reference to one of our files
            file_name = cmd["file"]
            text = cmd.get("text", f"Shared {file_name}.")
            event_id = cmd.get("eventId") or self.options.make_id(
                "share-", next(self._share_counter)
            )
            uri = cmd.get("uri")  # a test may point the reference elsewhere (another origin)
            if not all(isinstance(v, str) for v in (file_name, text, event_id)):
                raise TypeError("file, text and eventId must be strings")
            if uri is not None and not isinstance(uri, str):
                raise TypeError("uri must be a string")
            coalesce, force = self._coalesce_args(cmd)
            params = self._share_params(
                event_id,
                file_name,
                text,
                uri=uri,
                tags=cmd.get("tags"),
                origin=cmd.get("origin"),
                feature_set=cmd.get("featureSet", "lobby.events"),
            )
            if coalesce is not None:
                params["coalesce"] = coalesce
            self.log(f"push/event {event_id}: {text} [{params['payload']['content'][1]['uri']}]")
            self.request("push/event", self._coalesced(params, force, "pushEvents", "push/event"))
        elif name == "register":
            descriptors = cmd["channels"]
            if not isinstance(descriptors, list):
                raise TypeError("channels must be a list")
            for desc in descriptors:
                if isinstance(desc, dict) and isinstance(desc.get("id"), str):
                    self.channels[desc["id"]] = desc
            self.request("channels/register", {"channels": descriptors})
        elif name == "fsu_mode":  # how later featureSets/update requests are answered
            self.fsu_mode_override = cmd["mode"]
        elif name == "manifest":
            # Serve a new manifest from now on and announce it, as a server whose surface
            # changed does. The revision is a placeholder: a host must never trust it.
            self.manifest_override = cmd["manifest"]
            params = {
                "revision": "sha256:" + "A" * 43,
                "domains": cmd.get("domains", ["capabilities"]),
            }
            self.send({"jsonrpc": "2.0", "method": "mcpl/manifestChanged", "params": params})
        elif name == "raw":
            message = cmd["message"]
            if (
                isinstance(message, dict)
                and isinstance(message.get("method"), str)
                and valid_id(message.get("id"))
                and message["id"] not in self._pending
            ):
                self.request(message["method"], message.get("params"), raw=message)
            else:
                self.send(message)
        elif name == "line":
            text = cmd["text"]
            if not isinstance(text, str):
                raise TypeError("text must be a string")
            self.send_line(text)
        elif name == "hook":  # how later context/beforeInference requests are answered
            mode = cmd["mode"]
            if mode not in HOOK_MODES:
                raise ValueError(f"mode must be one of {HOOK_MODES}")
            injections = cmd.get("injections")
            if injections is not None and not isinstance(injections, list):
                raise TypeError("injections must be a list")
            feature_set = cmd.get("featureSet", HOOK_FEATURE_SET)
            if not isinstance(feature_set, str):
                raise TypeError("featureSet must be a string")
            self.hook_mode = mode
            self.hook_injections = injections
            self.hook_feature_set = feature_set
            self.log(f"hooks: mode {mode}, injections {short(injections)}")
            self.control.emit(
                {
                    "event": "hook_mode",
                    "mode": mode,
                    "injections": injections,
                    "featureSet": feature_set,
                }
            )
        elif name == "infer":
            messages = cmd["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages must be a list")
            stream = cmd.get("stream", False)
            if not isinstance(stream, bool):
                raise TypeError("stream must be a boolean")
            feature_set = cmd.get("featureSet", ASSIST_FEATURE_SET)
            if not isinstance(feature_set, str):
                raise TypeError("featureSet must be a string")
            params = {"featureSet": feature_set, "messages": messages, "stream": stream}
            if cmd.get("conversationId") is not None:
                params["conversationId"] = cmd["conversationId"]
            if cmd.get("maxTokens") is not None:
                max_tokens = cmd["maxTokens"]
                if type(max_tokens) is not int:
                    raise TypeError("maxTokens must be an integer")
                params["preferences"] = {"maxTokens": max_tokens}
            self._infer(params)
        elif name == "model_info":
            self.request("model/info", {})
        elif name == "rollback_mode":
            mode = cmd["mode"]
            if mode not in ROLLBACK_MODES:
                raise ValueError(f"mode must be one of {ROLLBACK_MODES}")
            self.rollback_mode = mode
            self.log(f"state/rollback mode: {mode}")
            self.control.emit({"event": "rollback_mode", "mode": mode})
        elif name == "render_mode":  # how later push/render requests are answered
            mode = cmd["mode"]
            if mode not in RENDER_MODES:
                raise ValueError(f"mode must be one of {RENDER_MODES}")
            content = cmd.get("content")
            if content is not None and not isinstance(content, list):
                raise TypeError("content must be a list of content blocks")
            delay = cmd.get("delaySeconds", DEFAULT_RENDER_DELAY)
            if type(delay) not in (int, float) or not 0 <= delay < math.inf:
                raise ValueError("delaySeconds must be a non-negative number")
            self.render_mode = mode
            self.render_content = content
            self.render_delay = float(delay)
            self.log(f"push/render mode: {mode}, content {short(content)}, delay {delay} s")
            self.control.emit(
                {
                    "event": "render_mode",
                    "mode": mode,
                    "content": content,
                    "delaySeconds": self.render_delay,
                }
            )
        elif name == "flood":
            count = cmd["count"]
            if type(count) is not int or not 0 <= count <= 100_000:
                raise ValueError("count must be an integer from 0 to 100000")
            self.spawn(self._flood, count, str(cmd.get("text", "flood")))
        else:
            raise ValueError(f"unknown command {name!r}")

    async def _flood(self, count: int, text: str) -> None:
        accepted = 0

        def tally(response: dict[str, Any] | None) -> None:
            nonlocal accepted
            result = response.get("result") if response else None
            if isinstance(result, dict) and result.get("accepted") is True:
                accepted += 1

        async with trio.open_nursery() as nursery:
            for i in range(1, count + 1):
                params = self._event_params(f"f{i}", text)
                first = self._send_request("push/event", params, None)
                nursery.start_soon(self._complete, "push/event", params, None, first, tally)
        self.log(f"flood of {count}: {accepted} accepted")
        self.control.emit({"event": "flood_done", "accepted": accepted, "count": count})


TOOLS = [
    {
        "name": "forecast",
        "description": "The weather forecast for a city.",
        "inputSchema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
    {
        "name": "roll",
        "description": "Roll a die with the given number of sides.",
        "inputSchema": {
            "type": "object",
            "properties": {"sides": {"type": "integer", "minimum": 1}},
            "required": ["sides"],
        },
    },
    {
        "name": "stall",
        "description": "Never answers (for testing deadlines).",
        "inputSchema": {"type": "object", "properties": {}},
    },
]

# Listed only with --notes.
NOTE_TOOL = {
    "name": "note",
    "description": "Add a note to the lobby notebook; returns the notebook",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}


# --------------------------------------------------------------------------------------------
# entry points


async def run_session(
    transport: StdioTransport | WsTransport,
    options: LobbyOptions,
    label: str = "",
    files: LobbyFiles | None = None,
) -> None:
    control = await _open_control(options, label)
    if control is not None:
        control.emit({"event": "hello", "pid": os.getpid(), "transport": transport.kind})
        if files is not None:
            files.controls.add(control)  # it hears of HTTP requests while the session lasts
    try:
        await Session(transport, options, control, label, files).run()
    finally:
        if control is not None:
            if files is not None:
                files.controls.discard(control)
            await control.aclose()


async def serve_stdio(options: LobbyOptions) -> None:
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    try:
        await run_session(StdioTransport(stdin, stdout), options)
    finally:
        with trio.CancelScope(shield=True):
            await stdin.aclose()
            await stdout.aclose()


def _authorized(request: trio_websocket.WebSocketRequest, token: str) -> bool:
    expected = f"Bearer {token}".encode()
    for name, value in request.headers:
        if name.lower() == b"authorization" and hmac.compare_digest(value.strip(), expected):
            return True
    return False


async def serve_ws(
    host: str,
    port: int,
    options: LobbyOptions | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve lobby sessions over websockets until cancelled; ``task_status.started(port)``.

    With ``options.files`` the same port also answers plain HTTP ``GET /files/<name>``.
    """
    opts = options or LobbyOptions()
    counter = itertools.count(1)
    http_counter = itertools.count(1)
    files: LobbyFiles | None = None

    async def session(
        request: trio_websocket.WebSocketRequest, label: str
    ) -> trio_websocket.WebSocketConnection | None:
        """Check the token, accept and run one session; the connection, if accepted."""
        if opts.token is not None and not _authorized(request, opts.token):
            log(f"{label}: rejecting a websocket client without the right bearer token")
            await request.reject(
                401, extra_headers=[(b"WWW-Authenticate", b"Bearer")], body=b"unauthorized\n"
            )
            return None
        try:
            ws = await request.accept()
        except trio_websocket.ConnectionClosed:
            return None
        log(f"{label}: connected from {request.remote}")
        await run_session(WsTransport(ws), opts, label, files)
        log(f"{label}: session over")
        return ws

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        await session(request, f"ws#{next(counter)}")

    async def serve(*, task_status: trio.TaskStatus[Any]) -> None:
        await trio_websocket.serve_websocket(
            handler, host, port, None, max_message_size=MAX_LINE_BYTES, task_status=task_status
        )

    async def websocket(stream: ReplayStream, label: str) -> None:
        """What serve_websocket does for one connection, on a stream whose head was read."""
        try:
            async with trio.open_nursery() as nursery:
                request = None
                with trio.move_on_after(WS_HANDSHAKE_TIMEOUT):
                    request = await trio_websocket.wrap_server_stream(
                        nursery, stream, max_message_size=MAX_LINE_BYTES
                    )
                if request is not None:
                    ws = await session(request, label)
                    if ws is not None:
                        with trio.move_on_after(WS_CLOSE_TIMEOUT):
                            await ws.aclose()
                nursery.cancel_scope.cancel()  # the connection's reader task
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async def connection(stream: trio.SocketStream) -> None:
        """One connection to the --files listener: a websocket session or one HTTP answer."""
        assert files is not None
        raw, head_bytes = b"", None
        with trio.move_on_after(HEAD_TIMEOUT):
            raw, head_bytes = await read_head(stream)
        try:
            head = None
            if head_bytes is not None:
                try:
                    head = RequestHead(head_bytes)
                except ValueError as exc:
                    log(f"unreadable HTTP request: {exc}")
                    await answer_http(stream, None, files, f"http#{next(http_counter)}", refuse=400)
                    return
            if head is not None and head.is_websocket_upgrade():
                await websocket(ReplayStream(stream, raw), f"ws#{next(counter)}")
            elif head is not None:
                await answer_http(stream, head, files, f"http#{next(http_counter)}")
            elif len(raw) > MAX_HEAD_BYTES:
                await answer_http(stream, None, files, f"http#{next(http_counter)}", refuse=431)
            # else: the peer went away (or said nothing in time) before its head was complete
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()

    async with trio.open_nursery() as nursery:
        if not opts.files:
            ws_server = await nursery.start(serve)
            task_status.started(ws_server.port)
            return
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        files = LobbyFiles(f"http://{display_host(host)}:{bound}")
        log(f"serving files at {files.base_url}/files/: {', '.join(files.files)}")
        await nursery.start(trio.serve_listeners, connection, listeners)
        task_status.started(bound)


async def _amain(options: LobbyOptions) -> None:
    if options.run_id:
        log(f"ids made up by this run start with {options.run_id}-")
    if options.ws:
        host, port = split_host_port(options.ws)
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_ws, host, port, options)
            print(f"LISTENING ws://{display_host(host)}:{bound}", flush=True)
            log(f"serving websockets on {host}:{bound}")
    else:
        if options.token:
            log("--token only applies to --ws; ignored")
        if options.files:
            log("--files only applies to --ws; ignored")
        await serve_stdio(options)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    try:
        trio.run(_amain, options)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
