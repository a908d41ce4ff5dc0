"""Where a request's prompt-cache marks go, and why the prefix they mark stays the same bytes from
one request to the next: pure functions, examples and properties."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.models.anthropic import to_messages_api
from actors.models.prompt_cache import (
    EPHEMERAL,
    MAX_MARKS,
    CacheMemory,
    Marked,
    mark_request,
    system_blocks,
)
from tests.fake_anthropic import marked_prefixes
from tests.test_anthropic_model import conversations

TOOLS = [{"name": "get_time", "description": "Now", "input_schema": {"type": "object"}}]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "blocks": [{"type": "text", "text": text}]}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "blocks": [{"type": "text", "text": text}]}


def body(marked: Marked) -> dict[str, Any]:
    return {"tools": marked.tools, "system": marked.system, "messages": marked.messages}


def marked_texts(marked: Marked) -> list[str]:
    """The text of each marked message block, in order."""
    return [
        str(b.get("text", b.get("type")))
        for turn in marked.messages
        for b in turn["content"]
        if "cache_control" in b
    ]


def flat(turns: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Each message block as the bytes it is sent as, with its role and turn boundary."""
    return [
        json.dumps([t["role"], j == 0, b], separators=(",", ":")).encode()
        for t in turns
        for j, b in enumerate(t["content"])
    ]


# --- system_blocks -------------------------------------------------------------------------------


def test_system_text_splits_where_the_turn_added_to_it() -> None:
    assert system_blocks("", None) == []
    assert system_blocks("  \n", 0) == []
    assert system_blocks("Be terse.", None) == [{"type": "text", "text": "Be terse."}]
    assert system_blocks("Be terse.\n\n[hook] sunny", 9) == [
        {"type": "text", "text": "Be terse."},
        {"type": "text", "text": "\n\n[hook] sunny"},
    ]
    # nothing added, only whitespace added, or no stable part: one block
    assert system_blocks("Be terse.", 9) == [{"type": "text", "text": "Be terse."}]
    assert system_blocks("Be terse.\n\n", 9) == [{"type": "text", "text": "Be terse.\n\n"}]
    assert system_blocks("added", 0) == [{"type": "text", "text": "added"}]
    assert system_blocks("abc", 99) == [{"type": "text", "text": "abc"}]


# --- mark_request: examples ----------------------------------------------------------------------


def test_the_stable_system_block_and_the_last_block_are_marked() -> None:
    system = system_blocks("Be terse.\n\nadded this turn", 9)
    messages = to_messages_api([user("one"), assistant("two"), user("three")])
    marked = mark_request(TOOLS, system, messages)
    assert marked.system[0]["cache_control"] == EPHEMERAL
    assert "cache_control" not in marked.system[1]
    assert all("cache_control" not in t for t in marked.tools)  # covered by the system mark
    assert marked_texts(marked) == ["three"]
    assert marked.count == 2
    # the inputs are not changed
    assert "cache_control" not in system[0] and "cache_control" not in messages[-1]["content"][0]


def test_without_system_text_the_last_tool_is_marked() -> None:
    tools = [*TOOLS, {"name": "b", "description": "", "input_schema": {"type": "object"}}]
    marked = mark_request(tools, [], to_messages_api([user("hi")]))
    assert ["cache_control" in t for t in marked.tools] == [False, True]
    assert mark_request([], [], to_messages_api([user("hi")])).count == 1


def test_the_next_turn_reads_where_the_last_request_ended() -> None:
    memory = CacheMemory()
    first = mark_request(TOOLS, system_blocks("S", None), to_messages_api([user("a")]))
    memory.remember("Ada", first.marks)
    # many blocks later (past the API's look-back), the old end is marked again to be read
    later = [user("a"), assistant("b"), *[user(f"m{i}") for i in range(30)]]
    second = mark_request(
        TOOLS, system_blocks("S", None), to_messages_api(later), remembered=memory.recall("Ada")
    )
    assert marked_texts(second) == ["a", "m29"]
    [end] = marked_prefixes(body(first))[1:]
    assert end in marked_prefixes(body(second))  # the same bytes
    # a changed system text is another prefix: nothing to read
    other = mark_request(
        TOOLS, system_blocks("T", None), to_messages_api(later), remembered=first.marks
    )
    assert marked_texts(other) == ["m29"]


def test_the_stable_point_ends_before_this_turns_injections() -> None:
    stored = [user("a"), assistant("b"), user("c")]
    injected = {**user("[context from lobby · weather] sunny"), "metadata": {"injection": {}}}
    messages = [*stored[:2], injected, stored[2]]
    marked = mark_request(
        TOOLS,
        system_blocks("S", None),
        to_messages_api(messages),
        next_turn=to_messages_api(messages[:2]),
    )
    assert marked_texts(marked) == ["b", "c"]
    # what the next turn sends starts with the marked prefix, byte for byte
    following = mark_request(
        TOOLS,
        system_blocks("S", None),
        to_messages_api([*stored, assistant("d"), user("e")]),
        remembered=marked.marks,
    )
    assert marked_texts(following) == ["b", "e"]
    assert marked_prefixes(body(marked))[1] == marked_prefixes(body(following))[1]


def test_cache_memory_is_bounded_and_forgets_the_one_unused_longest() -> None:
    memory = CacheMemory(limit=2)
    memory.remember("a", frozenset({b"1"}))
    memory.remember("b", frozenset({b"2"}))
    assert memory.recall("a") == {b"1"}  # used: "b" is now the one unused longest
    memory.remember("c", frozenset({b"3"}))
    assert len(memory) == 2
    assert memory.recall("b") == frozenset()
    assert memory.recall("a") == {b"1"} and memory.recall("c") == {b"3"}
    with pytest.raises(ValueError):
        CacheMemory(limit=0)


# --- properties ----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(conversations(), conversations())
def test_appending_messages_never_changes_the_bytes_of_the_earlier_turns(
    earlier: list[dict[str, Any]], added: list[dict[str, Any]]
) -> None:
    """Everything but the last turn of a conversation is sent again, byte for byte, once more
    messages follow it (the last turn may take more blocks, or have its results paired)."""
    before = to_messages_api(earlier)
    after = to_messages_api(earlier + added)
    kept = flat(before[:-1])
    assert flat(after)[: len(kept)] == kept


@settings(max_examples=300, deadline=None)
@given(
    conversations(),
    conversations(),
    st.booleans(),
    st.integers(0, 12),
    st.sampled_from(["", "S", "S\n\nadded"]),
)
def test_marks_stay_within_the_limit_and_the_next_request_reads_the_last_end(
    earlier: list[dict[str, Any]],
    added: list[dict[str, Any]],
    with_tools: bool,
    stable: int,
    system_text: str,
) -> None:
    tools = TOOLS if with_tools else []
    system = system_blocks(system_text, 1)
    first_turns = to_messages_api(earlier)
    first = mark_request(tools, system, first_turns, next_turn=to_messages_api(earlier[:stable]))
    assert first.count <= MAX_MARKS
    assert 1 <= len(first.marks) <= MAX_MARKS - 1  # one of the four is the system's or a tool's
    second_turns = to_messages_api(earlier + added)
    second = mark_request(tools, system, second_turns, remembered=first.marks)
    assert second.count <= MAX_MARKS
    # the marks change nothing else
    for sent, plain in ((first, first_turns), (second, second_turns)):
        bare = [
            {
                **t,
                "content": [
                    {k: v for k, v in b.items() if k != "cache_control"} for b in t["content"]
                ],
            }
            for t in sent.messages
        ]
        assert bare == plain
    # when the first request's last turn is sent again unchanged, the second request marks
    # the first one's end, so the prefix it wrote is read
    ends = flat(first_turns)
    if flat(second_turns)[: len(ends)] == ends:
        end_texts = len(ends) - 1
        marked_at = [
            i
            for i, b in enumerate(b for t in second.messages for b in t["content"])
            if "cache_control" in b
        ]
        assert end_texts in marked_at
