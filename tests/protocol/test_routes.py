"""Speech routes: the pool, holds, evicted wakes, place checks, suspension, and the RFC-011
publish outcome table."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from protocol.routes import (
    ABSENT,
    Candidate,
    Conversation,
    Hold,
    PublishOutcome,
    Route,
    Unroutable,
    classify_error,
    classify_publish,
    decide_route,
    place_problem,
    publish_thread_param,
    suspends,
)

# Small alphabets, so that candidates share conversations often.
servers = st.sampled_from(["s1", "s2"])
channels = st.sampled_from(["c1", "c2", "c3"])
threads = st.none() | st.sampled_from(["t1", "t2"])
places = st.sampled_from(["exact", "root", None, "weird"])
conversations = st.tuples(servers, channels, threads)


@st.composite
def candidate(draw: st.DrawFn, /, **fixed: Any) -> Candidate:
    values: dict[str, Any] = {
        "server_id": draw(servers),
        "channel_id": draw(channels),
        "thread_id": draw(threads),
        "message_id": draw(st.none() | st.text(max_size=4)),
        "addressed": draw(st.booleans()),
        "conversational": draw(st.booleans()),
        "place": draw(places),
        "registered": draw(st.booleans()),
    }
    values.update(fixed)
    return Candidate(**values)


candidate_lists = st.lists(candidate(), max_size=8)


@st.composite
def one_conversation(draw: st.DrawFn) -> list[Candidate]:
    """Candidates of one conversation, mostly routable, with stray others sometimes."""
    server, channel, thread = draw(conversations)
    same = candidate(
        server_id=server,
        channel_id=channel,
        thread_id=thread,
        conversational=True,
        place=draw(st.sampled_from(["exact", "exact", "root", None])),
        registered=draw(st.booleans() | st.just(True)),
    )
    return draw(st.lists(same | candidate(conversational=False), min_size=1, max_size=6))


mostly_routable = one_conversation() | candidate_lists
evicted_lists = st.lists(conversations, max_size=4)


def pool_of(candidates: list[Candidate]) -> list[Candidate]:
    """The pool as the rule states it, written independently of the module."""
    talk = [c for c in candidates if c.conversational]
    addressed = [c for c in talk if c.addressed]
    return addressed if addressed else talk


def first_appearance(items: list[Conversation]) -> list[Conversation]:
    seen: list[Conversation] = []
    for item in items:
        if item not in seen:
            seen.append(item)
    return seen


def conv(server: str = "s1", channel: str = "c1", thread: str | None = None) -> Conversation:
    return (server, channel, thread)


def wake(
    channel: str = "c1",
    thread: str | None = None,
    message: str | None = "m",
    *,
    addressed: bool = False,
    conversational: bool = True,
    place: str | None = "exact",
    registered: bool = True,
    server: str = "s1",
) -> Candidate:
    return Candidate(
        server_id=server,
        channel_id=channel,
        thread_id=thread,
        message_id=message,
        addressed=addressed,
        conversational=conversational,
        place=place,
        registered=registered,
    )


# place_problem


@pytest.mark.parametrize(
    ("place", "thread", "problem"),
    [
        ("exact", None, None),
        ("exact", "t1", None),
        ("exact", "", None),
        ("root", None, None),
        ("root", "t1", "thread"),
        ("root", "", "thread"),
        (None, None, "untargetable"),
        (None, "t1", "untargetable"),
        ("EXACT", None, "untargetable"),
        ("threads", "t1", "untargetable"),
        ("", None, "untargetable"),
    ],
)
def test_place_problem_table(place: str | None, thread: str | None, problem: str | None) -> None:
    assert place_problem(place, thread) == problem


@pytest.mark.parametrize(
    ("place", "thread", "sent"),
    [
        ("exact", "t1", "t1"),
        ("exact", None, None),
        ("root", None, None),
        ("root", "t1", "t1"),
        (None, "t1", ABSENT),
        (None, None, ABSENT),
        ("other", None, ABSENT),
    ],
)
def test_publish_thread_param(place: str | None, thread: str | None, sent: object) -> None:
    assert publish_thread_param(place, thread) is sent


# decide_route: examples


def test_one_conversation_routes_to_its_newest_message() -> None:
    got = decide_route([wake(message="m1"), wake(message="m2", place="exact")])
    assert got == Route(server_id="s1", channel_id="c1", thread_id=None, reply_to="m2")
    assert got.deliberate is False


def test_a_thread_routes_into_the_thread() -> None:
    got = decide_route([wake(thread="t1", message="m1")])
    assert got == Route(server_id="s1", channel_id="c1", thread_id="t1", reply_to="m1")


def test_nothing_woke_the_turn() -> None:
    assert decide_route([]) is None
    assert decide_route([wake(conversational=False)]) is None


def test_two_conversations_hold_in_order_of_first_appearance() -> None:
    got = decide_route([wake("c2"), wake("c1"), wake("c2", "t1"), wake("c1")])
    assert got == Hold(conversations=(conv(channel="c2"), conv(), conv(channel="c2", thread="t1")))


def test_the_same_channel_id_on_two_servers_is_two_conversations() -> None:
    got = decide_route([wake(server="s1"), wake(server="s2")])
    assert isinstance(got, Hold)


def test_an_addressed_wake_wins_over_unaddressed_chatter() -> None:
    got = decide_route([wake("c2", message="x"), wake(addressed=True, message="a"), wake("c3")])
    assert got == Route(server_id="s1", channel_id="c1", reply_to="a")


def test_a_reaction_never_competes() -> None:
    got = decide_route([wake(message="m"), wake("c2", conversational=False, addressed=True)])
    assert got == Route(server_id="s1", channel_id="c1", reply_to="m")


@pytest.mark.parametrize(
    ("newest", "reason"),
    [
        (wake(registered=False), "unresolved"),
        (wake(registered=False, place=None), "unresolved"),
        (wake(place=None), "untargetable"),
        (wake(place="sideways"), "untargetable"),
        (wake(thread="t1", place="root"), "thread"),
    ],
)
def test_one_conversation_that_cannot_take_prose(newest: Candidate, reason: str) -> None:
    older = attrs.evolve(newest, place="exact", registered=True, message_id="old")
    assert decide_route([older, newest]) == Unroutable(
        reason=reason, conversation=newest.conversation
    )


def test_the_newest_candidate_decides_the_place() -> None:
    assert decide_route([wake(place=None), wake(place="exact", message="n")]) == Route(
        server_id="s1", channel_id="c1", reply_to="n"
    )


def test_root_channel_at_its_root_routes() -> None:
    assert decide_route([wake(place="root")]) == Route(
        server_id="s1", channel_id="c1", reply_to="m"
    )


def test_an_evicted_wake_from_another_conversation_holds() -> None:
    got = decide_route([wake()], evicted=[conv(channel="c9")])
    assert got == Hold(conversations=(conv(), conv(channel="c9")))


def test_an_evicted_wake_from_the_same_conversation_still_routes() -> None:
    got = decide_route([wake(message="m")], evicted=[conv()])
    assert got == Route(server_id="s1", channel_id="c1", reply_to="m")


def test_evicted_wakes_do_not_count_against_an_addressed_pool() -> None:
    got = decide_route(
        [wake(addressed=True, message="a")], evicted=[conv(channel="c9")], evicted_overflow=True
    )
    assert got == Route(server_id="s1", channel_id="c1", reply_to="a")


def test_evicted_overflow_holds_with_unknown_others() -> None:
    got = decide_route([wake()], evicted=[conv(channel="c9")], evicted_overflow=True)
    assert got == Hold(conversations=(conv(), conv(channel="c9")), multiple_unknown=True)
    got = decide_route([wake()], evicted_overflow=True)
    assert got == Hold(conversations=(conv(),), multiple_unknown=True)


def test_overflow_with_nothing_known_is_nothing() -> None:
    assert decide_route([], evicted_overflow=True) is None


def test_a_lone_evicted_conversation_is_held_not_guessed() -> None:
    assert decide_route([], evicted=[conv()]) == Hold(conversations=(conv(),))


# decide_route: properties


@given(candidate_lists, evicted_lists, st.booleans())
def test_none_exactly_when_the_pool_is_empty_and_nothing_evicted(
    candidates: list[Candidate], evicted: list[Conversation], overflow: bool
) -> None:
    got = decide_route(candidates, evicted=evicted, evicted_overflow=overflow)
    assert (got is None) == (not pool_of(candidates) and not evicted)


@given(mostly_routable, evicted_lists, st.booleans())
def test_a_route_names_a_pool_conversation_and_replies_to_its_newest(
    candidates: list[Candidate], evicted: list[Conversation], overflow: bool
) -> None:
    got = decide_route(candidates, evicted=evicted, evicted_overflow=overflow)
    if not isinstance(got, Route):
        return
    pool = pool_of(candidates)
    assert {c.conversation for c in pool} == {got.conversation}
    newest = pool[-1]
    assert got.reply_to == newest.message_id
    assert newest.registered and place_problem(newest.place, newest.thread_id) is None
    assert got.deliberate is False


@given(mostly_routable, evicted_lists, st.booleans())
def test_the_outcome_follows_the_number_of_competing_conversations(
    candidates: list[Candidate], evicted: list[Conversation], overflow: bool
) -> None:
    got = decide_route(candidates, evicted=evicted, evicted_overflow=overflow)
    pool = pool_of(candidates)
    addressed = any(c.addressed for c in pool)
    competing = [c.conversation for c in pool] + ([] if addressed else evicted)
    known = first_appearance(competing)
    unknown = overflow and not addressed
    if not known:
        assert got is None
    elif len(known) > 1 or unknown or not pool:
        assert got == Hold(conversations=tuple(known), multiple_unknown=unknown)
    else:
        assert isinstance(got, Route | Unroutable)
        assert got.conversation == known[0]


@given(
    st.lists(candidate(conversational=True), min_size=1, max_size=6),
    candidate(conversational=True),
    evicted_lists,
)
def test_a_second_conversation_in_the_pool_never_routes(
    same: list[Candidate], other: Candidate, evicted: list[Conversation]
) -> None:
    first = same[0]
    addressed = first.addressed
    same = [
        attrs.evolve(
            c,
            server_id=first.server_id,
            channel_id=first.channel_id,
            thread_id=first.thread_id,
            addressed=addressed,
        )
        for c in same
    ]
    assume(other.conversation != first.conversation)
    other = attrs.evolve(other, addressed=addressed)
    before = decide_route(same, evicted=evicted)
    assert not isinstance(before, Hold) or evicted
    for at in range(len(same) + 1):
        got = decide_route([*same[:at], other, *same[at:]], evicted=evicted)
        assert isinstance(got, Hold)
        assert first.conversation in got.conversations
        assert other.conversation in got.conversations


@given(candidate_lists, candidate_lists, evicted_lists, st.booleans())
def test_addressed_candidates_dominate(
    addressed: list[Candidate],
    others: list[Candidate],
    evicted: list[Conversation],
    overflow: bool,
) -> None:
    addressed = [attrs.evolve(c, addressed=True, conversational=True) for c in addressed]
    assume(addressed)
    others = [attrs.evolve(c, addressed=False) for c in others]
    mixed = [*others, *addressed]
    expected = decide_route(addressed)
    assert decide_route(mixed, evicted=evicted, evicted_overflow=overflow) == expected
    # Interleaving keeps the addressed order, so the newest addressed is still last among them.
    interleaved = [c for pair in zip(addressed, others, strict=False) for c in pair]
    interleaved += addressed[len(others) :] + others[len(addressed) :]
    assert decide_route(interleaved, evicted=evicted) == expected


@given(candidate_lists, st.lists(candidate(conversational=False), max_size=4), st.randoms())
def test_non_conversational_candidates_never_count(
    candidates: list[Candidate], markers: list[Candidate], rnd: Any
) -> None:
    mixed = candidates + markers
    rnd.shuffle(mixed)
    # Shuffling moves the conversational ones too; put them back in their order.
    talk = iter([c for c in candidates if c.conversational])
    mixed = [next(talk) if c.conversational else c for c in mixed]
    assert decide_route(mixed) == decide_route(candidates)


@given(
    conversations,
    places,
    st.booleans(),
    st.lists(st.text(max_size=3), min_size=1, max_size=6, unique=True),
    st.randoms(),
)
def test_permuting_one_conversation_changes_only_reply_to(
    conversation: Conversation, place: str | None, registered: bool, ids: list[str], rnd: Any
) -> None:
    server, channel, thread = conversation
    candidates = [
        Candidate(
            server_id=server,
            channel_id=channel,
            thread_id=thread,
            message_id=i,
            place=place,
            registered=registered,
        )
        for i in ids
    ]
    base = decide_route(candidates)
    shuffled = list(candidates)
    rnd.shuffle(shuffled)
    got = decide_route(shuffled)
    if isinstance(base, Route):
        assert isinstance(got, Route)
        assert got.reply_to == shuffled[-1].message_id
        assert (got.server_id, got.channel_id, got.thread_id) == conversation
        assert got == Route(
            server_id=server, channel_id=channel, thread_id=thread, reply_to=got.reply_to
        )
    else:
        assert isinstance(base, Unroutable)
        assert got == base


# suspends


ROUTE = Route(server_id="s1", channel_id="c1", thread_id="t1", reply_to="m")


@pytest.mark.parametrize(
    ("arrival", "engaged", "expected"),
    [
        (wake("c2", addressed=True), (), True),
        (wake("c2"), (), False),
        (wake("c2"), [("s1", "c2")], True),
        (wake("c2"), [("s2", "c2")], False),
        (wake("c1", "t1", addressed=True), (), False),
        (wake("c1", "t2", addressed=True), (), True),
        (wake("c1", None, addressed=True), (), True),
        (wake("c1", None), [("s1", "c1")], True),
        (wake("c1", "t1"), [("s1", "c1")], False),
        (wake("c2", addressed=True, conversational=False), [("s1", "c2")], False),
        (wake("c1", "t1", server="s2", addressed=True), (), True),
    ],
)
def test_suspends_table(arrival: Candidate, engaged: list[tuple[str, str]], expected: bool) -> None:
    assert suspends(ROUTE, arrival, engaged=engaged) is expected


def test_a_deliberate_route_is_never_suspended() -> None:
    deliberate = Route(server_id="s1", channel_id="c1", deliberate=True)
    assert not suspends(deliberate, wake("c2", addressed=True), engaged=[("s1", "c2")])


@given(candidate(), st.lists(st.tuples(servers, channels), max_size=3))
def test_suspends_only_for_other_conversations(
    arrival: Candidate, engaged: list[tuple[str, str]]
) -> None:
    same = Route(
        server_id=arrival.server_id, channel_id=arrival.channel_id, thread_id=arrival.thread_id
    )
    assert not suspends(same, arrival, engaged=engaged)
    other = Route(server_id="s9", channel_id="c9")
    expected = arrival.conversational and (
        arrival.addressed or (arrival.server_id, arrival.channel_id) in engaged
    )
    assert suspends(other, arrival, engaged=engaged) is expected


# classify_publish: the RFC-011 §5 table

CONFIRM = "the server did not confirm the place"


@pytest.mark.parametrize(
    ("result", "sent", "expected"),
    [
        # Not an object.
        (None, ABSENT, PublishOutcome(status="unconfirmed", reason="malformed result")),
        ([], "t1", PublishOutcome(status="unconfirmed", reason="malformed result")),
        ("ok", None, PublishOutcome(status="unconfirmed", reason="malformed result")),
        (True, ABSENT, PublishOutcome(status="unconfirmed", reason="malformed result")),
        # The host's marker for a notification-form publish.
        ({"outcome": "unknown"}, "t1", PublishOutcome(status="unknown", reason=None)),
        # Delivered with a thread sent: the echo decides.
        (
            {"delivered": True, "messageId": "m1", "threadId": "t1"},
            "t1",
            PublishOutcome(status="delivered", message_id="m1", thread_id="t1"),
        ),
        (
            {"delivered": True, "messageId": "m1"},
            "t1",
            PublishOutcome(status="unconfirmed", message_id="m1", reason=CONFIRM),
        ),
        (
            {"delivered": True, "messageId": "m1", "threadId": "t2"},
            "t1",
            PublishOutcome(status="unconfirmed", message_id="m1", reason=CONFIRM),
        ),
        (
            {"delivered": True, "threadId": None},
            "t1",
            PublishOutcome(status="unconfirmed", reason=CONFIRM),
        ),
        (
            {"delivered": True, "threadId": 1},
            "1",
            PublishOutcome(status="unconfirmed", reason=CONFIRM),
        ),
        # Delivered with null sent: the echo must be null.
        (
            {"delivered": True, "messageId": 7, "threadId": None},
            None,
            PublishOutcome(status="delivered", message_id="7", thread_id=None),
        ),
        (
            {"delivered": True, "messageId": "m"},
            None,
            PublishOutcome(status="unconfirmed", message_id="m", reason=CONFIRM),
        ),
        (
            {"delivered": True, "threadId": "t1"},
            None,
            PublishOutcome(status="unconfirmed", reason=CONFIRM),
        ),
        (
            {"delivered": True, "threadId": ""},
            None,
            PublishOutcome(status="unconfirmed", reason=CONFIRM),
        ),
        # Delivered with no threadId sent: nothing to confirm.
        (
            {"delivered": True, "messageId": "m1"},
            ABSENT,
            PublishOutcome(status="delivered", message_id="m1"),
        ),
        (
            {"delivered": True, "messageId": "m1", "threadId": "t9"},
            ABSENT,
            PublishOutcome(status="delivered", message_id="m1", thread_id="t9"),
        ),
        ({"delivered": True}, ABSENT, PublishOutcome(status="delivered")),
        # Message ids: strings and integers, never booleans or other values.
        ({"delivered": True, "messageId": True}, ABSENT, PublishOutcome(status="delivered")),
        ({"delivered": True, "messageId": 1.5}, ABSENT, PublishOutcome(status="delivered")),
        ({"delivered": True, "messageId": ["m"]}, ABSENT, PublishOutcome(status="delivered")),
        # Refused.
        (
            {"delivered": False, "reason": "rate limited"},
            "t1",
            PublishOutcome(status="failed", reason="rate limited"),
        ),
        ({"delivered": False}, ABSENT, PublishOutcome(status="failed", reason="refused")),
        (
            {"delivered": False, "reason": 429},
            None,
            PublishOutcome(status="failed", reason="refused"),
        ),
        (
            {"delivered": False, "messageId": True},
            None,
            PublishOutcome(status="failed", reason="refused"),
        ),
        # Refused, yet naming a message: contradictory.
        (
            {"delivered": False, "messageId": "m1", "reason": "no"},
            ABSENT,
            PublishOutcome(status="unconfirmed", message_id="m1", reason="contradictory result"),
        ),
        (
            {"delivered": False, "messageId": 0},
            "t1",
            PublishOutcome(status="unconfirmed", message_id="0", reason="contradictory result"),
        ),
    ],
)
def test_classify_publish_table(result: object, sent: object, expected: PublishOutcome) -> None:
    got = classify_publish(result, sent)
    if expected.status == "unknown":
        assert got.status == "unknown" and got.message_id is None
    else:
        assert got == expected


@pytest.mark.parametrize(
    "result",
    [
        {},
        {"messageId": "m1"},
        {"delivered": "true", "messageId": "m1"},
        {"delivered": 1, "threadId": "t1"},
        {"delivered": None},
        {"outcome": "delivered"},
    ],
)
@pytest.mark.parametrize("sent", ["t1", None, ABSENT])
def test_no_boolean_delivered_is_unconfirmed(result: dict[str, Any], sent: object) -> None:
    got = classify_publish(result, sent)
    assert got.status == "unconfirmed"
    assert got.message_id == ("m1" if "messageId" in result else None)


def test_classify_error_is_unconfirmed() -> None:
    assert classify_error("timeout") == PublishOutcome(status="unconfirmed", reason="timeout")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=4,
)


@given(
    st.dictionaries(
        st.sampled_from(["delivered", "messageId", "threadId", "reason", "outcome"]), json_values
    ),
    st.sampled_from(["t1", "", None, ABSENT]),
)
def test_classification_invariants(result: dict[str, Any], sent: object) -> None:
    got = classify_publish(result, sent)
    assert got.status in {"delivered", "unconfirmed", "failed", "unknown"}
    if got.status == "delivered":
        assert result["delivered"] is True
        if sent is not ABSENT:
            assert "threadId" in result and result["threadId"] == sent
            assert type(result["threadId"]) is type(sent)
            assert got.thread_id == sent
    if got.status == "failed":
        assert result["delivered"] is False and got.message_id is None
    if got.status != "unknown" and not isinstance(result.get("delivered"), bool):
        assert got.status == "unconfirmed"
    if got.message_id is not None:
        assert str(result["messageId"]) == got.message_id
