"""The trace bus: per-subscriber cap with counted drops, bounded replay, subscriber cap."""

from __future__ import annotations

import itertools
from typing import Any
from unittest import mock

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from actors import trace
from actors.trace import MAX_SUBSCRIBERS, REPLAY_CAP, SUBSCRIBER_CAP, TraceBus, TraceEvent


def drain(recv: trio.MemoryReceiveChannel[TraceEvent]) -> list[TraceEvent]:
    out = []
    while True:
        try:
            out.append(recv.receive_nowait())
        except trio.WouldBlock:
            return out


def kinds(events: list[TraceEvent]) -> list[str]:
    return [e.kind for e in events]


# -- events -----------------------------------------------------------------------------------


def test_emit_delivers_frozen_events_in_order():
    bus = TraceBus()
    recv = bus.subscribe_nowait()
    sent = bus.emit(
        "turn-start", agent="Ada", server_id="lobby", channel_id="general", data={"n": 1}
    )
    bus.emit("turn-end", agent="Ada")
    got = drain(recv)
    assert got[0] is sent
    assert kinds(got) == ["turn-start", "turn-end"]
    assert (sent.agent, sent.server_id, sent.channel_id, dict(sent.data)) == (
        "Ada",
        "lobby",
        "general",
        {"n": 1},
    )
    with pytest.raises(AttributeError):
        sent.kind = "other"  # type: ignore[misc]


@pytest.mark.parametrize("bad", [5, 1.5, b"general", ["general"], {"id": "general"}, True])
def test_channel_id_must_be_a_string_or_none(bad: Any):
    with pytest.raises(TypeError, match="channel_id"):
        TraceEvent(kind="x", channel_id=bad)
    bus = TraceBus()
    recv = bus.subscribe_nowait()
    with pytest.raises(TypeError, match="channel_id"):
        bus.emit("x", channel_id=bad)
    assert drain(recv) == []


@given(st.one_of(st.none(), st.text()))
def test_any_string_or_none_is_a_channel_id(value: str | None):
    assert TraceEvent(kind="x", channel_id=value).channel_id == value


@given(
    st.one_of(
        st.integers(),
        st.floats(allow_nan=False),
        st.binary(),
        st.booleans(),
        st.lists(st.text(), max_size=2),
        st.tuples(st.text()),
    )
)
def test_nothing_else_is_a_channel_id(value: Any):
    with pytest.raises(TypeError):
        TraceEvent(kind="x", channel_id=value)


# -- the per-subscriber cap -------------------------------------------------------------------


def test_a_subscriber_holds_exactly_subscriber_cap_events():
    bus = TraceBus()
    recv = bus.subscribe_nowait()
    for i in range(SUBSCRIBER_CAP):
        bus.emit("e", data={"i": i})
    got = drain(recv)
    assert [e.data["i"] for e in got] == list(range(SUBSCRIBER_CAP))
    bus.emit("after")
    assert kinds(drain(recv)) == ["after"]  # nothing was dropped


def test_a_slow_subscriber_keeps_the_oldest_and_then_gets_one_count():
    bus = TraceBus()
    slow = bus.subscribe_nowait()
    fast = bus.subscribe_nowait()
    for i in range(SUBSCRIBER_CAP + 5):
        bus.emit("e", data={"i": i})
        if i % 100 == 0:
            drain(fast)
    drain(fast)
    assert slow.statistics().current_buffer_used == SUBSCRIBER_CAP
    got = drain(slow)
    assert [e.data["i"] for e in got[:-1]] == list(range(SUBSCRIBER_CAP))  # the oldest are kept
    assert got[-1].kind == "trace-dropped"
    assert dict(got[-1].data) == {"count": 5}
    assert (got[-1].server_id, got[-1].agent) == (None, None)  # the host's own events

    bus.emit("after")
    assert kinds(drain(slow)) == ["after"]  # the count is reported once
    assert kinds(drain(fast)) == ["after"]  # the other subscriber lost nothing


def test_a_count_takes_no_room_and_adds_up_until_it_is_read():
    bus = TraceBus()
    slow = bus.subscribe_nowait()
    for i in range(SUBSCRIBER_CAP + 3):
        bus.emit("e", server_id="lobby", data={"i": i})
    slow.receive_nowait()
    bus.emit("e", server_id="lobby", data={"i": -1})  # the freed slot takes it
    bus.emit("e", server_id="lobby", data={"i": -2})  # full again: counted with the others
    got = drain(slow)
    assert len(got) == SUBSCRIBER_CAP + 1
    notice = got[SUBSCRIBER_CAP - 1]
    assert notice.kind == "trace-dropped" and notice.server_id == "lobby"
    assert dict(notice.data) == {"count": 4}
    assert got[-1].data == {"i": -1}  # kept, after the count opened by the first drop


def test_a_flooding_server_loses_its_own_events_never_a_quiet_ones():
    bus = TraceBus()
    recv = bus.subscribe_nowait()
    quiet = 0
    for i in range(SUBSCRIBER_CAP * 3):
        bus.emit("diagnostic", server_id="flood", data={"i": i})
        if i % 50 == 0:
            bus.emit("incoming", server_id="lobby", channel_id="general", data={"n": quiet})
            bus.emit("published", agent="Ada", server_id="lobby", data={"n": quiet})
            bus.emit("turn-start", agent="Ada", data={"n": quiet})
            quiet += 1
    got = drain(recv)
    assert len([e for e in got if e.kind != "trace-dropped"]) == SUBSCRIBER_CAP
    for kind in ("incoming", "published", "turn-start"):
        assert [e.data["n"] for e in got if e.kind == kind] == list(range(quiet))
    notices = [e for e in got if e.kind == "trace-dropped"]
    assert [(e.server_id, e.agent) for e in notices] == [("flood", None)]
    flood = [e.data["i"] for e in got if e.kind == "diagnostic"]
    assert flood == sorted(flood)
    assert len(flood) + notices[0].data["count"] == SUBSCRIBER_CAP * 3


def test_sources_past_the_cap_share_one_slot_reported_as_other_sources():
    with mock.patch.object(trace, "MAX_SOURCES", 2), mock.patch.object(trace, "SUBSCRIBER_CAP", 8):
        bus = TraceBus()
        recv = bus.subscribe_nowait()
    for name in ("a", "b", "c", "d"):
        for i in range(8):
            bus.emit("e", server_id=name, data={"i": i})
    got = drain(recv)
    # "a" filled the buffer; "b" took half of it (each of its events evicted the newest of the
    # biggest holder, until it was the biggest itself); "c" and "d" came past the cap and share
    # one slot, which took room from both until it held as much as the biggest
    items = [(e.server_id, e.data["i"]) for e in got if e.kind == "e"]
    assert items == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2), ("c", 0), ("c", 1), ("c", 2)]
    notices = {
        ("other" if e.data.get("other_sources") else e.server_id): e.data["count"]
        for e in got
        if e.kind == "trace-dropped"
    }
    assert notices == {"a": 6, "b": 5, "other": 13}
    # once drained, sources are forgotten and new ones are told apart again
    bus.emit("e", server_id="c", data={"i": 99})
    assert [(e.server_id, e.data) for e in drain(recv)] == [("c", {"i": 99})]


bus_ops = st.lists(
    st.one_of(st.just(("emit", 0)), st.tuples(st.just("read"), st.integers(0, 5))),
    max_size=60,
)


@settings(max_examples=200)
@given(bus_ops)
def test_every_event_is_either_delivered_in_order_or_counted(script: list[tuple[str, int]]):
    cap = 3
    with mock.patch.object(trace, "SUBSCRIBER_CAP", cap):
        bus = TraceBus()
        recv = bus.subscribe_nowait()
    received: list[TraceEvent] = []
    emitted = 0
    for op, n in script:
        if op == "emit":
            bus.emit("e", data={"i": emitted})
            emitted += 1
        else:
            for _ in range(n):
                try:
                    received.append(recv.receive_nowait())
                except trio.WouldBlock:
                    break
        assert recv.statistics().current_buffer_used <= cap
    received += drain(recv)
    bus.emit("e", data={"i": emitted})  # with room again, any count pending arrives
    emitted += 1
    received += drain(recv)

    delivered = [e.data["i"] for e in received if e.kind == "e"]
    counted = sum(e.data["count"] for e in received if e.kind == "trace-dropped")
    assert delivered == sorted(set(delivered))  # in order, no repeats
    assert delivered[-1] == emitted - 1
    assert len(delivered) + counted == emitted
    assert all(e.data["count"] > 0 for e in received if e.kind == "trace-dropped")
    for a, b in itertools.pairwise(received):
        assert not (a.kind == b.kind == "trace-dropped")


# -- replay -----------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [0, 7])
def test_replay_is_bounded_by_replay_cap(extra: int):
    bus = TraceBus()
    total = REPLAY_CAP + extra
    for i in range(total):
        bus.emit("e", data={"i": i})
    recv = bus.subscribe_nowait(replay=True)
    got = drain(recv)
    assert [e.data["i"] for e in got] == list(range(extra, total))  # the newest, in order
    bus.emit("live")
    assert kinds(drain(recv)) == ["live"]


def test_no_replay_unless_asked():
    bus = TraceBus()
    bus.emit("before")
    recv = bus.subscribe_nowait()
    assert drain(recv) == []
    bus.emit("after")
    assert kinds(drain(recv)) == ["after"]


# -- kinds ------------------------------------------------------------------------------------


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=40), st.sets(st.sampled_from("abc")))
def test_a_kinds_subscriber_gets_exactly_those_kinds_in_order(emitted: list[str], wanted: set[str]):
    bus = TraceBus()
    bus.emit("a", data={"i": -1})  # before subscribing: replayed only when wanted
    every = bus.subscribe_nowait(replay=True)
    some = bus.subscribe_nowait(replay=True, kinds=frozenset(wanted))
    for i, kind in enumerate(emitted):
        bus.emit(kind, data={"i": i})
    all_events = drain(every)
    assert [e.data["i"] for e in drain(some)] == [
        e.data["i"] for e in all_events if e.kind in wanted
    ]


def test_a_kinds_subscriber_that_falls_behind_still_hears_the_count():
    bus = TraceBus()
    recv = bus.subscribe_nowait(kinds=frozenset({"x"}))
    for _ in range(SUBSCRIBER_CAP + 5):
        bus.emit("x")
        bus.emit("y")  # never counted for this subscriber: it did not ask for it
    got = drain(recv)
    assert kinds(got) == ["x"] * SUBSCRIBER_CAP + ["trace-dropped"]
    assert got[-1].data["count"] == 5
    bus.emit("y")
    assert drain(recv) == []


# -- the subscriber cap -----------------------------------------------------------------------


def test_at_most_max_subscribers_and_closing_one_frees_a_slot():
    bus = TraceBus()
    subs = [bus.subscribe_nowait() for _ in range(MAX_SUBSCRIBERS)]
    with pytest.raises(RuntimeError, match=str(MAX_SUBSCRIBERS)):
        bus.subscribe_nowait()
    subs[0].close()
    extra = bus.subscribe_nowait()
    bus.emit("e")
    assert all(kinds(drain(r)) == ["e"] for r in [*subs[1:], extra])


async def test_the_subscribe_context_counts_toward_the_cap_and_frees_its_slot():
    bus = TraceBus()
    subs = [bus.subscribe_nowait() for _ in range(MAX_SUBSCRIBERS - 1)]
    async with bus.subscribe() as recv:
        with pytest.raises(RuntimeError):
            bus.subscribe_nowait()
        bus.emit("inside")
        assert kinds(drain(recv)) == ["inside"]
    with pytest.raises(trio.EndOfChannel):
        await recv.receive()
    bus.subscribe_nowait()  # the slot is free again
    subs[0].close()
    async with bus.subscribe() as recv:  # a closed reader frees its slot for this form too
        bus.emit("e")
        assert kinds(drain(recv)) == ["e"]


async def test_a_reader_may_close_its_channel_inside_subscribe():
    bus = TraceBus()
    async with bus.subscribe() as recv:
        recv.close()
        bus.emit("after close")
    bus.emit("later")


async def test_close_ends_every_subscription_and_later_emits_are_harmless():
    bus = TraceBus()
    slow = bus.subscribe_nowait()
    for _ in range(SUBSCRIBER_CAP + 1):
        bus.emit("e")
    bus.close()
    bus.emit("after close")
    got = drain_until_end(slow)
    assert kinds(got) == ["e"] * SUBSCRIBER_CAP + ["trace-dropped"]  # nothing lost unsaid
    assert got[-1].data["count"] == 1


def drain_until_end(recv: trio.MemoryReceiveChannel[TraceEvent]) -> list[TraceEvent]:
    out = []
    while True:
        try:
            out.append(recv.receive_nowait())
        except trio.EndOfChannel:
            return out


# -- publish_fields: an event nobody takes now is built only if it is replayed -----------------


def test_published_fields_reach_a_subscriber_that_takes_their_kind():
    bus = TraceBus()
    every = bus.subscribe_nowait()
    some = bus.subscribe_nowait(kinds=frozenset({"incoming"}))
    other = bus.subscribe_nowait(kinds=frozenset({"push"}))
    bus.publish_fields("incoming", "lobby", "general", {"message_id": "m1"})
    expected = TraceEvent(
        kind="incoming", server_id="lobby", channel_id="general", data={"message_id": "m1"}
    )
    assert drain(every) == [expected]
    assert drain(some) == [expected]
    assert drain(other) == []


def test_published_fields_nobody_takes_are_replayed_in_order_as_events():
    bus = TraceBus()
    narrow = bus.subscribe_nowait(kinds=frozenset({"server-log"}))
    bus.emit("ready", server_id="lobby")
    bus.publish_fields("incoming", "lobby", "general", {"message_id": "m1"})
    bus.publish_fields("push", "lobby", None, {"event_id": "e1"})
    assert drain(narrow) == []
    later = bus.subscribe_nowait(replay=True)
    got = drain(later)
    assert kinds(got) == ["ready", "incoming", "push"]
    assert got[1] == TraceEvent(
        kind="incoming", server_id="lobby", channel_id="general", data={"message_id": "m1"}
    )
    assert got[2].channel_id is None and got[2].data == {"event_id": "e1"}
    # once a subscriber takes every kind, the events are built and delivered at once
    bus.publish_fields("incoming", "lobby", "general", {"message_id": "m2"})
    assert [e.data["message_id"] for e in drain(later)] == ["m2"]


def test_published_fields_refuse_a_channel_id_that_is_not_a_string():
    bus = TraceBus()
    with pytest.raises(TypeError):
        bus.publish_fields("incoming", "lobby", 5, {})  # type: ignore[arg-type]
    bus.subscribe_nowait()
    with pytest.raises(TypeError):
        bus.publish_fields("incoming", "lobby", 5, {})  # type: ignore[arg-type]


# -- timestamps -------------------------------------------------------------------------------


class FakeWall:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_events_carry_the_wall_time_of_their_emission_outside_their_identity():
    wall = FakeWall()
    bus = TraceBus(now=wall)
    recv = bus.subscribe_nowait()
    sent = bus.emit("e", server_id="lobby")
    wall.now = 2_000.0
    assert sent.ts == 1_000.0
    assert drain(recv)[0].ts == 1_000.0
    assert sent == TraceEvent(kind="e", server_id="lobby", ts=5.0)  # equal whatever the time


def test_lazily_built_events_keep_the_time_they_were_published_at():
    wall = FakeWall()
    bus = TraceBus(now=wall)
    narrow = bus.subscribe_nowait(kinds=frozenset({"server-log"}))
    bus.publish_fields("incoming", "lobby", "general", {"message_id": "m1"})
    wall.now = 1_500.0
    bus.publish_fields("incoming", "lobby", "general", {"message_id": "m2"})
    wall.now = 9_000.0  # built only now, when a subscriber asks for the replay
    later = bus.subscribe_nowait(replay=True)
    assert [e.ts for e in drain(later)] == [1_000.0, 1_500.0]
    bus.publish_fields("incoming", "lobby", "general", {"message_id": "m3"})
    assert [e.ts for e in drain(later)] == [9_000.0]
    assert drain(narrow) == []


async def test_a_parked_reader_wakes_for_an_event_and_sees_the_end(autojump_clock):
    bus = TraceBus()
    recv = bus.subscribe_nowait()
    got: list[TraceEvent] = []

    async def read() -> None:
        async for event in recv:
            got.append(event)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            bus.emit("first")
            await trio.testing.wait_all_tasks_blocked()
            assert kinds(got) == ["first"]
            bus.emit("second")
            bus.close()
    assert kinds(got) == ["first", "second"]
    with pytest.raises(trio.ClosedResourceError):
        recv.close()
        recv.receive_nowait()
