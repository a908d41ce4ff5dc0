"""``BatchQueue``: adaptive batches, backpressure at the cap, close."""

from __future__ import annotations

from collections import deque

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from actors.kernel import BatchQueue


async def test_take_returns_everything_accumulated_up_to_the_limit(
    autojump_clock: trio.abc.Clock,
) -> None:
    q: BatchQueue[int] = BatchQueue(cap=100)
    await q.put_many([1, 2])
    await q.put_many([3])
    assert await q.take(limit=10) == [1, 2, 3]
    await q.put_many(list(range(5)))
    assert await q.take(limit=2) == [0, 1]
    assert await q.take(limit=10) == [2, 3, 4]


async def test_take_waits_for_an_item(autojump_clock: trio.abc.Clock) -> None:
    q: BatchQueue[str] = BatchQueue(cap=4)
    got: list[list[str]] = []

    async def consumer() -> None:
        got.append(await q.take(limit=10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        await q.put_many(["a"])
    assert got == [["a"]]


async def test_put_waits_at_the_cap_until_a_take_makes_room(autojump_clock: trio.abc.Clock) -> None:
    q: BatchQueue[int] = BatchQueue(cap=3)
    await q.put_many([1, 2, 3])  # exactly at the cap
    done = trio.Event()

    async def producer() -> None:
        await q.put_many([4])
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set() and len(q) == 3  # backpressure
        assert await q.take(limit=1) == [1]
        await done.wait()
    assert await q.take(limit=10) == [2, 3, 4]


async def test_wait_below_returns_once_takes_bring_the_queue_under_the_mark(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A producer sharing the consumer with others waits for its queue to drain below a lower
    mark than the cap."""
    q: BatchQueue[int] = BatchQueue(cap=10)
    await q.put_many(list(range(6)))
    passed = trio.Event()

    async def producer() -> None:
        await q.wait_below(3)
        passed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.testing.wait_all_tasks_blocked()
        assert await q.take(limit=3) == [0, 1, 2]
        await trio.testing.wait_all_tasks_blocked()
        assert not passed.is_set() and len(q) == 3  # at the mark: still waiting
        assert await q.take(limit=1) == [3]
        await passed.wait()
    await q.wait_below(3)  # already under it: at once
    q.close()
    await q.wait_below(0)  # closed: never waits


async def test_wait_below_ends_when_its_condition_holds_once_nudged(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A reader holding back stops waiting as soon as it must read on (an answer it awaits may
    be behind what it holds back), though nothing was taken."""
    q: BatchQueue[int] = BatchQueue(cap=10)
    await q.put_many(list(range(5)))
    must_read = False
    passed = trio.Event()

    async def producer() -> None:
        await q.wait_below(2, unless=lambda: must_read)
        passed.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.testing.wait_all_tasks_blocked()
        q.nudge()  # nudged while the condition is false: waits on
        await trio.testing.wait_all_tasks_blocked()
        assert not passed.is_set()
        must_read = True
        await trio.testing.wait_all_tasks_blocked()
        assert not passed.is_set()  # a changed condition is only seen when nudged
        q.nudge()
        await passed.wait()
    assert len(q) == 5
    await q.wait_below(2, unless=lambda: True)  # holds already: at once


async def test_close_ends_the_consumer_and_refuses_producers(
    autojump_clock: trio.abc.Clock,
) -> None:
    q: BatchQueue[int] = BatchQueue(cap=1)
    await q.put_many([1])
    errors: list[type[BaseException]] = []

    async def blocked_producer() -> None:
        try:
            await q.put_many([2])
        except trio.ClosedResourceError as exc:
            errors.append(type(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(blocked_producer)
        await trio.testing.wait_all_tasks_blocked()
        q.close()
    assert errors == [trio.ClosedResourceError]
    assert await q.take(limit=5) == [1]  # what was queued is still handed out
    with pytest.raises(trio.EndOfChannel):
        await q.take(limit=5)


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.lists(st.integers(), min_size=1, max_size=4)),
            st.tuples(st.just("take"), st.integers(1, 5)),
        ),
        max_size=40,
    )
)
def test_batches_keep_fifo_order_against_a_model(ops: list[tuple[str, object]]) -> None:
    async def run() -> None:
        cap = 6
        q: BatchQueue[int] = BatchQueue(cap=cap)
        model: deque[int] = deque()
        for kind, arg in ops:
            if kind == "put":
                assert isinstance(arg, list)
                if len(model) >= cap:
                    continue  # would wait: the single-task model skips it
                await q.put_many(arg)
                model.extend(arg)
            else:
                assert isinstance(arg, int)
                if not model:
                    continue  # would wait
                expected = [model.popleft() for _ in range(min(arg, len(model)))]
                assert await q.take(limit=arg) == expected
            assert len(q) == len(model)

    trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
