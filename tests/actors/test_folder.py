"""A summarizer that hangs or refuses stores nothing and says so once; the turn goes on."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.agent.folding import SUMMARY_TIMEOUT_S, Folder
from actors.models.base import ModelError, ModelReply, ModelRequest, ModelRetry
from actors.turn_token import TurnToken
from protocol.hooks import ModelInfo

SPAN = [{"id": "m1", "role": "user", "blocks": [{"type": "text", "text": "hello"}], "tokens": 9}]


class Summarizer:
    name = "summarizer"
    info = ModelInfo(id="s", vendor="tests", context_window=1000, capabilities=())

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0

    async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
        self.calls += 1
        if self.mode == "hang":
            await trio.sleep_forever()
        if self.mode == "bug":
            raise KeyError("oops")
        return ModelReply(blocks=({"type": "text", "text": "   "},))


class NoStore:
    """Any use of the store fails the test: a failed fold writes nothing."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used ({name})")


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("hang", f"no summary within {SUMMARY_TIMEOUT_S:g} s"),
        ("refuse", "the summarizer gave no summary"),
        ("bug", "the summarizer failed: KeyError: 'oops'"),
    ],
)
async def test_a_failed_summary_stores_nothing_and_is_told_once(
    mode: str, why: str, autojump_clock: trio.testing.MockClock
) -> None:
    said: list[tuple[str, dict[str, Any]]] = []
    ctx = type("Ctx", (), {"store": NoStore(), "turns": TurnToken()})()
    model = Summarizer(mode)
    folder = Folder(ctx, "Ada", model, lambda kind, **data: said.append((kind, data)))
    with trio.fail_after(SUMMARY_TIMEOUT_S * 2):  # the folder's own bound comes first
        assert await folder.fold(SPAN) is None
    assert model.calls == 1
    assert said == [
        ("diagnostic", {"text": f"1 older message left the context unsummarized ({why})"})
    ]


async def test_the_summarizers_retries_are_told_as_they_happen() -> None:
    said: list[tuple[str, dict[str, Any]]] = []

    class Retrying(Summarizer):
        async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
            assert request.on_retry is not None
            request.on_retry(
                ModelRetry(
                    provider="anthropic",
                    failure="overloaded (529)",
                    attempt=1,
                    retries=4,
                    wait_s=0.5,
                )
            )
            raise ModelError("anthropic: overloaded (529)")

    ctx = type("Ctx", (), {"store": NoStore(), "turns": TurnToken()})()
    folder = Folder(ctx, "Ada", Retrying("x"), lambda kind, **data: said.append((kind, data)))
    assert await folder.fold(SPAN) is None
    assert [kind for kind, _ in said] == ["model-retry", "diagnostic"]
    assert said[0][1]["line"] == "summary: anthropic: overloaded (529), retry 1/4 in 0.5s"
    assert "the summarizer failed: anthropic: overloaded (529)" in said[1][1]["text"]
