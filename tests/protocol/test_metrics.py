"""``protocol.metrics``: label values quoted so that no name can break a line or a label, and
the exposition's shape."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.metrics import Family, exposition, label_value, number

_UNESCAPE = re.compile(r'\\(["\\n])')


def unquote(quoted: str) -> str:
    assert quoted[0] == quoted[-1] == '"'
    return _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), quoted[1:-1])


@given(st.text())
def test_a_label_value_reads_back_and_stays_on_its_line(value: str) -> None:
    quoted = label_value(value)
    assert "\n" not in quoted
    assert unquote(quoted) == value
    # no unescaped quote inside: the value ends where the format says
    assert re.fullmatch(r'"(?:[^"\\\n]|\\["\\n])*"', quoted)


@given(
    st.lists(
        st.tuples(st.dictionaries(st.sampled_from(["server", "agent"]), st.text()), st.floats()),
        max_size=5,
    )
)
def test_an_exposition_has_a_line_per_sample(
    samples: list[tuple[dict[str, str], float]],
) -> None:
    text = exposition([Family("mcplive_x", "an x\nof two lines", "gauge", samples)])
    lines = text.split("\n")  # the format's only line ending
    assert lines.pop() == ""
    assert lines[:2] == ["# HELP mcplive_x an x\\nof two lines", "# TYPE mcplive_x gauge"]
    assert len(lines) == 2 + len(samples)
    for line, (_, value) in zip(lines[2:], samples, strict=True):
        assert line.startswith("mcplive_x") and line.endswith(" " + number(value))


def test_numbers_as_the_format_writes_them() -> None:
    assert [number(v) for v in (1.0, 0.25, math.inf, -math.inf, math.nan)] == [
        "1",
        "0.25",
        "+Inf",
        "-Inf",
        "NaN",
    ]


@pytest.mark.parametrize("name", ["", "1x", "a-b", "a b"])
def test_a_bad_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not a metric name"):
        exposition([Family(name, "", "gauge", [])])
    with pytest.raises(ValueError, match="not a label name"):
        exposition([Family("ok", "", "gauge", [({name or "__x": "v"}, 1.0)])])
