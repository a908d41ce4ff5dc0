"""The depth rule: how deeply a value nests, and that no lane lets a member deeper than
``MAX_DEPTH`` through (the store's decoder refuses values nested past 400 levels)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.depth import MAX_DEPTH, deeper_than, depth, too_deep_member
from protocol.errors import INVALID_PARAMS, PARSE_ERROR, RpcError
from protocol.jsonrpc import ErrorResponse, Invalid, Request, parse_message
from protocol.lanes import ChannelDescriptor, parse_incoming, parse_push, structure
from store import decode_body, encode_body

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


def wrapped(inner: Any, levels: int, as_list: bool) -> Any:
    """``inner`` inside ``levels`` more arrays (or objects)."""
    for _ in range(levels):
        inner = [inner] if as_list else {"k": inner}
    return inner


@given(values)
def test_depth_is_the_levels_of_arrays_and_objects(value: Any) -> None:
    assert depth(value) == reference_depth(value)
    for limit in range(depth(value) + 2):
        assert deeper_than(value, limit) == (depth(value) > limit)


def test_depth_of_small_values() -> None:
    assert [depth(v) for v in (1, "x", None, [], {}, [[]], {"a": [1]}, [1, [2, [3]]])] == [
        0, 0, 0, 1, 1, 2, 2, 3,
    ]  # fmt: skip


def test_depth_walks_values_deeper_than_the_recursion_limit() -> None:
    value = wrapped(0, 50_000, as_list=True)
    assert depth(value) == 50_000
    assert deeper_than(value)


def push_params(origin: Any = None, content: Any = None, **extra: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "featureSet": "f",
        "eventId": "e1",
        "timestamp": "2026-01-01T00:00:00Z",
        "payload": {"content": content if content is not None else []},
        **extra,
    }
    if origin is not None:
        params["origin"] = origin
    return params


def refused_member(call: Any) -> str:
    with pytest.raises(RpcError) as caught:
        call()
    assert caught.value.code == INVALID_PARAMS
    data = caught.value.data
    assert data["reason"] == f"nested deeper than {MAX_DEPTH}"
    return str(data["member"])


@given(st.integers(1, MAX_DEPTH + 3), st.booleans(), values)
def test_push_members_at_the_cap_pass_and_one_past_is_refused(
    levels: int, as_list: bool, leaf: Any
) -> None:
    origin = {"o": wrapped(leaf, levels, as_list)}
    params = push_params(origin=origin)
    if depth(origin) <= MAX_DEPTH:
        assert depth(parse_push(params).origin) <= MAX_DEPTH
    else:
        assert refused_member(lambda: parse_push(params)) == "origin"


@pytest.mark.parametrize(
    ("member", "params"),
    [
        ("origin", push_params(origin=wrapped({}, MAX_DEPTH, as_list=False))),
        ("payload.content", push_params(content=wrapped([], MAX_DEPTH, as_list=True))),
        ("tags", push_params(tags=wrapped([], MAX_DEPTH, as_list=True))),
        ("coalesce", push_params(coalesce=wrapped({}, MAX_DEPTH, as_list=False))),
    ],
)
def test_each_push_member_is_bounded(member: str, params: dict[str, Any]) -> None:
    assert refused_member(lambda: parse_push(params)) == member


def message(**extra: Any) -> dict[str, Any]:
    base = {"channelId": "c", "messageId": "m", "author": {"id": "u"}, "content": []}
    return {**base, **extra}


@pytest.mark.parametrize(
    "member",
    ["metadata", "content", "tags"],
)
@pytest.mark.parametrize("levels", [MAX_DEPTH, MAX_DEPTH + 1])
def test_incoming_members_are_bounded(member: str, levels: int) -> None:
    value = wrapped({}, levels - 1, as_list=False) if member == "metadata" else None
    if value is None:
        value = wrapped([], levels - 1, as_list=True)
    raw = message(**{member: value})
    assert depth(raw[member]) == levels
    if levels <= MAX_DEPTH:
        parse_incoming(raw)
    else:
        assert refused_member(lambda: parse_incoming(raw)) == member
    # the general path (a member not of its exact type sends a message through it) too
    slow = {**raw, "messageId": 7}
    if levels > MAX_DEPTH:
        assert refused_member(lambda: parse_incoming(slow)) == member


def test_descriptor_metadata_is_bounded() -> None:
    raw = {"id": "c", "metadata": wrapped({}, MAX_DEPTH - 1, as_list=False)}
    assert depth(structure(raw, ChannelDescriptor).metadata) == MAX_DEPTH
    deep = {"id": "c", "metadata": wrapped({}, MAX_DEPTH, as_list=False)}
    assert refused_member(lambda: structure(deep, ChannelDescriptor)) == "metadata"


deep_values = st.integers(0, MAX_DEPTH + 2).flatmap(
    lambda n: values.map(lambda leaf: wrapped(leaf, n, as_list=n % 2 == 0))
)


@given(st.dictionaries(st.sampled_from(["metadata", "tags", "content", "x"]), deep_values))
def test_nothing_deeper_than_the_cap_passes_an_incoming_lane(members: dict[str, Any]) -> None:
    raw = message(**members)
    try:
        parsed = parse_incoming(raw)
    except RpcError:
        return  # refused, for its shape or its depth
    assert too_deep_member(raw) is None
    for value in (parsed.metadata, parsed.content, parsed.tags, parsed.coalesce):
        assert depth(value) <= MAX_DEPTH


def test_the_deepest_accepted_value_reads_back_from_the_store_form() -> None:
    deepest = wrapped({}, MAX_DEPTH - 1, as_list=False)
    stored = {"adapter_origin": deepest, "tags": [wrapped([], MAX_DEPTH - 1, as_list=True)]}
    _, metadata = decode_body(encode_body([{"type": "text", "text": "t"}], stored))
    assert metadata == stored


@pytest.mark.parametrize(
    "text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000]
)
def test_json_nested_past_the_parser_is_a_parse_error_answer(text: str) -> None:
    parsed = parse_message(text)
    assert isinstance(parsed, Invalid)
    assert isinstance(parsed.reply, ErrorResponse)
    assert parsed.reply.id is None
    assert parsed.reply.error.code == PARSE_ERROR


def test_a_request_deep_but_within_the_parser_is_still_a_request() -> None:
    text = (
        '{"jsonrpc":"2.0","id":1,"method":"push/event","params":{"origin":'
        + "[" * 500
        + "]" * 500
        + "}}"
    )
    assert isinstance(parse_message(text), Request)
