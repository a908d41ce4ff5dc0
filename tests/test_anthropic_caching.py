"""Prompt caching through AnthropicModel, against the fake Messages API over real loopback HTTP
with its prompt cache on (the fake reports the cache reads and writes the API would, from the
marks it is sent)."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
import trio

from actors.models.anthropic import AnthropicModel
from actors.models.base import ModelRequest, ToolSpec, Usage
from tests.fake_anthropic import (
    FakeScript,
    Reply,
    marked_prefixes,
    serve_fake_anthropic,
    text_block,
)

TIMEOUT = 30
SYSTEM = "You are Ada, a terse agent in a busy lobby. " * 20
TOOLS = [ToolSpec(name="get_time", description="The time now", input_schema={"type": "object"})]


@pytest.fixture
async def cached(nursery: trio.Nursery) -> tuple[FakeScript, AnthropicModel]:
    script = FakeScript(prompt_cache=True, min_cache_tokens=200)
    base_url = await nursery.start(serve_fake_anthropic, script)
    return script, AnthropicModel("claude-test", api_key="k", base_url=base_url)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "blocks": [{"type": "text", "text": text}]}


def said(text: str) -> dict[str, Any]:
    return {"role": "assistant", "blocks": [{"type": "text", "text": text}]}


def request(messages: list[dict[str, Any]], **kw: Any) -> ModelRequest:
    return ModelRequest(
        **{"agent": "Ada", "system": SYSTEM, "tools": TOOLS, **kw}, messages=messages
    )


async def test_the_second_of_two_turns_reads_the_prefix_the_first_wrote(
    cached: tuple[FakeScript, AnthropicModel],
) -> None:
    script, model = cached
    script.add(Reply(blocks=[text_block("Hello.")]), Reply(blocks=[text_block("Noon.")]))
    history = [user(f"message {i}: " + "words " * 30) for i in range(5)]
    with trio.fail_after(TIMEOUT):
        first = Usage.of((await model.complete(request(history))).usage)
        history += [said("Hello."), user("what time is it?")]
        second = Usage.of((await model.complete(request(history))).usage)

    one, two = (marked_prefixes(r.body) for r in script.requests)
    # turn one marks the system text and its own end; turn two marks the same two prefixes,
    # byte for byte, and its own end
    assert len(one) == 2 and len(two) == 3
    assert two[:2] == one
    # what turn one wrote, turn two reads; it writes only what was added
    assert first.cache_read_input_tokens == 0
    assert first.cache_creation_input_tokens > 0
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    assert 0 < second.cache_creation_input_tokens < first.cache_creation_input_tokens
    assert "cache" in second.describe() and "read" in second.describe()


async def test_a_tool_round_reads_the_round_before_it(
    cached: tuple[FakeScript, AnthropicModel],
) -> None:
    script, model = cached
    use = {"type": "tool_use", "id": "tu_1", "name": "get_time", "input": {}}
    script.add(
        Reply(blocks=[use], stop_reason="tool_use"),
        Reply(blocks=[text_block("It is noon.")]),
    )
    history = [user("what time is it? " + "please " * 200)]
    with trio.fail_after(TIMEOUT):
        first = Usage.of((await model.complete(request(history))).usage)
        history.append({"role": "assistant", "blocks": [use]})
        result = {"type": "tool_result", "tool_use_id": "tu_1", "content": "12:00"}
        history.append({"role": "tool", "blocks": [result]})
        second = Usage.of((await model.complete(request(history))).usage)
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens > 0


async def test_the_next_turn_reads_up_to_this_turns_injected_messages(
    cached: tuple[FakeScript, AnthropicModel],
) -> None:
    script, model = cached
    script.add(Reply(blocks=[text_block("Sunny.")]), Reply(blocks=[text_block("Yes.")]))
    stored = [user(f"message {i}: " + "words " * 30) for i in range(5)]
    injected = {**user("[context from lobby · weather] sunny"), "metadata": {"injection": {}}}
    with trio.fail_after(TIMEOUT):
        # turn one: an injected message before the newest one
        await model.complete(request([*stored[:4], injected, stored[4]], stable_messages=4))
        # turn two: the injection is gone, the rest is sent again
        second = await model.complete(request([*stored, said("Sunny."), user("really?")]))
    one = marked_prefixes(script.requests[0].body)
    two = marked_prefixes(script.requests[1].body)
    # turn one marks the system text, the end of what comes before its injection, and its end;
    # turn two marks the first two again, byte for byte
    assert len(one) == 3 and two[:2] == one[:2]
    assert one[1].endswith(b'"message 3: ' + b"words " * 30 + b'"}]]')
    assert Usage.of(second.usage).cache_read_input_tokens > 0


async def test_text_added_to_the_system_prompt_keeps_the_stable_part_cached(
    cached: tuple[FakeScript, AnthropicModel],
) -> None:
    script, model = cached
    script.add(Reply(blocks=[text_block("Sunny.")]), Reply(blocks=[text_block("Yes.")]))
    added = "\n\n[hook] the lobby is busy"
    with trio.fail_after(TIMEOUT):
        first = await model.complete(
            request([user("hi")], system=SYSTEM + added, stable_system=len(SYSTEM))
        )
        second = await model.complete(request([user("hi"), said("Sunny."), user("sure?")]))
    body = script.requests[0].body
    assert body["system"] == [
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": added},
    ]
    one = marked_prefixes(body)
    two = marked_prefixes(script.requests[1].body)
    assert one[0] == two[0]  # tools and the stable system text
    # the tools and stable system text were written by turn one and read by turn two
    assert Usage.of(first.usage).cache_creation_input_tokens > 0
    assert Usage.of(second.usage).cache_read_input_tokens > 0


async def test_the_fake_refuses_more_than_four_marks(nursery: trio.Nursery) -> None:
    script = FakeScript([Reply(blocks=[text_block("never")])], prompt_cache=True)
    base_url = await nursery.start(serve_fake_anthropic, script)
    mark = {"type": "ephemeral"}
    client = anthropic.AsyncAnthropic(api_key="k", base_url=base_url, max_retries=0)
    content = [{"type": "text", "text": f"b{i}", "cache_control": mark} for i in range(5)]
    try:
        with trio.fail_after(TIMEOUT), pytest.raises(anthropic.BadRequestError, match="Found 5"):
            await client.messages.create(
                model="claude-test",
                max_tokens=10,
                messages=[{"role": "user", "content": content}],  # type: ignore[typeddict-item]
            )
    finally:
        await client.close()
    assert script.remaining == 1
