"""``actors.turn_token.TurnToken``: first come, first served, except that a turn coming back
from a wait goes before turns not yet started; let go while away; never a stall (a waiter gives
up after ``max_wait`` and goes on). MockClock, no real time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from actors.turn_token import TurnToken


def unfenced(_agent: str, op: Any) -> Any:
    """A context's fencing on the embedded store: the op as it is."""
    return op


async def one_after_another(*turns: Callable[[], Awaitable[None]]) -> None:
    """Run ``turns`` side by side, each started once those before it wait."""
    async with trio.open_nursery() as nursery:
        for turn in turns:
            nursery.start_soon(turn)
            await trio.testing.wait_all_tasks_blocked()


def slow_store(committed: trio.Event, written: list[Any]) -> Any:
    """A store whose writes are done once ``committed`` is set (the commit), kept in
    ``written``."""

    class SlowStore:
        async def write(self, op: Any) -> None:
            written.append(op)
            await committed.wait()

    return SlowStore()


async def test_turns_are_served_in_the_order_they_asked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60)
    order: list[str] = []

    async def turn(name: str, work: float) -> None:
        async with token.turn():
            order.append(f"{name} in")
            await trio.sleep(work)  # work in the host, token held
            order.append(f"{name} out")

    async with trio.open_nursery() as nursery:
        for name in ("a", "b", "c"):
            nursery.start_soon(turn, name, 1.0)
            await trio.testing.wait_all_tasks_blocked()
    assert order == ["a in", "a out", "b in", "b out", "c in", "c out"]
    assert token.gave_up == 0


async def test_a_turn_back_from_a_wait_goes_before_turns_that_asked_earlier(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60)
    order: list[str] = []
    committed = trio.Event()

    async def storing(name: str) -> None:
        async with token.turn():
            async with token.away():  # e.g. its reply waiting for the store's commit
                await committed.wait()
            order.append(f"{name} back")

    async def holder(name: str) -> None:
        async with token.turn():
            order.append(f"{name} in")
            await trio.sleep(1.0)  # holds the token while the others queue
            committed.set()  # the stored turn queues now, after "new" asked
            await trio.testing.wait_all_tasks_blocked()

    async def new(name: str) -> None:
        async with token.turn():
            order.append(f"{name} in")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(storing, "a")
        await trio.testing.wait_all_tasks_blocked()  # a is away
        nursery.start_soon(holder, "b")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(new, "c")  # asks before a comes back
    assert order == ["b in", "a back", "c in"]
    assert token.gave_up == 0 and token.waiting() == 0


async def test_away_lets_the_others_in_and_takes_the_token_back_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60)
    order: list[str] = []
    server_answers = trio.Event()

    async def slow(name: str) -> None:
        async with token.turn():
            order.append(f"{name} works")
            async with token.away():  # e.g. a publish waiting on its server
                await server_answers.wait()
            assert token.held()
            order.append(f"{name} works again")

    async def quick(name: str) -> None:
        async with token.turn():
            order.append(f"{name} works")
        server_answers.set()

    await one_after_another(partial(slow, "a"), partial(quick, "b"))
    assert order == ["a works", "b works", "a works again"]
    assert not token.held()


async def test_a_stuck_holder_delays_the_others_only_by_max_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=0.25)
    started: list[float] = []

    async def stuck() -> None:
        async with token.turn():
            await trio.sleep_forever()

    async def other() -> None:
        async with token.turn():
            started.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stuck)
        await trio.testing.wait_all_tasks_blocked()
        begin = trio.current_time()
        await other()
        nursery.cancel_scope.cancel()
    assert started == [begin + 0.25]
    assert token.gave_up == 1


async def test_a_turn_cancelled_while_away_leaves_without_the_token(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60)
    with trio.move_on_after(1):
        async with token.turn():
            async with token.away():
                await trio.sleep_forever()
    assert not token.held()
    async with token.turn():  # free for the next turn at once
        assert token.held()


@pytest.mark.parametrize("wait", [0.0, 0.1])
async def test_away_without_the_token_just_waits(
    wait: float, autojump_clock: trio.testing.MockClock
) -> None:
    token = TurnToken(max_wait=60)
    async with token.away():
        await trio.sleep(wait)
    assert not token.held()


async def test_a_long_turn_hands_the_token_to_a_waiting_turn_at_its_next_share(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60, share_after=0.5)
    order: list[str] = []

    async def long() -> None:
        async with token.turn():
            for part in range(3):
                await trio.sleep(1.0)  # a part of its work in the host, token held
                order.append(f"long part {part}")
                await token.share()

    async def short() -> None:
        async with token.turn():
            order.append("short")

    await one_after_another(long, short)  # asks while the long turn is in its first part
    assert order == ["long part 0", "short", "long part 1", "long part 2"]
    assert token.shared == 1
    assert token.gave_up == 0


async def test_share_keeps_the_token_when_held_briefly_or_nobody_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60, share_after=5.0)
    order: list[str] = []

    async def holder() -> None:
        async with token.turn():
            await trio.sleep(1.0)
            await token.share()  # held 1 s < share_after: keeps it though another waits
            order.append("holder kept it")

    async def other() -> None:
        async with token.turn():
            order.append("other")

    await one_after_another(holder, other)
    assert order == ["holder kept it", "other"]
    async with token.turn():  # alone, long past share_after: nobody to hand it to
        await trio.sleep(10.0)
        await token.share()
        assert token.held()
    assert token.shared == 0


async def test_share_is_not_cancelled_and_the_next_checkpoint_is(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60, share_after=0.0)
    ran: list[str] = []

    async def waiter() -> None:
        async with token.turn():
            ran.append("waiter")

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            async with token.turn():
                nursery.start_soon(waiter)
                await trio.testing.wait_all_tasks_blocked()
                scope.cancel()
                await token.share()  # hands over and takes it back, cancelled meanwhile
                ran.append("after share")
                assert token.held()
                await trio.lowlevel.checkpoint()  # the cancellation lands here
                ran.append("never")
    assert ran == ["waiter", "after share"]
    assert not token.held()


async def test_a_share_between_whole_parts_of_a_turn_waits_longer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    token = TurnToken(max_wait=60, share_after=1.0, turn_share_after=10.0)
    order: list[str] = []

    async def holder() -> None:
        async with token.turn():
            await trio.sleep(5.0)
            await token.share(whole_turn=True)  # 5 s < 10 s: kept
            order.append("kept before the model")
            await token.share()  # 5 s >= 1 s between slices: handed over
            order.append("back after the other")

    async def other() -> None:
        async with token.turn():
            order.append("other")

    await one_after_another(holder, other)
    assert order == ["kept before the model", "other", "back after the other"]


async def test_a_turns_reply_waits_for_its_commit_without_the_token(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from types import SimpleNamespace

    from actors.agent.history import store_said

    committed = trio.Event()  # the writer thread's commit
    written: list[Any] = []
    token = TurnToken(max_wait=60)
    ctx = SimpleNamespace(store=slow_store(committed, written), turns=token, agent_fenced=unfenced)
    order: list[str] = []

    async def replying() -> None:
        async with token.turn():
            said = await store_said(ctx, "Ada", "assistant", [{"type": "text", "text": "hi"}])
            assert token.held()  # taken back once the commit is done
            order.append(f"stored {said['blocks'][0]['text']}")

    async def other() -> None:
        async with token.turn():
            order.append("other turn")
            committed.set()

    await one_after_another(replying, other)
    assert order == ["other turn", "stored hi"]
    assert token.gave_up == 0  # the other turn had the token, it did not go on without it
    assert len(written) == 1


async def test_a_turns_last_reply_does_not_take_the_token_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What follows a turn's last commit (queueing the reply, the server's answer) does not
    wait for the token: the turn goes on while another turn holds it."""
    from types import SimpleNamespace

    from actors.agent.history import store_said

    committed, other_done = trio.Event(), trio.Event()
    token = TurnToken(max_wait=60)
    ctx = SimpleNamespace(store=slow_store(committed, []), turns=token, agent_fenced=unfenced)
    order: list[str] = []

    async def replying() -> None:
        async with token.turn():
            await store_said(ctx, "Ada", "assistant", [{"type": "text", "text": "hi"}], last=True)
            assert not token.held()
            order.append("stored, going on")
            async with token.away():  # e.g. waiting for the publish: nothing to give back
                await other_done.wait()
            assert not token.held()

    async def other() -> None:
        async with token.turn():
            order.append("other turn")
            committed.set()
            await trio.sleep(5)  # holds the token well past the commit
            order.append("other turn ends")
        other_done.set()

    await one_after_another(replying, other)
    assert order == ["other turn", "stored, going on", "other turn ends"]
    assert token.gave_up == 0
