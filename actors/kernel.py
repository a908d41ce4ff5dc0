"""A small actor kernel on trio.

Each actor owns one bounded mailbox and one loop task; its state is touched only by its own tasks.
Others send it immutable messages: ``tell`` (fire and forget, waits when the mailbox is full),
``tell_nowait`` (raises ``MailboxFull``) and ``ask`` (a one-shot reply channel travels in the
envelope; the asker waits under a deadline). A handler answers through its ``Reply``; it may keep
the reply and answer later from a child task (a deferred reply), so the loop never waits on
another actor's slow work.

An actor may answer some asks in the asker's own task (:meth:`Actor.serve_inline`): a message
whose handler would only start a task of the actor's to do the work (a connection's call to its
server) is served where it was asked, so it costs neither the mailbox's scheduling round nor a
task's start. What such a handler does before its first wait runs at once against the actor's
state, as the loop would run it; nothing else of the actor runs meanwhile (one thread), so it
keeps to the actor's rules. It is not ordered after messages still queued in the mailbox: only
messages whose handling never depended on that order may be served this way, unless the actor
serves them only while it is :attr:`~Actor.idle` (nothing queued, no handler running), when
everything sent before has been handled. ``tell_promptly`` serves such a message inline too.

``Work`` counts the work in flight across the host (queued messages, requests being served,
running turns, writes not yet committed) so ``Host.run_until_idle`` can wait for zero.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import outcome
import trio

from protocol.backoff import ceiling

from .errors import ActorDied, AskTimeout, MailboxFull

log = logging.getLogger("mcplive")

M = TypeVar("M")


class Work:
    """A counter of work in flight, with a wait for zero."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = trio.Event()
        self._idle.set()

    def inc(self, n: int = 1) -> None:
        if self.count == 0:
            self._idle = trio.Event()
        self.count += n

    def dec(self, n: int = 1) -> None:
        self.count -= n
        if self.count <= 0:
            self.count = 0
            self._idle.set()

    async def wait_idle(self) -> None:
        # Zero must hold across a few scheduling rounds: callbacks from threads land through
        # ``run_sync_soon`` and may start new work.
        stable = 0
        while stable < 3:
            await self._idle.wait()
            await trio.lowlevel.checkpoint()
            stable = stable + 1 if self.count == 0 else 0


class Reply:
    """The answer slot of one message. A ``tell`` carries a reply that discards everything.

    An ask waits on the slot's event; the answer (or, when the message was abandoned, none:
    ``result`` stays None) is in place before the event is set. One event and one slot per
    ask: cheaper than a channel, which an answer given once does not need."""

    __slots__ = ("_done", "_event", "result")

    def __init__(self, event: trio.Event | None) -> None:
        self._event = event
        self._done = event is None
        self.result: outcome.Outcome[Any] | None = None

    @property
    def done(self) -> bool:
        return self._done

    def value(self, value: Any = None) -> None:
        self._finish(outcome.Value(value))

    def error(self, exc: BaseException) -> None:
        self._finish(outcome.Error(exc))

    def _finish(self, result: outcome.Outcome[Any] | None) -> None:
        if self._done:
            return
        self._done = True
        self.result = result
        assert self._event is not None
        self._event.set()  # an asker that gave up is no longer waiting: nothing happens

    def abandon(self) -> None:
        """Close without an answer: the asker gets ``ActorDied``."""
        if self._event is not None:
            self._finish(None)

    async def wait(self) -> None:
        """Until the message is answered or abandoned (at once for a ``tell``)."""
        if self._event is not None:
            await self._event.wait()


@attrs.frozen
class Envelope:
    msg: Any
    reply: Reply


#: What an actor serves in the asker's task: the answer's coroutine, or None for the mailbox.
Inline = Callable[[Any], Awaitable[Any] | None]


@attrs.frozen(eq=False)
class ActorRef(Generic[M]):
    name: str
    _send: trio.MemorySendChannel[Envelope]
    _work: Work
    _inline: Inline | None = None

    async def tell(self, msg: M) -> None:
        await self._put(Envelope(msg, Reply(None)))

    async def _put(self, env: Envelope, *, promptly: bool = False) -> None:
        """Queue a counted envelope, waiting while the mailbox is full; a message that was not
        queued (deadline, cancellation, stopped actor) is not work in flight. ``promptly``:
        without a scheduling round while the mailbox has room (a cancelled caller still stops
        here)."""
        self._work.inc()
        try:
            if promptly:
                await trio.lowlevel.checkpoint_if_cancelled()  # no round unless cancelled
                try:
                    self._send.send_nowait(env)
                    return
                except trio.WouldBlock:
                    pass
            await self._send.send(env)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._work.dec()
            raise ActorDied(self.name) from None
        except BaseException:
            self._work.dec()
            raise

    def tell_nowait(self, msg: M) -> None:
        self._work.inc()
        try:
            self._send.send_nowait(Envelope(msg, Reply(None)))
        except trio.WouldBlock:
            self._work.dec()
            raise MailboxFull(self.name) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._work.dec()
            raise ActorDied(self.name) from None

    async def tell_promptly(self, msg: M) -> None:
        """``tell`` that yields to the scheduler only when the mailbox is full: a task telling
        many actors in a row (one message each) does it in one step, not one scheduling round
        per actor. The caller must checkpoint elsewhere in its loop. A message the actor serves
        inline is handled here and now; its failure is logged, as the loop would log it."""
        serving = self._inline(msg) if self._inline is not None else None
        if serving is None:
            await self._put(Envelope(msg, Reply(None)), promptly=True)
            return
        self._work.inc()
        try:
            await serving
        except Exception:
            log.exception("%s: handling %r failed", self.name, msg)
        finally:
            self._work.dec()

    async def ask(self, msg: M, *, timeout: float) -> Any:
        serving = self._inline(msg) if self._inline is not None else None
        if serving is not None:
            return await self._served_here(serving, msg, timeout)
        reply = Reply(trio.Event())
        with trio.CancelScope(deadline=trio.current_time() + timeout):
            # queued at once while the mailbox has room: the wait for the answer is this
            # call's checkpoint (one scheduling round fewer per ask)
            await self._put(Envelope(msg, reply), promptly=True)
            await reply.wait()
        if not reply.done:  # only this deadline ends the wait unanswered
            raise AskTimeout(f"{self.name} did not answer {type(msg).__name__} in {timeout}s")
        if reply.result is None:
            raise ActorDied(self.name)
        return reply.result.unwrap()

    async def _served_here(self, serving: Awaitable[Any], msg: M, timeout: float) -> Any:
        """An ask the actor serves in this task (:meth:`Actor.serve_inline`), under the ask's
        deadline, counted as work in flight while it runs."""
        self._work.inc()
        try:
            with trio.move_on_after(timeout):
                return await serving
        finally:
            self._work.dec()
        raise AskTimeout(f"{self.name} did not answer {type(msg).__name__} in {timeout}s")

    @property
    def queued(self) -> int:
        return self._send.statistics().current_buffer_used


class Stop:
    """Ask an actor to stop after the messages queued before it."""


class Actor:
    """Base class: subclasses implement ``handle(msg, reply)`` and may override ``on_start``.

    ``handle`` must return quickly: slow work goes to ``self.spawn`` (a child task in the actor's
    own nursery) with the reply kept for later.
    """

    mailbox_size = 64

    def __init__(self, name: str, work: Work) -> None:
        self.name = name
        self.work = work
        self._nursery: trio.Nursery | None = None
        self.ref: ActorRef[Any] | None = None
        # Replies a handler kept for later; any still open when the actor ends are abandoned.
        self._open_replies: set[Reply] = set()
        self._prune_at = 64
        self._serving = False  # between the start and the end of the loop
        self._handling = False  # while the loop is inside ``handle``

    async def on_start(self) -> None:
        """Runs before the first message (the nursery is already open)."""

    async def handle(self, msg: Any, reply: Reply) -> None:
        raise NotImplementedError

    def serve_inline(self, msg: Any) -> Awaitable[Any] | None:
        """The answer to an ask of ``msg``, to be awaited in the asker's task (see the module
        docstring), or None to queue it in the mailbox. Called only while the actor runs;
        returns None unless a subclass serves some message this way."""
        return None

    @property
    def idle(self) -> bool:
        """Nothing waits in the mailbox and the loop is not inside a handler: an ask served
        inline now comes after everything sent to the actor before it."""
        return not self._handling and self.ref is not None and not self.ref.queued

    def _inline(self, msg: Any) -> Awaitable[Any] | None:
        return self.serve_inline(msg) if self._serving else None

    @property
    def running(self) -> bool:
        """The loop serves messages: the actor has started and not yet stopped."""
        return self._serving

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, counted: bool = True) -> None:
        """Run ``fn(*args)`` in the actor's nursery; a counted task is work in flight. Raises
        ``ActorDied`` once the actor's nursery has closed."""
        assert self._nursery is not None, "actor not started"
        if counted:
            self.work.inc()
        try:
            self._nursery.start_soon(self._guarded, fn, args, counted)
        except RuntimeError:  # the nursery closed: the actor has stopped
            if counted:
                self.work.dec()
            raise ActorDied(self.name) from None

    async def _guarded(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], counted: bool
    ) -> None:
        try:
            await fn(*args)
        except Exception as exc:
            log.exception("%s: task %s failed", self.name, getattr(fn, "__name__", fn))
            for arg in args:
                if isinstance(arg, Reply):
                    arg.error(exc)  # the asker gets the failure instead of waiting for ever
        finally:
            if counted:
                self.work.dec()

    async def run(
        self, *, task_status: trio.TaskStatus[ActorRef[Any]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        send, recv = trio.open_memory_channel[Envelope](self.mailbox_size)
        inline = self._inline if type(self).serve_inline is not Actor.serve_inline else None
        self.ref = ActorRef(self.name, send, self.work, inline)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self.on_start()
                self._serving = True
                task_status.started(self.ref)
                try:
                    async for env in recv:
                        try:
                            if isinstance(env.msg, Stop):
                                env.reply.value(None)
                                break
                            self._handling = True
                            try:
                                await self.handle(env.msg, env.reply)
                            except Exception as exc:
                                if env.reply.done:
                                    log.exception("%s: handling %r failed", self.name, env.msg)
                                env.reply.error(exc)
                        finally:
                            self._handling = False
                            if not env.reply.done:
                                self._keep_open(env.reply)
                            self.work.dec()
                finally:
                    self._serving = False  # an ask from now on finds the actor stopped
                    # Anything still queued will never be handled: release its counts and askers.
                    self._drain(recv)
                    recv.close()
                    nursery.cancel_scope.cancel()
        finally:
            # Replies kept for later (deferred, or cut short by cancellation) will never be
            # answered now: their askers get ActorDied instead of waiting for their deadline.
            for reply in self._open_replies:
                reply.abandon()
            self._open_replies.clear()

    def _keep_open(self, reply: Reply) -> None:
        self._open_replies.add(reply)
        if len(self._open_replies) >= self._prune_at:
            self._open_replies = {r for r in self._open_replies if not r.done}
            self._prune_at = max(64, 2 * len(self._open_replies))

    def _drain(self, recv: trio.MemoryReceiveChannel[Envelope]) -> None:
        while True:
            try:
                env = recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            env.reply.abandon()
            self.work.dec()


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry number ``attempt`` (1 for the first retry).

    The ceiling (:func:`protocol.backoff.ceiling`) doubles per attempt,
    ``min(cap, base * 2**(attempt-1))``, and the delay is drawn
    uniformly from ``[ceiling/2, ceiling]`` ("equal jitter"): never above ``cap``, never below
    half the ceiling.
    """
    top = ceiling(attempt, base, cap)
    return top / 2 + rng.random() * top / 2


class BatchQueue(Generic[M]):
    """A bounded FIFO between one producer task and one consumer task that hands the consumer
    everything accumulated since its last take (adaptive batching): under load the batches grow
    and per-batch costs are shared; when idle, a single item goes through at once.

    ``put_many`` waits while the queue holds ``cap`` items or more (backpressure); ``take`` waits
    for at least one item and returns at most ``limit``. ``close`` ends the consumer's loop.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._items: deque[M] = deque()
        self._data = trio.lowlevel.ParkingLot()
        self._space = trio.lowlevel.ParkingLot()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    async def put_many(self, items: list[M]) -> None:
        while len(self._items) >= self.cap and not self._closed:
            await self._space.park()
        if self._closed:
            raise trio.ClosedResourceError("queue closed")
        self._items.extend(items)
        self._data.unpark_all()
        await trio.lowlevel.checkpoint()

    async def wait_below(self, n: int, unless: Callable[[], bool] | None = None) -> None:
        """Wait until the queue holds fewer than ``n`` items (or is closed), or until
        ``unless()`` holds: it is checked now and whenever :meth:`nudge` is called."""
        while len(self._items) >= n and not self._closed:
            if unless is not None and unless():
                return
            await self._space.park()

    def nudge(self) -> None:
        """Have every waiting producer look again (a condition of its ``unless`` changed)."""
        self._space.unpark_all()

    async def take(self, limit: int) -> list[M]:
        while not self._items:
            if self._closed:
                raise trio.EndOfChannel
            await self._data.park()
        n = min(limit, len(self._items))
        batch = [self._items.popleft() for _ in range(n)]
        self._space.unpark_all()
        return batch

    def close(self) -> None:
        self._closed = True
        self._data.unpark_all()
        self._space.unpark_all()
