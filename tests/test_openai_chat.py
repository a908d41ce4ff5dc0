"""The pure parts of the OpenAI provider: stored messages → chat messages, and the event stream
decoder and chunk assembler."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.models.openai_chat import (
    ERROR_PREFIX,
    MISSING_RESULT,
    NOTICE_PREFIX,
    START_PLACEHOLDER,
    to_chat_messages,
)
from actors.models.openai_stream import ChunkAssembler, EventDecoder, MalformedStream, stop_reason

# --- conversion ----------------------------------------------------------------------------------

ids = st.sampled_from(["c1", "c2", "c3"])
texts = st.sampled_from(["", "  ", "hi", "x\ud800y", "more words"])
image = {"type": "image", "data": "AAAA", "mimeType": "image/png"}
blocks = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda i: {"type": "tool_use", "id": i, "name": "t", "input": {"a": 1}}, ids),
    st.builds(
        lambda i, e: {"type": "tool_result", "tool_use_id": i, "content": "r", "is_error": e},
        ids,
        st.booleans(),
    ),
    st.builds(
        lambda i: {"type": "tool_result", "tool_use_id": i, "content": [image]},
        ids,
    ),
    st.just(image),
    st.just({"type": "resource_link", "uri": "mcpl://x/y"}),
    st.just({"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}),
)
messages = st.lists(
    st.builds(
        lambda role, bs: {"role": role, "blocks": bs},
        st.sampled_from(["user", "assistant", "tool", "system"]),
        st.lists(blocks, max_size=4),
    ),
    max_size=8,
)


@given(messages, st.sampled_from(["", "Be brief."]))
def test_conversion_is_always_well_formed(stored: list[dict[str, Any]], system: str) -> None:
    out = to_chat_messages(system, stored)
    json.dumps(out, ensure_ascii=False).encode("utf-8")  # valid UTF-8 throughout
    rest = out[1:] if system else out
    if system:
        assert out[0] == {"role": "system", "content": system}
    assert rest and rest[0]["role"] == "user"
    i = 0
    while i < len(rest):
        message = rest[i]
        role = message["role"]
        assert role in ("user", "assistant", "tool")
        if role == "user":
            assert message["content"], "no empty user message"
        if role == "assistant":
            assert message["content"] or message.get("tool_calls"), "no empty assistant message"
            asked = [c["id"] for c in message.get("tool_calls", [])]
            assert len(set(asked)) == len(asked), "each call id once"
            answers = rest[i + 1 : i + 1 + len(asked)]
            # every call answered, in order, right after it
            assert [a.get("tool_call_id") for a in answers] == asked
            assert all(a["role"] == "tool" and a["content"] for a in answers)
            i += 1 + len(asked)
            continue
        assert role != "tool", "a tool message only right after its call"
        i += 1


def test_stored_roles_and_leftovers_become_user_text() -> None:
    stored = [
        {"role": "system", "blocks": [{"type": "text", "text": "tools changed"}]},
        {"role": "assistant", "blocks": [{"type": "tool_use", "id": "c1", "name": "t"}]},
        {"role": "user", "blocks": [{"type": "text", "text": "meanwhile"}]},
        {
            "role": "tool",
            "blocks": [
                {"type": "tool_result", "tool_use_id": "zz", "content": "stray"},
            ],
        },
    ]
    assert to_chat_messages("", stored) == [
        {"role": "user", "content": NOTICE_PREFIX + "tools changed"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "t", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": ERROR_PREFIX + MISSING_RESULT},
        {"role": "user", "content": "meanwhile\n[result of tool call zz]\nstray"},
    ]


def test_an_empty_context_gets_the_placeholder() -> None:
    assert to_chat_messages("S", []) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": START_PLACEHOLDER},
    ]


# --- the event stream ----------------------------------------------------------------------------

events = st.lists(
    st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=20),
    max_size=6,
)


@given(events, st.sampled_from(["\n", "\r\n", "\r"]), st.data())
def test_any_split_of_the_bytes_gives_the_same_events(
    payloads: list[str], eol: str, data: st.DataObject
) -> None:
    wire = "".join(f": ping{eol}data: {p}{eol}{eol}" for p in payloads).encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    decoder = EventDecoder()
    got: list[str] = []
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += decoder.receive_data(wire[start:end])
    assert got == [p for p in payloads]


def test_an_endless_line_is_malformed() -> None:
    decoder = EventDecoder(max_line=100)
    with pytest.raises(MalformedStream, match="longer than 100"):
        for _ in range(10):
            decoder.receive_data(b"data: " + b"x" * 20)


def test_empty_data_lines_count_towards_the_event_cap() -> None:
    # each empty line adds the LF that joins it: an endpoint cannot grow an event for free
    decoder = EventDecoder(max_line=100)
    with pytest.raises(MalformedStream, match="an event longer than 100"):
        decoder.receive_data(b"data:\n" * 102)


@given(st.lists(st.text(alphabet="ab", max_size=5), min_size=1, max_size=30), st.integers(10, 60))
def test_the_event_cap_is_the_joined_data_length(lines: list[str], cap: int) -> None:
    # (a cap of 10 or more: each line, "data:" and up to 5 characters, fits the line cap)
    wire = "".join(f"data:{line}\n" for line in lines).encode() + b"\n"
    joined = "\n".join(lines)
    decoder = EventDecoder(max_line=cap)
    if len(joined) > cap:
        with pytest.raises(MalformedStream, match=f"longer than {cap}"):
            decoder.receive_data(wire)
    else:
        assert decoder.receive_data(wire) == [joined]


def test_multi_line_data_joins_with_newlines() -> None:
    assert EventDecoder().receive_data(b"event: x\ndata: a\ndata:b\n\n") == ["a\nb"]


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
        ("something_new", "end_turn"),
    ],
)
def test_finish_reasons(finish: str | None, reason: str) -> None:
    assert stop_reason(finish) == reason


def test_tool_calls_with_a_stop_finish_are_tool_use() -> None:
    assembler = ChunkAssembler()
    call = {"index": 0, "id": "c", "function": {"name": "t", "arguments": "{}"}}
    assembler.feed(json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
    assembler.feed(json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    assert assembler.reply().stop_reason == "tool_use"


def test_too_many_tool_calls_are_malformed() -> None:
    assembler = ChunkAssembler()
    calls = [{"index": i, "function": {"name": "t"}} for i in range(200)]
    with pytest.raises(MalformedStream, match="more than 128 tool calls"):
        assembler.feed(json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]}))
