"""The trio side of the store: one writer task with group commit (:mod:`actors.store_writer`),
reads in worker threads.

``submit(op)`` waits only for an in-flight slot (backpressure at ``MAX_IN_FLIGHT`` writes not yet
committed) and returns a ``StoreFuture`` at once, so an actor can hand a write over without
waiting for the commit; whoever must not answer before the write is durable awaits the future.
Writes are committed in submission order.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from store import AppendResult, Reader, SkippedRecord
from store.dbapi import describe

from .config import HostConfig
from .fresh_feed import FreshFeeds
from .kernel import Work
from .store_writer import StoreWriter

T = TypeVar("T")

MAX_IN_FLIGHT = 4096
#: How long closing waits for the writes handed over to be committed.
CLOSE_WAIT_S = 10.0
DB_NAME = "store.sqlite3"


#: The upper bounds (seconds) of the commit-time histogram's buckets; one more counts the rest.
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class CommitTimes:
    """How long the store's commits took, as a histogram of fixed buckets (``COMMIT_BUCKETS``
    and one past the last): memory is one counter per bucket, whatever the number of commits."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(COMMIT_BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0

    def add(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        index = bisect.bisect_left(COMMIT_BUCKETS, seconds)
        self.counts[index] += 1
        self.count += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, commits at or under it) per bucket, the last bound ``inf``."""
        out, total = [], 0
        for bound, n in zip((*COMMIT_BUCKETS, math.inf), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out


class StoreFuture:
    """One op's result, settled when the batch it was submitted with is committed. The ops of a
    batch share one event: a future is only a position in its batch."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Completion, index: int) -> None:
        self._batch = batch
        self._index = index

    @property
    def done(self) -> bool:
        return self._batch.settled.is_set()

    def result(self) -> Any:
        """The result of a committed op (``done`` must be true); a failed op raises."""
        if not self._batch.settled.is_set():
            raise RuntimeError("the write is not committed yet")
        result = self._batch.results[self._index]
        if isinstance(result, BaseException):
            raise result
        return result

    async def wait(self) -> Any:
        """The op's result once it is committed; a failed op raises its ``StoreError``."""
        await self._batch.settled.wait()
        return self.result()

    async def wait_settled(self) -> None:
        """Wait until the op is committed or failed, without raising."""
        await self._batch.settled.wait()


class SettledFuture:
    """A ``StoreFuture`` for a write that was never needed (a retry already answered): settled
    from the start, its result says nothing was stored."""

    __slots__ = ("_result",)

    def __init__(self, *, stored: bool) -> None:
        self._result = AppendResult(stored=stored)

    @property
    def done(self) -> bool:
        return True

    def result(self) -> Any:
        return self._result

    async def wait(self) -> Any:
        return self._result

    async def wait_settled(self) -> None:
        return None


class _Completion:
    """The results of one ``submit_many`` of ``n`` ops, gathered as the writer calls ``done``
    once per op, in order; the last one settles the batch.

    It holds no reference to its futures (they hold it), so a settled batch is freed as soon as
    its futures are dropped, without waiting for the cycle collector."""

    __slots__ = ("client", "n", "results", "settled")

    def __init__(self, client: StoreClient, n: int) -> None:
        self.client = client
        self.n = n
        self.results: list[object] = []
        self.settled = trio.Event()

    def done(self, result: object) -> None:
        self.results.append(result)
        if len(self.results) == self.n:
            self.settled.set()
            self.client._free(self.n)
            self.client.work.dec(self.n)


class StoreClient:
    """The host's store: ``data_dir``'s embedded SQLite file, or the PostgreSQL database at
    ``location`` (a DSN) when one is given (see :func:`open_store`). Both behave alike."""

    def __init__(self, data_dir: Path, work: Work, *, location: str | None = None) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        where: Path | str = location if location is not None else data_dir / DB_NAME
        #: How the store is named to operators (a DSN without its password).
        self.label = describe(where)
        #: The SQLite file; for a PostgreSQL store, its DSN without the password.
        self.path: Path | str = self.label if location is not None else where
        self.work = work
        self.writer = StoreWriter(where)
        self.reader = Reader(where)
        #: Told of each stored record the reader skipped because it does not decode (once per
        #: record); the host makes a ``record-skipped`` trace event of it.
        self.on_skip: Callable[[SkippedRecord], object] | None = None
        # writes handed over and not yet committed (at most MAX_IN_FLIGHT); counted per batch
        self._in_flight = 0
        self._room = trio.Event()  # set (and replaced) whenever commits free room
        self._read_limiter = trio.CapacityLimiter(1)
        #: The rows of recent commits, per agent, filed before any write of theirs is reported
        #: done (see FreshFeeds); none on a PostgreSQL store, where other hosts write too.
        self.feeds = FreshFeeds()
        if location is None:  # on a fleet's store other hosts commit too: no feed is complete
            self.writer.on_commit = self.feeds.file
        #: How long each commit took (for ``/metrics``).
        self.commit_times = CommitTimes()
        self.writer.on_commit_time = self.commit_times.add

    def start(self) -> None:
        self.writer.start()

    async def submit(self, op: Any) -> StoreFuture:
        (fut,) = await self.submit_many([op])
        return fut

    async def submit_many(self, ops: list[Any], *, bulk: bool = False) -> list[StoreFuture]:
        """Hand several ops to the writer in one go; waits only while no slot is free.
        ``bulk`` ops (a flooding server's) may gather a little before their commit."""
        n = len(ops)
        if n > MAX_IN_FLIGHT:  # more than may ever be in flight: hand it over in parts
            futures: list[StoreFuture] = []
            for i in range(0, n, MAX_IN_FLIGHT):
                futures.extend(await self.submit_many(ops[i : i + MAX_IN_FLIGHT], bulk=bulk))
            return futures
        while self._in_flight + n > MAX_IN_FLIGHT:
            await self._room.wait()
        self._in_flight += n
        batch = _Completion(self, n)
        self.work.inc(len(ops))
        try:
            done = batch.done
            self.writer.submit_many([(op, done) for op in ops], bulk=bulk)
        except BaseException:
            self._free(n)
            self.work.dec(n)
            raise
        return [StoreFuture(batch, i) for i in range(n)]

    def _free(self, n: int) -> None:
        self._in_flight -= n
        room, self._room = self._room, trio.Event()
        room.set()

    async def write(self, op: Any) -> Any:
        return await (await self.submit(op)).wait()

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self._read_limiter)
        finally:
            self.report_skipped()

    def report_skipped(self) -> None:
        """Hand every record the reader skipped since the last call to ``on_skip``."""
        if self.on_skip is not None:
            for record in self.reader.take_skipped():
                self.on_skip(record)

    async def aclose(self) -> None:
        await self.writer.aclose(CLOSE_WAIT_S)


def open_store(cfg: HostConfig, work: Work) -> StoreClient:
    """The store ``cfg`` names: the PostgreSQL database of ``[host] store`` (or of the variable
    ``store_env`` names), else the embedded SQLite store in ``data_dir``. Raises
    :class:`~store.errors.StoreError` (one line, no password) when it cannot be opened."""
    return StoreClient(cfg.data_dir, work, location=cfg.store)
