"""``write_promptly`` over real pipes: the bytes go in the caller's step, a full pipe waits for
room, and a closed or broken pipe fails with trio's errors."""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from actors.prompt_io import is_pipe, write_promptly, write_whole_now

GENEROUS_S = 30.0  # real I/O: a bound against hanging, never a timing assertion


@contextmanager
def pipe() -> Iterator[tuple[int, trio.lowlevel.FdStream]]:
    """A pipe: its read end (a blocking fd) and its write end as a trio stream."""
    read_fd, write_fd = os.pipe()
    stream = trio.lowlevel.FdStream(write_fd)
    try:
        yield read_fd, stream
    finally:
        stream.close()
        os.close(read_fd)


def read_all(fd: int, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = os.read(fd, size - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


class Steps(trio.abc.Instrument):
    """Counts the steps of one task: a yield ends a step."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def test_the_bytes_are_written_in_the_callers_step():
    steps = Steps(trio.lowlevel.current_task())
    with trio.fail_after(GENEROUS_S), pipe() as (read_fd, stream):
        trio.lowlevel.add_instrument(steps)
        try:
            await write_promptly(stream, b"hello\n")
        finally:
            trio.lowlevel.remove_instrument(steps)
        assert steps.count == 0  # the write did not yield
        assert os.read(read_fd, 100) == b"hello\n"


async def test_a_payload_larger_than_the_pipe_waits_for_room_and_arrives_whole():
    payload = bytes(range(256)) * 4096  # 1 MiB, far over a pipe's buffer
    with trio.fail_after(GENEROUS_S), pipe() as (read_fd, stream):
        async with trio.open_nursery() as nursery:
            received: list[bytes] = []

            async def drain() -> None:
                received.append(await trio.to_thread.run_sync(read_all, read_fd, len(payload)))

            nursery.start_soon(drain)
            await write_promptly(stream, payload)
        assert received == [payload]


async def test_a_closed_stream_fails_as_closed():
    with pipe() as (_, stream):
        stream.close()
        with pytest.raises(trio.ClosedResourceError):
            await write_promptly(stream, b"x")


async def test_a_pipe_whose_reader_is_gone_fails_as_broken():
    read_fd, write_fd = os.pipe()
    stream = trio.lowlevel.FdStream(write_fd)
    os.close(read_fd)
    try:
        with pytest.raises(trio.BrokenResourceError):
            await write_promptly(stream, b"x")
    finally:
        stream.close()


async def test_a_cancelled_caller_writes_nothing():
    with pipe() as (read_fd, stream):
        with trio.CancelScope() as scope:
            scope.cancel()
            await write_promptly(stream, b"never")
        assert scope.cancelled_caught
        os.set_blocking(read_fd, False)
        with pytest.raises(BlockingIOError):
            os.read(read_fd, 10)


async def test_closing_the_stream_while_a_write_waits_for_room_fails_it_as_closed():
    with trio.fail_after(GENEROUS_S), pipe() as (_, stream):
        failures: list[BaseException] = []

        async def write_too_much() -> None:
            try:
                await write_promptly(stream, b"x" * (4 << 20))  # nobody reads: it must wait
            except trio.ClosedResourceError as exc:
                failures.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_too_much)
            await wait_all_tasks_blocked()
            stream.close()
        assert len(failures) == 1


# -- write_whole_now: a short write in another task's place ---------------------------------


async def test_a_short_line_is_written_whole_at_once():
    with pipe() as (read_fd, stream):
        assert is_pipe(stream)
        assert write_whole_now(stream, b"short\n")
        assert os.read(read_fd, 100) == b"short\n"


async def test_what_the_pipe_might_cut_or_cannot_take_now_is_not_written_at_all():
    with pipe() as (read_fd, stream):
        assert not write_whole_now(stream, b"x" * (select.PIPE_BUF + 1))  # might be cut
        while write_whole_now(stream, b"y" * 1024):  # fill the pipe
            pass
        assert not write_whole_now(stream, b"z\n")  # no room now
        os.set_blocking(read_fd, False)
        data = bytearray()
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_fd, 65536):
                data += chunk
        assert data and set(data) == {ord("y")}  # whole writes only, and nothing else


async def test_a_closed_or_broken_pipe_takes_nothing_and_says_so():
    with pipe() as (_, stream):
        stream.close()
        assert not write_whole_now(stream, b"x")
    read_fd, write_fd = os.pipe()
    stream = trio.lowlevel.FdStream(write_fd)
    os.close(read_fd)
    try:
        assert not write_whole_now(stream, b"x")
    finally:
        stream.close()


async def test_a_regular_file_is_not_a_pipe(tmp_path):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    stream = trio.lowlevel.FdStream(fd)
    try:
        assert not is_pipe(stream)
    finally:
        stream.close()
