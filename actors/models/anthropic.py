"""The Anthropic model provider: the Messages API, streamed, under trio.

:class:`AnthropicModel` implements :class:`actors.models.base.Model` with the official ``anthropic``
SDK's async client (httpx/anyio based, so it runs under trio). The SDK's own retries are off; this
module retries by itself so that the backoff sleeps are ``trio.sleep`` calls (a trio ``MockClock``
drives them) and each retry is announced through ``notice``.

Retry policy: HTTP 408, 409, 429, 5xx (529 "overloaded" included), connection errors, a stream
that stops before ``message_stop``, and mid-stream ``error`` events of a transient type
(``overloaded_error``, ``rate_limit_error``, ``api_error``, ``timeout_error``) are retried up to
``max_retries`` times; anything else (400, 401, 403, 404, ...) fails at once. The wait before
retry *n* is :func:`backoff_delay` (exponential, jittered, capped), raised to the server's
``retry-after`` when it asks for longer (still capped). Each retry is reported, before its wait,
to the request's ``on_retry`` (a :class:`~actors.models.base.ModelRetry`) and as a line to
``notice``. A failure that is final raises :class:`~actors.models.base.ModelError` with one readable
line; a refused credential (401), a denied permission (403) or a missing key raises its subclass
:class:`~actors.models.base.ModelAuthError`, since nothing but an operator's fix can cure it.

Each attempt is bounded by ``timeout_s`` (a server that never answers, or stops in the middle
of a stream, fails the attempt as a timeout, which is retried). A stream the SDK cannot read
(an event that is not JSON, or not the shape the API defines) fails the attempt as malformed, also
retried; nothing of a failed attempt is returned.

Prompt caching: each request marks its stable prefix with ``cache_control`` breakpoints
(:func:`actors.models.prompt_cache.mark_request`): the system text the next turn sends again (and
with it the tool definitions), the furthest point an earlier request of the same agent marked, the
last point the next turn shares, and the end of the request. The provider remembers the marked
prefixes of each agent's latest request (:class:`actors.models.prompt_cache.CacheMemory`).

Usage is read from ``message_start`` and ``message_delta``: ``input_tokens`` and
``output_tokens`` always, ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` when
the API reports them.

Text deltas reach ``on_delta`` as they arrive. When an attempt fails mid-stream after some text
was delivered, the retry streams its reply from the start again; the ``notice`` line announcing
the retry comes between the two.

The stored conversation is turned into Messages API turns by the pure function
:func:`to_messages_api`.
"""

from __future__ import annotations

import importlib
import os
import random
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import anthropic
import attrs
import trio
from anthropic.types import (
    InputJSONDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
    TextBlock,
    TextDelta,
    ToolUseBlock,
)

from protocol.display import scrub_surrogates, without_lone_surrogates
from protocol.hooks import ModelInfo
from protocol.jsonrpc import decode

from .base import (
    USAGE_KEYS,
    Block,
    DeltaSink,
    ModelAuthError,
    ModelError,
    ModelReply,
    ModelRequest,
    tool_result_items,
)
from .prompt_cache import CacheMemory, Marked, mark_request, system_blocks
from .retry import Failure, Retries, one_line, retry_after
from .tls import tls_context

__all__ = [
    "NOTICE_PREFIX",
    "START_PLACEHOLDER",
    "AnthropicModel",
    "to_messages_api",
]

#: Prefix of the user text that carries a stored ``system`` message (a host notice).
#: The context window the Messages API models offer, in tokens.
CONTEXT_WINDOW = 200_000
NOTICE_PREFIX = "[host notice] "
#: The user text put first when the stored context does not start with a user message.
START_PLACEHOLDER = "[earlier conversation omitted]"
#: The text of a ``tool_result`` whose stored content is empty.
EMPTY_RESULT = "(no output)"
#: The text of the ``tool_result`` made up for a ``tool_use`` that has no stored result.
MISSING_RESULT = "[no result was recorded for this tool call]"

_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_TRANSIENT_STREAM_ERRORS = frozenset(
    {"overloaded_error", "rate_limit_error", "api_error", "timeout_error"}
)
#: How long one attempt (request and whole stream) may take, in seconds.
ATTEMPT_TIMEOUT_S = 600.0
#: Where the key comes from when none is passed in.
CUSTOM_HEADERS_VARIABLE = "ANTHROPIC_CUSTOM_HEADERS"
KEY_VARIABLE = "ANTHROPIC_API_KEY"
#: What a refusal by HTTP status means for the credential.
_AUTH_PROBLEMS = {401: "refused the credential", 403: "denied the credential permission"}


# --- the provider --------------------------------------------------------------------------------


class AnthropicModel:
    """A :class:`actors.models.base.Model` backed by the Anthropic Messages API (streaming)."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        key_variable: str | None = KEY_VARIABLE,
        max_retries: int = 4,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 30.0,
        notice: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
        timeout_s: float = ATTEMPT_TIMEOUT_S,
        env_headers: bool = True,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self.model = model
        self._env_headers = env_headers
        self.name = f"anthropic:{model}"
        self.info = ModelInfo(
            id=model,
            vendor="anthropic",
            context_window=CONTEXT_WINDOW,
            capabilities=("tools", "vision"),
        )
        self._api_key = api_key
        self._base_url = base_url
        # None: no key is sent (an endpoint the operator configured without api_key_env)
        self._key_variable = key_variable
        self._retries = Retries(
            provider="anthropic",
            max_retries=max_retries,
            backoff_base_s=backoff_base_s,
            backoff_cap_s=backoff_cap_s,
            rng=rng if rng is not None else random.Random(),
            notice=notice,
        )
        self._timeout_s = timeout_s
        self._cache = CacheMemory()

    @property
    def _credential(self) -> str:
        if self._api_key is not None:
            return "the key passed in"
        return self._key_variable or "none is configured: name its variable in api_key_env"

    def _client(self, tls: ssl.SSLContext) -> anthropic.AsyncAnthropic:
        http = anthropic.DefaultAsyncHttpxClient(verify=tls)
        if self._api_key is None and self._key_variable is None:
            # no key: an empty one, and no authentication header at all
            omitted = {"Authorization": anthropic.Omit(), "X-Api-Key": anthropic.Omit()}
            return anthropic.AsyncAnthropic(
                api_key="",
                base_url=self._base_url,
                max_retries=0,
                default_headers=cast(Any, {**self._withheld(), **omitted}),
                http_client=http,
            )
        variable = self._key_variable or KEY_VARIABLE
        key = self._api_key if self._api_key is not None else os.environ.get(variable)
        if not key:
            raise ModelAuthError(
                f"{variable} is not set",
                provider="anthropic",
                problem="has no credential",
                credential=self._credential,
            )
        return anthropic.AsyncAnthropic(
            api_key=key,
            base_url=self._base_url,
            max_retries=0,
            default_headers=cast(Any, self._withheld()),
            http_client=http,
        )

    def _withheld(self) -> dict[str, Any]:
        """The SDK adds the headers of ``ANTHROPIC_CUSTOM_HEADERS`` to every request; they are
        meant for Anthropic's endpoint (or the one ``ANTHROPIC_BASE_URL`` names), so an endpoint
        of the config's own (``base_url``; ``env_headers=False``) never gets them."""
        if self._env_headers:
            return {}
        lines = os.environ.get(CUSTOM_HEADERS_VARIABLE, "").split("\n")
        names = [line.split(":", 1)[0].strip() for line in lines if ":" in line]
        return {name: anthropic.Omit() for name in names if name}

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelReply:
        client = self._client(await tls_context())
        try:
            return await self._complete_with_retries(client, request, on_delta)
        finally:
            # Closing only drops pooled sockets; shielded so a cancelled turn still releases them.
            with trio.move_on_after(5) as scope:
                scope.shield = True
                await client.close()

    async def _complete_with_retries(
        self,
        client: anthropic.AsyncAnthropic,
        request: ModelRequest,
        on_delta: DeltaSink | None,
    ) -> ModelReply:
        messages = to_messages_api(request.messages)
        next_turn = None
        if request.stable_messages is not None:
            next_turn = to_messages_api(request.messages[: request.stable_messages])
        # a server's tool text was made well formed as it came in; this keeps the body valid
        # UTF-8 whatever reaches it
        tools = scrub_surrogates(
            [
                {
                    "name": t.name,
                    "description": t.description,
                    "input_schema": {"type": "object", **dict(t.input_schema)},
                }
                for t in request.tools
            ]
        )
        system = system_blocks(without_lone_surrogates(request.system), request.stable_system)
        marked = mark_request(
            tools,
            system,
            messages,
            next_turn=next_turn,
            remembered=self._cache.recall(request.agent),
        )
        body: dict[str, Any] = {"model": self.model, "max_tokens": request.max_tokens}
        if marked.system:
            body["system"] = marked.system
        body["messages"] = marked.messages
        if marked.tools:
            body["tools"] = marked.tools
        if request.temperature is not None:
            body["temperature"] = request.temperature
        request.sent(body)
        retry = 0
        while True:
            try:
                with trio.move_on_after(self._timeout_s) as bound:
                    reply = await self._attempt(client, request, marked, on_delta)
                if bound.cancelled_caught:
                    raise _NoReplyInTime(f"no complete reply within {self._timeout_s:g}s")
            except Exception as exc:
                failure = _classify(exc)
                if failure is None:
                    raise
                error = self._retries.final_error(failure, retry, self._credential)
                if error is not None:
                    raise error from exc
            else:
                self._cache.remember(request.agent, marked.marks)
                return reply
            retry += 1
            await self._retries.wait(retry, failure, request)

    async def _attempt(
        self,
        client: anthropic.AsyncAnthropic,
        request: ModelRequest,
        marked: Marked,
        on_delta: DeltaSink | None,
    ) -> ModelReply:
        stream = await client.messages.create(
            model=self.model,
            max_tokens=request.max_tokens,
            messages=cast(Any, marked.messages),
            system=cast(Any, marked.system) if marked.system else anthropic.omit,
            tools=cast(Any, marked.tools) if marked.tools else anthropic.omit,
            stream=True,
            # this SDK's create() names no temperature; the API takes it in the body
            extra_body=None
            if request.temperature is None
            else {"temperature": request.temperature},
        )
        builder = _ReplyBuilder()
        async with stream:
            events = aiter(stream)
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    break
                except ValueError as exc:  # an event whose data is not JSON
                    raise _MalformedStream(f"malformed stream event: {exc}") from exc
                except RecursionError as exc:  # the SDK's parser recurses once per level
                    raise _MalformedStream("malformed stream event: nested too deeply") from exc
                try:
                    text = builder.feed(event)
                except (AttributeError, TypeError, KeyError) as exc:
                    # the SDK builds an event's object without checking it: a field missing or
                    # of the wrong type shows up as it is read
                    raise _MalformedStream(f"malformed stream event: {exc}") from exc
                if text and on_delta is not None:
                    await on_delta(text)
        if not builder.stopped:
            raise _StreamEndedEarly("the stream ended before message_stop")
        return builder.reply()


# --- assembling a streamed reply -----------------------------------------------------------------


@attrs.define
class _Part:
    kind: str  # "text" | "tool_use" | "other"
    text: str = ""
    id: str = ""
    name: str = ""
    start_input: Any = None
    json: str = ""
    input: dict[str, Any] | None = None


class _ReplyBuilder:
    def __init__(self) -> None:
        self.parts: dict[int, _Part] = {}
        self.model = ""
        self.stop_reason: str | None = None
        self.usage = {"input_tokens": 0, "output_tokens": 0}
        self.stopped = False

    def feed(self, event: object) -> str:
        """Take one stream event; returns the text it adds (possibly empty)."""
        if isinstance(event, RawMessageStartEvent):
            self.model = event.message.model
            self._take_usage(event.message.usage)
        elif isinstance(event, RawContentBlockStartEvent):
            block = event.content_block
            if isinstance(block, TextBlock):
                self.parts[event.index] = _Part("text", text=block.text)
                return block.text
            if isinstance(block, ToolUseBlock):
                self.parts[event.index] = _Part(
                    "tool_use", id=block.id, name=block.name, start_input=block.input
                )
            else:
                self.parts[event.index] = _Part("other")
        elif isinstance(event, RawContentBlockDeltaEvent):
            part = self.parts.get(event.index)
            if part is None:
                raise _MalformedStream(
                    f"malformed stream event: delta for unknown block {event.index}"
                )
            if isinstance(event.delta, TextDelta) and part.kind == "text":
                part.text += event.delta.text
                return event.delta.text
            if isinstance(event.delta, InputJSONDelta) and part.kind == "tool_use":
                part.json += event.delta.partial_json
        elif isinstance(event, RawContentBlockStopEvent):
            part = self.parts.get(event.index)
            if part is not None and part.kind == "tool_use":
                part.input = _tool_input(part)
        elif isinstance(event, RawMessageDeltaEvent):
            if event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
            self._take_usage(event.usage)
        elif isinstance(event, RawMessageStopEvent):
            self.stopped = True
        return ""

    def _take_usage(self, usage: object) -> None:
        """The counts a usage object reports (a ``message_delta`` repeats them as they stand
        at the end); the cache counts only when the API sends them."""
        for key in USAGE_KEYS:
            value = getattr(usage, key, None)
            if isinstance(value, int):
                self.usage[key] = value

    def reply(self) -> ModelReply:
        """The reply; text that is only whitespace, when that is all the text there is, is no
        block (a model that ends its turn with nothing to say may still send a newline)."""
        blocks: list[Block] = []
        says = any(p.kind == "text" and p.text.strip() for p in self.parts.values())
        for index in sorted(self.parts):
            part = self.parts[index]
            if part.kind == "text" and (part.text if says else part.text.strip()):
                blocks.append({"type": "text", "text": part.text})
            elif part.kind == "tool_use":
                tool_input = part.input if part.input is not None else _tool_input(part)
                blocks.append(
                    {"type": "tool_use", "id": part.id, "name": part.name, "input": tool_input}
                )
        return ModelReply(
            blocks=tuple(blocks),
            stop_reason=self.stop_reason or "end_turn",
            model=self.model,
            usage=dict(self.usage),
        )


def _tool_input(part: _Part) -> dict[str, Any]:
    if part.json.strip():
        try:
            value = decode(part.json)
        except ValueError as exc:
            raise ModelError(
                one_line(f"anthropic: tool call {part.name} has malformed input JSON: {exc}")
            ) from exc
    else:
        value = part.start_input if part.start_input is not None else {}
    if not isinstance(value, dict):
        raise ModelError(f"anthropic: tool call {part.name} input is not a JSON object")
    return value


# --- failures ------------------------------------------------------------------------------------


class _StreamEndedEarly(Exception):
    pass


class _MalformedStream(Exception):
    pass


class _NoReplyInTime(Exception):
    pass


def _transport_error_types() -> tuple[type[BaseException], ...]:
    # The SDK's HTTP layer is httpx2 in current releases and httpx in older ones; errors raised
    # while a response body streams come through unwrapped.
    found: list[type[BaseException]] = []
    for module_name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found.append(module.TransportError)
    return tuple(found)


_TRANSPORT_ERRORS = _transport_error_types()


def _status_label(status: int) -> str:
    if status == 529:
        return "overloaded"
    if status == 429:
        return "rate limited"
    if status == 408:
        return "request timeout"
    if status == 409:
        return "conflict"
    return "server error"


def _classify(exc: Exception) -> Failure | None:
    """How to treat an exception from one attempt; None for one that is not the API's."""
    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        etype = exc.type or "error"
        message = exc.api_message or str(exc)
        if 200 <= status < 300:  # an ``error`` event inside a 200 stream
            label = "overloaded" if etype == "overloaded_error" else "stream error"
            return Failure(
                retryable=etype in _TRANSIENT_STREAM_ERRORS,
                label=f"{label} (mid-stream {etype})",
                detail=f"mid-stream {etype}: {message}",
            )
        retryable = status in (408, 409, 429) or status >= 500
        return Failure(
            retryable=retryable,
            label=f"{_status_label(status)} ({status})",
            detail=f"HTTP {status} {etype}: {message}",
            retry_after=retry_after(exc.response.headers) if retryable else None,
            auth=_AUTH_PROBLEMS.get(status),
        )
    if isinstance(exc, anthropic.APITimeoutError):
        return Failure(True, "timeout", "request timed out")
    if isinstance(exc, anthropic.APIConnectionError):
        cause = exc.__cause__
        reason = f"{exc.message} {cause}" if cause is not None else exc.message
        return Failure(True, "connection error", f"connection error: {reason}")
    if isinstance(exc, _TRANSPORT_ERRORS):
        return Failure(True, "connection error", f"connection error: {exc}")
    if isinstance(exc, _StreamEndedEarly):
        return Failure(True, "stream cut short", str(exc))
    if isinstance(exc, _MalformedStream):
        return Failure(True, "malformed stream", str(exc))
    if isinstance(exc, _NoReplyInTime):
        return Failure(True, "no reply in time", str(exc))
    if isinstance(exc, anthropic.AnthropicError):
        return Failure(False, type(exc).__name__, f"{type(exc).__name__}: {exc}")
    return None


# --- stored messages → Messages API --------------------------------------------------------------


def to_messages_api(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Turn stored messages (oldest first) into Messages API ``messages``.

    * ``user`` → user, ``assistant`` → assistant (text and ``tool_use``), ``tool`` → user with
      ``tool_result`` blocks, ``system`` (host notices) → user text prefixed ``[host notice] ``.
    * Base64 images (``data`` + ``mimeType``) become image blocks where the API takes them (user
      turns, tool results); uri-form media and ``resource``/``resource_link`` blocks become the
      text ``[resource: <uri>]``; other blocks become a short bracketed placeholder.
    * Empty (whitespace-only) text blocks and messages left empty are dropped; consecutive turns
      of one role are merged; a user placeholder goes first when needed.
    * Each user turn starts with the ``tool_result`` blocks answering the assistant turn before
      it. A result that answers no ``tool_use`` of that turn (or answers one twice) becomes text;
      a ``tool_use`` with no stored result gets an error result saying so.
    * A final assistant turn loses trailing whitespace (the API rejects it).
    * A lone surrogate in any string becomes U+FFFD (the body must be valid UTF-8).

    The result is never empty, starts with a user turn and alternates roles.
    """
    turns: list[dict[str, Any]] = []
    for message in messages:
        stored_role = str(message.get("role", "user"))
        role = "assistant" if stored_role == "assistant" else "user"
        content: list[dict[str, Any]] = []
        for block in message.get("blocks") or ():
            if isinstance(block, Mapping):
                content.extend(_convert_block(block, stored_role))
        if not content:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(content)
        else:
            turns.append({"role": role, "content": content})

    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [_text(START_PLACEHOLDER)]})

    for i, turn in enumerate(turns):
        if turn["role"] == "user":
            asked = _tool_use_ids(turns[i - 1]) if i > 0 else []
            turn["content"] = _pair_results(turn["content"], asked)
    last = turns[-1]
    if last["role"] == "assistant":
        asked = _tool_use_ids(last)
        if asked:
            turns.append({"role": "user", "content": _pair_results([], asked)})
        else:
            _strip_trailing_whitespace(turns)
    return cast(list[dict[str, Any]], scrub_surrogates(turns))


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _uri_placeholder(uri: Any) -> dict[str, Any]:
    return _text(f"[resource: {uri}]")


def _convert_block(block: Mapping[str, Any], stored_role: str) -> list[dict[str, Any]]:
    btype = block.get("type")
    if btype == "text":
        text = str(block.get("text") or "")
        if not text.strip():
            return []
        return [_text(NOTICE_PREFIX + text if stored_role == "system" else text)]
    if btype == "tool_use":
        if stored_role == "assistant":
            raw_input = block.get("input")
            return [
                {
                    "type": "tool_use",
                    "id": str(block.get("id", "")),
                    "name": str(block.get("name", "")),
                    "input": dict(raw_input) if isinstance(raw_input, Mapping) else {},
                }
            ]
        return [_text(f"[tool call {block.get('name', '')} ({block.get('id', '')})]")]
    if btype == "tool_result":
        result = _convert_tool_result(block)
        if stored_role == "assistant":
            return _result_as_text(result, allow_images=False)
        return [result]
    return _convert_media(block, allow_images=stored_role != "assistant")


def _convert_media(block: Mapping[str, Any], *, allow_images: bool) -> list[dict[str, Any]]:
    """Image, audio, resource and unknown blocks (also inside tool results)."""
    btype = block.get("type")
    if btype in ("image", "audio"):
        mime = str(block.get("mimeType") or "")
        data = block.get("data")
        if btype == "image" and isinstance(data, str) and data:
            if allow_images and mime in _IMAGE_TYPES:
                return [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": mime, "data": data},
                    }
                ]
            return [_text(f"[image ({mime or 'unknown type'}) omitted]")]
        if block.get("uri"):
            return [_uri_placeholder(block["uri"])]
        return [_text(f"[{btype} ({mime or 'unknown type'}) omitted]")]
    if btype == "resource":
        resource = block.get("resource")
        uri = resource.get("uri") if isinstance(resource, Mapping) else None
        return [_uri_placeholder(uri if uri else block.get("uri", "?"))]
    if btype == "resource_link":
        return [_uri_placeholder(block.get("uri", "?"))]
    return [_text(f"[{btype} block omitted]")]


def _convert_tool_result(block: Mapping[str, Any]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for item in tool_result_items(block):
        if item.get("type") == "text":
            text = str(item.get("text") or "")
            if text.strip():
                content.append(_text(text))
        elif item.get("type") in ("tool_use", "tool_result"):
            content.append(_text(f"[{item.get('type')} block omitted]"))
        else:
            content.extend(_convert_media(item, allow_images=True))
    return {
        "type": "tool_result",
        "tool_use_id": str(block.get("tool_use_id", "")),
        "content": content or [_text(EMPTY_RESULT)],
        "is_error": bool(block.get("is_error", False)),
    }


def _result_as_text(
    result: Mapping[str, Any], *, allow_images: bool = True
) -> list[dict[str, Any]]:
    """A converted ``tool_result`` that cannot stand as one, as plain content."""
    error = " (error)" if result.get("is_error") else ""
    head = f"[result of tool call {result.get('tool_use_id', '')}{error}]"
    texts: list[str] = [head]
    images: list[dict[str, Any]] = []
    for block in result["content"]:
        if block["type"] == "text":
            texts.append(block["text"])
        elif allow_images:
            images.append(block)
        else:
            texts.append(f"[image ({block['source']['media_type']}) omitted]")
    return [_text("\n".join(texts)), *images]


def _tool_use_ids(turn: Mapping[str, Any]) -> list[str]:
    if turn["role"] != "assistant":
        return []
    return [b["id"] for b in turn["content"] if b["type"] == "tool_use"]


def _pair_results(content: list[dict[str, Any]], asked: list[str]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    answered: set[str] = set()
    for block in content:
        if block["type"] != "tool_result":
            others.append(block)
        elif block["tool_use_id"] in asked and block["tool_use_id"] not in answered:
            answered.add(block["tool_use_id"])
            results.append(block)
        else:
            others.extend(_result_as_text(block))
    for tool_use_id in asked:
        if tool_use_id not in answered:
            answered.add(tool_use_id)
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use_id,
                    "content": [_text(MISSING_RESULT)],
                    "is_error": True,
                }
            )
    return results + others


def _strip_trailing_whitespace(turns: list[dict[str, Any]]) -> None:
    content = turns[-1]["content"]
    if content[-1]["type"] == "text":
        content[-1] = _text(content[-1]["text"].rstrip())
        # Text blocks are never whitespace-only here, so the stripped text is not empty.
