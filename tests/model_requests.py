"""What the provider tests build their requests from: a user message, a request, and a sink
that keeps the streamed deltas."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.models.base import ModelRequest


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "blocks": [{"type": "text", "text": text}]}


def request_for(messages: Sequence[Mapping[str, Any]], **kw: Any) -> ModelRequest:
    return ModelRequest(agent="a1", system="You are terse.", messages=messages, **kw)


class Deltas:
    def __init__(self) -> None:
        self.items: list[str] = []

    async def __call__(self, text: str) -> None:
        self.items.append(text)
