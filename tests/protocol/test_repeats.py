"""Shapes of lines and the decision to collapse repeats (time is a parameter)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.repeats import (
    OTHER_SHAPES,
    OTHER_SOURCES,
    SHAPE_CHARS,
    RepeatCollapser,
    Summary,
    mask,
)

# -- shapes -----------------------------------------------------------------------------------

plain_words = st.text(
    alphabet=st.characters(blacklist_categories=["Cs", "Nd"], blacklist_characters="'\"`"),
    max_size=30,
)


@given(plain_words, st.lists(st.integers(), min_size=1, max_size=4), st.data())
def test_lines_differing_in_numbers_have_one_shape(
    prefix: str, numbers: list[int], data: st.DataObject
) -> None:
    others = data.draw(st.lists(st.integers(), min_size=len(numbers), max_size=len(numbers)))
    first = prefix + " " + " ".join(f"x{n}" for n in numbers)
    second = prefix + " " + " ".join(f"x{n}" for n in others)
    assert mask(first) == mask(second)


@given(plain_words, st.text(max_size=20), st.text(max_size=20), st.sampled_from("'\"`"))
def test_lines_differing_in_a_quoted_value_have_one_shape(
    prefix: str, one: str, two: str, quote: str
) -> None:
    one = one.replace(quote, "").replace("\n", "")
    two = two.replace(quote, "").replace("\n", "")
    assert mask(f"{prefix} {quote}{one}{quote}") == mask(f"{prefix} {quote}{two}{quote}")


@given(plain_words)
def test_a_line_without_digits_or_quotes_is_its_own_shape(text: str) -> None:
    assert mask(text) == text[:SHAPE_CHARS]


@given(st.text(max_size=SHAPE_CHARS * 6))
def test_masking_is_bounded_and_idempotent(text: str) -> None:
    shape = mask(text)
    assert len(shape) <= SHAPE_CHARS
    assert mask(shape) == shape


def test_a_diagnostic_keeps_its_words_and_loses_its_values() -> None:
    line = "? flood: not JSON, skipped: 'garbage 1234 \"x\"' (line 17 of 20,000)"
    assert mask(line) == "? flood: not JSON, skipped: '#' (line # of #"
    assert mask("-32602 invalid params") == "# invalid params"


# -- the collapse decision --------------------------------------------------------------------

events = st.lists(
    st.tuples(
        st.sampled_from(["flood", "lobby", "ada"]),
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.floats(0, 7, allow_nan=False),  # time since the previous event
        st.booleans(),  # the timer fires before this event
    ),
    max_size=150,
)


@settings(max_examples=300)
@given(events, st.integers(1, 4), st.integers(1, 3), st.integers(1, 3))
def test_every_occurrence_is_shown_or_counted_once_and_bursts_are_bounded(
    script: list[tuple[str, str, float, bool]], burst: int, max_sources: int, shapes: int
) -> None:
    c = RepeatCollapser(window_s=10, burst=burst, max_sources=max_sources, shapes_per_source=shapes)
    now = 0.0
    observed = Counter[str]()
    shown = Counter[str]()
    counted = Counter[object]()
    shown_times: dict[tuple[str, str], list[float]] = defaultdict(list)
    summaries: list[Summary] = []
    for source, shape, dt, tick in script:
        now += dt
        if tick:
            summaries += c.flush(now)
            assert c.next_due() is None or c.next_due() > now
        verdict = c.observe(source, shape, now, sample=f"{source}:{shape}")
        summaries += verdict.due
        observed[source] += 1
        if verdict.show:
            shown[source] += 1
            shown_times[source, shape].append(now)
        assert len(c) <= (max_sources + 1) * (shapes + 1)
        assert c.sources() <= max_sources + 1
    summaries += c.close(now)
    assert len(c) == 0
    for s in summaries:
        assert s.count > 0 and s.seconds >= 0
        counted[s.source] += s.count
    # a source past the cap is counted in the shared slot
    total_counted = sum(counted.values())
    assert sum(shown.values()) + total_counted == sum(observed.values())
    for source in observed:
        if OTHER_SOURCES not in counted:
            assert shown[source] + counted[source] == observed[source]
    # within any 10 s, one shape of one source shows at most two windows' bursts
    for times in shown_times.values():
        for i, t in enumerate(times):
            assert len([u for u in times[i:] if u < t + 10]) <= 2 * burst


def test_a_flood_shows_a_burst_then_one_summary_when_the_window_ends() -> None:
    c = RepeatCollapser(window_s=10, burst=3)
    shown = [c.observe("flood", "junk", i * 0.0004, sample=f"junk {i}").show for i in range(22_002)]
    assert shown[:3] == [True, True, True] and not any(shown[3:])
    assert c.next_due() == 10.0
    assert c.flush(9.99) == []
    (summary,) = c.flush(10.0)
    assert summary == Summary(
        source="flood",
        count=21_999,
        seconds=10.0,
        sample="junk 0",
        level=0,
        other_shapes=False,
    )
    assert len(c) == 0 and c.next_due() is None
    assert c.observe("flood", "junk", 11, sample="junk again").show  # a new window


def test_the_next_occurrence_brings_an_ended_windows_summary_before_it() -> None:
    c = RepeatCollapser(window_s=10, burst=1)
    c.observe("flood", "junk", 0, sample="first")
    c.observe("flood", "junk", 1, sample="second", level=30)
    verdict = c.observe("flood", "junk", 12, sample="third")
    assert verdict.show
    assert [(s.count, s.seconds, s.level) for s in verdict.due] == [(1, 12, 30)]


def test_a_quiet_window_ends_silently() -> None:
    c = RepeatCollapser(window_s=10, burst=3)
    c.observe("lobby", "x", 0, sample="x")
    c.observe("lobby", "x", 1, sample="x")
    assert c.flush(10) == [] and len(c) == 0


def test_shapes_past_the_cap_share_their_sources_overflow_entry() -> None:
    c = RepeatCollapser(window_s=10, burst=1, shapes_per_source=2)
    assert c.observe("flood", "s1", 0, sample="s1").show
    assert c.observe("flood", "s2", 0, sample="s2").show
    assert c.observe("flood", "s3", 0, sample="s3").show  # the overflow's first line
    assert not c.observe("flood", "s4", 0, sample="s4").show  # the overflow's burst is spent
    assert not c.observe("flood", "s5", 0, sample="s5").show
    assert c.observe("lobby", "s1", 0, sample="lobby s1").show  # another source is unaffected
    assert len(c) == 4
    (summary,) = c.flush(10)
    assert (summary.source, summary.count, summary.other_shapes) == ("flood", 2, True)


def test_sources_past_the_cap_share_one_entry() -> None:
    c = RepeatCollapser(window_s=10, burst=1, max_sources=2)
    c.observe("a", "x", 0, sample="a")
    c.observe("b", "x", 0, sample="b")
    assert c.observe("c", "x", 0, sample="c").show
    assert not c.observe("d", "x", 0, sample="d").show  # same shape, shared source
    assert c.sources() == 3
    (summary,) = c.flush(10)
    assert summary.source is OTHER_SOURCES and summary.count == 1
    assert c.sources() == 0


def test_close_reports_every_open_count() -> None:
    c = RepeatCollapser(window_s=10, burst=1, shapes_per_source=1)
    for i in range(3):
        c.observe("flood", "a", 0, sample="a")
        c.observe("flood", f"other {i}", 0, sample="o")
    got = sorted((s.other_shapes, s.count, s.seconds) for s in c.close(4))
    assert got == [(False, 2, 4), (True, 2, 4)]
    assert OTHER_SHAPES is not OTHER_SOURCES


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError):
        RepeatCollapser(window_s=0)
    with pytest.raises(ValueError):
        RepeatCollapser(burst=0)
