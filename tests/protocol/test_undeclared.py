"""Channels that declare no publish target (RFC-011) and the server key ``publish_undeclared``:
where prose may go (place × flag × thread), what a publish there carries and what its outcome
says, and the lines that explain it to the operator and the agent."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.receipts import (
    Delivery,
    Place,
    delivered_receipt,
    undeclared_channel_line,
    unroutable_notice,
)
from protocol.routes import (
    ABSENT,
    LEGACY,
    PLACES,
    Candidate,
    PublishOutcome,
    Route,
    Unroutable,
    decide_route,
    declared_target,
    legacy_outcome,
    place_problem,
    publish_thread_param,
    speech_place,
)

declared = st.sampled_from(["exact", "root", None, "weird", "", 3])
threads = st.none() | st.sampled_from(["t1", "t2"])
statuses = st.sampled_from(["delivered", "unconfirmed", "failed", "unknown"])
texts = st.text(max_size=20)


def capabilities(target: Any) -> Any:
    return {"publish": {"target": target}}


@given(declared)
def test_declared_target_is_a_known_place_or_none(target: Any) -> None:
    got = declared_target(capabilities(target))
    assert got == (target if target in PLACES else None)
    assert declared_target(None) is None and declared_target({"publish": True}) is None


@given(declared, st.booleans(), threads)
def test_prose_goes_where_the_place_and_the_flag_allow(
    target: Any, flag: bool, thread: str | None
) -> None:
    place = speech_place(declared_target(capabilities(target)), flag)
    may = place_problem(place, thread) is None
    known = target in PLACES
    # a declared place decides alone; an undeclared one takes prose at its root with the flag
    expected = (
        (target == "exact" or (target == "root" and thread is None))
        if known
        else (flag and thread is None)
    )
    assert may is expected
    # a thread of an undeclared channel is never a place, whatever the flag
    if not known and thread is not None:
        assert not may


@given(declared, st.booleans(), threads)
def test_a_thread_id_is_sent_exactly_to_declared_channels(
    target: Any, flag: bool, thread: str | None
) -> None:
    place = speech_place(declared_target(capabilities(target)), flag)
    sent = publish_thread_param(place, thread)
    if target in PLACES:
        assert sent == thread
    else:
        assert sent is ABSENT


@given(declared, st.booleans(), threads)
def test_a_turn_routes_to_an_undeclared_channel_only_with_the_flag(
    target: Any, flag: bool, thread: str | None
) -> None:
    place = speech_place(declared_target(capabilities(target)), flag)
    decision = decide_route(
        [Candidate(server_id="s", channel_id="c", thread_id=thread, message_id="m", place=place)]
    )
    if place_problem(place, thread) is None:
        assert isinstance(decision, Route)
    else:
        assert isinstance(decision, Unroutable)
        if target not in PLACES and not flag:
            assert decision.reason == "untargetable"


@given(statuses, st.none() | st.just("m1"), st.none() | texts)
def test_a_legacy_publish_is_never_delivered(
    status: str, message_id: str | None, reason: str | None
) -> None:
    outcome = PublishOutcome(status=status, message_id=message_id, reason=reason)
    got = legacy_outcome(outcome)
    assert got.status != "delivered"
    assert got.message_id == message_id  # still known, for echo detection
    if status == "delivered":
        assert got.status == "unconfirmed" and got.reason
    else:
        assert got == outcome


def test_legacy_is_not_a_declared_place() -> None:
    assert LEGACY not in PLACES
    assert speech_place("weird", True) == LEGACY and speech_place("weird", False) is None


@given(texts, texts, texts, st.booleans())
def test_the_operator_line_is_one_line_naming_the_key(
    server: str, channel: str, label: str, flag: bool
) -> None:
    line = undeclared_channel_line(server or "s", channel or "c", label, flag)
    assert "\n" not in line and "\r" not in line
    assert "publish_undeclared on [[servers]]" in line
    assert "unconfirmed" in line
    assert ("held as drafts" in line.rsplit("publish target", 1)[-1]) is (not flag)


def test_the_operator_line_reads_well() -> None:
    held = undeclared_channel_line("discord", "dc:1", "#dev", False)
    assert held == (
        "server discord: channel #dev (dc:1) declares no publish target: agents' plain speech "
        "there is held as drafts (channel_publish still posts); set publish_undeclared on "
        "[[servers]] discord to true to publish it there, unconfirmed"
    )
    sent = undeclared_channel_line("discord", "dc:1", "", True)
    assert sent.startswith("server discord: channel dc:1 declares no publish target: ")
    assert "published without a place and reported unconfirmed" in sent


@given(texts)
def test_the_held_notice_names_both_ways_out(server: str) -> None:
    place = Place(server_id=server or "s", channel_id="c", label="#dev")
    notice = unroutable_notice(place, "untargetable")
    assert "channel_publish" in notice and "publish_undeclared" in notice
    assert "\n" not in notice
    # the other reasons are not about the declaration
    assert "publish_undeclared" not in unroutable_notice(place, "thread")


def test_a_failed_segment_kept_as_a_draft_says_so() -> None:
    place = Place(server_id="s", channel_id="c", label="#dev")
    receipt = delivered_receipt(
        [Delivery(place=place, status="failed", reason="refused", kept=True)], drafts=1
    )
    assert receipt == (
        "[delivered] Failed: 1 segment to #dev (s / c) (refused; kept as a draft). "
        "Kept as drafts: 1 segment (use the drafts tool to list, resend or dismiss them)."
    )


@given(
    texts,
    st.sampled_from(["untargetable", "thread"]),
    st.booleans(),
    st.sampled_from(["locus", "explicit", "hybrid", "disabled"]),
)
def test_a_held_notice_names_the_true_reason_and_only_fixes_that_work(
    server: str, reason: str, addressed: bool, mode: str
) -> None:
    place = Place(server_id=server or "s", channel_id="c", label="#dev")
    notice = unroutable_notice(place, reason, addressed=addressed, mode=mode)
    # prose written with a prefix is not called unaddressed
    assert notice.startswith("[held] Prose addressed to" if addressed else "[held] Unaddressed")
    # the fixes it names work for this place: an explicit post; a prefix only the agent's own
    # mode has, and only to a channel that takes prose
    assert "call channel_publish" in notice
    prefixes = {"explicit": ">>target", "hybrid": ">>>target"}
    if mode in prefixes:
        assert f"{prefixes[mode]} naming a channel that takes prose" in notice
    assert (">>" in notice) is (mode in prefixes)
    assert ("channel_open" in notice) is (mode != "disabled")
    assert "\n" not in notice
