"""Stored source headers: the grammar, when a value is quoted, how it is escaped, the emoji
exemption, the header-word rule for labels, notices, and reading a header back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from protocol.source import (
    HeaderFields,
    channel_header,
    header_value,
    label_value,
    notice_label,
    notice_value,
    parse_header,
    quoted,
    unscoped_header,
)


def ranges(listing: str) -> frozenset[int]:
    """Code points of a listing such as ``U+00AD, U+0600–U+0605``."""
    points: set[int] = set()
    for item in listing.replace("\n", " ").split(","):
        low, _, high = item.strip().partition("–")
        first = int(low.removeprefix("U+"), 16)
        last = int(high.removeprefix("U+"), 16) if high else first
        points.update(range(first, last + 1))
    return frozenset(points)


# Appendix U, as the specification lists it (Unicode 17).
INVISIBLE = ranges(
    """U+00AD, U+034F, U+0600–U+0605, U+061C, U+06DD, U+070F, U+0890–U+0891, U+08E2, U+115F–U+1160,
    U+17B4–U+17B5, U+180B–U+180F, U+200B–U+200F, U+202A–U+202E, U+2060–U+206F, U+3164,
    U+FE00–U+FE0F, U+FEFF, U+FFA0, U+FFF0–U+FFFB, U+110BD, U+110CD, U+13430–U+1343F,
    U+1BCA0–U+1BCA3, U+1D173–U+1D17A, U+E0000–U+E0FFF"""
)
ZS = ranges("U+0020, U+00A0, U+1680, U+2000–U+200A, U+202F, U+205F, U+3000")
EMOJI_MODIFIER = ranges("U+1F3FB–U+1F3FF")
EXTENDED_PICTOGRAPHIC = ranges(
    """U+00A9, U+00AE, U+203C, U+2049, U+2122, U+2139, U+2194–U+2199, U+21A9–U+21AA, U+231A–U+231B,
U+2328, U+23CF, U+23E9–U+23F3, U+23F8–U+23FA, U+24C2, U+25AA–U+25AB, U+25B6, U+25C0,
U+25FB–U+25FE, U+2600–U+2604, U+260E, U+2611, U+2614–U+2615, U+2618, U+261D, U+2620,
U+2622–U+2623, U+2626, U+262A, U+262E–U+262F, U+2638–U+263A, U+2640, U+2642, U+2648–U+2653,
U+265F–U+2660, U+2663, U+2665–U+2666, U+2668, U+267B, U+267E–U+267F, U+2692–U+2697, U+2699,
U+269B–U+269C, U+26A0–U+26A1, U+26A7, U+26AA–U+26AB, U+26B0–U+26B1, U+26BD–U+26BE,
U+26C4–U+26C5, U+26C8, U+26CE–U+26CF, U+26D1, U+26D3–U+26D4, U+26E9–U+26EA, U+26F0–U+26F5,
U+26F7–U+26FA, U+26FD, U+2702, U+2705, U+2708–U+270D, U+270F, U+2712, U+2714, U+2716, U+271D,
U+2721, U+2728, U+2733–U+2734, U+2744, U+2747, U+274C, U+274E, U+2753–U+2755, U+2757,
U+2763–U+2764, U+2795–U+2797, U+27A1, U+27B0, U+27BF, U+2934–U+2935, U+2B05–U+2B07,
U+2B1B–U+2B1C, U+2B50, U+2B55, U+3030, U+303D, U+3297, U+3299, U+1F004, U+1F02C–U+1F02F,
U+1F094–U+1F09F, U+1F0AF–U+1F0B0, U+1F0C0, U+1F0CF–U+1F0D0, U+1F0F6–U+1F0FF, U+1F170–U+1F171,
U+1F17E–U+1F17F, U+1F18E, U+1F191–U+1F19A, U+1F1AE–U+1F1E5, U+1F201–U+1F20F, U+1F21A, U+1F22F,
U+1F232–U+1F23A, U+1F23C–U+1F23F, U+1F249–U+1F25F, U+1F266–U+1F321, U+1F324–U+1F393,
U+1F396–U+1F397, U+1F399–U+1F39B, U+1F39E–U+1F3F0, U+1F3F3–U+1F3F5, U+1F3F7–U+1F3FA,
U+1F400–U+1F4FD, U+1F4FF–U+1F53D, U+1F549–U+1F54E, U+1F550–U+1F567, U+1F56F–U+1F570,
U+1F573–U+1F57A, U+1F587, U+1F58A–U+1F58D, U+1F590, U+1F595–U+1F596, U+1F5A4–U+1F5A5, U+1F5A8,
U+1F5B1–U+1F5B2, U+1F5BC, U+1F5C2–U+1F5C4, U+1F5D1–U+1F5D3, U+1F5DC–U+1F5DE, U+1F5E1, U+1F5E3,
U+1F5E8, U+1F5EF, U+1F5F3, U+1F5FA–U+1F64F, U+1F680–U+1F6C5, U+1F6CB–U+1F6D2, U+1F6D5–U+1F6E5,
U+1F6E9, U+1F6EB–U+1F6F0, U+1F6F3–U+1F6FF, U+1F7DA–U+1F7FF, U+1F80C–U+1F80F, U+1F848–U+1F84F,
U+1F85A–U+1F85F, U+1F888–U+1F88F, U+1F8AE–U+1F8AF, U+1F8BC–U+1F8BF, U+1F8C2–U+1F8CF,
U+1F8D9–U+1F8FF, U+1F90C–U+1F93A, U+1F93C–U+1F945, U+1F947–U+1F9FF, U+1FA58–U+1FA5F,
U+1FA6E–U+1FAFF, U+1FC00–U+1FFFD"""
)
#: Whitespace as JavaScript's ``\\s`` has it.
JS_SPACE = frozenset("\t\n\x0b\x0c\r \xa0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff") | frozenset(
    map(chr, range(0x2000, 0x200B))
)
CONTROLS = frozenset(range(0x00, 0x20)) | frozenset(range(0x7F, 0xA0))
#: Characters that are quoted wherever they stand (D.2 rule 1).
STRUCTURAL = frozenset(map(ord, '[]·"\\\u2028\u2029')) | CONTROLS
#: Characters that are unseen outside an emoji sequence (D.2 rule 3).
UNSEEN = INVISIBLE | (ZS - {0x20})
#: Characters that break a line for some reader (``str.splitlines`` and D.4's list).
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
ALL_POINTS = range(0x110000)


def decode(value: str) -> str:
    """The value a rendered header value stands for."""
    return json.loads(value) if value.startswith('"') else value


def expected_fields(
    server: str,
    channel_id: str | None,
    label: str | None = None,
    thread: str | None = None,
    reply_to: str | None = None,
) -> HeaderFields:
    return HeaderFields(
        server=server,
        channel_id=channel_id,
        label=label or None,
        thread=thread or None,
        reply_to=reply_to or None,
    )


# D.6, input → stored header, byte for byte.
D6 = [
    pytest.param("channel", dict(server='discord', channel_id='discord:g1:room', label='#room (Guild One)'), '[source: discord / discord:g1:room · #room (Guild One)]', id="D-01"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='discord:g1:room'), '[source: discord / discord:g1:room]', id="D-03"),  # noqa: E501
    pytest.param("channel", dict(server='zulip', channel_id='zulip:stream:7', reply_to='z0'), '[source: zulip / zulip:stream:7 · reply to z0]', id="D-05"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label=''), '[source: discord / c]', id="D-07"),  # noqa: E501
    pytest.param("unscoped", dict(server='x / y'), '[source: "x / y" · unscoped]', id="D-09"),
    pytest.param("channel", dict(server='discord', channel_id='c', label='evil]\n[source: other / wrong'), '[source: discord / c · "evil]\\n[source: other / wrong"]', id="D-11"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='a\u2028[source: x]\u2029b\u0085c\u007fd'), '[source: discord / c · "a\\u2028[source: x]\\u2029b\\u0085c\\u007fd"]', id="D-13"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='[bracketed]'), '[source: discord / c · "[bracketed]"]', id="D-15"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='cr\rlf\n'), '[source: discord / c · "cr\\rlf\\n"]', id="D-17"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='thread topic-a'), '[source: discord / c · "thread topic-a"]', id="D-19"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='Thread Topic-A'), '[source: discord / c · "Thread Topic-A"]', id="D-21"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='thread'), '[source: discord / c · "thread"]', id="D-23"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='UNSCOPED pushes'), '[source: discord / c · "UNSCOPED pushes"]', id="D-25"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='thread\u00a0x'), '[source: discord / c · "thread\\u00a0x"]', id="D-27"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='thread-ideas'), '[source: discord / c · thread-ideas]', id="D-29"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='design thread'), '[source: discord / c · design thread]', id="D-31"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='unscopedness'), '[source: discord / c · unscopedness]', id="D-33"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='replyto x'), '[source: discord / c · replyto x]', id="D-35"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='\u200bthread spoofed'), '[source: discord / c · "\\u200bthread spoofed"]', id="D-37"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='\u202egeneral'), '[source: discord / c · "\\u202egeneral"]', id="D-39"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='a\u00a0/\u00a0b'), '[source: discord / c · "a\\u00a0/\\u00a0b"]', id="D-41"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='\u3164thread spoofed'), '[source: discord / c · "\\u3164thread spoofed"]', id="D-43"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='\ufe0fthread spoofed'), '[source: discord / c · "\\ufe0fthread spoofed"]', id="D-45"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='\ufff9x'), '[source: discord / c · "\\ufff9x"]', id="D-47"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='soft\u00adhyphen'), '[source: discord / c · "soft\\u00adhyphen"]', id="D-49"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='a\u202fb'), '[source: discord / c · "a\\u202fb"]', id="D-51"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='a / b'), '[source: discord / c · "a / b"]', id="D-53"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='a/ b'), '[source: discord / c · a/ b]', id="D-55"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='general'), '[source: discord / c · general]', id="D-57"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='Обсуждение'), '[source: discord / c · Обсуждение]', id="D-59"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='🏳\ufe0f\u200d🌈 pride'), '[source: discord / c · 🏳\ufe0f\u200d🌈 pride]', id="D-61"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='❤\ufe0f · \u202ex'), '[source: discord / c · "❤\ufe0f · \\u202ex"]', id="D-63"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f flag'), '[source: discord / c · "🏴\\udb40\\udc67\\udb40\\udc62\\udb40\\udc65\\udb40\\udc6e\\udb40\\udc67\\udb40\\udc7f flag"]', id="D-65"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='\u2800braille'), '[source: discord / c · \u2800braille]', id="D-67"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='#\ufe0f'), '[source: discord / c · "#\\ufe0f"]', id="D-69"),  # noqa: E501
    pytest.param("channel", dict(server='discord', channel_id='c', label='"quoted"'), '[source: discord / c · "\\"quoted\\""]', id="D-71"),  # noqa: E501
    pytest.param("channel", dict(server='dis cord', channel_id='a b', thread='release "v2"', reply_to='m\n1'), '[source: dis cord / a b · thread "release \\"v2\\"" · reply to "m\\n1"]', id="D-73"),  # noqa: E501
]  # fmt: skip


def render(kind: str, fields: dict[str, Any]) -> str:
    return channel_header(**fields) if kind == "channel" else unscoped_header(**fields)


@pytest.mark.parametrize(("kind", "fields", "header"), D6)
def test_the_specification_examples(kind: str, fields: dict[str, Any], header: str) -> None:
    assert render(kind, fields) == header


@pytest.mark.parametrize(("kind", "fields", "header"), D6)
def test_the_specification_examples_read_back(
    kind: str, fields: dict[str, Any], header: str
) -> None:
    assert parse_header(header) == expected_fields(
        fields["server"],
        fields.get("channel_id"),
        fields.get("label"),
        fields.get("thread"),
        fields.get("reply_to"),
    )


# -- The grammar (D.1) -------------------------------------------------------------------------


def test_parts_come_in_the_fixed_order() -> None:
    header = channel_header("s", "c", label="L", thread="T", reply_to="R")
    assert header == "[source: s / c · L · thread T · reply to R]"
    assert channel_header("s", "c", thread="T") == "[source: s / c · thread T]"
    assert channel_header("s", "c", label="L", reply_to="R") == "[source: s / c · L · reply to R]"


@pytest.mark.parametrize("empty", [None, ""])
def test_missing_or_empty_parts_are_left_out(empty: str | None) -> None:
    assert channel_header("s", "c", empty, empty, empty) == "[source: s / c]"


def test_the_unscoped_form_is_the_one_the_notice_names() -> None:
    assert unscoped_header("server") == "[source: server · unscoped]"


def test_the_separators_are_exact_characters() -> None:
    header = channel_header("s", "c", label="L")
    assert header[len("[source: s") : len("[source: s / ")] == " / "
    assert header[len("[source: s / c") : len("[source: s / c · ")] == " \u00b7 "


# -- header_value (D.2) ------------------------------------------------------------------------


@pytest.mark.parametrize("char", sorted(map(chr, STRUCTURAL)))
def test_a_structural_character_anywhere_quotes_the_value(char: str) -> None:
    rendered = header_value("a" + char + "b")
    assert rendered.startswith('"')
    assert json.loads(rendered) == "a" + char + "b"


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("a / b", '"a / b"'),
        (" / ", '" / "'),
        ("a /b", "a /b"),
        ("a/ b", "a/ b"),
        ("a/b", "a/b"),
        ("a//b", "a//b"),
        ("a  /b", "a  /b"),
    ],
)
def test_only_space_slash_space_is_a_separator(value: str, rendered: str) -> None:
    assert header_value(value) == rendered


@pytest.mark.parametrize(
    "space",
    [*"\t\n\x0b\x0c\r\x85\u2028\u2029\xa0\u1680\u2000\u200a\u202f\u205f\u3000\ufeff"],
)
def test_any_whitespace_on_both_sides_of_a_slash_quotes(space: str) -> None:
    for value in (f"a{space}/{space}b", f"a /{space}b", f"a{space}/ b"):
        assert header_value(value).startswith('"'), repr(value)


@pytest.mark.parametrize(
    "char",
    [
        "\u200b",
        "\u200c",
        "\u200d",
        "\u200e",
        "\u200f",
        *map(chr, range(0x202A, 0x202F)),
        *map(chr, range(0x2066, 0x206A)),
        "\u2060",
        "\ufeff",
        "\u00ad",
        "\u034f",
        "\u115f",
        "\u1160",
        "\u3164",
        "\uffa0",
        *map(chr, range(0xFE00, 0xFE10)),
        "\U000e0100",
        "\U000e01ef",
        "\ufff9",
        "\ufffa",
        "\ufffb",
        *map(chr, range(0x180B, 0x1810)),
        "\U000e0000",
        "\U000e0041",
        "\U000e0fff",
    ],
)
def test_invisible_characters_are_quoted_and_escaped(char: str) -> None:
    expected = '"a' + utf16_escape(char) + 'b"'
    assert header_value("a" + char + "b") == expected
    assert json.loads(expected) == "a" + char + "b"


def utf16_escape(char: str) -> str:
    units = char.encode("utf-16-be")
    return "".join(
        f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2)
    )


@pytest.mark.parametrize(
    "value",
    ["\u2800braille", "café", "Обсуждение", "a/b", "general", "#room (Guild One)", "日本語"],
)
def test_visible_text_is_left_as_it_is(value: str) -> None:
    assert header_value(value) == value
    assert label_value(value) == value


def test_every_code_point_is_classed_as_appendix_u_says() -> None:
    # A lone character after a letter: quoted exactly when it is structural or unseen.
    quoting = STRUCTURAL | UNSEEN
    wrong = [
        hex(point)
        for point in ALL_POINTS
        if header_value("a" + chr(point)).startswith('"') != (point in quoting)
    ]
    assert wrong == []


def test_every_pictograph_takes_a_selector_and_nothing_else_does() -> None:
    # A pictograph followed by VS16 is an emoji sequence (raw); anything else leaves VS16 unseen.
    wrong = [
        hex(point)
        for point in ALL_POINTS
        if (header_value(chr(point) + "\ufe0f") == chr(point) + "\ufe0f")
        != (point in EXTENDED_PICTOGRAPHIC)
    ]
    assert wrong == []


def test_only_modifiers_and_selectors_sit_between_a_pictograph_and_its_joiner() -> None:
    # Pictographs and modifiers all lie in the first two planes; the sweep stops there.
    ok = EMOJI_MODIFIER | {0xFE0E, 0xFE0F} | EXTENDED_PICTOGRAPHIC
    wrong = [
        hex(point)
        for point in range(0x20000)
        if (not header_value("😀" + chr(point) + "\u200d😀").startswith('"')) != (point in ok)
    ]
    assert wrong == []


def test_a_lone_surrogate_is_left_raw_and_escaped_when_quoted() -> None:
    assert label_value("\ud800") == "\ud800"
    assert header_value("\udfff") == "\udfff"
    assert header_value('"\ud800') == '"\\"\\ud800"'
    assert json.loads(header_value('"\ud800')) == '"\ud800'


# -- quoted (D.4) ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ('"', '"\\""'),
        ("\\", '"\\\\"'),
        ("\b\f\n\r\t", '"\\b\\f\\n\\r\\t"'),
        ("\x00\x01\x0b\x1f", '"\\u0000\\u0001\\u000b\\u001f"'),
        ("\x7f\x80\x85\x9f", '"\\u007f\\u0080\\u0085\\u009f"'),
        ("\u2028\u2029", '"\\u2028\\u2029"'),
        ("\u200b\ufeff", '"\\u200b\\ufeff"'),
        ("\U000e0041", '"\\udb40\\udc41"'),
        ("\u3000\xa0 ", '"\\u3000\\u00a0 "'),
        ("/", '"/"'),
        ("é😀", '"é😀"'),
        ("", '""'),
    ],
)
def test_quoted_escapes(value: str, rendered: str) -> None:
    assert quoted(value) == rendered
    assert json.loads(rendered) == value


# -- Emoji sequences (D.5) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("❤\ufe0f cats", "❤\ufe0f cats"),
        ("👩\u200d💻 dev", "👩\u200d💻 dev"),
        ("👍\U0001f3fd ok", "👍\U0001f3fd ok"),
        ("👩\U0001f3fd\u200d🚀", "👩\U0001f3fd\u200d🚀"),
        ("☺\ufe0e", "☺\ufe0e"),
        ("©\ufe0f ®\ufe0f ™\ufe0f ‼\ufe0f", "©\ufe0f ®\ufe0f ™\ufe0f ‼\ufe0f"),
        ("1\ufe0f\u20e3", '"1\\ufe0f\u20e3"'),
        ("😀\u200d", '"😀\\u200d"'),
        ("😀\u200dx", '"😀\\u200dx"'),
        ("❤\ufe0f\ufe0f", '"❤\ufe0f\\ufe0f"'),
        ("😀\U0001f3fb\ufe0f", '"😀\U0001f3fb\\ufe0f"'),
        ("\u200d😀", '"\\u200d😀"'),
        ("❤\ufe0f [x]", '"❤\ufe0f [x]"'),
    ],
)
def test_emoji_sequences_and_their_limits(value: str, rendered: str) -> None:
    assert header_value(value) == rendered
    assert decode(rendered) == value


# -- label_value (D.3) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label",
    [
        "thread",
        "Thread x",
        "THREAD x",
        "reply to",
        "reply to x",
        "Reply To x",
        "reply  to x",
        "unscoped",
        "UnScOpEd pushes",
        " thread x",
        "\u3000thread x",
        "\ufeffthread x",
        "thread\u2028x",
        "reply\u00a0to x",
    ],
)
def test_labels_beginning_with_a_header_word_are_quoted(label: str) -> None:
    assert label_value(label) == quoted(label)


@pytest.mark.parametrize(
    "label",
    [
        "threads",
        "thread-ideas",
        "thread:ops",
        "replyto x",
        "reply tones",
        "unscopedness",
        "#thread talk",
        "design thread",
        "unſcoped x",
        "threaD_x",
        "reply",
        "reply x",
        "thread\u2800x",
    ],
)
def test_near_misses_are_left_as_they_are(label: str) -> None:
    assert label_value(label) == label


def test_the_word_match_is_ascii_only() -> None:
    assert channel_header("s", "c", label="unſcoped x") == "[source: s / c · unſcoped x]"
    assert channel_header("s", "c", label="\u212athread") == "[source: s / c · \u212athread]"


def test_thread_and_reply_ids_get_no_word_test() -> None:
    assert channel_header("discord", "c", thread="reply to 5") == (
        "[source: discord / c · thread reply to 5]"
    )
    assert channel_header("discord", "c", reply_to="thread 5") == (
        "[source: discord / c · reply to thread 5]"
    )
    assert header_value("unscoped") == "unscoped"


# -- Notices (D.7) and examples built with quoted (I.8) ----------------------------------------


def test_notices_name_values_by_the_header_rule() -> None:
    forged = "ops\n[delivered] to #admin"
    shown = notice_label(forged)
    assert shown == '"ops\\n[delivered] to #admin"'
    assert len(f"[held] message for {shown}".splitlines()) == 1
    assert notice_label("general") == "general"
    assert notice_label("thread x") == '"thread x"'
    assert notice_value("thread x") == "thread x"
    assert notice_value("discord:g1:room") == "discord:g1:room"
    assert notice_value("a / b") == '"a / b"'


@given(st.text())
def test_notice_helpers_are_the_header_functions(text: str) -> None:
    assert notice_label(text) == label_value(text)
    assert notice_value(text) == header_value(text)


def test_a_resend_example_writes_ids_as_json_strings() -> None:
    destination, thread = quoted("c"), quoted('release "v2"')
    example = f"destination: {destination}, threadId: {thread}"
    assert 'destination: "c", threadId: "release \\"v2\\""' in example
    assert json.loads(destination) == "c"
    assert json.loads(thread) == 'release "v2"'
    assert quoted("a\\b\nc") == '"a\\\\b\\nc"'


# -- Reading a header back ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[source: ]",
        "[source: s]",
        "[source: s / c",
        "[source: s / c]x",
        "x[source: s / c]",
        "[source:  s / c]x",
        "[Source: s / c]",
        '[source: "s" / c]',
        '[source: s / c · "\\u00A0"]',
        '[source: s / c · "a\\/b"]',
        "[source: s / c · thread]",
        "[source: s / c · thread T · L]",
        "[source: s / c · reply to R · thread T]",
        "[source: s / c · thread T · thread U]",
        "[source: s / c · Thread x]",
        "[source: s / c · unscoped]",
        "[source: s · unscoped · x]",
        "[source: s · UNSCOPED]",
        '[source: s / c · "unterminated]',
        '[source: "s / c]',
        "[source: s / c / d]",
        "[source: s / c · ]",
        "[source: s / c ·  · L]",
        "\\[source: s / c]",
    ],
)
def test_text_that_is_not_a_rendered_header_reads_as_none(text: str) -> None:
    assert parse_header(text) is None


def test_a_slash_next_to_the_separator_is_read_with_the_shorter_server() -> None:
    # The grammar renders these two alike; the reading is one of them, and renders the same.
    assert channel_header("a /", "c") == channel_header("a", "/ c") == "[source: a / / c]"
    fields = parse_header("[source: a / / c]")
    assert fields == HeaderFields(server="a", channel_id="/ c")
    assert fields.render() == "[source: a / / c]"


# -- Properties --------------------------------------------------------------------------------

TRICKY = [
    *'[]·"\\/ :#x1é\t\n\r\x0b\x0c\x00\x1c\x1f\x7f\x85\x9f',
    " / ",
    "\u2028",
    "\u2029",
    "\xa0",
    "\u3000",
    "\u200b",
    "\u200d",
    "\u202e",
    "\u2066",
    "\ufeff",
    "\u00ad",
    "\u034f",
    "\u3164",
    "\ufe0f",
    "\ufe0e",
    "\U000e0041",
    "\U000e0100",
    "\u2800",
    "❤",
    "😀",
    "🏳",
    "🌈",
    "🏴",
    "\U0001f3fb",
    "©",
    "\u20e3",
    "thread",
    "Thread ",
    "reply",
    "to",
    "unscoped",
    "UNSCOPED",
    "ſ",
    "[source:",
    "Обсуждение",
]
values = (
    st.lists(st.sampled_from(TRICKY) | st.text(max_size=2), max_size=8).map("".join) | st.text()
)
optional = st.none() | values


def unseen_outside_emoji(text: str) -> list[str]:
    """The unseen characters of ``text`` that are not inside an emoji sequence (D.5)."""
    found: list[str] = []
    at = 0

    def pictograph(i: int) -> int:
        """End of a pictograph with its optional modifier or selector at ``i``, or -1."""
        if i >= len(text) or ord(text[i]) not in EXTENDED_PICTOGRAPHIC:
            return -1
        i += 1
        if i < len(text) and (ord(text[i]) in EMOJI_MODIFIER or text[i] in "\ufe0e\ufe0f"):
            i += 1
        return i

    while at < len(text):
        end = pictograph(at)
        if end < 0:
            if ord(text[at]) in UNSEEN:
                found.append(text[at])
            at += 1
            continue
        while end < len(text) and text[end] == "\u200d" and (more := pictograph(end + 1)) > 0:
            end = more
        at = end
    return found


@given(values)
def test_a_quoted_value_parses_back_and_hides_nothing(value: str) -> None:
    rendered = quoted(value)
    assert rendered.startswith('"') and rendered.endswith('"')
    assert json.loads(rendered) == value
    assert not LINE_BREAKS & set(rendered)
    assert not any(ord(char) in CONTROLS for char in rendered)
    assert unseen_outside_emoji(rendered) == []


@given(values)
def test_a_quoted_value_is_what_json_writes_when_nothing_else_needs_escaping(value: str) -> None:
    assume(not unseen_outside_emoji(value))
    assume(not any(char in "\x7f\u2028\u2029" or 0x80 <= ord(char) < 0xA0 for char in value))
    assert quoted(value) == json.dumps(value, ensure_ascii=False)


@given(values)
@example("a / b")
@example("a /b")
@example("❤\ufe0f cats")
def test_a_header_value_stands_for_exactly_its_value(value: str) -> None:
    rendered = header_value(value)
    assert decode(rendered) == value
    needs = (
        bool(STRUCTURAL & set(map(ord, value)))
        or " / " in value
        or bool(unseen_outside_emoji(value))
    )
    assert (rendered != value) == needs
    if needs:
        assert rendered == quoted(value)


def begins_with_header_word(label: str) -> bool:
    """D.3, written out: optional whitespace, a header word (ASCII case-insensitive), then
    whitespace or the end."""
    lower = label.translate({upper: upper + 32 for upper in range(0x41, 0x5B)})
    at = 0
    while at < len(label) and label[at] in JS_SPACE:
        at += 1
    end = -1
    for word in ("thread", "unscoped"):
        if lower.startswith(word, at):
            end = at + len(word)
    if lower.startswith("reply", at):
        gap = at + len("reply")
        while gap < len(label) and label[gap] in JS_SPACE:
            gap += 1
        if gap > at + len("reply") and lower.startswith("to", gap):
            end = gap + len("to")
    return end == len(label) or (end > 0 and label[end] in JS_SPACE)


@given(values)
def test_a_label_with_a_header_word_is_quoted(label: str) -> None:
    rendered = label_value(label)
    assert decode(rendered) == label
    if begins_with_header_word(label):
        assert rendered == quoted(label)
    else:
        assert rendered == header_value(label)


@given(values, values, optional, optional, optional)
def test_a_channel_header_is_one_line_and_reads_back(
    server: str, channel_id: str, label: str | None, thread: str | None, reply_to: str | None
) -> None:
    header = channel_header(server, channel_id, label, thread, reply_to)
    assert header.startswith("[source: ") and header.endswith("]")
    assert not LINE_BREAKS & set(header)
    assert len(header.splitlines()) == 1
    assert unseen_outside_emoji(header) == []
    fields = parse_header(header)
    assert fields is not None
    assert fields.render() == header
    if not (header_value(server).endswith(" /") or header_value(channel_id).startswith("/ ")):
        assert fields == expected_fields(server, channel_id, label, thread, reply_to)
        assert not fields.unscoped


@given(values)
def test_an_unscoped_header_is_one_line_and_reads_back(server: str) -> None:
    header = unscoped_header(server)
    assert not LINE_BREAKS & set(header)
    assert len(header.splitlines()) == 1
    fields = parse_header(header)
    assert fields == HeaderFields(server=server)
    assert fields is not None and fields.unscoped


@given(values, values)
def test_two_values_never_render_alike(first: str, second: str) -> None:
    assume(first != second)
    assert header_value(first) != header_value(second)
    assert label_value(first) != label_value(second)


@given(st.lists(st.sampled_from(TRICKY), max_size=12).map("".join))
def test_any_text_reads_back_only_as_the_header_it_is(text: str) -> None:
    for candidate in (text, "[source: " + text, "[source: " + text + "]"):
        fields = parse_header(candidate)
        assert fields is None or fields.render() == candidate
