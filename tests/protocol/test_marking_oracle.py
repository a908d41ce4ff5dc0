"""Marking and quoting on ``re`` against the ``regex`` implementation they replaced.

The oracle below is that implementation, frozen: the opening pattern compiled by the ``regex``
package and the walk that put one backslash before each opening's bracket. Generated texts are
dense with what the rule treats specially (brackets, the letters of "source" in every case and
fold, filler, backslashes, line breaks, header separators, author-like brackets, surrogates,
emoji, other non-ASCII), so most examples hold several openings and near misses. The header
values' patterns are the same pattern text under either engine; they are compared too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import regex
from hypothesis import example, given
from hypothesis import strategies as st

from protocol import source
from protocol.source import header_value, label_value, mark_blocks, mark_openings, mark_text, quoted

# -- The oracle: marking as it was, on the regex package ------------------------------------------

_ORACLE_JS_SPACE = r"\t\n\x0b\x0c\r\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_ORACLE_INVISIBLE = (
    r"\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160"
    r"\u17b4-\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164"
    r"\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    r"\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
_ORACLE_FILL = rf"[{_ORACLE_JS_SPACE}\x00-\x1f\x7f-\x9f{_ORACLE_INVISIBLE}]*+"
_ORACLE_OPENING = regex.compile(
    r"\["
    + _ORACLE_FILL
    + _ORACLE_FILL.join(("[sS\u017f]", "[oO]", "[uU]", "[rR]", "[cC]", "[eE]", r"[:\]]"))
)


def oracle_openings(texts: Sequence[str | None]) -> list[str | None]:
    joined = "".join(text for text in texts if text is not None)
    starts = [match.start() for match in _ORACLE_OPENING.finditer(joined)]
    out: list[str | None] = []
    next_start = 0
    offset = 0
    for text in texts:
        if text is None:
            out.append(None)
            continue
        end = offset + len(text)
        pieces: list[str] = []
        cut = 0
        while next_start < len(starts) and starts[next_start] < end:
            at = starts[next_start] - offset
            pieces += [text[cut:at], "\\"]
            cut = at
            next_start += 1
        pieces.append(text[cut:])
        out.append("".join(pieces))
        offset = end
    return out


def oracle_blocks(blocks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    texts = [
        text if b.get("type") == "text" and isinstance(text := b.get("text"), str) else None
        for b in blocks
    ]
    marked = oracle_openings(texts)
    return [
        b if new is None or new == old else {**b, "text": new}
        for b, old, new in zip(blocks, texts, marked, strict=True)
    ]


# -- Generated texts -------------------------------------------------------------------------------

FILLERS = [
    *" \t\n\r\x0b\x0c\x00\x1f\x7f\x85\x9f\xa0\xad\u034f\u061c\u115f\u1680\u180e\u2000\u200a",
    *"\u200b\u200c\u200d\u200f\u2028\u2029\u202a\u202f\u205f\u2060\u2064\u206f\u3000\u3164",
    *"\ufe00\ufe0f\ufeff\uffa0\ufff0\ufffb\U000110bd\U00013430\U0001d173\U000e0001\U000e0fff",
    # just outside a filler range
    *"\u0606\u115e\u180a\u1fff\u2030\u205e\u2070\u3163\ufe10\ufffc\U000e1000",
]
LETTERS = [*"sSoOuUrRcCeE:]", "\u017f", "\u212a", "\u0455", "\u1e61", "\uff53", "\uff1a"]
PIECES = [
    "[",
    "]",
    "[[",
    "\\",
    "\\\\",
    "\\[",
    "source",
    "SOURCE",
    "[source:",
    "[source]",
    "[sou",
    "rce:",
    "[author: alice]",
    "[author id: 42]",
    "[ author :",
    "[\u200bAUTHOR",
    "\n",
    "\r\n",
    " / ",
    " · ",
    "\u00b7",
    '"',
    "\ud800",
    "\udfff",
    "\ud83d\ude00",
    "\ud83d",
    "\U0001f600",
    "\U0001f44d\U0001f3fd",
    "\U0001f469\u200d\U0001f4bb",
    "\u2764\ufe0f",
    "é",
    "ß",
    "中文",
    "\u0645\u0631\u062d\u0628\u0627",
]

pieces = st.sampled_from(PIECES) | st.sampled_from(FILLERS) | st.sampled_from(LETTERS)
texts = st.lists(pieces | st.characters(), max_size=40).map("".join)


@st.composite
def an_opening(draw: st.DrawFn) -> str:
    fills = st.lists(st.sampled_from(FILLERS), max_size=2).map("".join)
    text = "["
    for letters in ("sS\u017f", "oO", "uU", "rR", "cC", "eE", ":]"):
        text += draw(fills) + draw(st.sampled_from(letters))
    return text


rich = st.lists(texts | an_opening(), max_size=8).map("".join)


@st.composite
def cut(draw: st.DrawFn) -> list[str | None]:
    """A rich text cut into blocks anywhere (empty ones too), with non-text blocks between."""
    text = draw(rich)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    blocks: list[str | None] = [
        text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)
    ]
    for at in draw(st.lists(st.integers(0, len(blocks)), max_size=3)):
        blocks.insert(at, None)
    return blocks


# -- The differential --------------------------------------------------------------------------


@given(rich)
@example("[source:" * 50)
@example("\\[source] [ſ\u200bO\x85u\U000e0041R\ufeffc\u3164E\r\n:]")
@example("[[source: x]] [author: [source]")
@example("\ud800[source]\udfff")
def test_mark_text_marks_what_the_oracle_marks(text: str) -> None:
    assert mark_text(text) == oracle_openings([text])[0]


@given(cut())
@example(["[sou", None, "rce:", "[source]"])
@example([None, "[\u200b", "", "S", None, "ource\n]"])
def test_mark_openings_marks_what_the_oracle_marks(blocks: list[str | None]) -> None:
    assert mark_openings(blocks) == oracle_openings(blocks)


@given(rich)
def test_a_single_text_among_other_blocks(text: str) -> None:
    blocks = [None, text, None]
    assert mark_openings(blocks) == oracle_openings(blocks)
    assert mark_openings([text]) == oracle_openings([text])


@given(
    st.lists(
        st.one_of(
            rich.map(lambda t: {"type": "text", "text": t}),
            rich.map(lambda t: {"type": "text", "text": t, "ref_id": "ref_1"}),
            st.just({"type": "image", "uri": "u"}),
            st.just({"type": "text", "text": 5}),
            rich.map(lambda t: {"type": "resource", "text": t}),
        ),
        max_size=4,
    )
)
def test_mark_blocks_marks_what_the_oracle_marks(blocks: list[dict[str, Any]]) -> None:
    marked = mark_blocks(blocks)
    expected = oracle_blocks(blocks)
    assert marked == expected
    for new, old in zip(marked, blocks, strict=True):
        if new == old:  # unmarked blocks come back as the same object
            assert new is old


# The header values: the same pattern text, compiled by regex, is the oracle.
_ORACLE_QUOTE_SCAN = regex.compile(source._QUOTE_SCAN.pattern)
_ORACLE_STRUCTURAL = regex.compile(source._STRUCTURAL.pattern)
_ORACLE_UNSEEN = regex.compile(source._UNSEEN.pattern)
_ORACLE_EMOJI = regex.compile(source._EMOJI.pattern)
_ORACLE_HEADER_WORD = regex.compile(source._HEADER_WORD.pattern)


def oracle_quoted(text: str) -> str:
    def escape(match: regex.Match[str]) -> str:
        found: str = match.group()
        if match.group("emoji") is not None:
            return found
        return source._SHORT_ESCAPES.get(found) or source._utf16_escape(found)

    return '"' + _ORACLE_QUOTE_SCAN.sub(escape, text) + '"'


def oracle_header_value(text: str) -> str:
    needs = (
        _ORACLE_STRUCTURAL.search(text) is not None
        or " / " in text
        or _ORACLE_UNSEEN.search(_ORACLE_EMOJI.sub("", text)) is not None
    )
    return oracle_quoted(text) if needs else text


def oracle_label_value(text: str) -> str:
    if _ORACLE_HEADER_WORD.match(text) is not None:
        return oracle_quoted(text)
    return oracle_header_value(text)


labels = st.lists(
    pieces | st.characters() | st.sampled_from(["thread ", "Reply\u3000to", " unscoped", "THREAD"]),
    max_size=12,
).map("".join)


@given(labels)
@example("\U0001f469\u200d\U0001f4bb\u200b")
@example("\u2764\ufe0f\ufe0f")
def test_header_values_are_what_the_oracle_gives(text: str) -> None:
    assert quoted(text) == oracle_quoted(text)
    assert header_value(text) == oracle_header_value(text)
    assert label_value(text) == oracle_label_value(text)
