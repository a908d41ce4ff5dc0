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
* :class:`Garbled` — a 200 stream that emits some blocks and then an event whose data is not what
  the API sends (by default, not JSON at all).
* :class:`Stall` — answers nothing (or, with ``head=True``, a 200 stream head, ``message_start``
  and some blocks) and then stays silent until the client hangs up.
  (These four answer with a stream even to a non-streaming request.)

Prompt caching, as the API defines it: a request may mark at most four blocks (tools, system
blocks, message content blocks) with ``"cache_control": {"type": "ephemeral"}``; more, or another
type, is refused with ``400 invalid_request_error`` before any response is taken off the queue.
With ``FakeScript(prompt_cache=True)`` the server keeps a cache of marked prefixes and reports the
usage the API would: the prefix is tools, then system, then messages; a prefix's identity is the
compact JSON of every block up to it (marks left out) with each message block's role and turn;
at each mark the longest prefix already cached is looked for at that block and the 19 before it
(``cache_read_input_tokens`` counts it), then each marked prefix of at least
``min_cache_tokens`` is stored (``cache_creation_input_tokens`` counts what the last mark adds to
what was read) and ``input_tokens`` counts the rest. Tokens are estimated as a block's JSON
length divided by 4 (at least 1 per block); entries never expire, and the newest
``CACHE_LIMIT`` are kept. The real API's minimum is 1,024 tokens or more by model; the fake's
is 0 unless set. Without ``prompt_cache`` the usage is the :class:`Reply`'s own.

When the queue is empty the server answers ``400 invalid_request_error`` ("fake anthropic: script
exhausted"), which a provider does not retry, so a test with too short a script fails fast.

Bounds: each request is recorded (method, path, lower-cased headers, parsed JSON body, the raw
body bytes) in
``FakeScript.requests``, which keeps only the newest ``log_limit`` entries (default 1000) and
counts the older ones it dropped in ``FakeScript.dropped_requests``. Request heads are limited to
64 KiB and bodies to 32 MiB; larger requests get an error status and the connection is closed.
The server is plain HTTP/1.1 with keep-alive; it needs a ``Content-Length`` on request bodies.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import attrs
import trio
import trio.lowlevel

from tests.fake_http import MAX_BODY_BYTES, Closed, HeadReader, parse_head, send_head, serve_local

__all__ = [
    "Disconnect",
    "FakeScript",
    "Garbled",
    "HttpError",
    "RecordedRequest",
    "Reply",
    "Stall",
    "StreamError",
    "marked_prefixes",
    "serve_fake_anthropic",
    "text_block",
    "tool_use_block",
]

DEFAULT_LOG_LIMIT = 1000
#: The most cache_control marks the API takes in one request.
MAX_CACHE_MARKS = 4
#: How many blocks before a mark the cache is searched (the mark's own block and 19 more).
LOOKBACK_BLOCKS = 20
#: Cache entries the fake keeps (the oldest go first).
CACHE_LIMIT = 4096


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
    #: the body as sent, in place of the API's error object (for hostile bodies)
    raw_body: str | None = None


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


@attrs.frozen(kw_only=True)
class Garbled:
    """A 200 stream: ``message_start``, ``prefix_blocks``, then one ``event`` whose data line is
    ``data`` as given, then the end of the stream."""

    prefix_blocks: Sequence[Mapping[str, Any]] = ()
    event: str = "content_block_delta"
    data: str = '{"type": "content_block_delta", "index": 0, "delta": {"type": "text_de'
    chunk_size: int = 4


@attrs.frozen(kw_only=True)
class Stall:
    """No answer at all; with ``head``, a 200 stream head, ``message_start`` and
    ``prefix_blocks`` first. Then silence until the client closes the connection."""

    head: bool = False
    prefix_blocks: Sequence[Mapping[str, Any]] = ()
    chunk_size: int = 4


Response = Reply | HttpError | StreamError | Disconnect | Garbled | Stall


@attrs.frozen(kw_only=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    raw: bytes = b""


class FakeScript:
    """The scripted responses (consumed in order) and the log of requests received."""

    def __init__(
        self,
        responses: Iterable[Response] = (),
        *,
        log_limit: int = DEFAULT_LOG_LIMIT,
        prompt_cache: bool = False,
        min_cache_tokens: int = 0,
    ):
        self._queue: collections.deque[Response] = collections.deque(responses)
        self._log: collections.deque[RecordedRequest] = collections.deque(maxlen=log_limit)
        self.dropped_requests = 0
        self.prompt_cache = prompt_cache
        self.min_cache_tokens = min_cache_tokens
        self._cache: collections.OrderedDict[bytes, int] = collections.OrderedDict()

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

    def _cached_usage(self, body: Any) -> dict[str, int] | None:
        """The input counts the API would report for ``body`` (see the module docstring), with
        the cache updated; None when the fake keeps no cache."""
        if not self.prompt_cache:
            return None
        digests, totals, marks = _prefix_walk(body)
        total = totals[-1] if totals else 0
        read_at = -1
        for mark in marks:
            for q in range(mark, max(-1, mark - LOOKBACK_BLOCKS), -1):
                if digests[q] in self._cache:
                    read_at = max(read_at, q)
                    break
        read = totals[read_at] if read_at >= 0 else 0
        written = 0
        for mark in marks:
            if totals[mark] >= self.min_cache_tokens:
                self._cache[digests[mark]] = totals[mark]
                self._cache.move_to_end(digests[mark])
                written = max(written, totals[mark] - read)
        while len(self._cache) > CACHE_LIMIT:
            self._cache.popitem(last=False)
        return {
            "input_tokens": total - read - written,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": written,
        }

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
    ids = itertools.count(1)

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, script, ids)

    await serve_local(handler, "", task_status)


# --- HTTP/1.1 ------------------------------------------------------------------------------------


async def _serve_connection(
    stream: trio.SocketStream, script: FakeScript, ids: Iterator[int]
) -> None:
    reader = HeadReader(stream)
    try:
        while True:
            head = await reader.read_head()
            if head is None:
                await _send_json(
                    stream, 431, _error_body("invalid_request_error", "head too large")
                )
                return
            method, path, headers = parse_head(head)
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
            script._record(
                RecordedRequest(method=method, path=path, headers=headers, body=body, raw=raw)
            )
            keep_going = await _respond(stream, script, method, path, body, next(ids))
            if not keep_going or headers.get("connection", "").lower() == "close":
                return
    except (Closed, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await trio.aclose_forcefully(stream)


def _error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


async def _send_head(stream: trio.SocketStream, status: int, headers: Mapping[str, str]) -> None:
    await send_head(stream, status, headers, _REASONS)


async def _send_json(
    stream: trio.SocketStream,
    status: int,
    payload: Any,
    extra_headers: Mapping[str, str] | None = None,
    request_id: str = "req_fake",
) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
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
    refused = _check_marks(body)
    if refused is not None:
        await _send_json(
            stream, 400, _error_body("invalid_request_error", refused), request_id=request_id
        )
        return True
    response = script._next()
    if isinstance(response, Reply):
        counted = script._cached_usage(body)
        if counted is not None:
            response = attrs.evolve(response, **counted)
    if isinstance(response, Stall) and not response.head:
        await _wait_for_hang_up(stream)
        return False
    if isinstance(response, HttpError):
        error = {**_error_body(response.error_type, response.message), "request_id": request_id}
        await _send_json(
            stream,
            response.status,
            error if response.raw_body is None else response.raw_body.encode(),
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
        line = data.text if isinstance(data, _Raw) else json.dumps(data)
        payload = f"event: {event}\ndata: {line}\n\n".encode()
        await stream.send_all(b"%x\r\n%s\r\n" % (len(payload), payload))
        await trio.lowlevel.checkpoint()
    if isinstance(response, Disconnect):
        return False
    if isinstance(response, Stall):
        await _wait_for_hang_up(stream)
        return False
    await stream.send_all(b"0\r\n\r\n")
    return True


async def _wait_for_hang_up(stream: trio.SocketStream) -> None:
    """Say nothing until the client closes the connection (what it sends is dropped)."""
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:
        pass


# --- prompt caching ------------------------------------------------------------------------------


def _request_blocks(body: Any) -> list[tuple[str, Any]]:
    """The request's cacheable blocks in the API's order (tools, system, messages), each with
    where it stands (``tool``, ``system``, or a message's role with ``+`` on its first block)."""
    if not isinstance(body, dict):
        return []
    out: list[tuple[str, Any]] = [("tool", t) for t in body.get("tools") or ()]
    system = body.get("system")
    if isinstance(system, str):
        out.append(("system", {"type": "text", "text": system}))
    elif isinstance(system, list):
        out += [("system", b) for b in system]
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for j, block in enumerate(content or ()):
            out.append((f"{message.get('role')}{'+' if j == 0 else ''}", block))
    return out


def _compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _prefix_walk(body: Any) -> tuple[list[bytes], list[int], list[int]]:
    """For each block: the digest of the prefix through it, the tokens through it; and the
    indexes of the marked blocks."""
    digests: list[bytes] = []
    totals: list[int] = []
    marks: list[int] = []
    digest, total = b"", 0
    for i, (where, block) in enumerate(_request_blocks(body)):
        if isinstance(block, dict) and "cache_control" in block:
            marks.append(i)
        step = _compact([where, _unmarked(block)])
        digest = hashlib.sha256(digest + step).digest()
        total += max(1, len(step) // 4)
        digests.append(digest)
        totals.append(total)
    return digests, totals, marks


def _check_marks(body: Any) -> str | None:
    """Why the API would refuse the request's cache marks, or None."""
    found = 0
    for _, block in _request_blocks(body):
        if isinstance(block, dict) and "cache_control" in block:
            found += 1
            control = block["cache_control"]
            if not isinstance(control, dict) or control.get("type") != "ephemeral":
                return f"cache_control: unknown type {control!r}"
    if found > MAX_CACHE_MARKS:
        return (
            f"A maximum of {MAX_CACHE_MARKS} blocks with cache_control may be provided. "
            f"Found {found}."
        )
    return None


def marked_prefixes(body: Any) -> list[bytes]:
    """For each marked block of a request body, in order: the compact JSON of the request's
    blocks (each with where it stands) up to and including it, as the client sent them but for
    the marks, which are no part of what the cache keeps (a prefix marked where the request
    before ended is read back although that request marked other blocks on the way)."""
    blocks = _request_blocks(body)
    return [
        _compact([[where, _unmarked(b)] for where, b in blocks[: i + 1]])
        for i, (_, block) in enumerate(blocks)
        if isinstance(block, dict) and "cache_control" in block
    ]


def _unmarked(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    return {k: v for k, v in block.items() if k != "cache_control"}


@attrs.frozen
class _Raw:
    text: str


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
    response: Reply | StreamError | Disconnect | Garbled | Stall, msg_id: str
) -> Iterator[tuple[str, Any]]:
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
    elif isinstance(response, Garbled):
        yield response.event, _Raw(response.data)
    elif isinstance(response, Reply):
        yield _ev(
            "message_delta",
            delta={"stop_reason": response.stop_reason, "stop_sequence": None},
            usage={"output_tokens": response.output_tokens},
        )
        yield _ev("message_stop")
