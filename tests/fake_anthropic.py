"""A scripted stand-in for the Anthropic Messages API, served over real loopback HTTP.

The test builds a :class:`FakeScript` (a queue of responses), starts the server in a nursery and
points a provider at the base URL it returns::

    script = FakeScript([Reply(blocks=[text_block("Hello")])])
    base_url = await nursery.start(serve_fake_anthropic, script)
    model = AnthropicModel("claude-x", api_key="k", base_url=base_url)
    ...
    assert script.requests[-1].body["stream"] is True

Every ``POST /v1/messages`` takes the next response off the queue:

* :class:`Reply` — a successful message: streamed as server-sent events when the request body
  says ``"stream": true`` (``message_start``, ``content_block_start`` / ``content_block_delta`` /
  ``content_block_stop`` per block, ``message_delta``, ``message_stop``, with ``ping`` events
  between), otherwise returned as one JSON message. Its usage (with the prompt-cache counts when
  given) is in ``message_start``; ``message_delta`` brings the final ``output_tokens``.
* :class:`HttpError` — an HTTP error status with an Anthropic error JSON body.
* :class:`StreamError` — a 200 stream that emits some blocks and then an ``error`` event.
* :class:`Disconnect` — a 200 stream that emits some blocks and then drops the connection.
  (These two answer with a stream even to a non-streaming request.)

When the queue is empty the server answers ``400 invalid_request_error`` ("fake anthropic: script
exhausted"), which a provider does not retry, so a test with too short a script fails fast.

Bounds: each request is recorded (method, path, lower-cased headers, parsed JSON body) in
``FakeScript.requests``, which keeps only the newest ``log_limit`` entries (default 1000) and
counts the older ones it dropped in ``FakeScript.dropped_requests``. Request heads are limited to
64 KiB and bodies to 32 MiB; larger requests get an error status and the connection is closed.
The server is plain HTTP/1.1 with keep-alive; it needs a ``Content-Length`` on request bodies.
"""

from __future__ import annotations

import collections
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import attrs
import trio
import trio.lowlevel

__all__ = [
    "Disconnect",
    "FakeScript",
    "HttpError",
    "RecordedRequest",
    "Reply",
    "StreamError",
    "serve_fake_anthropic",
    "text_block",
    "tool_use_block",
]

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_LOG_LIMIT = 1000


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(id: str, name: str, input: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": name, "input": dict(input)}


@attrs.frozen(kw_only=True)
class Reply:
    """A successful assistant message.

    ``blocks`` are ``text`` and ``tool_use`` dicts (see :func:`text_block`,
    :func:`tool_use_block`). When streamed, each text is sent as ``text_delta`` pieces of
    ``chunk_size`` characters and each tool input as ``input_json_delta`` pieces of its compact
    JSON, ``chunk_size`` characters each.
    """

    blocks: Sequence[Mapping[str, Any]] = ()
    stop_reason: str = "end_turn"
    model: str = "claude-fake"
    input_tokens: int = 11
    output_tokens: int = 7
    #: Prompt-cache counts; None leaves the field out, as the API does when caching is unused.
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    chunk_size: int = 4

    def usage(self, *, output_tokens: int | None = None) -> dict[str, int]:
        """The ``usage`` object of this message (``output_tokens`` as counted so far)."""
        out = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens if output_tokens is None else output_tokens,
        }
        for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@attrs.frozen(kw_only=True)
class HttpError:
    """An error status with body ``{"type":"error","error":{"type":..., "message":...}}``."""

    status: int
    error_type: str = "api_error"
    message: str = "Internal server error"
    headers: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class StreamError:
    """A 200 stream: ``message_start``, then ``prefix_blocks`` in full, then an ``error`` event."""

    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    prefix_blocks: Sequence[Mapping[str, Any]] = ()
    chunk_size: int = 4


@attrs.frozen(kw_only=True)
class Disconnect:
    """A 200 stream: ``message_start``, then ``prefix_blocks``, then the connection is dropped."""

    prefix_blocks: Sequence[Mapping[str, Any]] = ()
    chunk_size: int = 4


Response = Reply | HttpError | StreamError | Disconnect


@attrs.frozen(kw_only=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


class FakeScript:
    """The scripted responses (consumed in order) and the log of requests received."""

    def __init__(self, responses: Iterable[Response] = (), *, log_limit: int = DEFAULT_LOG_LIMIT):
        self._queue: collections.deque[Response] = collections.deque(responses)
        self._log: collections.deque[RecordedRequest] = collections.deque(maxlen=log_limit)
        self.dropped_requests = 0

    def add(self, *responses: Response) -> None:
        self._queue.extend(responses)

    @property
    def remaining(self) -> int:
        return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """The recorded requests, oldest first (at most ``log_limit`` of the newest)."""
        return list(self._log)

    def _record(self, request: RecordedRequest) -> None:
        if self._log.maxlen is not None and len(self._log) == self._log.maxlen:
            self.dropped_requests += 1
        self._log.append(request)

    def _next(self) -> Response:
        if self._queue:
            return self._queue.popleft()
        return HttpError(
            status=400,
            error_type="invalid_request_error",
            message="fake anthropic: script exhausted",
        )


async def serve_fake_anthropic(
    script: FakeScript, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Serve ``script`` on 127.0.0.1 (a free port); reports the base URL via ``task_status``.

    Runs until cancelled.
    """
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    ids = itertools.count(1)

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, script, ids)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(f"http://127.0.0.1:{port}")
        await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


# --- HTTP/1.1 ------------------------------------------------------------------------------------


class _Closed(Exception):
    pass


class _Reader:
    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buf = bytearray()

    async def _fill(self) -> None:
        data = await self._stream.receive_some(65536)
        if not data:
            raise _Closed
        self._buf += data

    async def read_head(self) -> bytes | None:
        """The request head (without the blank line), or None if too large."""
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(self._buf[:end])
                del self._buf[: end + 4]
                return head
            if len(self._buf) > MAX_HEAD_BYTES:
                return None
            await self._fill()

    async def read_exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            await self._fill()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data


async def _serve_connection(
    stream: trio.SocketStream, script: FakeScript, ids: Iterator[int]
) -> None:
    reader = _Reader(stream)
    try:
        while True:
            head = await reader.read_head()
            if head is None:
                await _send_json(
                    stream, 431, _error_body("invalid_request_error", "head too large")
                )
                return
            method, path, headers = _parse_head(head)
            if "chunked" in headers.get("transfer-encoding", "").lower():
                await _send_json(stream, 411, _error_body("invalid_request_error", "need length"))
                return
            length = int(headers.get("content-length", "0") or "0")
            if length > MAX_BODY_BYTES:
                await _send_json(stream, 413, _error_body("request_too_large", "body too large"))
                return
            raw = await reader.read_exactly(length)
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            script._record(RecordedRequest(method=method, path=path, headers=headers, body=body))
            keep_going = await _respond(stream, script, method, path, body, next(ids))
            if not keep_going or headers.get("connection", "").lower() == "close":
                return
    except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await trio.aclose_forcefully(stream)


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


async def _send_head(stream: trio.SocketStream, status: int, headers: Mapping[str, str]) -> None:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


async def _send_json(
    stream: trio.SocketStream,
    status: int,
    payload: Any,
    extra_headers: Mapping[str, str] | None = None,
    request_id: str = "req_fake",
) -> None:
    data = json.dumps(payload).encode()
    headers = {
        "content-type": "application/json",
        "content-length": str(len(data)),
        "request-id": request_id,
        **(extra_headers or {}),
    }
    await _send_head(stream, status, headers)
    await stream.send_all(data)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    411: "Length Required",
    413: "Payload Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}


async def _respond(
    stream: trio.SocketStream, script: FakeScript, method: str, path: str, body: Any, n: int
) -> bool:
    """Answer one request; False when the connection must be closed afterwards."""
    request_id = f"req_fake_{n}"
    if method != "POST" or path.split("?", 1)[0] != "/v1/messages":
        await _send_json(
            stream, 404, _error_body("not_found_error", f"{method} {path}"), request_id=request_id
        )
        return True
    response = script._next()
    if isinstance(response, HttpError):
        await _send_json(
            stream,
            response.status,
            {**_error_body(response.error_type, response.message), "request_id": request_id},
            response.headers,
            request_id,
        )
        return True
    streaming = isinstance(body, dict) and body.get("stream") is True
    if isinstance(response, Reply) and not streaming:
        await _send_json(stream, 200, _message_json(response, f"msg_fake_{n}"), None, request_id)
        return True
    await _send_head(
        stream,
        200,
        {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "transfer-encoding": "chunked",
            "request-id": request_id,
        },
    )
    for event, data in _events(response, f"msg_fake_{n}"):
        payload = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
        await stream.send_all(b"%x\r\n%s\r\n" % (len(payload), payload))
        await trio.lowlevel.checkpoint()
    if isinstance(response, Disconnect):
        return False
    await stream.send_all(b"0\r\n\r\n")
    return True


def _message_json(reply: Reply, msg_id: str) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [dict(b) for b in reply.blocks],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": reply.usage(),
    }


def _chunks(s: str, size: int) -> list[str]:
    size = max(1, size)
    return [s[i : i + size] for i in range(0, len(s), size)]


def _ev(name: str, **data: Any) -> tuple[str, dict[str, Any]]:
    return name, {"type": name, **data}


def _block_events(
    index: int, block: Mapping[str, Any], chunk_size: int
) -> Iterator[tuple[str, dict[str, Any]]]:
    if block["type"] == "text":
        yield _ev("content_block_start", index=index, content_block={"type": "text", "text": ""})
        for piece in _chunks(block["text"], chunk_size):
            yield _ev(
                "content_block_delta", index=index, delta={"type": "text_delta", "text": piece}
            )
    elif block["type"] == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        yield _ev("content_block_start", index=index, content_block=start)
        # The real API opens a tool input with an empty piece; so does this one.
        pieces = _chunks(json.dumps(block["input"], separators=(",", ":")), chunk_size)
        for piece in ["", *pieces]:
            yield _ev(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": piece},
            )
    else:
        raise ValueError(f"fake anthropic cannot stream a {block['type']!r} block")
    yield _ev("content_block_stop", index=index)


def _events(
    response: Reply | StreamError | Disconnect, msg_id: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    reply = response if isinstance(response, Reply) else Reply()
    message = {**_message_json(reply, msg_id), "content": [], "stop_reason": None}
    message["usage"] = reply.usage(output_tokens=1)
    yield _ev("message_start", message=message)
    yield _ev("ping")
    blocks = response.blocks if isinstance(response, Reply) else response.prefix_blocks
    for index, block in enumerate(blocks):
        yield from _block_events(index, block, response.chunk_size)
        yield _ev("ping")
    if isinstance(response, StreamError):
        yield "error", _error_body(response.error_type, response.message)
    elif isinstance(response, Reply):
        yield _ev(
            "message_delta",
            delta={"stop_reason": response.stop_reason, "stop_sequence": None},
            usage={"output_tokens": response.output_tokens},
        )
        yield _ev("message_stop")
