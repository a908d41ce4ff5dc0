"""The actor kernel: mailbox order and cap, ask/tell, deferred replies, Stop, cancellation, Work."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import outcome
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio.testing import wait_all_tasks_blocked

from actors.errors import ActorDied, AskTimeout, MailboxFull
from actors.kernel import Actor, ActorRef, Reply, Stop, Work

CAP = 4  # the test actor's mailbox size
LONG = 3600.0  # an ask deadline the autojump clock reaches at once when every task is blocked
# Scopes guarding against a hang use 2 * LONG, so a stuck ask shows as AskTimeout first.


# -- the test actor ---------------------------------------------------------------------------


@attrs.frozen(eq=False)
class Echo:
    value: Any


@attrs.frozen(eq=False)
class Fail:
    text: str


@attrs.frozen(eq=False)
class Hold:
    """The handler itself waits for the gate (the loop is busy, so the mailbox fills)."""

    gate: trio.Event


@attrs.frozen(eq=False)
class Defer:
    """The handler keeps the reply and answers from a spawned task once the gate is set."""

    value: Any
    gate: trio.Event


@attrs.frozen(eq=False)
class Keep:
    """The handler keeps the reply in the actor's state and returns without answering."""


@attrs.frozen(eq=False)
class Forever:
    """Spawn a task that never ends on its own."""

    counted: bool


@attrs.frozen(eq=False)
class Crash:
    """Spawn a task holding the reply that fails before it answers."""

    text: str


class Probe(Actor):
    mailbox_size = CAP

    def __init__(self, work: Work) -> None:
        super().__init__("probe", work)
        self.seen: list[Any] = []
        self.kept: list[Reply] = []
        self.finished: list[str] = []

    @property
    def echoes(self) -> list[Any]:
        return [m.value for m in self.seen if isinstance(m, Echo)]

    async def handle(self, msg: Any, reply: Reply) -> None:
        self.seen.append(msg)
        match msg:
            case Echo(value):
                reply.value(value)
            case Fail(text):
                raise ValueError(text)
            case Hold(gate):
                await gate.wait()
                reply.value("held")
            case Defer(value, gate):
                self.spawn(self._answer_later, value, gate, reply)
            case Keep():
                self.kept.append(reply)
            case Forever(counted):
                self.spawn(self._forever, "counted" if counted else "uncounted", counted=counted)
                reply.value(None)
            case Crash(text):
                self.spawn(self._crash, text, reply)
            case _:
                raise TypeError(f"unexpected {msg!r}")

    async def _answer_later(self, value: Any, gate: trio.Event, reply: Reply) -> None:
        await gate.wait()
        reply.value(value)

    async def _forever(self, tag: str) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self.finished.append(tag)

    async def _crash(self, text: str, reply: Reply) -> None:
        await trio.lowlevel.checkpoint()
        raise ValueError(text)


async def capture(
    results: dict[str, outcome.Outcome[Any]], key: str, ref: ActorRef[Any], msg: Any
) -> None:
    """Ask and keep the outcome (cancellation is not an outcome: it propagates)."""
    try:
        results[key] = outcome.Value(await ref.ask(msg, timeout=LONG))
    except Exception as exc:
        results[key] = outcome.Error(exc)


async def busy(ref: ActorRef[Any]) -> trio.Event:
    """Make the actor's loop wait inside a handler; set the returned event to let it go on."""
    gate = trio.Event()
    await ref.tell(Hold(gate))
    await wait_all_tasks_blocked()
    return gate


# -- tell / ask -------------------------------------------------------------------------------


@asynccontextmanager
async def running(actor: Any) -> AsyncIterator[tuple[Any, trio.Nursery]]:
    """The actor started in a nursery of its own, cancelled when the block ends."""
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(actor.run)
        yield ref, nursery
        nursery.cancel_scope.cancel()


async def test_tell_order_is_preserved_through_backpressure(autojump_clock):
    actor = Probe(Work())
    async with running(actor) as (ref, _nursery):
        assert ref.name == "probe"
        for i in range(5 * CAP):
            await ref.tell(Echo(i))
        await wait_all_tasks_blocked()
        assert actor.echoes == list(range(5 * CAP))


async def test_ask_returns_the_handlers_value(autojump_clock):
    actor = Probe(Work())
    async with running(actor) as (ref, _nursery):
        assert await ref.ask(Echo({"a": 1}), timeout=LONG) == {"a": 1}
        assert await ref.ask(Echo(None), timeout=LONG) is None


async def test_a_handler_exception_goes_to_the_asker_and_the_actor_keeps_going(autojump_clock):
    work = Work()
    actor = Probe(work)
    async with running(actor) as (ref, _nursery):
        with pytest.raises(ValueError, match=r"^boom$"):
            await ref.ask(Fail("boom"), timeout=LONG)
        assert await ref.ask(Echo("still here"), timeout=LONG) == "still here"
        assert work.count == 0


async def test_a_failing_tell_is_logged_and_the_actor_keeps_going(autojump_clock, caplog):
    work = Work()
    actor = Probe(work)
    async with running(actor) as (ref, _nursery):
        with caplog.at_level(logging.ERROR, logger="mcplive"):
            await ref.tell(Fail("told"))
            assert await ref.ask(Echo(1), timeout=LONG) == 1
        assert any("probe" in r.getMessage() and r.exc_info for r in caplog.records)
        assert work.count == 0


async def test_deferred_reply_answers_later_while_the_mailbox_stays_live(autojump_clock):
    work = Work()
    actor = Probe(work)
    results: dict[str, outcome.Outcome[Any]] = {}
    gate = trio.Event()
    async with running(actor) as (ref, nursery):
        nursery.start_soon(capture, results, "deferred", ref, Defer("later", gate))
        await wait_all_tasks_blocked()
        assert "deferred" not in results
        assert work.count == 1  # the spawned task holding the reply
        # The loop is not waiting on the deferred work.
        assert await ref.ask(Echo("meanwhile"), timeout=LONG) == "meanwhile"
        gate.set()
        await wait_all_tasks_blocked()
        assert results["deferred"].unwrap() == "later"
        assert work.count == 0


async def test_a_spawned_task_that_fails_sends_its_error_to_the_asker(autojump_clock):
    work = Work()
    actor = Probe(work)
    async with running(actor) as (ref, _nursery):
        with pytest.raises(ValueError, match=r"^crashed$"):
            await ref.ask(Crash("crashed"), timeout=LONG)
        assert await ref.ask(Echo(2), timeout=LONG) == 2
        await wait_all_tasks_blocked()
        assert work.count == 0


async def test_ask_deadline_raises_ask_timeout(autojump_clock):
    work = Work()
    actor = Probe(work)
    async with running(actor) as (ref, _nursery):
        start = trio.current_time()
        with pytest.raises(AskTimeout, match="Keep"):
            await ref.ask(Keep(), timeout=5)
        assert trio.current_time() == pytest.approx(start + 5)  # virtual time: the deadline
        assert isinstance(AskTimeout(), TimeoutError)
        actor.kept[0].value("too late")  # answering a gone asker is harmless
        assert await ref.ask(Echo(3), timeout=LONG) == 3
        assert work.count == 0


async def test_an_asker_cancelled_from_outside_is_cancelled_not_timed_out(autojump_clock):
    work = Work()
    actor = Probe(work)
    async with running(actor) as (ref, _nursery):
        with trio.move_on_after(5) as outer:
            await ref.ask(Keep(), timeout=LONG)
        assert outer.cancelled_caught  # the caller's own deadline, not the ask's AskTimeout
        actor.kept[0].value("too late")
        assert await ref.ask(Echo(4), timeout=LONG) == 4


async def test_ask_timing_out_at_a_full_mailbox_leaves_no_work_behind(autojump_clock):
    work = Work()
    actor = Probe(work)
    async with running(actor) as (ref, _nursery):
        gate = await busy(ref)
        for i in range(CAP):
            ref.tell_nowait(Echo(i))
        with pytest.raises(AskTimeout):
            await ref.ask(Echo("never sent"), timeout=5)
        gate.set()
        await wait_all_tasks_blocked()
        assert actor.echoes == list(range(CAP))
        assert work.count == 0
        with trio.fail_after(2 * LONG):
            await work.wait_idle()


# -- the mailbox cap --------------------------------------------------------------------------


async def test_tell_nowait_raises_mailbox_full_exactly_at_the_cap(autojump_clock):
    work = Work()
    actor = Probe(work)
    async with running(actor) as (ref, _nursery):
        gate = await busy(ref)
        for i in range(CAP):
            ref.tell_nowait(Echo(i))  # the CAP-th still fits
        assert ref.queued == CAP
        with pytest.raises(MailboxFull, match="probe"):
            ref.tell_nowait(Echo("rejected"))
        assert ref.queued == CAP
        assert work.count == 1 + CAP  # the held message and the queue; the rejected one is not
        gate.set()
        await wait_all_tasks_blocked()
        assert actor.echoes == list(range(CAP))
        assert work.count == 0


async def test_tell_waits_at_the_cap_and_proceeds_when_the_actor_drains(autojump_clock):
    work = Work()
    actor = Probe(work)
    done = trio.Event()

    async def teller(ref: ActorRef[Any]) -> None:
        await ref.tell(Echo("waited"))
        done.set()

    async with running(actor) as (ref, nursery):
        gate = await busy(ref)
        for i in range(CAP):
            await ref.tell(Echo(i))
        nursery.start_soon(teller, ref)
        await wait_all_tasks_blocked()
        assert not done.is_set()
        assert ref.queued == CAP
        assert work.count == 1 + CAP + 1  # the waiting tell is already work in flight
        gate.set()
        await wait_all_tasks_blocked()
        assert done.is_set()
        assert actor.echoes == [*range(CAP), "waited"]
        assert work.count == 0


async def test_tell_promptly_queues_without_yielding_and_waits_only_at_the_cap(autojump_clock):
    """Telling many actors in a row costs no scheduling round while their mailboxes have room
    (a task ready to run does not run in between); at the cap it waits like ``tell``; a
    cancelled caller is stopped as by ``tell``."""
    work = Work()
    actor = Probe(work)
    go, ran = trio.Event(), trio.Event()

    async def ready_to_run() -> None:
        await go.wait()
        ran.set()

    async with running(actor) as (ref, nursery):
        gate = await busy(ref)
        nursery.start_soon(ready_to_run)
        await wait_all_tasks_blocked()
        go.set()  # runnable from now on: any scheduling round runs it
        for i in range(CAP):
            await ref.tell_promptly(Echo(i))
        assert not ran.is_set() and ref.queued == CAP
        await wait_all_tasks_blocked()
        assert ran.is_set()
        with trio.CancelScope() as scope:
            scope.cancel()
            await ref.tell_promptly(Echo("never"))
        assert scope.cancelled_caught and ref.queued == CAP
        done = trio.Event()

        async def teller() -> None:
            await ref.tell_promptly(Echo("waited"))
            done.set()

        nursery.start_soon(teller)
        await wait_all_tasks_blocked()
        assert not done.is_set() and ref.queued == CAP  # at the cap: waiting
        gate.set()
        await wait_all_tasks_blocked()
        assert done.is_set()
        assert actor.echoes == [*range(CAP), "waited"]


# -- Stop and cancellation --------------------------------------------------------------------


async def test_stop_runs_the_messages_before_it_and_fails_those_after(autojump_clock):
    work = Work()
    actor = Probe(work)
    results: dict[str, outcome.Outcome[Any]] = {}
    with trio.fail_after(2 * LONG):
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            gate = await busy(ref)
            ref.tell_nowait(Echo(1))
            nursery.start_soon(capture, results, "before", ref, Echo(2))
            await wait_all_tasks_blocked()
            ref.tell_nowait(Stop())
            nursery.start_soon(capture, results, "behind", ref, Echo(3))
            await wait_all_tasks_blocked()
            assert ref.queued == CAP
            gate.set()
        # The nursery exited: run returned on its own.
    assert actor.echoes == [1, 2]
    assert results["before"].unwrap() == 2
    with pytest.raises(ActorDied):
        results["behind"].unwrap()
    assert work.count == 0
    with pytest.raises(ActorDied):
        ref.tell_nowait(Echo(4))
    with pytest.raises(ActorDied):
        await ref.tell(Echo(5))
    with pytest.raises(ActorDied):
        await ref.ask(Echo(6), timeout=LONG)
    assert work.count == 0
    assert actor.echoes == [1, 2]


async def test_ask_stop_is_answered(autojump_clock):
    actor = Probe(Work())
    with trio.fail_after(2 * LONG):
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            assert await ref.ask(Stop(), timeout=LONG) is None


async def test_stop_fails_deferred_replies_and_cancels_spawned_tasks(autojump_clock):
    work = Work()
    actor = Probe(work)
    results: dict[str, outcome.Outcome[Any]] = {}
    with trio.fail_after(2 * LONG):
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            nursery.start_soon(capture, results, "deferred", ref, Defer("x", trio.Event()))
            nursery.start_soon(capture, results, "kept", ref, Keep())
            await ref.ask(Forever(counted=True), timeout=LONG)
            await ref.tell(Stop())
    for key in ("deferred", "kept"):
        with pytest.raises(ActorDied):
            results[key].unwrap()
    assert actor.finished == ["counted"]
    assert work.count == 0


async def test_asks_in_flight_when_the_actor_is_cancelled_get_actor_died(autojump_clock):
    work = Work()
    actor = Probe(work)
    results: dict[str, outcome.Outcome[Any]] = {}
    with trio.fail_after(2 * LONG):
        async with trio.open_nursery() as askers:
            async with trio.open_nursery() as nursery:
                ref = await nursery.start(actor.run)
                askers.start_soon(capture, results, "deferred", ref, Defer("x", trio.Event()))
                await wait_all_tasks_blocked()
                askers.start_soon(capture, results, "kept", ref, Keep())
                await wait_all_tasks_blocked()
                askers.start_soon(capture, results, "handling", ref, Hold(trio.Event()))
                await wait_all_tasks_blocked()
                askers.start_soon(capture, results, "queued", ref, Echo(1))
                await wait_all_tasks_blocked()
                assert not results
                nursery.cancel_scope.cancel()
    assert set(results) == {"deferred", "kept", "handling", "queued"}
    for key, result in results.items():
        with pytest.raises(ActorDied):
            result.unwrap()
        assert key
    assert work.count == 0


async def test_cancel_leaves_no_task_behind(autojump_clock):
    work = Work()
    actor = Probe(work)
    with trio.fail_after(2 * LONG):
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            await ref.ask(Forever(counted=True), timeout=LONG)
            await ref.ask(Forever(counted=False), timeout=LONG)
            await wait_all_tasks_blocked()
            assert work.count == 1  # only the counted task is work in flight
            nursery.cancel_scope.cancel()
    assert sorted(actor.finished) == ["counted", "uncounted"]
    assert work.count == 0


async def test_a_task_spawned_once_the_actor_stopped_fails_as_a_dead_actor(autojump_clock):
    """Not with trio's own ``Nursery is closed to new arrivals``, which reached a user through
    a publish that the host's stop cut short after its channel had stopped."""
    work = Work()
    actor = Probe(work)
    with trio.fail_after(2 * LONG):
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            assert actor.running
            await ref.ask(Stop(), timeout=LONG)
    assert not actor.running
    with pytest.raises(ActorDied):
        actor.spawn(actor._forever, "late")
    assert work.count == 0


# -- Work -------------------------------------------------------------------------------------


async def test_wait_idle_returns_at_once_at_zero(autojump_clock):
    work = Work()
    start = trio.current_time()
    with trio.fail_after(1):
        await work.wait_idle()
    assert trio.current_time() == start


async def test_work_counts_everything_and_wait_idle_returns_only_at_zero(autojump_clock):
    work = Work()
    actor = Probe(work)
    idle = trio.Event()
    results: dict[str, outcome.Outcome[Any]] = {}

    async def waiter() -> None:
        await work.wait_idle()
        idle.set()

    async with running(actor) as (ref, nursery):
        later = trio.Event()
        nursery.start_soon(capture, results, "deferred", ref, Defer("later", later))
        await wait_all_tasks_blocked()
        gate = await busy(ref)
        for i in range(CAP):
            ref.tell_nowait(Echo(i))
        nursery.start_soon(waiter)
        await wait_all_tasks_blocked()
        assert work.count == 1 + 1 + CAP  # deferred task, held message, queue
        assert not idle.is_set()

        gate.set()
        await wait_all_tasks_blocked()
        assert work.count == 1
        assert not idle.is_set()

        later.set()
        await wait_all_tasks_blocked()
        assert work.count == 0
        assert idle.is_set()
        assert results["deferred"].unwrap() == "later"


async def test_wait_idle_is_not_fooled_by_work_that_starts_just_after_zero(autojump_clock):
    work = Work()
    work.inc()
    idle = trio.Event()

    async def waiter() -> None:
        await work.wait_idle()
        idle.set()

    async def handover() -> None:
        # One piece of work ends and, a scheduling round later, the next one starts (as a
        # callback landing through run_sync_soon does).
        work.dec()
        await trio.lowlevel.checkpoint()
        work.inc()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await wait_all_tasks_blocked()
        nursery.start_soon(handover)
        await wait_all_tasks_blocked()
        assert work.count == 1
        assert not idle.is_set()
        work.dec()
        await wait_all_tasks_blocked()
        assert idle.is_set()


def test_work_counter_rules():
    work = Work()
    work.inc(3)
    assert work.count == 3
    work.dec()
    work.dec(2)
    assert work.count == 0
    work.dec()  # never below zero
    assert work.count == 0
    work.inc()
    assert work.count == 1


# -- a property over random operation sequences -----------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("tell_nowait"), st.integers()),
        st.tuples(st.just("tell"), st.integers()),
        st.tuples(st.just("ask"), st.integers()),
        st.tuples(st.just("fail"), st.text(alphabet="abc", max_size=4)),
        st.tuples(st.just("defer"), st.integers()),
        st.just(("release", None)),
        st.just(("settle", None)),
    ),
    max_size=40,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_mailbox_and_work_follow_the_model(script: list[tuple[str, Any]]) -> None:
    """Model: an actor waiting for mail takes one message in hand at once, then CAP queue;
    every accepted message is handled once, in order; Work counts queue, hand and deferrals."""

    async def main() -> None:
        work = Work()
        actor = Probe(work)
        expected: list[Any] = []
        gates: list[trio.Event] = []
        deferred: dict[str, outcome.Outcome[Any]] = {}
        waiting, queued = True, 0  # the actor waits for mail; nothing queued

        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            await wait_all_tasks_blocked()
            for n, (op, arg) in enumerate(script):
                if op == "tell_nowait":
                    if waiting or queued < CAP:
                        ref.tell_nowait(Echo(arg))
                        expected.append(arg)
                        if waiting:
                            waiting = False
                        else:
                            queued += 1
                    else:
                        with pytest.raises(MailboxFull):
                            ref.tell_nowait(Echo(arg))
                else:
                    if op == "tell":
                        await ref.tell(Echo(arg))
                        expected.append(arg)
                    elif op == "ask":
                        assert await ref.ask(Echo(arg), timeout=LONG) == arg
                        expected.append(arg)
                    elif op == "fail":
                        with pytest.raises(ValueError, match=f"^{arg}$"):
                            await ref.ask(Fail(arg), timeout=LONG)
                    elif op == "defer":
                        gates.append(trio.Event())
                        nursery.start_soon(
                            capture, deferred, f"{n}:{arg}", ref, Defer(arg, gates[-1])
                        )
                    elif op == "release":
                        for gate in gates:
                            gate.set()
                    await wait_all_tasks_blocked()
                    waiting, queued = True, 0
                pending = sum(not g.is_set() for g in gates)
                assert ref.queued == queued
                assert work.count == (not waiting) + queued + pending

            for gate in gates:
                gate.set()
            await wait_all_tasks_blocked()
            with trio.fail_after(2 * LONG):
                await work.wait_idle()
            assert work.count == 0
            assert actor.echoes == expected
            for key, result in deferred.items():
                assert result.unwrap() == int(key.split(":")[1])
            assert len(deferred) == len(gates)
            assert await ref.ask(Stop(), timeout=LONG) is None

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_many_kept_replies_answered_or_abandoned_exactly_once(autojump_clock):
    work = Work()
    actor = Probe(work)
    results: dict[str, outcome.Outcome[Any]] = {}
    count = 3 * 64  # more replies than the actor holds before it forgets answered ones
    with trio.fail_after(2 * LONG):
        async with trio.open_nursery() as nursery:
            ref = await nursery.start(actor.run)
            for i in range(count):
                nursery.start_soon(capture, results, str(i), ref, Keep())
                await wait_all_tasks_blocked()
            assert len(actor.kept) == count
            for i, reply in enumerate(actor.kept):
                if i % 2 == 0:
                    reply.value(i)
            await wait_all_tasks_blocked()
            await ref.tell(Stop())
    assert len(results) == count
    for i in range(count):
        if i % 2 == 0:
            assert results[str(i)].unwrap() == i
        else:
            with pytest.raises(ActorDied):
                results[str(i)].unwrap()
    assert work.count == 0


# -- asks served in the asker's task ------------------------------------------------------------


@attrs.frozen(eq=False)
class Here:
    """Served in the asker's task: answers which task served it, once ``gate`` is set."""

    gate: trio.Event


class Inline(Probe):
    """A Probe that serves ``Here`` in the asker's task; everything else goes by its mailbox."""

    def __init__(self, work: Work) -> None:
        super().__init__(work)
        self.started_here = 0

    def serve_inline(self, msg: Any) -> Any:
        return self._here(msg) if isinstance(msg, Here) else None

    async def _here(self, msg: Here) -> trio.lowlevel.Task:
        self.started_here += 1  # before any wait: at the moment of the ask
        await msg.gate.wait()
        return trio.lowlevel.current_task()


async def test_an_ask_the_actor_serves_inline_runs_in_the_askers_task(autojump_clock):
    work = Work()
    actor = Inline(work)
    async with running(actor) as (ref, _):
        gate = await busy(ref)  # the loop is stuck in a handler: the mailbox could not serve it
        opened = trio.Event()
        opened.set()
        assert await ref.ask(Here(opened), timeout=LONG) is trio.lowlevel.current_task()
        assert actor.started_here == 1
        assert not any(isinstance(m, Here) for m in actor.seen)  # never in the mailbox
        gate.set()
        assert await ref.ask(Echo(1), timeout=LONG) == 1  # the rest still goes by the mailbox


async def test_an_inline_ask_starts_at_once_and_counts_as_work_until_answered(autojump_clock):
    work = Work()
    actor = Inline(work)
    async with running(actor) as (ref, nursery):
        await wait_all_tasks_blocked()
        assert work.count == 0
        gate = trio.Event()
        results: dict[str, outcome.Outcome[Any]] = {}
        nursery.start_soon(capture, results, "here", ref, Here(gate))
        await wait_all_tasks_blocked()
        assert actor.started_here == 1 and work.count == 1
        gate.set()
        await wait_all_tasks_blocked()
        assert isinstance(results["here"], outcome.Value) and work.count == 0


async def test_an_inline_ask_past_its_deadline_is_cut_short_and_times_out(autojump_clock):
    work = Work()
    async with running(Inline(work)) as (ref, _):
        with pytest.raises(AskTimeout):
            await ref.ask(Here(trio.Event()), timeout=5)
        assert work.count == 0


async def test_an_inline_ask_after_the_actor_stopped_fails_as_a_dead_actor(autojump_clock):
    work = Work()
    actor = Inline(work)
    async with running(actor) as (ref, _):
        await ref.ask(Stop(), timeout=LONG)
        opened = trio.Event()
        opened.set()
        with pytest.raises(ActorDied):
            await ref.ask(Here(opened), timeout=LONG)
        assert actor.started_here == 0


@attrs.frozen(eq=False)
class Note:
    """Taken in the sender's task while the actor is idle (``fail``: the taking raises)."""

    tag: str
    fail: bool = False


class WhenIdle(Probe):
    """A Probe that takes ``Note`` inline while it is idle, and by its mailbox otherwise; it
    records where each note was taken, in the order taken."""

    def __init__(self, work: Work) -> None:
        super().__init__(work)
        self.taken: list[tuple[str, str]] = []  # (tag, "inline" or "mailbox")
        self.tasks: list[trio.lowlevel.Task] = []

    def serve_inline(self, msg: Any) -> Any:
        return self._take(msg, "inline") if isinstance(msg, Note) and self.idle else None

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Note):
            await self._take(msg, "mailbox")
            reply.value(None)
        else:
            await super().handle(msg, reply)

    async def _take(self, msg: Note, where: str) -> None:
        self.tasks.append(trio.lowlevel.current_task())
        if msg.fail:
            raise ValueError(f"note {msg.tag} failed")
        self.taken.append((msg.tag, where))


async def test_a_tell_served_inline_is_taken_in_the_tellers_task_without_a_round(
    autojump_clock,
):
    work = Work()
    actor = WhenIdle(work)
    async with running(actor) as (ref, _):
        await wait_all_tasks_blocked()
        assert actor.idle
        await ref.tell_promptly(Note("a"))
        assert actor.taken == [("a", "inline")]  # done when the tell returns
        assert actor.tasks == [trio.lowlevel.current_task()]
        assert work.count == 0


async def test_an_idle_only_message_waits_its_turn_while_the_loop_is_busy_or_mail_waits(
    autojump_clock,
):
    actor = WhenIdle(Work())
    async with running(actor) as (ref, _):
        gate = await busy(ref)  # the loop is inside a handler: not idle
        assert not actor.idle
        await ref.tell_promptly(Note("while-busy"))
        await ref.tell_promptly(Note("after-it"))  # one waits in the mailbox: still not idle
        assert actor.taken == []
        gate.set()
        await wait_all_tasks_blocked()
        assert actor.taken == [("while-busy", "mailbox"), ("after-it", "mailbox")]
        assert actor.idle
        await ref.tell_promptly(Note("idle-again"))
        assert actor.taken[-1] == ("idle-again", "inline")


async def test_a_failing_inline_tell_is_logged_not_raised_and_leaves_no_work(
    autojump_clock, caplog
):
    work = Work()
    actor = WhenIdle(work)
    async with running(actor) as (ref, _):
        await wait_all_tasks_blocked()
        with caplog.at_level(logging.ERROR, logger="mcplive"):
            await ref.tell_promptly(Note("x", fail=True))
        assert "note x failed" in caplog.text
        assert work.count == 0
        assert await ref.ask(Echo(2), timeout=LONG) == 2  # the actor goes on
