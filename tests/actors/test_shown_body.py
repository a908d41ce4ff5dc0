"""The body of a request as the console shows it: whole strings (no clip), credentials
redacted, and the whole cut at ``REQUEST_SHOWN_BYTES`` at a character's start."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from actors.web.api import REQUEST_SHOWN_BYTES, shown_body


def test_a_long_string_is_shown_whole_and_a_credential_is_not() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 10_000 + " sk-secret"}]}
    text, size = shown_body(body, lambda t: t.replace("sk-secret", "[redacted]"))
    shown = json.loads(text)
    assert shown["messages"][0]["content"] == "x" * 10_000 + " [redacted]"
    assert size == len(text.encode())


def test_a_body_past_the_cap_is_cut_there() -> None:
    body = {"messages": [{"content": "é" * REQUEST_SHOWN_BYTES}]}
    text, size = shown_body(body, lambda t: t)
    assert size > REQUEST_SHOWN_BYTES
    assert REQUEST_SHOWN_BYTES - 4 < len(text.encode()) <= REQUEST_SHOWN_BYTES


@given(
    st.recursive(
        st.text() | st.integers(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=20,
    )
)
def test_any_small_body_round_trips(body: object) -> None:
    text, size = shown_body(body, lambda t: t)
    assert size == len(text.encode())
    assert json.loads(text) == body
