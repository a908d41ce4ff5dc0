"""A lone surrogate from a peer: replaced by U+FFFD once, as the line is decoded, in every string
of the message (keys too); a pair, however written, stays the character it encodes."""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.display import scrub_surrogates, without_lone_surrogates
from protocol.jsonrpc import NotificationReceived, RequestReceived, RpcSession, decode

SURROGATE = re.compile("[\ud800-\udfff]")
surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
# any text, lone surrogates and surrogate pairs (as two code points) among the rest
# (st.text never draws a surrogate: the characters are joined instead)
texts = st.lists(st.one_of(st.characters(codec=None), surrogates), max_size=30).map("".join)
clean_texts = st.text(max_size=30)  # no surrogate at all
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)


def strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def same_shape(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        # keys that come out equal keep the later value, as a repeated JSON key does
        last = {without_lone_surrogates(k): v for k, v in a.items()}
        return (
            isinstance(b, dict)
            and list(b) == list(last)
            and all(same_shape(v, b[k]) for k, v in last.items())
        )
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_shape, a, b))
    if isinstance(a, str):
        return isinstance(b, str)
    return a == b and type(a) is type(b)


@given(json_values)
def test_no_scrubbed_string_holds_a_surrogate(value: Any) -> None:
    scrubbed = scrub_surrogates(value)
    assert not any(SURROGATE.search(s) for s in strings(scrubbed))
    for s in strings(scrubbed):
        s.encode("utf-8")  # strict: never raises


@given(json_values)
def test_scrubbing_keeps_the_structure_and_is_idempotent(value: Any) -> None:
    scrubbed = scrub_surrogates(value)
    assert same_shape(value, scrubbed)
    assert scrub_surrogates(scrubbed) == scrubbed


@given(
    st.recursive(clean_texts, lambda inner: st.lists(inner) | st.dictionaries(clean_texts, inner))
)
def test_a_value_without_surrogates_is_left_as_it_is(value: Any) -> None:
    assert scrub_surrogates(value) == value


@given(texts)
def test_each_lone_surrogate_becomes_one_replacement_character(text: str) -> None:
    out = without_lone_surrogates(text)
    # a pair (high then low) is the one character it encodes; each other surrogate is one U+FFFD
    joined = re.sub(
        "[\ud800-\udbff][\udc00-\udfff]",
        lambda m: m.group(0).encode("utf-16-le", "surrogatepass").decode("utf-16-le"),
        text,
    )
    assert out == SURROGATE.sub("\ufffd", joined)


@given(st.text(max_size=20), st.lists(surrogates, min_size=1, max_size=3), st.text(max_size=20))
def test_decoded_text_holds_replacements_where_the_escapes_were(
    before: str, lone: list[str], after: str
) -> None:
    # json.dumps writes each surrogate as its escape, "\udXXX"
    value = {
        "jsonrpc": "2.0",
        "method": f"m{lone[0]}",
        "params": {f"k{lone[-1]}": [before, *lone, after]},
    }
    decoded = decode(json.dumps(value))
    assert decoded == scrub_surrogates(value)
    assert not any(SURROGATE.search(s) for s in strings(decoded))


@given(st.characters(min_codepoint=0x10000, max_codepoint=0x10FFFF))
def test_a_pair_written_as_escapes_stays_its_character(char: str) -> None:
    escaped = json.dumps({"text": char})  # "\ud83d\ude00" for 😀
    assert re.search(r"\\ud[89ab]", escaped)
    assert decode(escaped) == {"text": char}


def test_every_lane_of_a_session_sees_the_replaced_text() -> None:
    session = RpcSession()
    [request] = session.receive_line(
        '{"jsonrpc":"2.0","id":1,"method":"push/\\ud800","params":{"t\\udc00":"a\\ud800b"}}'
    )
    assert isinstance(request, RequestReceived)
    assert request.request.method == "push/\ufffd"
    assert request.request.params == {"t\ufffd": "a\ufffdb"}
    [note] = session.receive_line(
        '{"jsonrpc":"2.0","method":"m","params":["\\uDFFF\\ud83d\\ude00"]}'
    )
    assert isinstance(note, NotificationReceived)
    assert note.notification.params == ["\ufffd😀"]
