"""The store's write connection in a process of its own.

A writer spends most of a commit in SQLite, which lets go of the interpreter lock at every
statement and must take it back before the next. While the host's event loop keeps the lock
busy, each of those waits lasts up to the thread switch interval, and a commit of ten statements
waits ten times. The child process runs the :class:`~store.sqlite.Database` under an interpreter
lock of its own instead. :class:`DatabaseProcess` is that child for the writer thread
(:mod:`store.writer`), which hands it a whole batch and waits for the answer in two blocking pipe
calls; the host's trio writer (``actors.store_writer``) talks to the same child through
:func:`spawn`, :func:`frame` and :func:`take_frame` on non-blocking pipes.

:class:`DatabaseProcess` has the part of the :class:`~store.sqlite.Database` interface the
writer uses: ``apply``, ``items.take_committed`` and ``close``. A batch crosses the pipe
pickled, as a length-prefixed frame; the child answers each with the batch's outcomes (or the
exception ``apply`` raised) and the message rows it committed.

The child (:mod:`store.writer_child`) ends when its pipe closes (the host closed the store),
after the batch in hand. It is killed with the thread that started it (on Linux), so it starts
no batch after the host died: a host started again finds the store as the dead one left it,
give or take the commit that was on its way to the disk at the kill (its ops were never
acknowledged). It ignores SIGINT and SIGTERM: a signal sent to the whole process group does not
cut off the commits the host still makes on its way out. When the child ends in the middle of a
batch (killed), that batch fails with :class:`~store.errors.StoreError` (SQLite undid what it
did not commit, so nothing acknowledged is lost), and the next batch starts a new child.

Create it in the thread that will use it: the child's life is tied to that thread's.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from store.dbapi import Location, as_location, describe, is_dsn
from store.errors import StoreError
from store.items import WrittenRow
from store.records import Op, Outcome

_HEADER = struct.Struct("!I")
#: The largest frame either side accepts (a batch of ``max_batch`` ops is far smaller).
MAX_FRAME = 1 << 30


def frame(value: object) -> bytes:
    """``value`` as one frame: its pickle after its length."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def send(stream: IO[bytes], value: object) -> None:
    """Write ``value`` as one frame."""
    stream.write(frame(value))
    stream.flush()


#: What reading or writing a frame raises when the other end is gone or sent garbage.
PIPE_ERRORS = (OSError, EOFError, ValueError, pickle.UnpicklingError)

#: What :func:`take_frame` returns while the buffer holds no whole frame.
INCOMPLETE: Any = object()


def take_frame(buffer: bytearray) -> Any:
    """The value of the first whole frame in ``buffer``, removed from it, or
    :data:`INCOMPLETE` (the buffer left as it was) while more bytes are needed. Raises
    ``ValueError`` for a frame over :data:`MAX_FRAME`."""
    if len(buffer) < _HEADER.size:
        return INCOMPLETE
    (size,) = _HEADER.unpack_from(buffer)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over {MAX_FRAME}")
    end = _HEADER.size + size
    if len(buffer) < end:
        return INCOMPLETE
    value = pickle.loads(memoryview(buffer)[_HEADER.size : end])
    del buffer[:end]
    return value


def receive(stream: IO[bytes]) -> Any:
    """The next value, or ``None`` when the pipe closed at a frame's start."""
    header = stream.read(_HEADER.size)
    if not header:
        return None
    if len(header) < _HEADER.size:
        raise EOFError("pipe closed inside a frame header")
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over {MAX_FRAME}")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("pipe closed inside a frame")
    return pickle.loads(data)


class _Committed:
    """What the last batch committed, as :class:`store.items.ItemWriter` reports it."""

    def __init__(self) -> None:
        self.rows: list[WrittenRow] = []
        self.gap = False

    def take_committed(self) -> tuple[list[WrittenRow], bool]:
        rows, gap = self.rows, self.gap
        self.rows, self.gap = [], False
        return rows, gap


class DatabaseProcess:
    """A :class:`~store.sqlite.Database` in a child process (see the module docstring). Used by
    one thread at a time. Raises :class:`StoreError` when the database cannot be opened."""

    def __init__(self, path: Location) -> None:
        self.path = as_location(path)
        self.items = _Committed()
        self._child: subprocess.Popen[bytes] | None = None
        self._start()

    def _start(self) -> None:
        self._child = start_child(self.path)

    @property
    def pid(self) -> int | None:
        """The child's process id (None between a child's end and the next batch)."""
        return self._child.pid if self._child is not None else None

    def apply(self, ops: Sequence[Op]) -> list[Outcome]:
        """:meth:`store.sqlite.Database.apply` in the child; raises :class:`StoreError` when
        the child ended (the next call starts a new one)."""
        if self._child is None or self._child.poll() is not None:
            self._child = None
            self._start()  # the first batch, or the child ended between two
        child = self._child
        assert child is not None and child.stdin is not None and child.stdout is not None
        try:
            send(child.stdin, list(ops))
            answer = receive(child.stdout)
        except PIPE_ERRORS as exc:
            answer = StoreError(f"store process failed: {exc}")
        try:
            outcomes, rows, gap = unpack_answer(answer)
        except StoreError:  # the child ended: the next batch starts another
            self._child = None
            end(child, kill=True)  # in whatever state it is, it is not trusted again
            self.items.gap = True  # what it committed last may not have been reported
            raise
        self.items.rows.extend(rows)
        self.items.gap = self.items.gap or gap
        if isinstance(outcomes, StoreError):
            raise outcomes
        return outcomes

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            end(child)


#: The variable a child is given a PostgreSQL DSN in (its command line, which any user of the
#: machine may read, names the store without its password).
DSN_VARIABLE = "MCPLIVE_STORE_DSN"


def spawn(path: Location) -> subprocess.Popen[bytes]:
    """Start a child on the store at ``path`` (a file or a DSN), tied to the calling thread;
    its first answer says whether it opened the store (:func:`check_ready`)."""
    env = {**os.environ, "PYTHONPATH": _import_path()}
    where = str(path)
    if is_dsn(path):
        env[DSN_VARIABLE] = where
        where = describe(path)
    return subprocess.Popen(
        [sys.executable, "-m", "store.writer_child", where, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )


def start_child(path: Location) -> subprocess.Popen[bytes]:
    """A child on the store at ``path`` that has opened it (this waits for it), tied to the
    calling thread; raises the :class:`StoreError` that stopped it."""
    child = spawn(path)
    assert child.stdout is not None
    try:
        answer = receive(child.stdout)
    except PIPE_ERRORS as exc:
        answer = StoreError(f"store process failed to start: {exc}")
    check_ready(child, answer)
    return child


def unpack_answer(
    answer: Any,
) -> tuple[list[Outcome] | StoreError, list[WrittenRow], bool]:
    """A batch's answer from the child: its outcomes (or the :class:`StoreError` that failed the
    batch whole, undone), the message rows it committed, and whether some may be missing.
    Raises :class:`StoreError` when there is no answer: ``None`` (the child closed its pipe) or
    the error that stopped reading it; the child is then not to be trusted again."""
    if answer is None:
        raise StoreError("store process ended")
    if isinstance(answer, StoreError):
        raise answer
    outcomes: list[Outcome] | StoreError
    rows: list[WrittenRow]
    gap: bool
    outcomes, rows, gap = answer
    return outcomes, rows, gap


def check_ready(child: subprocess.Popen[bytes], answer: object) -> None:
    """Raise the :class:`StoreError` that stopped ``child`` unless its first ``answer`` says it
    is ready (it is then ended)."""
    if answer == "ready":
        return
    end(child, kill=True)
    if isinstance(answer, StoreError):
        raise answer
    raise StoreError(f"store process failed to start (code {child.returncode})")


def end(child: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """Close the child's pipe and wait for it to finish its batch and end (``kill``: end it
    at once)."""
    if kill:
        child.kill()
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass
    child.wait()


def _import_path() -> str:
    """Where the child finds this package (first), then what the host's own path has."""
    here = str(Path(__file__).resolve().parent.parent)
    rest = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + rest if rest else "")
