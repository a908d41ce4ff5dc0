"""The child process of :class:`store.writer_process.DatabaseProcess`:
``python -m store.writer_child PATH PARENT_PID`` (for a PostgreSQL store, PATH is the DSN
without its password, and the DSN itself is in the variable
:data:`~store.writer_process.DSN_VARIABLE`).

It opens the database, answers ``"ready"`` (or the :class:`~store.errors.StoreError` that
stopped it), then applies each batch read from stdin and answers ``(outcomes, rows, gap)``:
the outcomes of :meth:`store.sqlite.Database.apply` (or the error it raised) and the message
rows the batch committed. It ends when stdin closes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

from store.dbapi import is_dsn
from store.errors import StoreError
from store.sqlite import Database
from store.writer_process import DSN_VARIABLE, receive, send

_PR_SET_PDEATHSIG = 1


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
    location = os.environ.pop(DSN_VARIABLE, path) if is_dsn(path) else path
    if not _die_with_parent(parent):
        return 1
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    try:
        database = Database(location)
    except Exception as exc:
        if is_dsn(path) and isinstance(exc, StoreError):
            send(stdout, StoreError(str(exc)))  # it names the store (without its password)
        else:
            send(stdout, StoreError(f"cannot open the store {path}: {exc}"))
        return 1
    send(stdout, "ready")
    try:
        while (ops := receive(stdin)) is not None:
            try:
                outcomes: object = database.apply(ops)
            except Exception as exc:
                outcomes = StoreError(f"store write failed: {exc}")
            rows, gap = database.items.take_committed()
            send(stdout, (outcomes, rows, gap))
    finally:
        database.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
