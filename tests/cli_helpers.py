"""Running ``mcplive`` as a user does, in tests: a subprocess, its exit status and its lines."""

from __future__ import annotations

import contextlib
import hashlib
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Append, Database, MessageRecord, db_path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
MCPLIVE = [sys.executable, "-m", "actors.cli"]

# Root ignores file permissions; a child that should meet them drops the capabilities that let
# it (it keeps uid 0, so the files it may read stay readable).
_SETPRIV = shutil.which("setpriv")
_DROP_DAC = [
    "--inh-caps=-dac_override,-dac_read_search",
    "--bounding-set=-dac_override,-dac_read_search",
]


def unprivileged_prefix() -> list[str]:
    """The argv prefix that makes a child meet file permissions (nothing when not root)."""
    if os.geteuid() != 0:
        return []
    if _SETPRIV is None:
        pytest.skip("running as root without setpriv: permissions cannot be tested")
    return [_SETPRIV, *_DROP_DAC]


def child_env(**extra: str | None) -> dict[str, str]:
    """The test process's environment for a child, with ``extra`` set (None: removed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def mcplive(
    *args: str,
    cwd: Path,
    unprivileged: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = 90,
) -> subprocess.CompletedProcess[str]:
    prefix = unprivileged_prefix() if unprivileged else []
    return subprocess.run(
        [*prefix, *MCPLIVE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else child_env(),
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a failed command printed on stderr (asserting there was exactly one and
    no traceback)."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mcplive: "), lines[0]
    return lines[0]


def tree_digest(folder: Path, *, skip: Callable[[Path], bool] = lambda p: False) -> dict[str, str]:
    """``relative path -> sha256`` of every file under ``folder``."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not skip(path):
            out[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def store_files(path: Path) -> bool:
    """The store's own files (not the lock, whose pid a host rewrites)."""
    return path.name.startswith("store.sqlite3")


def unchanged_store(before: dict[str, str], after: dict[str, str]) -> None:
    """Every file there before is byte for byte the same; a read-only reader may only have
    added SQLite's empty ``-wal`` and its index ``-shm`` beside the store."""
    assert {k: after.get(k) for k in before} == before
    assert set(after) - set(before) <= {"store.sqlite3-wal", "store.sqlite3-shm"}


@contextlib.contextmanager
def read_only(*paths: Path) -> Iterator[None]:
    """Make ``paths`` read-only (folders stay listable) for the block."""
    modes = {p: p.stat().st_mode for p in paths}
    try:
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


class Running:
    """A ``mcplive`` process started in the background, read line by line with a deadline."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [*MCPLIVE, *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env if env is not None else child_env(),
        )
        assert self.proc.stdout is not None
        self._buffer = b""
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, predicate: Callable[[str], bool], what: str, timeout: float = 60) -> str:
        """The first line from now on for which ``predicate`` holds (the lines read on the way
        are kept in ``lines``)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                while b"\n" in self._buffer:
                    raw, self._buffer = self._buffer.split(b"\n", 1)
                    line = raw.decode("utf-8", "replace")
                    self.lines.append(line)
                    if predicate(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise AssertionError(f"no {what} within {timeout}s; read: {self.lines}")
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    raise AssertionError(f"exited before {what}; read: {self.lines}; {err}")
                self._buffer += chunk

    def interrupt(self, timeout: float = 60) -> int:
        """Ctrl-C, then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def stored(
    id: str,
    text: str,
    *,
    agent: str = "Ada",
    role: str = "user",
    at: float = 1_800_000_000.0,
    server: str | None = None,
    channel: str | None = None,
    label: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> MessageRecord:
    """A message record as the host stores it (an inbound one when ``server`` is given, from a
    channel with ``label`` when given)."""
    meta: dict[str, Any] = dict(metadata or {})
    if server is not None:
        meta.update(server_id=server, channel_id=channel)
        meta["inbound_source"] = {"server": server, "channel": channel, "label": label}
    return MessageRecord(
        id=id,
        agent=agent,
        role=role,
        blocks=({"type": "text", "text": text},),
        metadata=meta,
        created_at=at,
    )


def make_store(data_dir: Path, records: Iterable[MessageRecord]) -> Path:
    """A store in ``data_dir`` holding ``records`` (written as the host writes, then closed);
    its path."""
    path = db_path(data_dir)
    with Database(path) as db:
        outcomes = db.apply([Append(records=(r,)) for r in records])
    assert all(not isinstance(o, Exception) for o in outcomes), outcomes
    return path
