"""The group-commit writer: one dedicated thread owns the only write connection (kept in a
child process by default, :mod:`store.writer_process`).

Callers :meth:`~GroupCommitWriter.submit` ops with a ``done`` callback. The thread takes the
oldest waiting op plus every other op already waiting (up to ``max_batch``), applies them in one
transaction, commits once, and only then calls each ``done(outcome)`` in submission order. An op
is therefore durable when its callback runs, and ops reach the database in submission order.

Bulk ops (``bulk=True``: a flooding server's backlog) are committed with the others in order,
but ops that are all bulk wait up to ``bulk_gap`` seconds after the previous commit to gather
(:func:`bulk_wait`): a commit's cost is mostly its sync to disk, so a flood then costs a few
large commits instead of many small ones, and the thread is free far more often when a prompt
op (a quieter server's message, an agent's reply) comes in. A prompt op ends any wait at once
and is committed with every op queued before it.

Bound: at most ``max_queue`` ops wait for the thread; :meth:`~GroupCommitWriter.submit` raises
:class:`~store.errors.StoreFull` at that cap and the caller applies backpressure. Ops the thread
has taken (at most ``max_batch``) no longer count as waiting.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict, Unpack

import attrs

from store.dbapi import Location, as_location
from store.errors import StoreClosed, StoreError, StoreFull
from store.items import WrittenRow
from store.records import Append, Op, Outcome, PutState, RecordAudit, RecordUsage, TrimJournal
from store.sqlite import Database
from store.writer_process import DatabaseProcess

log = logging.getLogger(__name__)

#: Called from the writer thread with an op's result or the :class:`StoreError` that failed it.
#: It runs on the writer thread, so it must be quick and must not wait for other ops.
Done = Callable[[object], None]
#: Called from the writer thread after each commit, before the ``done`` callbacks of its ops,
#: with the message rows it committed (seq order) and whether some may be missing (see
#: :meth:`store.items.ItemWriter.take_committed`). Quick, like ``Done``.
CommitObserver = Callable[[list[WrittenRow], bool], None]


#: How long ops that are all bulk may gather after a commit before they are committed.
BULK_GAP_S = 0.01


def bulk_wait(
    *, queued: int, prompt: int, max_batch: int, since_commit: float, gap: float
) -> float:
    """How long the writer waits before taking a batch from ``queued`` ops, ``prompt`` of
    them not bulk, ``since_commit`` seconds after its previous commit: none while a prompt op
    waits or a full batch is there, else what is left of ``gap``."""
    if prompt > 0 or queued >= max_batch:
        return 0.0
    return max(0.0, gap - since_commit)


@attrs.frozen(kw_only=True)
class WriterStats:
    """Counters of a writer: ops applied, batches committed, and the largest batch."""

    ops: int
    batches: int
    largest_batch: int


class WriterLimits(TypedDict, total=False):
    """The keywords a writer's limits are given by (see :class:`WriterRules`)."""

    max_queue: int
    max_batch: int
    bulk_gap: float


class WriterRules:
    """What every store writer keeps (this thread's, and the host's trio task): its store, the
    queue of ops waiting (at most ``max_queue``), when to take a batch of at most ``max_batch``
    (bulk ops gather up to ``bulk_gap``), and how a commit is reported. A writer calls these
    from one thread at a time (the thread writer under its lock)."""

    def __init__(
        self,
        path: Location,
        *,
        max_queue: int = 4096,
        max_batch: int = 512,
        bulk_gap: float = BULK_GAP_S,
    ) -> None:
        if max_queue < 1 or max_batch < 1:
            raise ValueError("max_queue and max_batch must be at least 1")
        #: The store: an SQLite file or a PostgreSQL DSN (:mod:`store.dbapi`; it may hold a
        #: password: name it with :func:`store.dbapi.describe`).
        self.path: Path | str = as_location(path)
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.bulk_gap = bulk_gap
        #: Told of the message rows of each commit, before its ops' ``done`` callbacks (set
        #: before the writer starts).
        self.on_commit: CommitObserver | None = None
        self._queue: deque[tuple[Op, Done, bool]] = deque()  # (op, done, whether it is bulk)
        self._prompt = 0  # queued ops that are not bulk
        self._closing = False
        self._committed_at = 0.0  # on the writer's clock, at the end of the previous commit
        self._ops = self._batches = self._largest = 0

    def stats(self) -> WriterStats:
        return WriterStats(ops=self._ops, batches=self._batches, largest_batch=self._largest)

    def _told(self, rows: list[WrittenRow], gap: bool) -> None:
        """Tell ``on_commit`` of a commit's rows (or of a gap); its errors are logged."""
        if self.on_commit is not None and (rows or gap):
            try:
                self.on_commit(rows, gap)
            except Exception:
                log.exception("store commit observer failed")

    def _count(self, batch: int) -> None:
        """Count a batch of ``batch`` ops as applied."""
        self._ops += batch
        self._batches += 1
        self._largest = max(self._largest, batch)

    def _enqueue(self, items: Sequence[tuple[Op, Done]], bulk: bool) -> bool:
        """Queue ``items``, all or none, and say whether the writer must be woken (a prompt op
        ends any wait; a first op starts one). Raises :class:`TypeError` for what is no store
        op, :class:`StoreClosed` once closing and :class:`StoreFull` past the cap."""
        for op, _ in items:
            if not isinstance(op, Append | PutState | TrimJournal | RecordUsage | RecordAudit):
                raise TypeError(f"not a store op: {op!r}")
        if self._closing:
            raise StoreClosed("writer is closed")
        if len(self._queue) + len(items) > self.max_queue:
            raise StoreFull(f"{len(items)} ops do not fit under max_queue {self.max_queue}")
        first = not self._queue
        self._queue.extend((op, done, bulk) for op, done in items)
        if not bulk:
            self._prompt += len(items)
        return not bulk or first

    def _wait_before_take(self, now: float) -> float | None:
        """How long to wait, at ``now``, before taking a batch: ``None`` to stop (closing,
        nothing queued), ``inf`` while nothing is queued, 0 to take one now, else what is left
        of a bulk wait."""
        if not self._queue:
            return None if self._closing else math.inf
        if self._closing:
            return 0.0  # closing commits what is queued at once
        return bulk_wait(
            queued=len(self._queue),
            prompt=self._prompt,
            max_batch=self.max_batch,
            since_commit=now - self._committed_at,
            gap=self.bulk_gap,
        )

    def _pop_batch(self) -> list[tuple[Op, Done]]:
        """The oldest ops queued, at most ``max_batch``."""
        batch = []
        for _ in range(min(len(self._queue), self.max_batch)):
            op, done, bulk = self._queue.popleft()
            self._prompt -= not bulk
            batch.append((op, done))
        return batch

    def _take_all(self) -> list[tuple[Op, Done]]:
        """Every op queued, the queue emptied."""
        waiting = [(op, done) for op, done, _ in self._queue]
        self._queue.clear()
        self._prompt = 0
        return waiting


class GroupCommitWriter(WriterRules):
    """Serializes every write to the store through one thread, committing in groups.

    Ops may be submitted before :meth:`start`; they wait (within ``max_queue``) and are applied
    once the thread runs. The writer is also a context manager (start on enter, close on exit).
    """

    def __init__(
        self,
        path: Location,
        *,
        process: bool = True,
        **limits: Unpack[WriterLimits],
    ) -> None:
        super().__init__(path, **limits)
        #: Whether the write connection lives in a child process (:mod:`store.writer_process`).
        self.process = process
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._database: Database | DatabaseProcess | None = None

    def __enter__(self) -> GroupCommitWriter:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Open the database and start the writer thread. Raises :class:`StoreError` on failure."""
        with self._cond:
            if self._closing:
                raise StoreClosed("writer is closed")
            if self._thread is not None:
                raise RuntimeError("writer already started")
            self._launch_locked()

    def _launch_locked(self) -> None:
        """Start the thread, which opens the database (a child process is tied to the thread
        that starts it), and wait for it to be open; raises what stopped it."""
        opened: list[Database | DatabaseProcess | StoreError] = []
        ready = threading.Event()
        thread = threading.Thread(
            target=self._run, args=(opened, ready), name="mcplive-store-writer", daemon=True
        )
        thread.start()
        ready.wait()
        first = opened[0] if opened else StoreError("writer could not start")
        if isinstance(first, StoreError):
            thread.join()
            raise first
        self._thread = thread

    def _open(self) -> Database | DatabaseProcess:
        if self.process:
            return DatabaseProcess(self.path)
        return Database(self.path)

    def submit(self, op: Op, done: Done) -> None:
        """Queue ``op``; ``done(outcome)`` is called once it is committed (or has failed).

        Raises :class:`StoreFull` when ``max_queue`` ops are waiting and :class:`StoreClosed`
        after :meth:`close`; in both cases ``done`` will not be called.
        """
        with self._cond:
            self._enqueue([(op, done)], bulk=False)
            self._cond.notify()

    def submit_many(self, items: Sequence[tuple[Op, Done]], *, bulk: bool = False) -> None:
        """Queue several ops at once (one lock, one wake-up of the thread), all or none;
        ``bulk`` ops may gather a little before they are committed (see the module docstring).

        Raises :class:`StoreFull` when they do not all fit under ``max_queue``, and
        :class:`StoreClosed` after :meth:`close`; then no ``done`` will be called.
        """
        with self._cond:
            if self._enqueue(items, bulk):
                self._cond.notify()

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting ops, apply and commit every queued op, and join the thread.

        Returns False if the thread is still draining after ``timeout`` seconds (or when called
        from a ``done`` callback, which runs on the writer thread itself). A writer that was never
        started is started here if ops are waiting, so they are committed too.
        """
        failed: list[tuple[Op, Done]] = []
        error = StoreError("writer could not start")
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            if self._thread is None and self._queue:
                try:
                    self._launch_locked()
                except StoreError as exc:
                    failed, error = self._take_all(), exc
            thread = self._thread
        if failed:
            _fail(failed, error)
            raise error
        if thread is None:
            return True
        if thread is threading.current_thread():
            return False
        thread.join(timeout)
        return not thread.is_alive()

    @property
    def store_pid(self) -> int | None:
        """The process id of the child that holds the write connection, if there is one."""
        database = self._database
        return database.pid if isinstance(database, DatabaseProcess) else None

    def stats(self) -> WriterStats:
        with self._cond:
            return super().stats()

    def _take(self) -> list[tuple[Op, Done]] | None:
        with self._cond:
            while (wait := self._wait_before_take(time.monotonic())) != 0:
                if wait is None:
                    return None
                self._cond.wait(None if wait == math.inf else wait)  # an op or close wakes it
            return self._pop_batch()

    def _run(
        self, opened: list[Database | DatabaseProcess | StoreError], ready: threading.Event
    ) -> None:
        try:
            try:
                database = self._open()
            except Exception as exc:
                error = exc if isinstance(exc, StoreError) else StoreError(f"cannot open: {exc}")
                opened.append(error)
                return
            opened.append(database)
            self._database = database
        finally:
            ready.set()
        try:
            while (batch := self._take()) is not None:
                self._commit(database, batch)
        finally:
            database.close()
            with self._cond:
                # Only finds ops if the loop itself broke; nothing may wait forever.
                self._closing = True
                leftover = self._take_all()
            _fail(leftover, StoreClosed("writer thread stopped"))

    def _commit(self, database: Database | DatabaseProcess, batch: list[tuple[Op, Done]]) -> None:
        ops = [op for op, _ in batch]
        outcomes: list[Outcome]
        try:
            outcomes = database.apply(ops)
        except Exception as exc:
            log.exception("store batch failed")
            outcomes = [StoreError(f"store write failed: {exc}") for _ in ops]
        self._told(*database.items.take_committed())
        with self._cond:
            self._committed_at = time.monotonic()
            self._count(len(batch))
        settle(batch, outcomes)


def settle(entries: Sequence[tuple[Op, Done]], outcomes: Sequence[object]) -> None:
    """Call each entry's ``done`` with its outcome, in order; a callback's errors are logged."""
    for (_, done), outcome in zip(entries, outcomes, strict=True):
        try:
            done(outcome)
        except Exception:
            log.exception("store done callback failed")


def _fail(entries: list[tuple[Op, Done]], error: StoreError) -> None:
    settle(entries, [error] * len(entries))
