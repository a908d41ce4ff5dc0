"""Server text made safe for a terminal line and for a JSON line."""

from __future__ import annotations

import json
import math
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from protocol.display import (
    STRING_CLIP,
    clip,
    json_line,
    json_safe,
    one_line,
    printable,
    well_formed,
)

BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


@given(st.text())
def test_a_printable_line_is_one_inert_line(text: str) -> None:
    line = printable(text)
    assert len(line.splitlines()) <= 1
    for char in line:
        assert unicodedata.category(char) not in ("Cc", "Cs", "Zl", "Zp")
        assert char not in BIDI
    line.encode("utf-8")  # never raises
    assert printable(line) == line


@given(st.text(alphabet=st.characters(blacklist_categories=["Cc", "Cs", "Zl", "Zp", "Cf"])))
def test_text_without_controls_is_unchanged(text: str) -> None:
    assert printable(text) == text


def test_controls_become_spaces_or_visible_escapes() -> None:
    assert printable("a\nb\tc\r\n") == "a b c  "
    assert printable("\x1b[2Jcleared") == "\\x1b[2Jcleared"
    assert printable("abc\u202edef") == "abc\\u202edef"
    assert printable("lone \ud800 surrogate") == "lone \ufffd surrogate"
    assert printable("[bold]not markup[/bold]") == "[bold]not markup[/bold]"


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.frozensets(st.integers(), max_size=3)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(json_like)
def test_anything_becomes_one_line_a_strict_reader_accepts(value: object) -> None:
    line = json_line(json_safe({"data": value}))
    assert len(line.splitlines()) == 1
    line.encode("utf-8")  # no lone surrogate left

    def no_constants(name: str) -> object:
        raise AssertionError(f"{name} is not JSON")

    json.loads(line, parse_constant=no_constants)
    ascii_line = json_line(json_safe({"data": value}), ascii_only=True)
    assert ascii_line.isascii() and json.loads(ascii_line) == json.loads(line)


def _nested(depth: int) -> list[object]:
    value: list[object] = [1]
    for _ in range(depth):
        value = [value]
    return value


def test_values_are_converted_as_documented() -> None:
    value = {
        1: math.inf,
        "b": b"\x00\x01",
        "s": {3},
        "t": ("x\ud83d", None),
        "o": object,
        "deep": _nested(30),
    }
    safe = json_safe(value)
    assert safe["1"] == "inf" and safe["b"] == "<2 bytes>" and safe["s"] == [3]
    assert safe["t"] == ["x\ufffd", None]
    assert safe["o"] == "<class 'object'>"
    assert "…" in json_line(safe["deep"])


def test_strings_pass_the_filter_before_they_are_clipped() -> None:
    secret = "s3cr3t-token"
    long = "x" * (STRING_CLIP - 5) + secret
    safe = json_safe({"text": long}, lambda t: t.replace(secret, "«redacted»"))
    assert "s3cr3t" not in safe["text"] and len(safe["text"]) == STRING_CLIP
    assert clip("abc", 2) == "a…"
    assert well_formed("a\udfffb") == "a\ufffdb"


def test_line_separators_inside_strings_are_escaped() -> None:
    line = json_line(json_safe({"text": "a\u2028b\x85c\u2029"}))
    assert line == '{"text":"a\\u2028b\\u0085c\\u2029"}'
    assert json.loads(line)["text"] == "a\u2028b\x85c\u2029"


@given(st.text(), st.integers(min_value=1, max_value=500))
def test_one_line_is_one_line_within_its_limit(text: str, limit: int) -> None:
    flat = one_line(text, limit)
    assert len(flat) <= limit
    assert not any(c in flat for c in "\n\r\t\v\f")
    if len(" ".join(text.split())) <= limit:
        assert flat == " ".join(text.split())


@given(st.text(), st.integers(min_value=1, max_value=500))
def test_clip_keeps_a_prefix_within_its_limit(text: str, limit: int) -> None:
    cut = clip(text, limit)
    assert len(cut) <= limit
    assert cut == text or (cut.endswith("…") and text.startswith(cut[:-1]))
