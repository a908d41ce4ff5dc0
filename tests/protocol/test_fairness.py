"""The per-source fair buffer: bounded, ordered, and a flood only ever loses its own items."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.fairness import (
    GIVE_WAY,
    MAX_PAUSE_S,
    OTHER_SOURCES,
    RECENT_S,
    SHARED_SLICE,
    Dropped,
    FairBuffer,
    ingest_pause,
    ingest_slice,
)

SOURCES = ["flood", "lobby", "ada", "clock"]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(SOURCES)),
        st.tuples(st.just("get"), st.integers(1, 6)),
    ),
    max_size=120,
)


def drain(buf: FairBuffer[int]) -> list[int | Dropped]:
    out: list[int | Dropped] = []
    while (got := buf.get()) is not None:
        out.append(got)
    return out


@settings(max_examples=300)
@given(ops, st.integers(1, 8))
def test_every_item_is_delivered_in_order_or_counted_against_a_source_holding_the_most(
    script: list[tuple[str, object]], cap: int
) -> None:
    buf: FairBuffer[int] = FairBuffer(cap, max_sources=len(SOURCES))
    source_of: dict[int, str] = {}
    got: list[int | Dropped] = []
    for op, arg in script:
        if op == "put":
            assert isinstance(arg, str)
            before = {s: buf.buffered(s) for s in SOURCES}
            dropped_before = buf.dropped_total
            item = len(source_of)
            source_of[item] = arg
            buf.put(arg, item)
            if buf.dropped_total > dropped_before:
                # a drop always hits a source that held the most at that moment
                most = max(before.values())
                losers = [s for s in SOURCES if buf.buffered(s) < before[s]]
                if losers:  # an older item was evicted, and the new one kept
                    (loser,) = losers
                    assert before[loser] == most > before[arg]
                else:  # the new item itself was dropped
                    assert before[arg] == most
        else:
            assert isinstance(arg, int)
            for _ in range(arg):
                if (one := buf.get()) is None:
                    break
                got.append(one)
        assert len(buf) <= cap
        assert buf.pending_notices() <= len(SOURCES)
    got += drain(buf)
    assert len(buf) == 0 and buf.sources() == 0  # everything forgotten once drained
    items = [g for g in got if not isinstance(g, Dropped)]
    assert items == sorted(items)  # the order they were put in, across sources
    counted = Counter[str]()
    for g in got:
        if isinstance(g, Dropped):
            assert isinstance(g.source, str) and g.count > 0
            counted[g.source] += g.count
    delivered = Counter(source_of[i] for i in items)
    assert delivered + counted == Counter(source_of.values())  # nothing lost unsaid


@settings(max_examples=200)
@given(st.integers(2, 16), st.lists(st.booleans(), max_size=300))
def test_a_source_with_less_than_half_waiting_loses_nothing_to_a_flood(
    cap: int, quiet_turns: list[bool]
) -> None:
    buf: FairBuffer[tuple[str, int]] = FairBuffer(cap, max_sources=4)
    sent = 0
    delivered: list[int] = []
    for i, quiet in enumerate(quiet_turns):
        buf.put("flood", ("flood", i))
        if quiet:
            buf.put("lobby", ("lobby", sent))
            sent += 1
        if buf.buffered("lobby") >= cap // 2:  # the reader comes by before the quiet one piles up
            while (got := buf.get()) is not None:
                if isinstance(got, tuple) and got[0] == "lobby":
                    delivered.append(got[1])
    while (got := buf.get()) is not None:
        if isinstance(got, tuple) and got[0] == "lobby":
            delivered.append(got[1])
    assert delivered == list(range(sent))


def test_one_notice_per_source_in_the_place_of_its_first_drop() -> None:
    buf: FairBuffer[str] = FairBuffer(3, max_sources=4)
    for item in ("f1", "f2", "f3", "f4", "f5"):
        buf.put("flood", item)
    buf.put("lobby", "l1")  # evicts the flood's newest (f3), not its oldest
    buf.put("flood", "f6")
    assert drain(buf) == ["f1", "f2", Dropped("flood", 4), "l1"]
    assert drain(buf) == []


def test_sources_past_the_cap_share_one_slot() -> None:
    buf: FairBuffer[str] = FairBuffer(10, max_sources=2)
    for source in ("a", "b", "c", "d"):
        buf.put(source, source)
    assert buf.sources() == 3  # a, b, and the shared slot
    assert buf.buffered(OTHER_SOURCES) == 2
    assert drain(buf) == ["a", "b", "c", "d"]
    assert buf.sources() == 0
    buf.put("d", "d2")  # room again: told apart
    assert buf.buffered("d") == 1


def test_the_shared_slot_is_counted_as_one_source_when_full() -> None:
    buf: FairBuffer[str] = FairBuffer(2, max_sources=1)
    buf.put("a", "a1")
    buf.put("a", "a2")
    buf.put("b", "b1")  # past the cap: the shared slot, which takes room from "a"
    buf.put("c", "c1")  # the shared slot holds as much as "a" now: c1 is dropped
    assert drain(buf) == ["a1", Dropped("a", 1), "b1", Dropped(OTHER_SOURCES, 1)]


@pytest.mark.parametrize("cap,max_sources", [(0, 1), (1, 0)])
def test_limits_must_be_positive(cap: int, max_sources: int) -> None:
    with pytest.raises(ValueError):
        FairBuffer(cap, max_sources)


def test_a_notice_carries_the_time_of_its_first_drop() -> None:
    buf: FairBuffer[str] = FairBuffer(1, max_sources=4)
    buf.put("flood", "f1", now=1.0)
    buf.put("flood", "f2", now=2.0)
    buf.put("flood", "f3", now=3.0)
    buf.put("lobby", "l1", now=4.0)  # evicts f1: the flood's notice keeps its first time
    assert drain(buf) == [Dropped("flood", 3, since=2.0), "l1"]


# -- a connection's share of ingest ------------------------------------------------------------


counts = st.integers(min_value=0, max_value=3000)


@given(
    waiting=counts,
    in_hand=counts,
    slice_size=st.integers(min_value=1, max_value=64),
    others_turning=st.booleans(),
    others=st.lists(counts, max_size=4),
    spent=st.floats(min_value=-1.0, max_value=10.0, allow_nan=False),
)
def test_a_connection_pauses_only_when_it_floods_and_another_needs_the_host(
    waiting: int,
    in_hand: int,
    slice_size: int,
    others_turning: bool,
    others: list[int],
    spent: float,
) -> None:
    pause = ingest_pause(
        waiting=waiting,
        in_hand=in_hand,
        slice_size=slice_size,
        others_turning=others_turning,
        others_in_hand=others,
        spent=spent,
    )
    assert 0.0 <= pause <= MAX_PAUSE_S
    keeping_up = waiting < slice_size
    lighter = any(0 < n < waiting + in_hand for n in others)
    if keeping_up or spent <= 0 or not (others_turning or lighter):
        assert pause == 0.0
    else:
        assert pause == min(GIVE_WAY * spent, MAX_PAUSE_S)


def test_of_two_flooding_connections_only_the_heavier_gives_way() -> None:
    def pause(waiting: int, others: list[int]) -> float:
        return ingest_pause(
            waiting=waiting,
            in_hand=0,
            slice_size=16,
            others_turning=False,
            others_in_hand=others,
            spent=0.001,
        )

    assert pause(500, [100]) > 0  # the heavier waits for the lighter
    assert pause(100, [500]) == 0  # the lighter goes on
    assert pause(500, [500]) == 0  # equals share the rounds
    assert pause(500, [0]) == 0  # an idle one needs nothing
    assert pause(10, [1]) == 0  # one keeping up never waits


@given(
    full=st.integers(1, 64),
    last_read=st.dictionaries(
        st.sampled_from(["a", "b", "c"]), st.floats(0, 10, allow_nan=False), max_size=3
    ),
    now=st.floats(0, 10, allow_nan=False),
    others_turning=st.booleans(),
)
def test_a_connection_takes_the_shared_slice_only_while_another_needs_the_host(
    full: int, last_read: dict[str, float], now: float, others_turning: bool
) -> None:
    step = ingest_slice(
        full=full, server="a", now=now, last_read=last_read, others_turning=others_turning
    )
    others_lately = any(s != "a" and now - t < RECENT_S for s, t in last_read.items())
    if others_turning or others_lately:
        assert step == min(full, SHARED_SLICE)
    else:
        assert step == full  # its own reads never slow it down
    assert 1 <= step <= full
