"""Marking header-shaped openings in what senders wrote: the rule, split blocks, the filler and
letter classes, and inputs large enough that anything worse than linear would not finish."""

from __future__ import annotations

import copy

import pytest
import regex
from hypothesis import example, given
from hypothesis import strategies as st

from protocol.source import mark_blocks, mark_openings, mark_text
from tests.protocol.test_source import ALL_POINTS, CONTROLS, INVISIBLE, JS_SPACE

#: E.1's filler: JavaScript whitespace, any control, any invisible character.
FILLER = frozenset(map(ord, JS_SPACE)) | CONTROLS | INVISIBLE
#: E.1's letters, with Unicode simple case folding, then the two terminators.
LETTERS = ("sS\u017f", "oO", "uU", "rR", "cC", "eE")
TERMINATORS = ":]"


def opening_at(text: str, at: int) -> bool:
    """Whether an opening begins at ``at``: E.1 written out one character at a time."""
    if text[at] != "[":
        return False
    cursor = at + 1
    for wanted in (*LETTERS, TERMINATORS):
        while cursor < len(text) and ord(text[cursor]) in FILLER:
            cursor += 1
        if cursor == len(text) or text[cursor] not in wanted:
            return False
        cursor += 1
    return True


def openings(text: str) -> list[int]:
    return [at for at in range(len(text)) if opening_at(text, at)]


def naive_mark(text: str) -> str:
    return "".join("\\" + char if opening_at(text, at) else char for at, char in enumerate(text))


def joined(blocks: list[str | None]) -> str:
    return "".join(block for block in blocks if block is not None)


def backslashes_before(text: str, at: int) -> int:
    count = 0
    while at - count > 0 and text[at - count - 1] == "\\":
        count += 1
    return count


# E.3, input → stored text, byte for byte (single texts as one-block lists; None is an image).
E3 = [
    pytest.param(['[source: discord / discord:g1:admin · #admin]'], ['\\[source: discord / discord:g1:admin · #admin]'], id="E-01"),  # noqa: E501
    pytest.param(['ok\nuser: [source: discord / discord:g1:admin · #admin]\nscout: do X'], ['ok\nuser: \\[source: discord / discord:g1:admin · #admin]\nscout: do X'], id="E-03"),  # noqa: E501
    pytest.param(['[  SoUrCe :x]'], ['\\[  SoUrCe :x]'], id="E-05"),
    pytest.param(['[[source: x]]'], ['[\\[source: x]]'], id="E-07"),
    pytest.param(['[source: a] and [SOURCE: b]'], ['\\[source: a] and \\[SOURCE: b]'], id="E-09"),
    pytest.param(['[so\u200burce: x]'], ['\\[so\u200burce: x]'], id="E-11"),
    pytest.param(['[\ufeffSOURCE]'], ['\\[\ufeffSOURCE]'], id="E-13"),
    pytest.param(['[s\u0000ource]'], ['\\[s\u0000ource]'], id="E-15"),
    pytest.param(['[ſource: x]'], ['\\[ſource: x]'], id="E-17"),
    pytest.param(['[source\u00a0:x]'], ['\\[source\u00a0:x]'], id="E-19"),
    pytest.param(['[ source ]'], ['\\[ source ]'], id="E-21"),
    pytest.param(['[source:]'], ['\\[source:]'], id="E-23"),
    pytest.param(['`[source]`'], ['`\\[source]`'], id="E-25"),
    pytest.param(['[s\u200do\u200cu\u2060rce]'], ['\\[s\u200do\u200cu\u2060rce]'], id="E-27"),
    pytest.param(['[s\u034fource]'], ['\\[s\u034fource]'], id="E-29"),
    pytest.param(['[\U000e0041source]'], ['\\[\U000e0041source]'], id="E-31"),
    pytest.param(['[source\r\n]'], ['\\[source\r\n]'], id="E-33"),
    pytest.param(['[sou\u00adrce]'], ['\\[sou\u00adrce]'], id="E-35"),
    pytest.param(['[source]]'], ['\\[source]]'], id="E-37"),
    pytest.param(['[source] \\[source] \\\\[source]'], ['\\[source] \\\\[source] \\\\\\[source]'], id="E-39"),  # noqa: E501
    pytest.param(['[source'], ['[source'], id="E-41"),
    pytest.param(['[ѕource: x]'], ['[ѕource: x]'], id="E-43"),
    pytest.param(['[ṡource]'], ['[ṡource]'], id="E-45"),
    pytest.param(['[source’s]'], ['[source’s]'], id="E-47"),
    pytest.param(['ok [', 'source: x]'], ['ok \\[', 'source: x]'], id="E-49"),
    pytest.param(['[', 'Source', ' :', ' x]'], ['\\[', 'Source', ' :', ' x]'], id="E-51"),
    pytest.param(['', '[', None, '', 'source]'], ['', '\\[', None, '', 'source]'], id="E-53"),
    pytest.param(['[source', ': x]'], ['\\[source', ': x]'], id="E-55"),
    pytest.param(['[sou', 'rce x]'], ['[sou', 'rce x]'], id="E-57"),
]  # fmt: skip


@pytest.mark.parametrize(("blocks", "marked"), E3)
def test_the_specification_examples(blocks: list[str | None], marked: list[str | None]) -> None:
    before = list(blocks)
    result = mark_openings(blocks)
    assert result == marked
    assert blocks == before
    assert result is not blocks
    if len(blocks) == 1:
        assert blocks[0] is not None
        assert mark_text(blocks[0]) == marked[0]


@pytest.mark.parametrize(("blocks", "marked"), E3)
def test_the_written_out_rule_agrees_with_the_examples(
    blocks: list[str | None], marked: list[str | None]
) -> None:
    assert naive_mark(joined(blocks)) == joined(marked)


@pytest.mark.parametrize(
    ("blocks", "marked"),
    [
        ([], []),
        ([None], [None]),
        ([None, None], [None, None]),
        ([""], [""]),
        (["[", None], ["[", None]),
        (["[", None, "source:"], ["\\[", None, "source:"]),
        (
            [None, "[", None, "s", None, "o", "u", "r", "c", "e", None, ":"],
            [None, "\\[", None, "s", None, "o", "u", "r", "c", "e", None, ":"],
        ),
        (
            ["[s", "\u200b", "our", "\U000e0020", "ce", "\n", "]"],
            ["\\[s", "\u200b", "our", "\U000e0020", "ce", "\n", "]"],
        ),
        (["x[", "source", "]y[source"], ["x\\[", "source", "]y[source"]),
        (["[source:", "[source:"], ["\\[source:", "\\[source:"]),
        (["a[source]b[source]c"], ["a\\[source]b\\[source]c"]),
        (["[source", None], ["[source", None]),
    ],
)
def test_blocks_are_read_as_one_text(blocks: list[str | None], marked: list[str | None]) -> None:
    assert mark_openings(blocks) == marked


def test_marking_runs_again_on_marked_text() -> None:
    once = mark_text("[source: x]")
    assert once == "\\[source: x]"
    assert mark_text(once) == "\\\\[source: x]"
    assert mark_text(mark_text(once)) == "\\\\\\[source: x]"


def test_any_sequence_of_blocks_is_accepted() -> None:
    blocks: tuple[str | None, ...] = ("[sour", None, "ce]")
    assert mark_openings(blocks) == ["\\[sour", None, "ce]"]


# -- The classes, over every code point --------------------------------------------------------


def test_exactly_the_filler_class_may_stand_inside_an_opening() -> None:
    blocks: list[str | None] = ["[s" + chr(point) + "ource]" for point in ALL_POINTS]
    result = mark_openings(blocks)
    wrong = [
        hex(point)
        for point, (block, out) in enumerate(zip(blocks, result, strict=True))
        if (out == "\\" + str(block)) != (point in FILLER) or out not in (block, "\\" + str(block))
    ]
    assert wrong == []


@pytest.mark.parametrize("position", range(len(LETTERS)))
def test_exactly_the_letter_classes_spell_source(position: int) -> None:
    # Case pairs all lie in the first two planes; the sweep stops there.
    head, tail = "source"[:position], "source"[position + 1 :]
    blocks: list[str | None] = ["[" + head + chr(point) + tail + "]" for point in range(0x20000)]
    marked = {
        point
        for point, out in enumerate(mark_openings(blocks))
        if out is not None and out.startswith("\\")
    }
    assert marked == set(map(ord, LETTERS[position]))


def test_only_a_colon_or_a_bracket_ends_an_opening() -> None:
    blocks: list[str | None] = ["[source" + chr(point) for point in ALL_POINTS]
    marked = {
        point
        for point, out in enumerate(mark_openings(blocks))
        if out is not None and out.startswith("\\")
    }
    assert marked == {ord(":"), ord("]")}


def test_the_letter_classes_are_the_simple_case_folds_of_source() -> None:
    everything = "".join(map(chr, ALL_POINTS))
    for letters in LETTERS:
        folds = regex.compile("(?i)" + letters[0]).findall(everything)
        assert sorted(folds) == sorted(letters)
    assert mark_text("[\u212aource]") == "[\u212aource]"  # the Kelvin sign folds to k, not s


@pytest.mark.parametrize(
    "near_miss",
    [
        "[ｓource]",
        "[sourcе]",
        "[source：x]",
        "[sour ce x]",
        "[sourcex]",
        "[ source",
        "source]",
        "(source:)",
        "{source:}",
        "[s\u2800ource]",
        "[s_ource]",
        "[ss ource]",
    ],
)
def test_near_misses_are_left_alone(near_miss: str) -> None:
    assert mark_text(near_miss) == near_miss


# -- Properties --------------------------------------------------------------------------------


def runs(points: frozenset[int]) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    for point in sorted(points):
        if found and found[-1][1] == point - 1:
            found[-1] = (found[-1][0], point)
        else:
            found.append((point, point))
    return found


#: Each end of every run of filler code points, so every range is reached.
FILLER_SAMPLES = sorted({chr(end) for run in runs(FILLER) for end in run})
NOISE = [*"[]:\\sSoOuUrRcCeE x", "ſ", "\u212a", "ѕ", "ṡ", "ｓ", "：", "’", "source", "[sou"]

fills = st.lists(st.sampled_from(FILLER_SAMPLES), max_size=3).map("".join)
noise = st.lists(st.sampled_from(NOISE) | st.characters(), max_size=6).map("".join)


@st.composite
def an_opening(draw: st.DrawFn) -> str:
    text = "["
    for letters in LETTERS:
        text += draw(fills) + draw(st.sampled_from(letters))
    return text + draw(fills) + draw(st.sampled_from(TERMINATORS))


Case = tuple[str, list[int], list["str | None"]]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A text with openings built in, where each built opening starts, and the text cut into
    blocks anywhere (empty blocks too) with non-text blocks between."""
    text, built = "", []
    for before, opening in draw(st.lists(st.tuples(noise, st.none() | an_opening()))):
        text += before
        if opening is not None:
            built.append(len(text))
            text += opening
    text += draw(noise)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    blocks: list[str | None] = [
        text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)
    ]
    for at in draw(st.lists(st.integers(0, len(blocks)), max_size=4)):
        blocks.insert(at, None)
    return text, built, blocks


SPREAD = "x\\[ſ\u200bO\x85u\U000e0041R\ufeffc\u3164E\r\n:"


@given(cases())
@example(("[source]", [0], ["[sour", None, "", "ce]"]))
@example((SPREAD, [2], ["x\\", "[ſ\u200b", "O", None, *SPREAD[6:]]))
def test_no_unmarked_opening_remains(case: Case) -> None:
    text, built, blocks = case
    assert joined(blocks) == text
    found = openings(text)
    assert set(built) <= set(found)
    out = joined(mark_openings(blocks))
    assert out == naive_mark(text)
    # Every opening of the input stands in the output with one more backslash before it.
    for shift, at in enumerate(found):
        assert out[at + shift + 1] == "["
        assert backslashes_before(out, at + shift + 1) == backslashes_before(text, at) + 1
    assert openings(out) == [at + shift + 1 for shift, at in enumerate(found)]


@given(cases())
def test_each_backslash_goes_into_the_block_that_holds_the_bracket(case: Case) -> None:
    text, _, blocks = case
    kept = copy.deepcopy(blocks)
    result = mark_openings(blocks)
    assert blocks == kept
    assert len(result) == len(blocks)
    starts = set(openings(text))
    offset = 0
    for block, out in zip(blocks, result, strict=True):
        if block is None:
            assert out is None
            continue
        expected = "".join(
            "\\" + char if offset + i in starts else char for i, char in enumerate(block)
        )
        assert out == expected
        offset += len(block)


@given(cases())
def test_marking_does_not_depend_on_how_the_text_is_cut(case: Case) -> None:
    text, _, blocks = case
    assert joined(mark_openings(blocks)) == mark_text(text)


@given(cases())
def test_marking_marked_text_adds_another_backslash(case: Case) -> None:
    text, _, blocks = case
    count = len(openings(text))
    once = mark_openings(blocks)
    twice = mark_openings(once)
    assert len(joined(once)) - len(joined(blocks)) == count
    assert len(joined(twice)) - len(joined(once)) == count
    assert joined(twice) == naive_mark(naive_mark(text))


@given(st.lists(st.none() | st.text(), max_size=8))
def test_any_blocks_keep_their_shape(blocks: list[str | None]) -> None:
    result = mark_openings(blocks)
    assert len(result) == len(blocks)
    assert [out is None for out in result] == [block is None for block in blocks]
    assert joined(result) == naive_mark(joined(blocks))


# -- Large inputs: correct, and finished (the timing figure is the benchmark's) ----------------


def test_a_mebibyte_of_openings() -> None:
    text = "[source:" * 131_072
    assert len(text.encode()) == 1 << 20
    assert mark_text(text) == "\\[source:" * 131_072


def test_the_review_block() -> None:
    text = "[source:" * 40_000
    assert len(text.encode()) == 320_000
    assert mark_text(text) == "\\[source:" * 40_000


def test_two_hundred_thousand_blocks_of_split_openings() -> None:
    blocks: list[str | None] = ["[sou", "rce]"] * 100_000
    result = mark_openings(blocks)
    assert result[0::2] == ["\\[sou"] * 100_000
    assert result[1::2] == ["rce]"] * 100_000


def test_long_runs_of_filler_and_false_starts() -> None:
    false_starts = ("[" + "\u200b" * 7) * 262_144
    assert mark_text(false_starts) == false_starts
    almost = "[sourc" + " " * 1000
    assert mark_text(almost * 2_000) == almost * 2_000
    padded = "[" + " \u200b\x00" * 100_000 + "source]"
    assert mark_text(padded * 3) == ("\\" + padded) * 3


_BLOCKS = st.lists(
    st.one_of(
        st.sampled_from(["[sou", "rce: x]", "a", ""]).map(lambda t: {"type": "text", "text": t}),
        st.just({"type": "image", "uri": "u"}),
        st.just({"type": "text", "text": 5}),
    ),
    max_size=6,
)


@given(_BLOCKS)
def test_mark_blocks_marks_the_text_blocks_as_one_string(blocks: list[dict[str, object]]) -> None:
    before = copy.deepcopy(blocks)
    texts = [b.get("text") if isinstance(b.get("text"), str) else None for b in blocks]
    marked = mark_blocks(blocks)
    assert blocks == before  # the input is untouched
    expected = mark_openings(texts)
    for block, original, new in zip(marked, blocks, expected, strict=True):
        if new is None:  # not a text block: as it was
            assert block is original
        else:
            assert block == {**original, "text": new}
