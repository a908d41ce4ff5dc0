"""Prompt caching through OpenAIModel, against the fake chat-completions server over real loopback
HTTP with its prompt cache on (the fake reports as cached the longest prefix of the request's
bytes an earlier request shared, in 128-token blocks, as OpenAI does by prefix)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.models.base import ModelRequest, ToolSpec, Usage
from actors.models.openai import OpenAIModel
from tests.fake_openai import FakeScript, Reply, prompt_bytes, serve_fake_openai

TIMEOUT = 30
SYSTEM = "You are Ada, a terse agent in a busy lobby. " * 40
TOOLS = [ToolSpec(name="get_time", description="The time now", input_schema={"type": "object"})]


@pytest.fixture
async def cached(nursery: trio.Nursery) -> tuple[FakeScript, OpenAIModel]:
    script = FakeScript(prompt_cache=True)
    base_url = await nursery.start(serve_fake_openai, script)
    return script, OpenAIModel("gpt-test", api_key="k", base_url=base_url)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "blocks": [{"type": "text", "text": text}]}


def request(messages: list[dict[str, Any]], system: str = SYSTEM) -> ModelRequest:
    return ModelRequest(agent="Ada", system=system, tools=TOOLS, messages=messages)


async def test_a_request_that_appends_reads_the_prefix_the_one_before_sent(
    cached: tuple[FakeScript, OpenAIModel],
) -> None:
    script, model = cached
    script.add(Reply(), Reply(), Reply())
    history = [user(f"message {i}: " + "words " * 30) for i in range(5)]
    with trio.fail_after(TIMEOUT):
        first = Usage.of((await model.complete(request(history))).usage)
        history.append(user("and one more"))  # a silent turn: only a message is added
        second = Usage.of((await model.complete(request(history))).usage)
        # the same history under another system prompt: only the tools are shared
        third = Usage.of((await model.complete(request(history, system="Now " + SYSTEM))).usage)
    one, two = (prompt_bytes(r.body) for r in script.requests[:2])
    assert first.cache_read_input_tokens == 0
    assert first.input_tokens == len(one) // 4  # the whole prompt, counted from its bytes
    # what the first sent is the start of what the second sends, but for how the last user
    # message ends (the new one is joined to it); that is read, in whole 128-token blocks
    read = second.cache_read_input_tokens
    assert read % 128 == 0 and len(one) // 4 - 128 < read <= len(one) // 4
    assert second.input_tokens + read == len(two) // 4
    assert third.cache_read_input_tokens < 128 < read
