"""A scripted stand-in for an OpenAI-compatible chat-completions server, on real loopback HTTP.

The test builds a :class:`FakeScript` (a queue of responses), starts the server in a nursery and
points a provider at the base URL it returns (which ends in ``/v1``, as OpenAI's does)::

    script = FakeScript([Reply(text="Hello")])
    base_url = await nursery.start(serve_fake_openai, script)
    model = OpenAIModel("gpt-x", base_url=base_url, api_key="k")

Every ``POST /v1/chat/completions`` takes the next response off the queue:

* :class:`Reply` — a completion. Streamed when the body says ``"stream": true``, as the interface
  documents it: ``data: {chat.completion.chunk}`` events (a first chunk with the role, the text
  in ``content`` pieces of ``chunk_size`` characters, each tool call opened with its ``id``,
  ``type`` and ``function.name`` and continued with ``function.arguments`` pieces, a chunk with
  the ``finish_reason``), then, when ``stream_options.include_usage`` is asked for, a chunk with
  empty ``choices`` and the ``usage`` (every earlier chunk then carries ``"usage": null``), then
  ``data: [DONE]``. Otherwise one ``chat.completion`` JSON object.
* :class:`HttpError` — an error status with the interface's ``{"error": {...}}`` body.
* :class:`Raw` — a 200 event stream of the given lines, as they are (for malformed streams).
* :class:`Cut` — a 200 stream of a reply's first ``events`` events, then the connection drops.
* :class:`Silent` — the request is read and never answered (until the server is cancelled).
* :class:`Held` — the request is held (``entered`` is set) until the test sets ``release``; then
  its ``reply`` is sent and ``sent`` is set.

Prompt caching, as OpenAI does it (automatically, by prefix): with ``FakeScript(prompt_cache=True)``
the server remembers each request's prompt, read as the bytes of its ``tools`` then its
``messages`` in compact JSON, and reports as ``usage.prompt_tokens_details.cached_tokens`` the
longest byte prefix it shares with an earlier prompt, in tokens (a token per four bytes), rounded
down to whole blocks of ``cache_block_tokens`` (128, as OpenAI's) and nothing below
``min_cache_tokens`` (OpenAI's is 1,024; the fake's is 0 unless set); ``prompt_tokens`` is the
whole prompt's tokens. Anything that changes early in a prompt (a time in the system message)
ends the shared prefix there, as it does for the real API. The newest ``CACHE_LIMIT`` prompts
are kept. Without ``prompt_cache`` the usage is the :class:`Reply`'s own.

When the queue is empty the answer is ``400 invalid_request_error`` ("fake openai: script
exhausted"), which a provider does not retry.

What it checks of a request: the method and path, a JSON body with ``model`` and a ``messages``
list; anything else is answered 400 and recorded. What it cannot check: that a real server would
accept the messages (roles in order, tool messages after their call, image support of a model),
the meaning of sampling settings, or rate limits other than those scripted.

Bounds: each request is recorded (method, path, lower-cased headers, parsed JSON body) in
``FakeScript.requests``, which keeps only the newest ``log_limit`` (default 1000). Request heads
are limited to 64 KiB and bodies to 32 MiB. HTTP/1.1 with keep-alive; bodies need a
``Content-Length``.
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

from tests.fake_http import MAX_BODY_BYTES, Closed, HeadReader, parse_head, send_head, serve_local

__all__ = [
    "Cut",
    "FakeScript",
    "Held",
    "HttpError",
    "Raw",
    "RecordedRequest",
    "Reply",
    "Silent",
    "ToolCall",
    "prompt_bytes",
    "serve_fake_openai",
]

DEFAULT_LOG_LIMIT = 1000
#: Prompts the fake's prompt cache keeps (the oldest go first).
CACHE_LIMIT = 256
#: OpenAI caches a prompt's prefix in blocks of this many tokens.
CACHE_BLOCK_TOKENS = 128


@attrs.frozen(kw_only=True)
class ToolCall:
    id: str
    name: str
    arguments: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Reply:
    text: str = ""
    tool_calls: Sequence[ToolCall] = ()
    refusal: str = ""
    finish_reason: str | None = None  # None: "tool_calls" when there are calls, else "stop"
    model: str = "gpt-fake"
    prompt_tokens: int = 11
    completion_tokens: int = 7
    cached_tokens: int | None = None  # None leaves prompt_tokens_details out
    chunk_size: int = 4

    @property
    def finish(self) -> str:
        if self.finish_reason is not None:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"

    def usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if self.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage


@attrs.frozen(kw_only=True)
class HttpError:
    status: int
    message: str = "The server had an error while processing your request."
    error_type: str = "server_error"
    code: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    #: the body as sent, in place of the interface's error object (for hostile bodies)
    raw_body: str | None = None


@attrs.frozen(kw_only=True)
class Raw:
    """A 200 ``text/event-stream`` whose body is these lines, each followed by a blank line."""

    lines: Sequence[str]


@attrs.frozen(kw_only=True)
class Cut:
    reply: Reply
    events: int = 2


@attrs.frozen(kw_only=True)
class Silent:
    pass


@attrs.frozen(kw_only=True)
class Held:
    """``reply``, once the test sets ``release``; ``entered`` is set when the request arrives and
    ``sent`` once the reply is written (into the socket's buffer: its reader may be stopped)."""

    reply: Reply
    release: trio.Event = attrs.field(factory=trio.Event)
    entered: trio.Event = attrs.field(factory=trio.Event)
    sent: trio.Event = attrs.field(factory=trio.Event)


Response = Reply | HttpError | Raw | Cut | Silent | Held


@attrs.frozen(kw_only=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


class FakeScript:
    """The scripted responses (consumed in order) and the log of requests received."""

    def __init__(
        self,
        responses: Iterable[Response] = (),
        *,
        log_limit: int = DEFAULT_LOG_LIMIT,
        prompt_cache: bool = False,
        min_cache_tokens: int = 0,
        cache_block_tokens: int = CACHE_BLOCK_TOKENS,
    ):
        self._queue: collections.deque[Response] = collections.deque(responses)
        self._log: collections.deque[RecordedRequest] = collections.deque(maxlen=log_limit)
        self.prompt_cache = prompt_cache
        self.min_cache_tokens = min_cache_tokens
        self.cache_block_tokens = max(1, cache_block_tokens)
        self._prompts: collections.deque[bytes] = collections.deque(maxlen=CACHE_LIMIT)

    def add(self, *responses: Response) -> None:
        self._queue.extend(responses)

    @property
    def remaining(self) -> int:
        return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        return list(self._log)

    def _cached_usage(self, body: Mapping[str, Any]) -> dict[str, int] | None:
        """``prompt_tokens`` and ``cached_tokens`` as the API would count them for ``body``
        (see the module docstring), the prompt remembered; None when the fake keeps no cache."""
        if not self.prompt_cache:
            return None
        prompt = prompt_bytes(body)
        shared = max((_common_prefix(prompt, seen) for seen in self._prompts), default=0)
        self._prompts.append(prompt)
        cached = shared // 4 // self.cache_block_tokens * self.cache_block_tokens
        if cached < self.min_cache_tokens:
            cached = 0
        return {"prompt_tokens": max(1, len(prompt) // 4), "cached_tokens": cached}

    def _next(self) -> Response:
        if self._queue:
            return self._queue.popleft()
        return HttpError(
            status=400, message="fake openai: script exhausted", error_type="invalid_request_error"
        )


def prompt_bytes(body: Mapping[str, Any]) -> bytes:
    """What the fake's prompt cache reads of a request: its tools, then its messages, as
    compact JSON."""
    tools = json.dumps(body.get("tools") or [], ensure_ascii=False, separators=(",", ":"))
    messages = json.dumps(body.get("messages"), ensure_ascii=False, separators=(",", ":"))
    return (tools + messages).encode("utf-8", "replace")


def _common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


async def serve_fake_openai(
    script: FakeScript, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Serve ``script`` on 127.0.0.1 (a free port); reports the base URL (``.../v1``) via
    ``task_status``. Runs until cancelled."""
    ids = itertools.count(1)

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, script, ids)

    await serve_local(handler, "/v1", task_status)


# --- HTTP/1.1 ------------------------------------------------------------------------------------


async def _serve_connection(
    stream: trio.SocketStream, script: FakeScript, ids: Iterator[int]
) -> None:
    reader = HeadReader(stream)
    try:
        while True:
            head = await reader.read_head()
            if head is None:
                await _send_json(stream, 431, _error("head too large", "invalid_request"))
                return
            method, path, headers = parse_head(head)
            length = int(headers.get("content-length", "0") or "0")
            if length > MAX_BODY_BYTES or "chunked" in headers.get("transfer-encoding", ""):
                await _send_json(stream, 413, _error("body too large or unsized", "invalid"))
                return
            raw = await reader.read_exactly(length)
            try:
                body: Any = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode("utf-8", "replace")
            script._log.append(
                RecordedRequest(method=method, path=path, headers=headers, body=body)
            )
            if not await _respond(stream, script, method, path, body, next(ids)):
                return
    except (Closed, trio.BrokenResourceError, trio.ClosedResourceError):
        return
    finally:
        await trio.aclose_forcefully(stream)


def _error(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 429: "Too Many"}


async def _send_head(stream: trio.SocketStream, status: int, headers: Mapping[str, str]) -> None:
    await send_head(stream, status, headers, _REASONS)


async def _send_json(
    stream: trio.SocketStream, status: int, payload: Any, extra: Mapping[str, str] | None = None
) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"content-type": "application/json", "content-length": str(len(data))}
    await _send_head(stream, status, {**headers, **(extra or {})})
    await stream.send_all(data)


async def _send_event(stream: trio.SocketStream, line: str) -> None:
    payload = f"{line}\n\n".encode()
    await stream.send_all(b"%x\r\n%s\r\n" % (len(payload), payload))
    await trio.lowlevel.checkpoint()


async def _respond(
    stream: trio.SocketStream, script: FakeScript, method: str, path: str, body: Any, n: int
) -> bool:
    """Answer one request; False when the connection must be closed afterwards."""
    if method != "POST" or path.split("?", 1)[0] != "/v1/chat/completions":
        await _send_json(stream, 404, _error(f"no route {method} {path}", "invalid_request_error"))
        return True
    if not (
        isinstance(body, dict)
        and isinstance(body.get("model"), str)
        and isinstance(body.get("messages"), list)
    ):
        await _send_json(stream, 400, _error("model and messages required", "invalid_request"))
        return True
    response = script._next()
    held: Held | None = None
    if isinstance(response, Held):
        held = response
        held.entered.set()
        await held.release.wait()
        response = held.reply
    if isinstance(response, Reply):
        counted = script._cached_usage(body)
        if counted is not None:
            response = attrs.evolve(response, **counted)
    if isinstance(response, Silent):
        await trio.sleep_forever()
    if isinstance(response, HttpError):
        payload: Any = _error(response.message, response.error_type, response.code)
        if response.raw_body is not None:
            payload = response.raw_body.encode()
        await _send_json(stream, response.status, payload, response.headers)
        return True
    streaming = body.get("stream") is True
    if isinstance(response, Reply) and not streaming:
        await _send_json(stream, 200, _completion(response, f"chatcmpl-{n}"))
        if held is not None:
            held.sent.set()
        return True
    await _send_head(
        stream,
        200,
        {"content-type": "text/event-stream", "transfer-encoding": "chunked"},
    )
    if isinstance(response, Raw):
        for line in response.lines:
            await _send_event(stream, line)
        await stream.send_all(b"0\r\n\r\n")
        return True
    reply = response.reply if isinstance(response, Cut) else response
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    events = list(_chunks(reply, f"chatcmpl-{n}", include_usage))
    if isinstance(response, Cut):
        events = events[: response.events]
    for event in events:
        await _send_event(stream, f"data: {json.dumps(event)}")
    if isinstance(response, Cut):
        return False
    await _send_event(stream, "data: [DONE]")
    await stream.send_all(b"0\r\n\r\n")
    if held is not None:
        held.sent.set()
    return True


def _completion(reply: Reply, cid: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(dict(c.arguments))},
            }
            for c in reply.tool_calls
        ]
    return {
        "id": cid,
        "object": "chat.completion",
        "created": 1,
        "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish}],
        "usage": reply.usage(),
    }


def _pieces(s: str, size: int) -> list[str]:
    size = max(1, size)
    return [s[i : i + size] for i in range(0, len(s), size)]


def _chunks(reply: Reply, cid: str, include_usage: bool) -> Iterator[dict[str, Any]]:
    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": reply.model,
            "choices": [{"index": 0, "delta": dict(delta), "finish_reason": finish}],
        }
        if include_usage:
            out["usage"] = None
        return out

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(reply.text, reply.chunk_size):
        yield chunk({"content": piece})
    for piece in _pieces(reply.refusal, reply.chunk_size):
        yield chunk({"refusal": piece})
    for index, call in enumerate(reply.tool_calls):
        opening = {"index": index, "id": call.id, "type": "function"}
        yield chunk({"tool_calls": [{**opening, "function": {"name": call.name, "arguments": ""}}]})
        arguments = json.dumps(dict(call.arguments), separators=(",", ":"))
        for piece in _pieces(arguments, reply.chunk_size):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, reply.finish)
    if include_usage:
        yield {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": reply.model,
            "choices": [],
            "usage": reply.usage(),
        }
