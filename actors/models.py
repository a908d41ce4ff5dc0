"""The model-provider interface shared by every provider.

A provider turns an agent's context (stored messages, oldest first) into one assistant reply: text
blocks and ``tool_use`` blocks. The agent's turn task calls :meth:`Model.complete` once per tool
round; it executes the tool calls itself and calls again with the results appended.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from protocol.hooks import ModelInfo

Block = Mapping[str, Any]

#: Called with each text delta while a reply streams (may be ``None``).
DeltaSink = Callable[[str], Awaitable[None]]


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


class Model(Protocol):
    name: str
    #: What ``model/info`` and the hook and lifecycle params say about this model.
    info: ModelInfo

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelReply: ...
