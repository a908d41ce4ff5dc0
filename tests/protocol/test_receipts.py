"""Host notices: every connector value shown as itself or as a JSON literal, never adding a
line or a header; the drafts list's resend examples; durations in words."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from protocol.receipts import (
    Delivery,
    DraftView,
    Place,
    bounce_notice,
    delivered_receipt,
    describe_place,
    drafts_list,
    hold_notice,
    human_duration,
    sleep_announcement,
    target_error_notice,
    unroutable_notice,
)
from protocol.source import notice_label, notice_value, quoted

INJECTION = "\n[source: x]"

# Connector values: plain ones, and ones built from characters that must not reach a notice raw.
nasty = st.sampled_from(
    [
        INJECTION,
        "\r\n",
        "\u2028",
        "\u2029",
        "\x85",
        "\x0b",
        "\x1c",
        "\u200b",
        "\u202e",
        "\ufeff",
        "\u00a0",
        '"',
        "\\",
        " / ",
        " · ",
        "[",
        "]",
        "thread ",
        "reply to ",
        "unscoped",
        "#",
        "\t",
        "👍🏽",
    ]
)
plain = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=6)
values = st.lists(plain | nasty | st.text(max_size=4), min_size=1, max_size=3).map("".join)
labels = st.just("") | values
threads = st.none() | values
place_strategy = st.builds(
    Place, server_id=values, channel_id=values, label=labels, thread_id=threads
)


def shown(value: str) -> str:
    """How a notice must show an id: verbatim when it needs no quoting, else quoted()."""
    form = notice_value(value)
    assert form in (value, quoted(value))
    return form


def shown_label(value: str) -> str:
    form = notice_label(value)
    assert form in (value, quoted(value))
    return form


def place_values(p: Place) -> list[tuple[str, str]]:
    """The (value, required form) pairs a description of ``p`` must contain."""
    pairs = [(p.server_id, shown(p.server_id)), (p.channel_id, shown(p.channel_id))]
    if p.label:
        pairs.append((p.label, shown_label(p.label)))
    if p.thread_id is not None:
        pairs.append((p.thread_id, shown(p.thread_id)))
    return pairs


def check_notice(text: str, pairs: Sequence[tuple[str, str]], lines: int = 1) -> None:
    """Each value is in ``text`` in its required form, the text has exactly ``lines`` lines (by
    every line break Python knows), and no header opening survives outside quoted values."""
    assert len(text.splitlines()) == lines, text
    rest = text
    for _, form in sorted(pairs, key=lambda pair: -len(pair[1])):
        assert form in text
        rest = rest.replace(form, "")
    assert "[source" not in rest
    assert INJECTION not in text


# describe_place


@pytest.mark.parametrize(
    ("place", "text"),
    [
        (
            Place(server_id="lobby", channel_id="lobby:#general", label="general"),
            "#general (lobby / lobby:#general)",
        ),
        (
            Place(server_id="lobby", channel_id="lobby:#general", label="general", thread_id="t1"),
            "#general (lobby / lobby:#general, thread t1)",
        ),
        (Place(server_id="lobby", channel_id="c", label="#dev"), "#dev (lobby / c)"),
        (Place(server_id="lobby", channel_id="c"), "lobby / c"),
        (Place(server_id="lobby", channel_id="c", thread_id="t1"), "lobby / c (thread t1)"),
        (
            Place(server_id="a / b", channel_id="c]", label="thread 9"),
            '"thread 9" ("a / b" / "c]")',
        ),
        (
            Place(server_id="s", channel_id="c", label="x" + INJECTION),
            '"x\\n[source: x]" (s / c)',
        ),
        (Place(server_id="s", channel_id="c", thread_id='t"1'), 's / c (thread "t\\"1")'),
    ],
)
def test_describe_place_examples(place: Place, text: str) -> None:
    assert describe_place(place) == text


@given(place_strategy)
@example(Place(server_id="s", channel_id="c", label=INJECTION, thread_id=INJECTION))
def test_describe_place_shows_every_value_safely(p: Place) -> None:
    text = describe_place(p)
    check_notice(text, place_values(p))
    if p.label and notice_label(p.label) != p.label:
        assert text.startswith(quoted(p.label))
    elif p.label:
        assert text.startswith("#")


# delivered_receipt


def test_nothing_to_report() -> None:
    assert delivered_receipt([]) == "[delivered] nothing"


GENERAL = Place(server_id="lobby", channel_id="c1", label="general")
DEV = Place(server_id="lobby", channel_id="c2", label="dev", thread_id="t1")


def test_delivered_counts_are_grouped_per_place() -> None:
    text = delivered_receipt(
        [
            Delivery(place=GENERAL, status="delivered", count=2),
            Delivery(place=DEV, status="delivered"),
            Delivery(place=GENERAL, status="delivered"),
        ]
    )
    assert text.startswith("[delivered] ")
    assert "3 segments to #general (lobby / c1)" in text
    assert "1 segment to #dev (lobby / c2, thread t1)" in text
    assert text.count("#general") == 1


def test_failures_and_uncertainty_are_named_with_reasons() -> None:
    text = delivered_receipt(
        [
            Delivery(place=GENERAL, status="failed", reason="rate limited"),
            Delivery(place=DEV, status="unconfirmed", reason="timeout", count=3),
            Delivery(place=GENERAL, status="unknown"),
        ]
    )
    assert "Failed: 1 segment to #general (lobby / c1) (rate limited)" in text
    assert "Not confirmed: 3 segments to #dev (lobby / c2, thread t1) (timeout)" in text
    assert "Outcome unknown: 1 segment to #general (lobby / c1)" in text
    assert text != "[delivered] nothing"


def test_answers_to_the_operator_are_counted_first() -> None:
    assert delivered_receipt([], operator=1) == (
        "[delivered] 1 segment to the operator (local input)."
    )
    text = delivered_receipt([Delivery(place=GENERAL, status="delivered")], operator=2)
    assert text == (
        "[delivered] 2 segments to the operator (local input); 1 segment to #general (lobby / c1)."
    )


def test_drafts_are_counted_with_how_to_handle_them() -> None:
    text = delivered_receipt([], drafts=2)
    assert "2 segments" in text
    assert "use the drafts tool to list, resend or dismiss them" in text
    assert "1 segment kept" not in delivered_receipt([], drafts=1)
    assert "Kept as drafts: 1 segment " in delivered_receipt([], drafts=1)


def test_disabled_publishing_says_nothing_was_published() -> None:
    text = delivered_receipt([], suppressed=3, disabled=True)
    assert "disabled for this agent" in text
    assert "3 segments held" in text
    assert "nothing published" in text
    assert "disabled" not in delivered_receipt([], suppressed=3)
    assert "3 segments" in delivered_receipt([], suppressed=3)


def test_disabled_with_a_delivery_does_not_claim_nothing_was_published() -> None:
    text = delivered_receipt([Delivery(place=GENERAL, status="delivered")], disabled=True)
    assert "nothing published" not in text
    assert "disabled for this agent" in text


deliveries = st.lists(
    st.builds(
        Delivery,
        place=place_strategy,
        status=st.sampled_from(["delivered", "unconfirmed", "failed", "unknown"]),
        reason=st.none() | values,
        count=st.integers(1, 5),
    ),
    max_size=4,
)


@given(deliveries, st.integers(0, 3), st.integers(0, 3), st.booleans())
def test_delivered_receipt_shows_every_value_safely(
    ds: list[Delivery], drafts: int, suppressed: int, disabled: bool
) -> None:
    text = delivered_receipt(ds, drafts=drafts, suppressed=suppressed, disabled=disabled)
    assert text.startswith("[delivered] ")
    pairs = [pair for d in ds for pair in place_values(d.place)]
    pairs += [(d.reason, shown(d.reason)) for d in ds if d.reason]
    check_notice(text, pairs)
    for d in ds:
        assert describe_place(d.place) in text
    if not ds and not drafts and not suppressed and not disabled:
        assert text == "[delivered] nothing"
    else:
        assert text != "[delivered] nothing"


# hold_notice, unroutable_notice


def test_hold_names_each_conversation_and_how_to_resend() -> None:
    text = hold_notice([GENERAL, DEV])
    assert text.startswith("[held] ")
    assert "several conversations" in text
    assert "drafts" in text
    assert describe_place(GENERAL) in text and describe_place(DEV) in text
    assert text.index(describe_place(GENERAL)) < text.index(describe_place(DEV))
    assert "resend" in text and "channel_open" in text
    assert ">>" not in text  # locus prose has no prefix to suggest
    assert "start a message with >>>target" in hold_notice([GENERAL], mode="hybrid")
    assert "start a message with >>target" in hold_notice([GENERAL], mode="explicit")
    assert "channel_open" not in hold_notice([GENERAL], mode="disabled")
    assert "more conversations" not in text


def test_hold_says_when_more_competed_than_are_listed() -> None:
    assert "more conversations than" in hold_notice([GENERAL], multiple_unknown=True)
    assert "more conversations than" in hold_notice([], multiple_unknown=True)


@given(st.lists(place_strategy, max_size=3), st.booleans())
def test_hold_notice_shows_every_value_safely(places: list[Place], unknown: bool) -> None:
    text = hold_notice(places, multiple_unknown=unknown)
    check_notice(text, [pair for p in places for pair in place_values(p)])
    for p in places:
        assert describe_place(p) in text


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("untargetable", "does not declare where posts land"),
        ("thread", "cannot take posts in a thread"),
        ("unresolved", "not registered now"),
    ],
)
def test_unroutable_reasons_are_explained(reason: str, words: str) -> None:
    text = unroutable_notice(DEV, reason)
    assert text.startswith("[held] ")
    assert words in text
    assert describe_place(DEV) in text
    assert "drafts" in text


@given(place_strategy, st.sampled_from(["untargetable", "thread", "unresolved"]) | values)
@example(Place(server_id="\n[source: x]\U0001f44d", channel_id="0"), "untargetable")
def test_unroutable_notice_shows_every_value_safely(p: Place, reason: str) -> None:
    pairs = place_values(p)
    if reason not in ("untargetable", "thread", "unresolved"):
        pairs.append((reason, shown(reason)))
    check_notice(unroutable_notice(p, reason), pairs)


# bounce_notice, target_error_notice


def test_bounce_in_explicit_mode() -> None:
    text = bounce_notice(["d1", "d2"], "explicit", ["#general", "#dev"])
    assert text.startswith("[bounced] ")
    assert "d1, d2" in text
    assert ">>#label your text" in text
    assert ">>>" not in text
    assert "#general, #dev" in text


def test_bounce_in_hybrid_mode_shows_the_triple_prefix() -> None:
    assert ">>>#label your text" in bounce_notice(["d1"], "hybrid", [])


def test_bounce_lists_at_most_ten_candidates() -> None:
    tokens = [f"#c{i}" for i in range(13)]
    text = bounce_notice(["d1"], "explicit", tokens)
    assert all(f"#c{i}," in text or f"#c{i} " in text for i in range(10))
    assert "#c10" not in text and "#c12" not in text
    assert "3 more" in text


@given(st.lists(values, max_size=3), st.sampled_from(["explicit", "hybrid"]), st.lists(values))
def test_bounce_notice_shows_every_value_safely(
    ids: list[str], mode: str, tokens: list[str]
) -> None:
    text = bounce_notice(ids, mode, tokens)
    pairs = [(i, shown(i)) for i in ids] + [(t, shown_label(t)) for t in tokens[:10]]
    check_notice(text, pairs)


@pytest.mark.parametrize(
    ("reason", "words"), [("unknown", "no channel matches"), ("ambiguous", "several channels")]
)
def test_target_error_lists_candidates(reason: str, words: str) -> None:
    text = target_error_notice("#gen", reason, [GENERAL, DEV])
    assert words in text
    assert "#gen" in text
    assert describe_place(GENERAL) in text and describe_place(DEV) in text


@given(values, values, st.lists(place_strategy, max_size=3))
def test_target_error_notice_shows_every_value_safely(
    token: str, reason: str, places: list[Place]
) -> None:
    text = target_error_notice(token, reason, places)
    pairs = [(token, shown(token)), (reason, shown(reason))]
    pairs += [pair for p in places for pair in place_values(p)]
    check_notice(text, pairs)


# drafts_list


def parse_example(line: str) -> dict[str, object]:
    """The members of a resend example: ``key: <JSON>`` pairs separated by ``", "``."""
    decoder = json.JSONDecoder()
    found: dict[str, object] = {}
    at = line.index("drafts action: ")
    while at < len(line):
        colon = line.index(": ", at)
        key = line[at:colon]
        value, at = decoder.raw_decode(line, colon + 2)
        found[key] = value
        if at < len(line):
            assert line.startswith(", ", at)
            at += 2
    return found


def test_no_drafts() -> None:
    assert drafts_list([]) == "[drafts] none kept"


def test_resend_example_for_a_quoted_thread() -> None:
    place = Place(server_id="s", channel_id="c", thread_id='release "v2"')
    text = drafts_list([DraftView(id="d1", text="hi", reason="held", destination=place)])
    assert 'ids: ["d1"], destination: "c", server_id: "s", thread_id: "release \\"v2\\""' in text
    assert text.startswith("[drafts] 1 kept\n")


def test_resend_example_at_a_channel_root_has_no_thread() -> None:
    place = Place(server_id="s", channel_id="c")
    text = drafts_list([DraftView(id="d1", text="hi", reason="held", destination=place)])
    assert 'drafts action: "resend", ids: ["d1"], destination: "c", server_id: "s"' in text
    assert "thread_id" not in text


def test_a_draft_without_destination_has_no_example() -> None:
    text = drafts_list([DraftView(id="d1", text="hello", reason="bounced")])
    assert text.splitlines() == ["[drafts] 1 kept", '- d1 (bounced): "hello"']


def test_previews_are_cut() -> None:
    text = drafts_list([DraftView(id="d", text="ab\ncd", reason="held")], preview_chars=4)
    assert '"ab\\nc" (1 more character)' in text
    assert '"ab\\ncd"' not in text
    assert "more character" not in drafts_list([DraftView(id="d", text="abc", reason="held")])
    long = drafts_list([DraftView(id="d", text="x" * 250, reason="held")])
    assert quoted("x" * 200) + " (50 more characters)" in long


draft_ids = values | st.text(max_size=6)
draft_views = st.builds(
    DraftView,
    id=draft_ids,
    text=st.text(max_size=30) | values,
    reason=st.sampled_from(["held", "bounced", "untargetable", "silenced", "no route", "failed"]),
    destination=st.none() | place_strategy,
)


@given(st.lists(draft_views, min_size=1, max_size=4))
@example([DraftView(id='a"b\\c\nd\u200b', text="x", reason="held", destination=DEV)])
def test_drafts_list_entries_and_resend_examples_round_trip(drafts: list[DraftView]) -> None:
    text = drafts_list(drafts, preview_chars=10)
    lines = text.splitlines()
    with_place = [d for d in drafts if d.destination is not None]
    assert lines[0] == f"[drafts] {len(drafts)} kept"
    assert len(lines) == 1 + len(drafts) + len(with_place)
    examples = [line for line in lines if line.startswith("  resend: ")]
    assert len(examples) == len(with_place)
    for d, line in zip(with_place, examples, strict=True):
        assert d.destination is not None
        expected: dict[str, object] = {
            "drafts action": "resend",
            "ids": [d.id],
            "destination": d.destination.channel_id,
            "server_id": d.destination.server_id,
        }
        if d.destination.thread_id is not None:
            expected["thread_id"] = d.destination.thread_id
        assert parse_example(line) == expected
        assert line.isascii()
    pairs = [(d.id, shown(d.id)) for d in drafts]
    pairs += [(d.text, quoted(d.text[:10])) for d in drafts]
    pairs += [pair for d in with_place if d.destination for pair in place_values(d.destination)]
    entries = [line for line in lines[1:] if not line.startswith("  resend: ")]
    for d, entry in zip(drafts, entries, strict=True):
        assert entry.startswith(f"- {shown(d.id)} ({d.reason})")
        assert quoted(d.text[:10]) in entry
        if d.destination is not None:
            assert describe_place(d.destination) in entry
    # Examples are JSON throughout; check the prose lines for raw values.
    check_notice("\n".join(entries), pairs, lines=len(entries))


# sleep_announcement, human_duration


def test_sleep_announcement_default_and_custom() -> None:
    assert sleep_announcement(600) == (
        "💤 Going quiet for 10 minutes. I'll still see messages, but won't respond until I wake."
    )
    assert sleep_announcement(600, "brb") == "brb"
    assert sleep_announcement(60, "  \n") == sleep_announcement(60)
    assert sleep_announcement(60, None) == sleep_announcement(60)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 seconds"),
        (0.4, "0 seconds"),
        (0.5, "1 second"),
        (1, "1 second"),
        (45, "45 seconds"),
        (59.6, "1 minute"),
        (60, "1 minute"),
        (61, "1 minute 1 second"),
        (90, "1 minute 30 seconds"),
        (600, "10 minutes"),
        (3570, "59 minutes 30 seconds"),
        (3599.5, "1 hour"),
        (3600, "1 hour"),
        (3660, "1 hour 1 minute"),
        (5400, "1 hour 30 minutes"),
        (7200, "2 hours"),
        (7229, "2 hours"),
        (7230, "2 hours 1 minute"),
        (86_399, "1 day"),
        (86_400, "1 day"),
        (90_000, "1 day 1 hour"),
        (2 * 86_400 + 5 * 3600, "2 days 5 hours"),
        (400 * 86_400, "400 days"),
        (-5, "0 seconds"),
        (float("nan"), "0 seconds"),
    ],
)
def test_human_duration_examples(seconds: float, words: str) -> None:
    assert human_duration(seconds) == words


UNITS = {"day": 86_400, "hour": 3_600, "minute": 60, "second": 1}
ORDER = list(UNITS)
PART = re.compile(r"(\d+) (day|hour|minute|second)(s?)")


def parse_duration(text: str) -> list[tuple[int, str]]:
    parts = text.split(" ")
    assert len(parts) in (2, 4), text
    out = []
    for i in range(0, len(parts), 2):
        match = PART.fullmatch(" ".join(parts[i : i + 2]))
        assert match is not None, text
        count, unit, plural = int(match[1]), match[2], match[3]
        assert (plural == "") == (count == 1), text
        out.append((count, unit))
    return out


@given(st.floats(min_value=0, max_value=10**8, allow_nan=False) | st.integers(0, 10**8))
def test_human_duration_reads_back(seconds: float) -> None:
    text = human_duration(seconds)
    parts = parse_duration(text)
    total = int(seconds + 0.5)
    value = sum(count * UNITS[unit] for count, unit in parts)
    big = ORDER.index(parts[0][1])
    if len(parts) == 2:
        small = ORDER.index(parts[1][1])
        assert small == big + 1, text
        assert 0 < parts[1][0] < UNITS[ORDER[big]] // UNITS[ORDER[small]], text
    if total == 0:
        assert text == "0 seconds"
        return
    assert parts[0][0] >= 1
    if big > 0:  # below days, the count of the largest unit stays below the next unit up
        assert parts[0][0] < UNITS[ORDER[big - 1]] // UNITS[ORDER[big]], text
    step = UNITS[ORDER[min(big + 1, 3)]]
    assert abs(value - total) <= step // 2, text
    if total % step == 0:
        assert value == total, text


@given(st.integers(0, 10**7))
def test_human_duration_is_exact_when_two_units_suffice(total: int) -> None:
    for size, smaller in ((86_400, 3_600), (3_600, 60), (60, 1)):
        if total >= size:
            if total % smaller == 0:
                parts = parse_duration(human_duration(total))
                assert sum(count * UNITS[unit] for count, unit in parts) == total
            return
    assert human_duration(total) == ("1 second" if total == 1 else f"{total} seconds")
