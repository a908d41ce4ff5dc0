"""The data directory's lock: one running host per ``data_dir``.

A host holds an exclusive ``flock`` on ``<data_dir>/mcplive.lock`` for as long as it runs, and
writes its pid into the file. The lock is the kernel's, so it goes away with the process however
the process ends (a SIGKILL included); the pid left in the file is only a hint for messages.
Readers (``mcplive history``, ``status``, ``check``) never take it: they ask :func:`holder`, which
tests the lock without keeping it.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import socket
from pathlib import Path

from .errors import DataDirBusy

LOCK_NAME = "mcplive.lock"
#: The file keeping a generated host id, so a host keeps its id across restarts.
HOST_ID_NAME = "host_id"
#: What a host id may be: letters, digits, ``_``, ``.``, ``-``; at most 64 characters.
HOST_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def host_id_of(data_dir: Path, configured: str | None) -> str:
    """The host's id: ``configured`` (``[host] host_id``), else the one kept in the data dir,
    else a new one (the machine's name and six hex digits) written there for the next start.
    Blocking: call it from a worker thread."""
    if configured:
        return configured
    path = data_dir / HOST_ID_NAME
    try:
        kept = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        kept = ""
    if HOST_ID.fullmatch(kept):
        return kept
    machine = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "host"
    made = f"{machine}-{secrets.token_hex(3)}"
    temporary = path.with_name(f".{HOST_ID_NAME}.{secrets.token_hex(4)}")
    temporary.write_text(made + "\n", encoding="utf-8")
    os.replace(temporary, path)
    return made


class DataDirLock:
    """The exclusive lock of one data directory, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`DataDirBusy` naming the holder's pid. The folder must
        exist."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise DataDirBusy(self.data_dir, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the lock go (the file stays; its pid is stale from now on)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def holder(data_dir: Path) -> int | None:
    """The pid of the host running on ``data_dir`` now (0 when one runs but the file names no
    pid), or None when none does."""
    try:
        fd = os.open(data_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            return pid if pid is not None else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
