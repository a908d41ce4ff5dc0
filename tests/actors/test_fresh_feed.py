"""The rows of recent commits, per agent: an agent's context reader takes what was stored since
its last read from them without a trip to the reading thread, and only when they provably hold
all of it; otherwise it reads the store. The same context either way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.agent.history import ContextReader
from actors.fresh_feed import FreshFeeds
from actors.kernel import Work
from actors.storage import DB_NAME, StoreClient
from actors.turn_token import TurnToken
from store import Append, CorruptRecord, Database, MessageRecord, encode_body
from store.items import WrittenRow
from tests.actors.test_context_pages import Counting, Expected, record, shown

AGENTS = ["Ada", "Bo", "Cy"]


def row(seq: int, agent: str, text: str = "hi") -> WrittenRow:
    blocks = ({"type": "text", "text": text},)
    return (seq, f"m{seq}", agent, "user", encode_body(blocks, {}))


def test_a_feed_holds_what_was_filed_after_its_start() -> None:
    feeds = FreshFeeds()
    feeds.file([row(5, "Ada", "a"), row(6, "Bo"), row(7, "Ada", "b")], gap=False)
    assert feeds.take("Ada", 3) is None  # seq 4 may be Ada's: the feed started at 5
    taken = feeds.take("Ada", 4)
    assert taken is not None
    messages, newest = taken
    assert [m["blocks"][0]["text"] for m in messages] == ["a", "b"]
    assert newest == 7
    assert feeds.take("Ada", 7) == ([], 7)  # nothing new
    assert feeds.take("Ada", 6) is None  # what it gave out is gone
    assert feeds.take("Cy", 0) is None  # no feed


def test_a_commit_that_may_have_lost_rows_empties_every_feed() -> None:
    feeds = FreshFeeds()
    feeds.file([row(1, "Ada"), row(2, "Bo")], gap=False)
    feeds.file([row(4, "Ada")], gap=True)  # seq 3 (Ada's or Bo's) may be missing
    assert feeds.take("Ada", 0) is None
    assert feeds.take("Ada", 2) is None
    assert feeds.take("Bo", 2) is None
    assert feeds.take("Ada", 3) is None  # none starts from the commit with the gap
    feeds.file([row(5, "Ada")], gap=False)
    assert feeds.take("Ada", 4) is not None  # the next commit starts them again


def test_at_the_row_cap_the_oldest_rows_go_and_the_feed_says_so() -> None:
    feeds = FreshFeeds(rows_per_agent=3)
    feeds.file([row(s, "Ada") for s in range(1, 6)], gap=False)
    assert feeds.take("Ada", 1) is None  # rows 1 and 2 were dropped at the cap
    taken = feeds.take("Ada", 2)
    assert taken is not None and [m["id"] for m in taken[0]] == ["m3", "m4", "m5"]


def test_at_the_agent_cap_the_feed_least_recently_taken_from_goes() -> None:
    feeds = FreshFeeds(agents=2)
    feeds.file([row(1, "Ada"), row(2, "Bo")], gap=False)
    assert feeds.take("Ada", 0) is not None  # Bo is now the least recently taken from
    feeds.file([row(3, "Cy")], gap=False)
    assert len(feeds) == 2
    assert feeds.take("Bo", 1) is None
    assert feeds.take("Ada", 1) == ([], 1)
    assert feeds.take("Cy", 2) is not None


def test_a_body_that_does_not_decode_sends_the_reader_to_the_store() -> None:
    feeds = FreshFeeds()
    feeds.file([(1, "m1", "Ada", "user", b"\xff\x00 not cbor")], gap=False)
    assert feeds.take("Ada", 0) is None
    assert len(feeds) == 0


COMMIT = st.lists(
    st.tuples(st.sampled_from(AGENTS), st.booleans()),  # (agent, lost if the commit has a gap)
    min_size=1,
    max_size=6,
)
STEP = st.one_of(
    st.tuples(st.just("commit"), COMMIT, st.booleans()),
    st.tuples(st.just("read"), st.sampled_from(AGENTS), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(STEP, max_size=40), rows_per_agent=st.integers(1, 6))
def test_a_take_is_every_row_after_the_seq_or_nothing(
    steps: list[tuple[Any, ...]], rows_per_agent: int
) -> None:
    """Whatever the commits (some losing rows, with the gap reported), the caps and the
    readers (each reading the store when the feed cannot tell), a take gives exactly the
    agent's committed rows after the seq."""
    feeds = FreshFeeds(rows_per_agent=rows_per_agent, agents=2)
    committed: list[WrittenRow] = []
    seen = dict.fromkeys(AGENTS, 0)
    seq = 0
    for step in steps:
        if step[0] == "commit":
            _, rows, gap = step
            filed = []
            for agent, lost in rows:
                seq += 1
                r = row(seq, agent, f"t{seq}")
                committed.append(r)
                if not (gap and lost):
                    filed.append(r)
            feeds.file(filed, gap)
            continue
        _, agent, from_store_first = step
        truth = [r for r in committed if r[2] == agent and r[0] > seen[agent]]
        taken = None if from_store_first else feeds.take(agent, seen[agent])
        if taken is None:  # the store read: everything committed
            seen[agent] = truth[-1][0] if truth else seen[agent]
            continue
        messages, newest = taken
        assert [m["id"] for m in messages] == [r[1] for r in truth]
        assert newest == (truth[-1][0] if truth else seen[agent])
        seen[agent] = newest
        assert len(feeds) <= 2


def test_the_writer_reports_the_rows_it_committed_and_a_partial_undo_as_a_gap(
    tmp_path: Path,
) -> None:
    db = Database(tmp_path / DB_NAME)
    try:
        first = record("Ada", "user", "one")
        copies = (
            first,
            MessageRecord(
                id="copy",
                agent="Bo",
                role="user",
                blocks=first.blocks,
                metadata=first.metadata,
                created_at=first.created_at,
            ),
        )
        db.apply([Append(records=copies)])
        rows, gap = db.items.take_committed()
        assert not gap
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
            (1, first.id, "Ada", "user"),
            (2, "copy", "Bo", "user"),
        ]
        assert rows[0][4] is rows[1][4]  # one body for the copies of one item
        assert db.items.take_committed() == ([], False)
        # a batch with a taken id runs op by op: the good op is stored, the gap reported
        again = record("Ada", "user", "two")
        db.apply([Append(records=(again,)), Append(records=(first,))])
        rows, gap = db.items.take_committed()
        assert gap
        assert [r[1] for r in rows] == []  # which rows survived is not known here
    finally:
        db.close()


@asynccontextmanager
async def reading(data: Path) -> AsyncIterator[tuple[StoreClient, Counting, ContextReader]]:
    """A running store client, its counted reads, and Ada's context reader on it."""
    store = StoreClient(data, Work())
    store.start()
    counting = Counting(store)
    ctx = SimpleNamespace(store=counting, coalescer=None, turns=TurnToken())
    try:
        yield store, counting, ContextReader(ctx, "Ada", 4_000)  # type: ignore[arg-type]
    finally:
        await store.aclose()
        store.reader.close()


async def first_read(store: StoreClient, reader: ContextReader, data: Path) -> Expected:
    """Store Ada's first message and read it (from the store: nothing was read before); the
    reference reader, past the same read."""
    await store.write(Append(records=(record("Ada", "user", "first"),)))
    reference = Expected(data, "Ada", 4_000)
    await reader.read()
    reference.read()
    return reference


async def test_an_agent_reads_its_new_messages_from_the_feed_with_the_same_context(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with reading(data) as (store, counting, reader):
        with trio.fail_after(60):
            reference = await first_read(store, reader, data)  # from the store
            reads = counting.decoded
            for n in range(30):
                texts = [f"{n}:{i} " + "z" * (40 * i) for i in range(n % 4 + 1)]
                await store.write(Append(records=tuple(record("Ada", "user", t) for t in texts)))
                await store.write(Append(records=(record("Bo", "user", "not Ada's"),)))
                context = await reader.read()
                assert shown(context) == reference.read()
            assert counting.decoded == reads  # not one more trip to the reading thread


async def test_after_a_gap_the_reader_goes_back_to_the_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    async with reading(data) as (store, counting, reader):
        with trio.fail_after(60):
            reference = await first_read(store, reader, data)
            taken = record("Ada", "user", "taken id")
            await store.write(Append(records=(taken,)))
            # a batch with a taken id: the writer undoes one op of it and reports a gap
            ok = record("Ada", "user", "kept")
            futures = await store.submit_many([Append(records=(ok,)), Append(records=(taken,))])
            for f in futures:
                await f.wait_settled()
            before = counting.decoded
            context = await reader.read()
            assert shown(context) == reference.read()
            assert "kept" in str(context)
            assert counting.decoded > before  # read from the store


async def test_a_big_batch_is_decoded_a_slice_at_a_time_with_the_same_context(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with reading(data) as (store, counting, reader):
        with trio.fail_after(60):
            reference = await first_read(store, reader, data)
            reads = counting.decoded
            batch = tuple(record("Ada", "user", f"flood {i}") for i in range(200))
            await store.write(Append(records=batch))  # more than one slice (RENDER_SLICE)
            assert shown(await reader.read()) == reference.read()
            assert counting.decoded == reads  # from the feed, slice by slice


async def test_a_body_that_does_not_decode_midway_sends_the_reader_to_the_store(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with reading(data) as (store, counting, reader):
        with trio.fail_after(60):
            reference = await first_read(store, reader, data)
            feeds = counting.feeds
            decode = feeds.decode
            seen = 0

            def failing(row: WrittenRow) -> dict[str, Any]:
                nonlocal seen
                seen += 1
                if seen == 100:  # in the second slice: what the feed gave so far is let go
                    raise CorruptRecord("a body that does not decode")
                return decode(row)

            feeds.decode = failing  # type: ignore[method-assign]
            batch = tuple(record("Ada", "user", f"flood {i}") for i in range(200))
            await store.write(Append(records=batch))
            before = counting.decoded
            assert shown(await reader.read()) == reference.read()
            assert counting.decoded > before  # read from the store instead
            assert seen == 100
