from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import Append, Database, MessageRecord, Reader, body_text, text_matcher
from store.bodytext import without_header

from .conftest import record

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
def test_first_block_loses_the_header_when_it_equals_or_begins_with_it(
    header: str, first: str, rest: list[dict[str, Any]]
) -> None:
    bs = [{"type": "text", "text": first}, *rest]
    got = body_text({"blocks": bs, "metadata": {"source_header": header}})
    if first == header:
        expected = _texts(rest)
    elif first.startswith(header):
        expected = [first[len(header) :], *_texts(rest)]
    else:
        expected = [first, *_texts(rest)]
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


# --- without_header (F.4), case by case -------------------------------------------------------

HEADER = "[source: lobby / lobby:general · #general]"


def _t(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, **extra}


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        {},
        {"kind": "x"},
        {"source_header": None},
        {"source_header": 5},
        {"sourceHeader": HEADER},
    ],
)
def test_no_header_leaves_the_content_unchanged(metadata: dict[str, Any] | None) -> None:
    content = [_t(HEADER), _t("hello")]
    assert without_header(content, metadata) == content


def test_a_later_shard_is_unchanged_even_when_it_begins_with_the_header() -> None:
    meta = {"source_header": HEADER}
    for content in ([_t(HEADER), _t("x")], [_t(HEADER + "x")], [_t("x")]):
        assert without_header(content, meta, shard_index=1) == content
        assert without_header(content, meta, shard_index=7) == content
    # The first shard of the same text does lose it.
    assert without_header([_t(HEADER + "x")], meta, shard_index=0) == [_t("x")]


def test_a_first_block_equal_to_the_header_is_dropped() -> None:
    meta = {"source_header": HEADER}
    image = {"type": "image", "data": "QQ==", "mimeType": "image/png"}
    assert without_header([_t(HEADER), _t("hi"), image], meta) == [_t("hi"), image]
    assert without_header([_t(HEADER)], meta) == []
    # Only the first block: a later block equal to the header is what a sender wrote.
    assert without_header([_t(HEADER), _t(HEADER)], meta) == [_t(HEADER)]


def test_a_first_block_beginning_with_the_header_loses_that_prefix() -> None:
    meta = {"source_header": HEADER}
    content = [_t(HEADER + "general chatter", cache=True), _t("more")]
    assert without_header(content, meta) == [_t("general chatter", cache=True), _t("more")]
    # Only a prefix: the header further in is body.
    assert without_header([_t(HEADER + HEADER)], meta) == [_t(HEADER)]
    assert without_header([_t(HEADER + "\n" + HEADER)], meta) == [_t("\n" + HEADER)]


@pytest.mark.parametrize(
    "first",
    [
        _t("[source: lobby / lobby:general · #renamed]"),  # edited
        _t(" " + HEADER),
        _t(HEADER[:-1]),
        _t("hello " + HEADER),
        {"type": "image", "data": "QQ==", "mimeType": "image/png"},
        {"type": "text"},
        {"type": "text", "text": 5},
        {"type": "tool_result", "content": [_t(HEADER)]},
        "not a block",
    ],
)
def test_an_edited_or_other_first_block_is_unchanged(first: Any) -> None:
    content = [first, _t(HEADER), _t("hello")]
    assert without_header(content, {"source_header": HEADER}) == content


def test_empty_content_is_empty() -> None:
    assert without_header([], {"source_header": HEADER}) == []
    assert without_header((), None) == []
    assert without_header([], {"source_header": HEADER}, shard_index=3) == []


def test_the_input_is_not_changed() -> None:
    first = _t(HEADER + "body")
    content = [first]
    out = without_header(content, {"source_header": HEADER})
    assert out == [_t("body")] and content == [first] and first["text"] == HEADER + "body"
    assert out is not content


def test_body_text_reads_the_prefix_case() -> None:
    message = {"blocks": [_t(HEADER + "hello"), _t("there")], "metadata": {"source_header": HEADER}}
    assert body_text(message) == "hello\nthere"


# --- search through the real SQLite store ------------------------------------------------------

OTHER = "[source: lobby / lobby:random · #random · thread t1]"


def _ids(reader: Reader, text: str, **kw: Any) -> list[str]:
    return [m["id"] for m in reader.search(text, **kw)]


@pytest.fixture
def stored(path: Path) -> Path:
    sharded = MessageRecord(  # a first block that begins with the header (sharded-shape item)
        id="s1",
        agent="alice",
        role="user",
        blocks=({"type": "text", "text": HEADER + "hello from the first shard"},),
        metadata={"source_header": HEADER},
        created_at=1.0,
    )
    with Database(path) as db:
        db.apply(
            [
                Append(records=(record("hello there", id="g1", header=HEADER),)),
                Append(records=(record("nothing to see", id="g2", header=HEADER),)),
                Append(records=(record("meet me in #general later", id="g3", header=HEADER),)),
                Append(records=(record("hello from random", id="r1", header=OTHER),)),
                Append(records=(record("quoting: " + HEADER, id="q1", header=OTHER),)),
                Append(records=(record(HEADER, id="l1"),)),  # local input: no header, marked text
                Append(records=(sharded,)),
            ]
        )
    return path


def test_a_header_only_match_is_not_found(stored: Path) -> None:
    with Reader(stored) as reader:
        assert _ids(reader, "lobby:general") == ["q1", "l1"]
        assert _ids(reader, "thread t1") == []
        assert _ids(reader, "[source:") == ["q1", "l1"]
        assert _ids(reader, "#random") == []
        assert _ids(reader, r"lobby:random", regex=True) == []
        assert _ids(reader, r"thread\s+t1", regex=True) == []


def test_a_label_matches_only_where_a_sender_wrote_it(stored: Path) -> None:
    with Reader(stored) as reader:
        assert _ids(reader, "#general") == ["g3", "q1", "l1"]
        assert _ids(reader, "#GENERAL", agent="alice") == ["g3", "q1", "l1"]
        assert _ids(reader, r"#general\s", regex=True) == ["g3"]
        assert _ids(reader, r"#general\]", regex=True) == ["q1", "l1"]


def test_caret_anchors_at_the_body(stored: Path) -> None:
    with Reader(stored) as reader:
        assert _ids(reader, r"^hello", regex=True) == ["g1", "r1", "s1"]
        assert _ids(reader, r"^\[source", regex=True) == ["l1"]
        assert _ids(reader, r"^quoting", regex=True) == ["q1"]
        assert _ids(reader, r"\A(nothing|meet)", regex=True) == ["g2", "g3"]
        assert _ids(reader, r"(?m)^\[source", regex=True) == ["l1"]


def test_regex_and_substring_both_skip_the_header(stored: Path) -> None:
    with Reader(stored) as reader:
        for needle in ("lobby / lobby:random", "random ·", "· #general]"):
            assert "r1" not in _ids(reader, needle)
            assert "r1" not in _ids(reader, re.escape(needle), regex=True)
            assert "g1" not in _ids(reader, needle)
            assert "g1" not in _ids(reader, re.escape(needle), regex=True)
        assert _ids(reader, "random") == ["r1"]  # the sender's "random", not the label
        assert _ids(reader, r"random$", regex=True) == ["r1"]
        assert _ids(reader, r"shard$", regex=True) == ["s1"]


def test_search_results_are_whole_messages_header_included(stored: Path) -> None:
    with Reader(stored) as reader:
        (found,) = reader.search("hello there")
        history = {m["id"]: m for m in reader.history()}
    assert found == history["g1"]
    assert found["blocks"][0] == {"type": "text", "text": HEADER}
    assert found["metadata"]["source_header"] == HEADER
