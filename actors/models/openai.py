"""The OpenAI-compatible model provider: chat completions, streamed, under trio.

:class:`OpenAIModel` implements :class:`actors.models.base.Model` on the chat-completions interface
that OpenAI, OpenRouter, vLLM, Ollama, LM Studio and most other servers speak. It talks HTTP
itself, through ``httpx`` (which runs under trio by way of anyio), rather than through the
official ``openai`` SDK. The SDK would run under trio too, but its client reads more of the
environment than the key: ``OPENAI_BASE_URL``, ``OPENAI_ORG_ID``, ``OPENAI_PROJECT_ID`` and
``OPENAI_CUSTOM_HEADERS`` are sent along to whatever endpoint it is given. Here every header is
this module's choice, so a credential goes only where the operator sent it: the key named by
``key_variable`` (or passed in), as ``Authorization: Bearer``, and nothing when there is none (a
local server needs none). The client also takes no proxy, netrc or certificate settings from the
environment and follows no redirect.

Retry policy, as the Anthropic provider's: HTTP 408, 409, 429, 5xx, connection errors, no
answer within ``idle_timeout_s`` (between any two reads, the response head included) or within
``attempt_timeout_s`` (the whole attempt), a stream cut short, and a mid-stream error whose code
says overload or a server fault are retried up to ``max_retries`` times; anything else fails at
once. The wait before retry *n* is :func:`~actors.kernel.backoff_delay`, raised to the server's
``retry-after`` (or ``retry-after-ms``) when it asks for longer, capped at ``backoff_cap_s``.
Each retry is reported, before its wait, to the request's ``on_retry`` and as a line to
``notice``. A final failure is a :class:`~actors.models.base.ModelError` of one line; HTTP 401 and
403, or a key variable that is not set, raise :class:`~actors.models.base.ModelAuthError`.

A stream that is not the interface's shape (see :mod:`actors.models.openai_stream`) fails the
call at once with nothing returned. A stream ends at ``data: [DONE]``; one that ends without it
counts as cut short unless a ``finish_reason`` came. Text deltas reach ``on_delta`` as they
arrive; a retried call streams its reply from the start again.

The request body carries ``max_tokens`` (``max_completion_tokens`` for OpenAI's own endpoint,
where the reasoning models take no other), ``temperature`` when set, and
``stream_options.include_usage`` so the last chunk reports usage.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from protocol.display import without_lone_surrogates
from protocol.hooks import ModelInfo
from protocol.jsonrpc import decode

from .base import (
    DeltaSink,
    ModelAuthError,
    ModelReply,
    ModelRequest,
)
from .openai_chat import to_chat_messages, to_chat_tools
from .openai_stream import ChunkAssembler, EventDecoder, MalformedStream, StreamError
from .retry import MAX_LINE, Failure, Retries, retry_after
from .tls import tls_context

__all__ = ["DEFAULT_BASE_URL", "KEY_VARIABLE", "OpenAIModel"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: Where the key comes from when the agent configures no endpoint of its own.
KEY_VARIABLE = "OPENAI_API_KEY"
#: What ``model/info`` reports; the interface does not say, so a common size is assumed.
CONTEXT_WINDOW = 128_000
PROVIDER = "openai"
NO_KEY = "none is configured: name its variable in api_key_env"
#: How long a server may send nothing (the response head included), and how long one attempt
#: may take in all, before it counts as no answer.
IDLE_TIMEOUT_S = 300.0
ATTEMPT_TIMEOUT_S = 900.0

_MAX_ERROR_BODY = 64 * 1024
_AUTH_PROBLEMS = {401: "refused the credential", 403: "denied the credential permission"}
_TRANSIENT_CODES = frozenset({"server_error", "rate_limit_exceeded", "overloaded"})


class OpenAIModel:
    """A :class:`actors.models.base.Model` on an OpenAI-compatible chat-completions endpoint."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        key_variable: str | None = KEY_VARIABLE,
        max_retries: int = 4,
        backoff_base_s: float = 1.0,
        backoff_cap_s: float = 30.0,
        idle_timeout_s: float | None = None,
        attempt_timeout_s: float | None = None,
        notice: Callable[[str], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.model = model
        self.name = f"{PROVIDER}:{model}"
        self.info = ModelInfo(
            id=model,
            vendor=PROVIDER,
            context_window=CONTEXT_WINDOW,
            capabilities=("tools", "vision"),
        )
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._api_key = api_key
        self._key_variable = key_variable
        self._retries = Retries(
            provider=PROVIDER,
            max_retries=max_retries,
            backoff_base_s=backoff_base_s,
            backoff_cap_s=backoff_cap_s,
            rng=rng if rng is not None else random.Random(),
            notice=notice,
        )
        self._idle_timeout_s = IDLE_TIMEOUT_S if idle_timeout_s is None else idle_timeout_s
        self._attempt_timeout_s = (
            ATTEMPT_TIMEOUT_S if attempt_timeout_s is None else attempt_timeout_s
        )
        official = urlsplit(self.base_url).hostname == urlsplit(DEFAULT_BASE_URL).hostname
        self._limit_key = "max_completion_tokens" if official else "max_tokens"

    @property
    def credential(self) -> str:
        """Where the key comes from, for the operator."""
        if self._api_key is not None:
            return "the key passed in"
        return self._key_variable or NO_KEY

    def _key(self) -> str | None:
        if self._api_key is not None:
            return self._api_key
        if self._key_variable is None:
            return None
        key = os.environ.get(self._key_variable)
        if not key:
            raise ModelAuthError(
                f"{self._key_variable} is not set",
                provider=PROVIDER,
                problem="has no credential",
                credential=self.credential,
            )
        return key

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body of the request for ``request``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_chat_messages(without_lone_surrogates(request.system), request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            self._limit_key: request.max_tokens,
        }
        if request.tools:
            body["tools"] = to_chat_tools(request.tools)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        return body

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelReply:
        key = self._key()
        headers = {"accept": "text/event-stream", "user-agent": "mcplive"}
        if key is not None:
            headers["authorization"] = f"Bearer {key}"
        client = httpx.AsyncClient(
            verify=await tls_context(),
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(self._idle_timeout_s, connect=min(30.0, self._idle_timeout_s)),
            headers=headers,
        )
        try:
            return await self._complete_with_retries(client, request, on_delta)
        finally:
            # Closing only drops pooled sockets; shielded so a cancelled turn still releases them.
            with trio.move_on_after(5) as scope:
                scope.shield = True
                await client.aclose()

    async def _complete_with_retries(
        self, client: httpx.AsyncClient, request: ModelRequest, on_delta: DeltaSink | None
    ) -> ModelReply:
        body = self.body(request)
        request.sent(body)
        retry = 0
        while True:
            try:
                return await self._attempt(client, body, on_delta)
            except Exception as exc:
                failure = self._classify(exc)
                if failure is None:
                    raise
                error = self._retries.final_error(failure, retry, self.credential)
                if error is not None:
                    raise error from exc
            retry += 1
            await self._retries.wait(retry, failure, request)

    async def _attempt(
        self, client: httpx.AsyncClient, body: Mapping[str, Any], on_delta: DeltaSink | None
    ) -> ModelReply:
        url = f"{self.base_url}/chat/completions"
        with trio.move_on_after(self._attempt_timeout_s) as deadline:
            async with client.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    raise _HttpFailure(response.status_code, await _error_body(response), response)
                decoder = EventDecoder()
                assembler = ChunkAssembler()
                async for raw in response.aiter_bytes():
                    for data in decoder.receive_data(raw):
                        text = assembler.feed(data)
                        if text and on_delta is not None:
                            await on_delta(text)
                        if assembler.done:
                            return assembler.reply()
                if assembler.finish_reason is None:
                    raise _StreamEndedEarly("the stream ended before [DONE]")
                return assembler.reply()
        assert deadline.cancelled_caught
        raise _NoAnswer(f"no complete answer within {self._attempt_timeout_s:g}s")

    def _classify(self, exc: Exception) -> Failure | None:
        """How to treat an exception from one attempt; None for one that is not the API's."""
        if isinstance(exc, _HttpFailure):
            retryable = exc.status in (408, 409, 429) or exc.status >= 500
            return Failure(
                retryable=retryable,
                label=f"{_status_label(exc.status)} ({exc.status})",
                detail=f"HTTP {exc.status} {exc.detail}",
                retry_after=retry_after(exc.headers) if retryable else None,
                auth=_AUTH_PROBLEMS.get(exc.status),
            )
        if isinstance(exc, httpx.TimeoutException):
            return Failure(True, "no answer", f"no answer within {self._idle_timeout_s:g}s")
        if isinstance(exc, _NoAnswer):
            return Failure(True, "no answer", str(exc))
        if isinstance(exc, httpx.TransportError):
            return Failure(True, "connection error", f"connection error: {exc or type(exc)}")
        if isinstance(exc, _StreamEndedEarly):
            return Failure(True, "stream cut short", str(exc))
        if isinstance(exc, StreamError):
            code = exc.code
            transient = (isinstance(code, int) and (code == 429 or code >= 500)) or (
                code in _TRANSIENT_CODES
            )
            return Failure(transient, f"stream error ({code})", f"mid-stream error: {exc}")
        if isinstance(exc, MalformedStream):
            return Failure(False, "malformed stream", f"malformed stream: {exc}")
        return None


# --- failures ------------------------------------------------------------------------------------


class _StreamEndedEarly(Exception):
    pass


class _NoAnswer(Exception):
    pass


class _HttpFailure(Exception):
    def __init__(self, status: int, detail: str, response: httpx.Response) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = response.headers


async def _error_body(response: httpx.Response) -> str:
    """The error an error response names: ``type`` (or ``code``) and ``message`` from the
    interface's ``{"error": {...}}`` body, else the start of the body as text."""
    raw = bytearray()
    async for piece in response.aiter_bytes():
        raw += piece
        if len(raw) > _MAX_ERROR_BODY:
            break
    text = raw[:_MAX_ERROR_BODY].decode("utf-8", "replace")
    try:
        payload = decode(text)
    except ValueError:
        return text.strip()[:MAX_LINE] or response.reason_phrase
    error = payload.get("error") if isinstance(payload, Mapping) else None
    if isinstance(error, Mapping):
        kind = error.get("type") or error.get("code") or "error"
        return f"{kind}: {error.get('message') or response.reason_phrase}"
    if isinstance(error, str):
        return error
    return text.strip()[:MAX_LINE]


def _status_label(status: int) -> str:
    labels = {429: "rate limited", 408: "request timeout", 409: "conflict"}
    return labels.get(status, "server error" if status >= 500 else "refused")
