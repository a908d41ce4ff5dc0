"""Writing to a pipe without a scheduling round in front of the write, or without a task.

trio's ``FdStream.send_all`` passes a whole scheduling round (a checkpoint) before it touches the
pipe. On a busy host a round is long (every runnable task steps once in it), and the host's
writes that others wait on go through such a call: each batch to the store process, each line to
a server over stdio. :func:`write_promptly` makes the system call first: while the pipe has room
the bytes are on their way in the caller's step, and only a full pipe makes it wait. It is
still a cancellation point. It does not yield otherwise, so a loop calling it must wait
elsewhere (both callers do: the store writer for the store's answer, a link's writer for its
next lines).

Only one task may write to a stream (the store writer and a link's writer each own theirs).
:func:`write_whole_now` lets another task write in its place while that task has nothing in hand
(the caller checks that): a line short enough that the pipe takes it whole or not at all, never
waiting, so it cannot be cut in two.
"""

from __future__ import annotations

import errno
import os
import select
import stat

import trio


async def write_promptly(stream: trio.lowlevel.FdStream, data: bytes) -> None:
    """Write all of ``data`` to ``stream``: at once while the pipe takes it, waiting only while
    it is full. Raises :class:`trio.ClosedResourceError` when the stream was closed (before or
    meanwhile) and :class:`trio.BrokenResourceError` when the other end is gone."""
    await trio.lowlevel.checkpoint_if_cancelled()
    fd = stream.fileno()
    with memoryview(data) as view:
        sent = 0
        while sent < len(view):
            try:
                sent += os.write(fd, view[sent:])
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
                fd = stream.fileno()  # closed meanwhile: the wait raised already
            except OSError as exc:
                if exc.errno == errno.EBADF or fd < 0:
                    raise trio.ClosedResourceError("the pipe was closed") from None
                raise trio.BrokenResourceError(f"the pipe is broken: {exc}") from exc


def is_pipe(stream: trio.lowlevel.FdStream) -> bool:
    """Whether ``stream`` writes to a pipe (where a short write is whole or not at all)."""
    try:
        return stat.S_ISFIFO(os.fstat(stream.fileno()).st_mode)
    except OSError:
        return False


def write_whole_now(stream: trio.lowlevel.FdStream, data: bytes) -> bool:
    """Write ``data`` to a pipe (see :func:`is_pipe`) in this step if it takes it whole: at most
    ``PIPE_BUF`` bytes, which a pipe writes whole or not at all. False, with nothing written,
    when it is longer, the pipe has no room now, or the pipe is closed or broken (its writing
    task finds that out on its next write)."""
    if len(data) > select.PIPE_BUF:
        return False
    fd = stream.fileno()
    if fd < 0:
        return False
    try:
        written = os.write(fd, data)
    except OSError:  # BlockingIOError among them: no room now
        return False
    if written != len(data):  # never for a pipe; the link cannot go on with a cut line
        raise trio.BrokenResourceError(f"a short write cut a line ({written} of {len(data)})")
    return True
