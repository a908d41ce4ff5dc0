"""The host's store writer: a trio task that hands batches to the store process.

It keeps the rules of :class:`store.writer.GroupCommitWriter` (which stays for synchronous
users): ops are committed in submission order, in batches of every op waiting (at most
``max_batch``); ops that are all bulk gather up to ``bulk_gap`` seconds after the previous commit
(:func:`store.writer.bulk_wait`, on trio's clock); each batch's message rows go to ``on_commit``
before any of its ops' ``done`` callbacks run, and a ``done`` runs only once its op is committed
(or has failed). At most ``max_queue`` ops wait; :meth:`StoreWriter.submit_many` raises
:class:`~store.errors.StoreFull` past that.

What differs is where it runs. The thread writer's pipe calls each waited for the interpreter
lock, and its results reached trio through ``run_sync_soon``, one scheduling round later. Here a
system task writes each pickled batch to the store process's stdin and reads the answer from its
stdout through trio's own pipes, and calls the callbacks in the trio thread, so a commit costs the
host no thread hand-off at all.

The store process (:mod:`store.writer_child`) is started from the trio thread and dies with it
(Linux). When it ends in the middle of a batch, that batch fails with
:class:`~store.errors.StoreError`, ``on_commit`` is told there may be a gap, and the next batch
starts a new process. :meth:`StoreWriter.aclose` commits every queued op, then lets the process
end after its last batch; when the process has not answered within the close's time limit (stuck
on its disk), :meth:`StoreWriter.abort` kills it and fails what it had not committed. A trio run
that ends without a close does the same. Nothing that fails this way was acknowledged.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, Unpack

import trio

from store import StoreClosed, StoreError
from store.items import WrittenRow
from store.records import Op
from store.writer import Done, WriterLimits, WriterRules, settle
from store.writer_process import (
    INCOMPLETE,
    PIPE_ERRORS,
    check_ready,
    end,
    frame,
    spawn,
    start_child,
    take_frame,
    unpack_answer,
)

from .prompt_io import write_promptly

log = logging.getLogger(__name__)

#: How many bytes one read of the store process's answers asks for.
READ_SIZE = 1 << 20


class _Process:
    """One store process and trio's ends of its pipes."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdin is not None and child.stdout is not None
        self.child = child
        self.to = trio.lowlevel.FdStream(os.dup(child.stdin.fileno()))
        self.back = trio.lowlevel.FdStream(os.dup(child.stdout.fileno()))
        child.stdin.close()
        child.stdout.close()
        self.buffer = bytearray()

    async def receive(self) -> Any:
        """The next answer, or None when the process closed its end."""
        while (value := take_frame(self.buffer)) is INCOMPLETE:
            data = await self.back.receive_some(READ_SIZE)
            if not data:
                if self.buffer:
                    raise EOFError("pipe closed inside a frame")
                return None
            self.buffer += data
        return value

    async def finish(self) -> None:
        """Close the process's stdin and wait, without blocking trio, until it has ended."""
        self.to.close()
        try:
            while await self.back.receive_some(READ_SIZE):
                pass  # it answers nothing more: its stdout closes as it exits
        except trio.ClosedResourceError:
            return  # aborted meanwhile: it was killed
        self.end()

    def end(self, *, kill: bool = False) -> None:
        """Close the pipes and wait for the process to end (after the batch in hand, unless
        ``kill``)."""
        self.to.close()
        self.back.close()
        end(self.child, kill=kill)


class StoreWriter(WriterRules):
    """Serializes the host's writes through one trio task, committing in groups (see the module
    docstring). Ops may be submitted before :meth:`start`; they are committed once it runs."""

    def __init__(self, path: str | os.PathLike[str], **limits: Unpack[WriterLimits]) -> None:
        super().__init__(path, **limits)
        self._wake = trio.Event()  # set when an op that ends a wait is queued, or on close
        self._started = False
        self._stopped = trio.Event()
        self._ended = threading.Event()  # set with _stopped, for a wait in real time
        self._process: _Process | None = None
        self._gap = False  # a process ended before it reported what it committed last
        #: Told how long each batch took, from its hand-over to the store process to the
        #: answer (seconds of trio's clock), failed batches too.
        self.on_commit_time: Callable[[float], object] | None = None

    def start(self) -> None:
        """Start the store process and the task (in the trio thread). Raises
        :class:`StoreError` when the store cannot be opened."""
        if self._closing:
            raise StoreClosed("writer is closed")
        if self._started:
            raise RuntimeError("writer already started")
        self._process = _Process(start_child(self.path))
        self._started = True
        self._committed_at = trio.current_time()
        trio.lowlevel.spawn_system_task(self._run, name="mcplive-store-writer")

    @property
    def store_pid(self) -> int | None:
        """The store process's id (None between a process's end and the next batch)."""
        return self._process.child.pid if self._process is not None else None

    def submit(self, op: Op, done: Done) -> None:
        """Queue one prompt op (see :meth:`submit_many`)."""
        self.submit_many([(op, done)])

    def submit_many(self, items: Sequence[tuple[Op, Done]], *, bulk: bool = False) -> None:
        """Queue ops, all or none; each ``done(outcome)`` runs once its op is committed or has
        failed. Raises :class:`StoreFull` when they do not all fit under ``max_queue`` and
        :class:`StoreClosed` after :meth:`aclose`; then no ``done`` will be called."""
        if self._enqueue(items, bulk):
            self._wake.set()

    async def aclose(self, timeout: float | None = None) -> None:
        """Stop taking ops, commit every queued one, and let the store process end; shielded
        from cancellation. After ``timeout`` seconds (real time; None: no limit) it gives up
        (:meth:`abort`)."""
        if not self._started and self._queue:
            try:
                self.start()  # ops were queued before the start: they are committed too
            except StoreError:
                self.abort()  # nothing queued waits forever
                raise
        self._closing = True
        self._wake.set()
        if not self._started:
            return
        # real time, whatever trio's clock: a test's clock that jumps ahead while the process
        # commits must not make the close give up (the thread cannot be cancelled either)
        ended = await trio.to_thread.run_sync(self._ended.wait, timeout)
        if not ended:  # the store process does not answer: give up on it
            self.abort()
        with trio.CancelScope(shield=True):
            await self._stopped.wait()  # at once when aborted: its batch fails as it dies

    async def _run(self) -> None:
        try:
            while (batch := await self._take()) is not None:
                await self._commit(batch)
            if self._process is not None:
                await self._process.finish()
                self._process = None
        except Exception:  # a system task must not raise: what is left fails below
            log.exception("store writer stopped")
        finally:
            self._closing = True
            self._drop()  # only when cancelled (the run ended without a close): nothing it
            self._fail_queued()  # held or still waits was acknowledged
            self._stopped.set()
            self._ended.set()

    def abort(self) -> None:
        """Give up on what is not committed yet (a close that took too long): every op still
        queued fails with :class:`StoreClosed`, the store process is killed (the batch it held
        fails, unacknowledged), and the task ends."""
        self._closing = True
        self._fail_queued()
        self._drop()
        self._wake.set()

    def _fail_queued(self) -> None:
        waiting = self._take_all()
        settle(waiting, [StoreClosed("writer stopped") for _ in waiting])

    async def _take(self) -> list[tuple[Op, Done]] | None:
        while (wait := self._wait_before_take(trio.current_time())) != 0:
            if wait is None:
                return None
            with trio.move_on_after(wait):  # an op that ends the wait, or close, ends it sooner
                await self._wait()
        return self._pop_batch()

    async def _wait(self) -> None:
        self._wake = trio.Event()
        await self._wake.wait()

    async def _commit(self, batch: list[tuple[Op, Done]]) -> None:
        outcomes: Sequence[object]
        began = trio.current_time()
        try:
            outcomes, rows = await self._apply([op for op, _ in batch])
        except StoreError as exc:
            outcomes, rows = [StoreError(str(exc)) for _ in batch], []
        except Exception as exc:
            log.exception("store batch failed")
            outcomes, rows = [StoreError(f"store write failed: {exc}") for _ in batch], []
        gap, self._gap = self._gap, False
        self._told(rows, gap)
        self._committed_at = trio.current_time()
        self._count(len(batch))
        if self.on_commit_time is not None:
            self.on_commit_time(self._committed_at - began)
        settle(batch, outcomes)

    async def _apply(self, ops: list[Op]) -> tuple[Sequence[object], list[WrittenRow]]:
        """The batch's outcomes and committed rows, from the store process (a new one if the
        last ended); raises :class:`StoreError` when the process ends before it answers."""
        process = self._process
        try:
            if process is None or process.child.poll() is not None:
                process = await self._restart(process)
            await write_promptly(process.to, frame(ops))
            answer = await process.receive()
        except (*PIPE_ERRORS, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            answer = StoreError(f"store process failed: {exc}")  # closed: aborted meanwhile
        try:
            outcomes, rows, gap = unpack_answer(answer)
        except StoreError:  # the process ended: the next batch starts another
            self._drop()  # in whatever state it is, it is not trusted again
            self._gap = True  # what it committed last may not have been reported
            raise
        self._gap = self._gap or gap
        if isinstance(outcomes, StoreError):  # the batch failed as a whole, and was undone
            return [StoreError(str(outcomes)) for _ in ops], rows
        return outcomes, rows

    async def _restart(self, ended: _Process | None) -> _Process:
        """A new store process in place of one that ended between batches."""
        if ended is not None:  # it had answered every batch it was given
            self._drop()
        process = _Process(spawn(self.path))
        self._process = process
        answer = await process.receive()
        if answer != "ready":
            self._process = None
            process.to.close()
            process.back.close()
            check_ready(process.child, answer)
        return process

    def _drop(self) -> None:
        """Kill the store process, if there is one."""
        process, self._process = self._process, None
        if process is not None:
            process.end(kill=True)
