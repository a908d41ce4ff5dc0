from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import (
    Append,
    CorruptRecord,
    MessageRecord,
    PutState,
    StoreError,
    decode_body,
    decode_value,
    encode_body,
    encode_value,
)

from .conftest import record

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(deadline=None)
@given(json_values)
def test_value_round_trip(value: Any) -> None:
    assert decode_value(encode_value(value)) == value


@settings(deadline=None)
@given(
    st.lists(st.dictionaries(st.text(), json_values, max_size=4), max_size=4),
    st.dictionaries(st.text(), json_values, max_size=4),
)
def test_body_round_trip(blocks: list[dict[str, Any]], metadata: dict[str, Any]) -> None:
    assert decode_body(encode_body(blocks, metadata)) == (blocks, metadata)


def test_tuples_and_mappings_become_plain() -> None:
    from types import MappingProxyType

    value = {"a": (1, 2, MappingProxyType({"b": ("c",)}))}
    assert decode_value(encode_value(value)) == {"a": [1, 2, {"b": ["c"]}]}


def test_infinite_float_round_trips() -> None:
    assert math.isinf(decode_value(encode_value(float("inf"))))


@pytest.mark.parametrize("data", [b"", b"\xff\x00", b"\x62\xff\xfe"])
def test_garbage_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptRecord):
        decode_value(data)


@pytest.mark.parametrize(
    "value",
    [1, [], {"blocks": [], "metadata": []}, {"blocks": [1], "metadata": {}}, {"metadata": {}}],
)
def test_badly_shaped_body_is_corrupt(value: Any) -> None:
    with pytest.raises(CorruptRecord):
        decode_body(encode_value(value))


def test_unencodable_value_is_store_error() -> None:
    with pytest.raises(StoreError):
        encode_value({"x": object()})


def test_message_record_validates() -> None:
    good = record("x")
    assert good.as_message()["blocks"] == [{"type": "text", "text": "x"}]
    for role in ("user", "assistant", "tool", "system"):
        MessageRecord(id="a", agent="b", role=role, blocks=(), metadata={}, created_at=0)
    bad: list[dict[str, Any]] = [
        {"role": "robot"},
        {"id": ""},
        {"agent": 3},
        {"blocks": [{"type": "text"}]},
        {"blocks": ("not a mapping",)},
        {"metadata": []},
        {"created_at": math.nan},
        {"created_at": True},
    ]
    base: dict[str, Any] = {
        "id": "a",
        "agent": "b",
        "role": "user",
        "blocks": (),
        "metadata": {},
        "created_at": 0.0,
    }
    for change in bad:
        with pytest.raises((TypeError, ValueError)):
            MessageRecord(**(base | change))


def test_op_validation() -> None:
    Append(records=(record(),), dedupe=("event", "lobby", "e1"))
    with pytest.raises((TypeError, ValueError)):
        Append(records=[record()])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Append(records=(), dedupe=("event", "lobby"))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        PutState(namespace=1, key="k", value=1)  # type: ignore[arg-type]


@given(st.lists(st.sampled_from(["a", "\ud800", "\udfff", "\ud83c", "\udf89", "é", "\U0001f389"])))
def test_lone_surrogates_are_stored_as_replacement_characters(parts: list[str]) -> None:
    text = "".join(parts)
    stored = decode_value(encode_value({"k" + text: [text]}))
    ((key, [value]),) = stored.items()
    expected = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    assert key == "k" + expected and value == expected
    value.encode("utf-8")  # well-formed now: this does not raise


_good_block = st.just({"type": "text", "text": "hi"})
_bad_block = st.sampled_from([None, "text", 3, ["type", "text"]])
_block_tuples = st.lists(
    st.tuples(st.booleans(), st.lists(_good_block | _bad_block, max_size=3).map(tuple)),
    min_size=1,
    max_size=8,
)


@given(_block_tuples)
def test_every_record_checks_its_blocks_however_often_a_tuple_recurs(
    plan: list[tuple[bool, tuple[Any, ...]]],
) -> None:
    """The copies of one item share a tuple of blocks, checked once; a record is still refused
    exactly when its own tuple holds something that is not a mapping, whatever came before."""
    seen: list[tuple[Any, ...]] = []
    for reuse, blocks in plan:
        if reuse and seen:
            blocks = seen[-1]
        seen.append(blocks)
        valid = all(isinstance(b, dict) for b in blocks)
        for _copy in range(2):
            if valid:
                made = MessageRecord(
                    id="m1", agent="ada", role="user", blocks=blocks, metadata={}, created_at=1.0
                )
                assert made.blocks is blocks
            else:
                with pytest.raises(TypeError, match="must be a mapping"):
                    MessageRecord(
                        id="m1",
                        agent="ada",
                        role="user",
                        blocks=blocks,
                        metadata={},
                        created_at=1.0,
                    )


_names = st.text(min_size=1, max_size=8)


@given(_names, _names, _names, st.sampled_from(["user", "assistant", "tool", "system"]))
def test_a_copy_for_another_agent_equals_the_record_made_whole(
    agent: str, other: str, other_id: str, role: str
) -> None:
    first = MessageRecord(
        id="m1",
        agent=agent,
        role=role,
        blocks=({"type": "text", "text": "hi"},),
        metadata={"k": 1},
        created_at=2.5,
    )
    copy = first.for_agent(other, other_id)
    whole = MessageRecord(
        id=other_id,
        agent=other,
        role=role,
        blocks=first.blocks,
        metadata=first.metadata,
        created_at=2.5,
    )
    assert copy == whole
    assert copy.blocks is first.blocks and copy.metadata is first.metadata
    for bad_agent, bad_id in (("", other_id), (other, ""), (None, other_id), (other, 3)):
        with pytest.raises(ValueError, match="non-empty string"):
            first.for_agent(bad_agent, bad_id)  # type: ignore[arg-type]
