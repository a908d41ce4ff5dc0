from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from store import body_text, text_matcher

texts = st.text(max_size=20)
text_blocks = texts.map(lambda t: {"type": "text", "text": t})
other_blocks = st.sampled_from(
    [
        {"type": "image", "data": "AAAA", "mimeType": "image/png"},
        {"type": "tool_use", "id": "t1", "name": "x", "input": {}},
        {"type": "text"},
        {"type": "text", "text": 5},
    ]
)
blocks = st.lists(text_blocks | other_blocks, max_size=6)


def _texts(bs: list[dict[str, Any]]) -> list[str]:
    return [b["text"] for b in bs if b.get("type") == "text" and isinstance(b.get("text"), str)]


@settings(deadline=None)
@given(header=texts, body=blocks)
def test_stored_header_block_is_skipped(header: str, body: list[dict[str, Any]]) -> None:
    message = {
        "blocks": [{"type": "text", "text": header}, *body],
        "metadata": {"source_header": header},
    }
    assert body_text(message) == "\n".join(_texts(body))


@settings(deadline=None)
@given(bs=blocks, metadata=st.dictionaries(st.sampled_from(["kind", "tags"]), texts))
def test_without_header_every_text_block_counts(
    bs: list[dict[str, Any]], metadata: dict[str, Any]
) -> None:
    assert body_text({"blocks": bs, "metadata": metadata}) == "\n".join(_texts(bs))


@settings(deadline=None)
@given(header=texts, first=texts, rest=blocks)
def test_first_block_kept_unless_it_equals_the_header(
    header: str, first: str, rest: list[dict[str, Any]]
) -> None:
    bs = [{"type": "text", "text": first}, *rest]
    got = body_text({"blocks": bs, "metadata": {"source_header": header}})
    expected = _texts(rest) if first == header else [first, *_texts(rest)]
    assert got == "\n".join(expected)


@settings(deadline=None)
@given(header=texts, lead=other_blocks, rest=blocks)
def test_only_the_first_block_can_be_the_header(
    header: str, lead: dict[str, Any], rest: list[dict[str, Any]]
) -> None:
    # A non-text first block is never the header, so a later copy of the header text is body.
    bs = [lead, {"type": "text", "text": header}, *rest]
    got = body_text({"blocks": bs, "metadata": {"source_header": header}})
    assert got == "\n".join(_texts(bs))


def test_header_text_repeated_in_body_is_kept() -> None:
    h = "[source: lobby / general]"
    message = {
        "blocks": [{"type": "text", "text": h}, {"type": "text", "text": h}],
        "metadata": {"source_header": h},
    }
    assert body_text(message) == h


def test_missing_fields() -> None:
    assert body_text({}) == ""
    assert body_text({"blocks": [], "metadata": {"source_header": "x"}}) == ""


def test_matchers() -> None:
    sub = text_matcher("HeLLo")
    assert sub("say hello there") and not sub("help")
    rx = text_matcher(r"^hi\b", regex=True)
    assert rx("hi there") and not rx("oh hi") and not rx("Hi there")
    assert text_matcher(r"(?i)^hi", regex=True)("Hi")
    assert text_matcher("STRASSE")("straße")


def test_bad_regex_raises() -> None:
    try:
        text_matcher("(", regex=True)
    except re.error:
        pass
    else:
        raise AssertionError("expected re.error")
