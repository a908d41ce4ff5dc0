"""The model-provider interface shared by every provider.

A provider turns an agent's context (stored messages, oldest first) into one assistant reply: text
blocks and ``tool_use`` blocks. The agent's turn task calls :meth:`Model.complete` once per tool
round; it executes the tool calls itself and calls again with the results appended.

Each reply reports its token usage (:class:`Usage`). A provider that retries by itself reports
each retry to the request's ``on_retry`` as it happens (:class:`ModelRetry`). A failure that no
retry and no later call can cure until an operator acts (a refused or missing credential) is a
:class:`ModelAuthError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from protocol.hooks import ModelInfo

Block = Mapping[str, Any]

#: Told the body a provider sends for a request (see ``ModelRequest.on_request``).
RequestSink = Callable[[Mapping[str, Any]], None]

#: Called with each text delta while a reply streams (may be ``None``).
DeltaSink = Callable[[str], Awaitable[None]]

#: The usage keys, as the Anthropic Messages API names them.
USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


@attrs.frozen(kw_only=True)
class Usage:
    """Tokens one model call (or the sum of several) used.

    ``input_tokens`` counts the input that was neither read from nor written to the provider's
    prompt cache; ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` count the rest
    (the Anthropic Messages API's meaning of its fields of the same names).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0

    @classmethod
    def of(cls, reported: Mapping[str, Any]) -> Usage:
        """The usage a provider reported: the known keys that hold a count; anything else
        (a missing key, a negative number, a value that is no integer) counts as 0."""
        counts = {
            k: v
            for k in USAGE_KEYS
            if isinstance(v := reported.get(k), int) and not isinstance(v, bool) and v > 0
        }
        return cls(**counts)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens
            + other.cache_creation_input_tokens,
        )

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in USAGE_KEYS}

    def describe(self) -> str:
        """One short phrase, e.g. ``1,204 in, 87 out, cache 1,000 read, 0 written`` (the cache
        part only when the cache was used)."""
        text = f"{self.input_tokens:,} in, {self.output_tokens:,} out"
        if self.cache_read_input_tokens or self.cache_creation_input_tokens:
            text += (
                f", cache {self.cache_read_input_tokens:,} read, "
                f"{self.cache_creation_input_tokens:,} written"
            )
        return text


@attrs.frozen(kw_only=True)
class ModelRetry:
    """A provider is about to retry a call: what failed, which retry this is of how many it
    allows, and how long it waits first."""

    provider: str  # e.g. "anthropic"
    failure: str  # e.g. "overloaded (529)"
    attempt: int  # this retry's number, from 1
    retries: int  # the most retries the provider makes
    wait_s: float

    @property
    def line(self) -> str:
        wait = f"{self.wait_s:.0f}s" if self.wait_s >= 10 else f"{self.wait_s:.2g}s"
        return f"{self.provider}: {self.failure}, retry {self.attempt}/{self.retries} in {wait}"


#: Called by a provider before each retry (never awaited; it must not block).
RetrySink = Callable[[ModelRetry], None]


@attrs.frozen(kw_only=True)
class ToolSpec:
    name: str
    description: str
    input_schema: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class ModelRequest:
    """What a provider needs for one round.

    ``messages`` are stored messages (DESIGN section 5): dicts with ``role`` in
    ``user | assistant | tool | system`` and ``blocks``. ``tool`` messages hold ``tool_result``
    blocks answering the ``tool_use`` blocks of the assistant message before them.
    """

    agent: str
    system: str
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[ToolSpec] = ()
    max_tokens: int = 1024
    temperature: float | None = None
    #: Of ``system``, how many leading characters the agent's next turn sends again (the rest
    #: is this turn's additions); None: all of it. A provider with a prompt cache ends the
    #: system part of its cached prefix there.
    stable_system: int | None = None
    #: Of ``messages``, how many leading ones the agent's next turn sends again unchanged (the
    #: ones before this turn's injected messages); None: all of them.
    stable_messages: int | None = None
    #: What the request is for: ``"turn"`` (an agent's turn) or ``"summary"`` (folding an
    #: agent's older context into a summary, :mod:`actors.agent.folding`).
    purpose: str = "turn"
    #: Told of each retry the provider makes for this request (see :class:`ModelRetry`).
    on_retry: RetrySink | None = attrs.field(default=None, eq=False, repr=False)
    #: Told, once before the first attempt, the request as the provider sends it: the body of
    #: its HTTP request (JSON-able, never the credential), or what a scripted model reads.
    on_request: RequestSink | None = attrs.field(default=None, eq=False, repr=False)

    def sent(self, body: Mapping[str, Any]) -> None:
        """Tell ``on_request`` (if any) what the provider sends for this request."""
        if self.on_request is not None:
            self.on_request(body)


@attrs.frozen(kw_only=True)
class ModelReply:
    """One assistant reply: ``blocks`` are ``text`` and ``tool_use`` dicts, in order."""

    blocks: tuple[Block, ...]
    stop_reason: str = "end_turn"
    model: str = ""
    usage: Mapping[str, int] = attrs.field(factory=dict)

    @property
    def tool_uses(self) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.get("type") == "tool_use")

    @property
    def text(self) -> str:
        return "".join(str(b.get("text", "")) for b in self.blocks if b.get("type") == "text")


class ModelError(Exception):
    """A provider failed for good (after its own retries). The message is one readable line."""


class ModelAuthError(ModelError):
    """The provider will not serve this credential: it refused it (HTTP 401), denied it the
    permission (HTTP 403), or none is configured. Every later call fails alike until an operator
    fixes the key, so the agent stops calling (see ``AgentActor``'s pause).

    ``str(exc)`` is the provider's one-line error; ``problem`` says what went wrong in words
    (``"refused the credential"``) and ``credential`` names where the key comes from.
    """

    def __init__(self, message: str, *, provider: str, problem: str, credential: str) -> None:
        super().__init__(message)
        self.provider = provider
        self.problem = problem
        self.credential = credential


class Model(Protocol):
    name: str
    #: What ``model/info`` and the hook and lifecycle params say about this model.
    info: ModelInfo

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelReply: ...


def tool_result_items(block: Block) -> list[Mapping[str, Any]]:
    """The items of a stored ``tool_result`` block's ``content`` (a string is one text item;
    anything that is not a mapping is left out)."""
    raw = block.get("content")
    if isinstance(raw, str):
        return [{"type": "text", "text": raw}]
    if isinstance(raw, Sequence):
        return [item for item in raw if isinstance(item, Mapping)]
    return []


def text_only(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``messages`` for a model that reads text only: each image block carrying data (also in a
    tool result's content) becomes a short text note naming its type; every other block, and a
    message without images, is kept as it is (the same object), so the result is the same for
    the same messages on every turn."""
    out: list[Mapping[str, Any]] = []
    for message in messages:
        blocks = message.get("blocks")
        if not isinstance(blocks, Sequence) or not any(_has_image(b) for b in blocks):
            out.append(message)
            continue
        out.append({**message, "blocks": [_without_images(b) for b in blocks]})
    return out


def _is_image(block: object) -> bool:
    return isinstance(block, Mapping) and block.get("type") == "image" and bool(block.get("data"))


def _has_image(block: object) -> bool:
    if _is_image(block):
        return True
    if isinstance(block, Mapping) and block.get("type") == "tool_result":
        return any(_is_image(item) for item in tool_result_items(block))
    return False


def _image_note(block: Mapping[str, Any]) -> dict[str, Any]:
    mime = str(block.get("mimeType") or "unknown type")
    return {"type": "text", "text": f"[image ({mime}) not shown: this model reads text only]"}


def _without_images(block: Any) -> Any:
    if _is_image(block):
        return _image_note(block)
    if not _has_image(block):
        return block
    items = [_image_note(i) if _is_image(i) else i for i in tool_result_items(block)]
    return {**block, "content": items}
