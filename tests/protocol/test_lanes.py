"""Typed params of the inbound lanes: camelCase members, tolerance, and -32602 shape errors."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import INVALID_PARAMS, RpcError
from protocol.lanes import (
    MAX_BATCH,
    Author,
    ChannelDescriptor,
    ChannelsChanged,
    IncomingMessage,
    Origin,
    PushEvent,
    native_channel,
    parse_descriptors,
    parse_incoming,
    parse_incoming_batch,
    parse_push,
    structure,
)

TS = "2025-03-01T12:00:00Z"


def push(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "featureSet": "mail",
        "eventId": "e-1",
        "timestamp": TS,
        "payload": {"content": [{"type": "text", "text": "hi"}]},
    }
    base.update(over)
    return base


def incoming(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "channelId": "discord:#general",
        "messageId": "m-1",
        "author": {"id": "u-1", "name": "Ann"},
        "timestamp": TS,
        "content": [{"type": "text", "text": "hello"}],
    }
    base.update(over)
    return base


def refused(fn: Any, *args: Any) -> str:
    with pytest.raises(RpcError) as info:
        fn(*args)
    assert info.value.code == INVALID_PARAMS
    return info.value.message


# --- push/event -------------------------------------------------------------------------------


def test_push_event_camel_case_members() -> None:
    event = parse_push(
        push(origin={"mcplChannelId": "c1"}, tags=["chat:dm"], payload={"content": [], "x": 1})
    )
    assert event == PushEvent(
        feature_set="mail",
        event_id="e-1",
        timestamp=TS,
        payload_content=(),
        origin={"mcplChannelId": "c1"},
        tags=("chat:dm",),
    )


def test_push_event_tolerates_unknown_members() -> None:
    event = parse_push(push(extra={"a": 1}, revision="x", featureSetVersion=2))
    assert event.event_id == "e-1"
    assert event.payload_content == ({"type": "text", "text": "hi"},)
    assert (event.origin, event.tags) == (None, ())


def test_push_event_numeric_id_becomes_a_string() -> None:
    assert parse_push(push(eventId=42)).event_id == "42"


@pytest.mark.parametrize(
    ("over", "member"),
    [
        ({"featureSet": [5]}, "featureSet"),
        ({"featureSet": None}, "featureSet"),
        ({"eventId": 1.5}, "eventId"),
        ({"eventId": True}, "eventId"),
        ({"eventId": ["e"]}, "eventId"),
        ({"tags": "chat:dm"}, "tags"),
        ({"origin": "c1"}, "origin"),
        ({"payload": {"content": "text"}}, "payload.content"),
        ({"payload": {"content": {"type": "text"}}}, "payload.content"),
    ],
)
def test_push_event_wrong_types_name_the_member(over: dict[str, Any], member: str) -> None:
    message = refused(parse_push, push(**over))
    assert member in message
    assert "_" not in message.split("Invalid params:")[1]  # wire names, not ours


@pytest.mark.parametrize("member", ["featureSet", "eventId", "timestamp"])
def test_push_event_missing_member_is_named(member: str) -> None:
    params = push()
    del params[member]
    assert member in refused(parse_push, params)


@pytest.mark.parametrize("payload", [None, {}, "content", {"text": "x"}])
def test_push_event_needs_payload_content(payload: Any) -> None:
    assert "payload.content" in refused(parse_push, push(payload=payload))


def test_push_event_rejects_empty_id_and_bad_timestamp() -> None:
    assert "eventId" in refused(parse_push, push(eventId=""))
    for ts in ("yesterday", "", "2025-3-1", "12:00"):
        assert "timestamp" in refused(parse_push, push(timestamp=ts))
    for ts in ("2025-03-01", "2025-03-01T12:00:00.123+02:00", "2025-03-01 12:00:00"):
        assert parse_push(push(timestamp=ts)).timestamp == ts


@pytest.mark.parametrize("params", [None, [], "x", 5])
def test_push_params_must_be_an_object(params: Any) -> None:
    assert "object" in refused(parse_push, params)


# --- channels ---------------------------------------------------------------------------------


def test_channel_descriptor_camel_case_and_defaults() -> None:
    desc = structure(
        {
            "id": "discord:#general",
            "type": "discord",
            "label": "#general",
            "direction": "inbound",
            "address": {"guild": 1},
            "metadata": {"topic": "t"},
            "initiallyOpen": False,
            "capabilities": {"history": {}},
            "unknownExtra": [1, 2],
        },
        ChannelDescriptor,
    )
    assert desc == ChannelDescriptor(
        id="discord:#general",
        type="discord",
        label="#general",
        direction="inbound",
        address={"guild": 1},
        metadata={"topic": "t"},
        initially_open=False,
        capabilities={"history": {}},
    )
    minimal = structure({"id": 7}, ChannelDescriptor)
    assert minimal == ChannelDescriptor(id="7")
    assert minimal.direction == "bidirectional"


@pytest.mark.parametrize(
    ("value", "member"),
    [
        ({"id": None}, "id"),
        ({"id": 1.0}, "id"),
        ({"id": "c", "label": {"text": "x"}}, "label"),
        ({"id": "c", "initiallyOpen": "yes"}, "initiallyOpen"),
        ({"id": "c", "initiallyOpen": 1}, "initiallyOpen"),
        ({"id": "c", "metadata": []}, "metadata"),
        ({"id": "c", "capabilities": "all"}, "capabilities"),
        ({}, "id"),
    ],
)
def test_channel_descriptor_wrong_types_name_the_member(value: Any, member: str) -> None:
    message = refused(structure, value, ChannelDescriptor)
    assert f"params.{member}" in message


def test_channels_changed() -> None:
    changed = structure(
        {"added": [{"id": "a"}], "removed": ["b", 3], "updated": [{"id": 4, "label": "x"}]},
        ChannelsChanged,
    )
    assert changed == ChannelsChanged(
        added=(ChannelDescriptor(id="a"),),
        removed=("b", "3"),
        updated=(ChannelDescriptor(id="4", label="x"),),
    )
    assert structure({}, ChannelsChanged) == ChannelsChanged()


def test_channels_changed_names_the_bad_element() -> None:
    assert "params.removed[2]" in refused(structure, {"removed": ["a", 1, None]}, ChannelsChanged)
    message = refused(structure, {"added": [{"id": "a"}, {"label": "x"}]}, ChannelsChanged)
    assert "params.added[1].id" in message
    assert "params.updated" in refused(structure, {"updated": {"id": "a"}}, ChannelsChanged)
    assert "params.added[0]" in refused(structure, {"added": ["a"]}, ChannelsChanged)


# --- channels/incoming ------------------------------------------------------------------------


def test_incoming_message_camel_case_members() -> None:
    msg = structure(
        incoming(threadId=9, metadata={"edited": True}, tags=["chat:mention"], extra=1),
        IncomingMessage,
    )
    assert msg == IncomingMessage(
        channel_id="discord:#general",
        message_id="m-1",
        author=Author(id="u-1", name="Ann"),
        content=({"type": "text", "text": "hello"},),
        timestamp=TS,
        thread_id="9",
        metadata={"edited": True},
        tags=("chat:mention",),
    )


def test_incoming_message_numeric_ids_become_strings() -> None:
    msg = structure(incoming(messageId=123, author={"id": 456}), IncomingMessage)
    assert (msg.message_id, msg.author) == ("123", Author(id="456"))


@pytest.mark.parametrize(
    ("over", "member"),
    [
        ({"channelId": ["c"]}, "params.channelId"),
        ({"messageId": None}, "params.messageId"),
        ({"author": "Ann"}, "params.author"),
        ({"author": {"id": True}}, "params.author.id"),
        ({"author": {"name": "Ann"}}, "params.author.id"),
        ({"content": "hello"}, "params.content"),
        ({"threadId": {}}, "params.threadId"),
        ({"tags": {"chat": "dm"}}, "params.tags"),
    ],
)
def test_incoming_message_wrong_types_name_the_member(over: dict[str, Any], member: str) -> None:
    assert member in refused(structure, incoming(**over), IncomingMessage)


@pytest.mark.parametrize("value", [None, [], "channelId messageId author content", 5])
def test_a_message_that_is_not_an_object_is_refused(value: Any) -> None:
    assert "object" in refused(structure, value, IncomingMessage)


def test_every_bad_member_is_named() -> None:
    message = refused(structure, incoming(channelId=1.5, content=None), IncomingMessage)
    assert "channelId" in message
    assert "content" in message


def test_origin() -> None:
    assert structure({"mcplChannelId": 3}, Origin) == Origin(mcpl_channel_id="3")
    assert structure({}, Origin) == Origin()


# --- batches ----------------------------------------------------------------------------------


def test_incoming_batch_at_the_cap_and_one_past() -> None:
    at_cap = [incoming(messageId=str(i)) for i in range(MAX_BATCH)]
    assert parse_incoming_batch({"messages": at_cap}) == at_cap
    past = [*at_cap, incoming(messageId="late")]
    assert str(MAX_BATCH) in refused(parse_incoming_batch, {"messages": past})


def test_descriptor_batch_at_the_cap_and_one_past() -> None:
    at_cap = [{"id": str(i)} for i in range(MAX_BATCH)]
    assert parse_descriptors({"channels": at_cap}) == at_cap
    assert parse_descriptors({"added": at_cap}, "added") == at_cap
    message = refused(parse_descriptors, {"channels": [*at_cap, {"id": "x"}]})
    assert "channels" in message
    assert str(MAX_BATCH) in message


@pytest.mark.parametrize("params", [{}, {"messages": None}, {"messages": {"a": 1}}, None, []])
def test_incoming_batch_needs_a_messages_array(params: Any) -> None:
    message = refused(parse_incoming_batch, params)
    assert "messages" in message or "object" in message


def test_empty_batch_is_allowed() -> None:
    assert parse_incoming_batch({"messages": []}) == []


# --- properties -------------------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
_members = st.sampled_from(
    [
        "channelId",
        "messageId",
        "author",
        "content",
        "timestamp",
        "threadId",
        "metadata",
        "tags",
        "id",
        "label",
        "initiallyOpen",
        "added",
        "removed",
        "updated",
        "featureSet",
        "eventId",
        "payload",
        "origin",
    ]
)
shapes = st.one_of(json_values, st.dictionaries(_members, json_values, max_size=8))


@given(shapes, st.sampled_from([IncomingMessage, ChannelDescriptor, ChannelsChanged, PushEvent]))
def test_any_json_structures_or_raises_invalid_params(value: Any, cls: type) -> None:
    try:
        structure(value, cls)
    except RpcError as exc:
        assert exc.code == INVALID_PARAMS
        assert exc.message.startswith("Invalid params: ")


@given(shapes)
def test_any_json_push_parses_or_raises_invalid_params(value: Any) -> None:
    try:
        event = parse_push(value)
    except RpcError as exc:
        assert exc.code == INVALID_PARAMS
    else:
        assert event.event_id
        assert isinstance(event.payload_content, tuple)


@given(st.one_of(st.integers(), st.text(max_size=10)))
def test_ids_keep_their_decimal_text(value: int | str) -> None:
    assert structure({"id": value}, ChannelDescriptor).id == str(value)


# --- the fast path for incoming messages agrees with the general converter -------------------

_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=5), st.floats(allow_nan=False)
)
_member = st.one_of(
    _scalar,
    st.lists(_scalar, max_size=2),
    st.dictionaries(st.text(max_size=3), _scalar, max_size=2),
)


@st.composite
def _incoming_shapes(draw: st.DrawFn) -> dict[str, object]:
    good = {
        "channelId": "c",
        "messageId": "m",
        "author": {"id": "u", "name": "U"},
        "content": [{"type": "text", "text": "hi"}],
        "timestamp": "2026-01-01T00:00:00Z",
        "threadId": "t",
        "metadata": {"k": 1},
        "tags": ["chat:mention"],
    }
    out: dict[str, object] = {}
    for key, value in good.items():
        choice = draw(st.sampled_from(["keep", "drop", "replace"]))
        if choice == "keep":
            out[key] = value
        elif choice == "replace":
            out[key] = draw(_member)
    if draw(st.booleans()):
        out["author"] = {
            "id": draw(_member),
            **({"name": draw(_member)} if draw(st.booleans()) else {}),
        }
    return out


@given(_incoming_shapes())
def test_incoming_fast_path_matches_the_converter(raw: dict[str, object]) -> None:
    from protocol.lanes import IncomingMessage, parse_incoming

    try:
        expected: object = structure(raw, IncomingMessage)
    except RpcError as exc:
        expected = exc.code
    try:
        got: object = parse_incoming(raw)
    except RpcError as exc:
        got = exc.code
    assert got == expected


def test_a_well_formed_incoming_message_takes_the_fast_path() -> None:
    from protocol.lanes import IncomingMessage, _fast_incoming

    raw = {
        "channelId": "c",
        "messageId": "m",
        "author": {"id": "u"},
        "content": [{"type": "text", "text": "hi"}],
        "extra": True,
    }
    fast = _fast_incoming(raw)
    assert fast is not None
    assert fast == structure(raw, IncomingMessage)
    assert _fast_incoming({**raw, "messageId": 7}) is None  # numbers go the general way
    assert structure({**raw, "messageId": 7}, IncomingMessage).message_id == "7"


@pytest.mark.parametrize("thread", [None, "t1", 7])  # 7 takes the general (slow) path
def test_the_coalesce_member_and_event_id_are_kept_as_sent(thread: object) -> None:
    raw: dict[str, object] = {
        "channelId": "c",
        "messageId": "m1",
        "author": {"id": "a"},
        "content": [],
        "eventId": "e2",
        "coalesce": {"key": "message:m1", "odd": [1]},
    }
    if thread is not None:
        raw["threadId"] = thread
    message = parse_incoming(raw)
    assert message.event_id == "e2"
    assert message.coalesce == {"key": "message:m1", "odd": [1]}
    push = parse_push(
        {
            "featureSet": "f",
            "eventId": "e",
            "timestamp": "2026-01-01T00:00:00Z",
            "payload": {"content": []},
            "coalesce": "not even an object",
        }
    )
    assert push.coalesce == "not even an object"  # judged later, with a field and a reason
    assert parse_incoming({**raw, "coalesce": None, "eventId": None}).coalesce is None


_SEGMENT = st.text(alphabet="abcdefg0123-", min_size=1, max_size=4)


@given(st.sets(st.lists(_SEGMENT, min_size=1, max_size=3).map(":".join), max_size=8), _SEGMENT)
def test_a_native_channel_id_names_the_one_channel_it_can_mean(
    registered: set[str], native: str
) -> None:
    meaning = [c for c in registered if c == native or c.endswith(":" + native)]
    found = native_channel({"channelId": native}, registered)
    assert found == (meaning[0] if len(meaning) == 1 else None)
    # the other spellings name it the same way; anything else names nothing
    assert native_channel({"channel": native}, registered) == found
    assert native_channel({"channelId": 3, "channel_id": native}, registered) == found
    assert native_channel({"channelId": ""}, registered) is None
    assert native_channel({"mcplChannelId": native}, registered) is None
    assert native_channel(None, registered) is None


def test_a_native_channel_id_is_matched_on_whole_segments() -> None:
    channels = {"toy:evt-3", "toy:evt-33", "discord:g1:general", "discord:g2:general"}
    assert native_channel({"channelId": "evt-3"}, channels) == "toy:evt-3"
    assert native_channel({"channelId": "3"}, channels) is None  # not a segment of its own
    assert native_channel({"channelId": "general"}, channels) is None  # two channels
    assert native_channel({"channelId": "g1:general"}, channels) == "discord:g1:general"
