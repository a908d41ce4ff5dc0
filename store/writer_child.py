"""The child process of :class:`store.writer_process.DatabaseProcess`:
``python -m store.writer_child PATH PARENT_PID``.

It opens the database, answers ``"ready"`` (or the :class:`~store.errors.StoreError` that
stopped it), then applies each batch read from stdin and answers ``(outcomes, rows, gap)``:
the outcomes of :meth:`store.sqlite.Database.apply` (or the error it raised) and the message
rows the batch committed. It ends when stdin closes.

No commit moves the write-ahead log into the database file (SQLite does that at the commit that
takes the log past 1,000 pages, and every op waiting for that commit waited tens of
milliseconds): a :class:`Checkpointer` thread of this process does it beside the commits, with
a connection of its own, at most every ``CHECKPOINT_EVERY_S`` while commits come in.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sqlite3
import sys
import threading
from collections.abc import Sequence

from store.errors import StoreError
from store.sqlite import BUSY_TIMEOUT, Database
from store.writer_process import receive, send

_PR_SET_PDEATHSIG = 1
#: The least time between two checkpoints.
CHECKPOINT_EVERY_S = 0.2


class Checkpointer:
    """Checkpoints the store's write-ahead log in a thread of its own, after commits (see the
    module docstring). A checkpoint that fails is retried after the next commit."""

    def __init__(self, path: str, every: float = CHECKPOINT_EVERY_S) -> None:
        self.every = every
        self._conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
        self._due = threading.Event()
        self._closing = False
        self._ran = threading.Condition()
        self.done = 0  # checkpoints run
        self._thread = threading.Thread(target=self._run, name="checkpointer", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        """A commit was made: checkpoint soon."""
        self._due.set()

    def wait(self, done: int, timeout: float) -> bool:
        """Wait until ``done`` checkpoints have run (False if ``timeout`` passed first)."""
        with self._ran:
            return self._ran.wait_for(lambda: self.done >= done, timeout)

    def close(self) -> None:
        self._closing = True
        self._due.set()
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        stop = threading.Event()
        while True:
            self._due.wait()
            if self._closing:
                return
            self._due.clear()
            try:
                self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                with self._ran:
                    self.done += 1
                    self._ran.notify_all()
            except sqlite3.Error:
                self._due.set()  # tried again after the next pause
            stop.wait(self.every)  # commits in the meantime gather into the next one


def _die_with_parent(parent: int) -> bool:
    """Be killed when the thread that started this process ends (Linux); False when the
    parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == parent


def main(argv: Sequence[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    path, parent = argv[0], int(argv[1])
    if not _die_with_parent(parent):
        return 1
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    try:
        database = Database(path)
    except Exception as exc:
        send(stdout, StoreError(f"cannot open the store {path}: {exc}"))
        return 1
    database.set_autocheckpoint(0)
    checkpointer = Checkpointer(path)
    send(stdout, "ready")
    try:
        while (ops := receive(stdin)) is not None:
            try:
                outcomes: object = database.apply(ops)
            except Exception as exc:
                outcomes = StoreError(f"store write failed: {exc}")
            rows, gap = database.items.take_committed()
            send(stdout, (outcomes, rows, gap))
            checkpointer.committed()
    finally:
        checkpointer.close()
        database.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
