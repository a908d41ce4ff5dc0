from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from store import Append, MessageRecord, db_path
from store.dbapi import is_dsn

_ids = itertools.count()


def record(
    text: str = "hello",
    *,
    agent: str = "alice",
    role: str = "user",
    id: str | None = None,
    header: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> MessageRecord:
    """A message record with one text block, or a header block plus a body block."""
    meta = dict(metadata or {})
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if header is not None:
        meta["source_header"] = header
        blocks.insert(0, {"type": "text", "text": header})
    return MessageRecord(
        id=id if id is not None else f"m{next(_ids)}",
        agent=agent,
        role=role,
        blocks=tuple(blocks),
        metadata=meta,
        created_at=1.5,
    )


def item_copies(item: int, agents: list[str], *, invited: frozenset[str] = frozenset()) -> Append:
    """An item heard by ``agents`` as the host stores it: the copies share blocks and metadata,
    except an invited agent's, which has a notice block of its own."""
    blocks = ({"type": "text", "text": "[source: s · #c]"}, {"type": "text", "text": f"hi {item}"})
    meta: dict[str, Any] = {"source_header": "[source: s · #c]", "n": item}
    records = []
    for agent in agents:
        if agent in invited:
            own = (*blocks, {"type": "text", "text": "[invitation] open it"})
            records.append(
                MessageRecord(
                    id=f"{agent}-{item}",
                    agent=agent,
                    role="user",
                    blocks=own,
                    metadata={**meta, "kind": "channel-invitation"},
                    created_at=2.0,
                )
            )
            continue
        records.append(
            MessageRecord(
                id=f"{agent}-{item}",
                agent=agent,
                role="user",
                blocks=blocks,
                metadata=meta,
                created_at=2.0,
            )
        )
    return Append(records=tuple(records))


#: The store backends every test of the shared suite runs on.
BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test taking ``path`` runs once per backend, unless marked ``sqlite_only`` (it reads
    the SQLite file itself, or an SQLite-only feature: old schemas, read-only files)."""
    if "path" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("backend", ["sqlite"] if only else list(BACKENDS))


@pytest.fixture
def path(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """Where the test's store is: an SQLite file in the test's folder, or (backend
    ``postgresql``) the DSN of a new database on the session's throwaway cluster."""
    if backend == "postgresql":
        return request.getfixturevalue("pg_dsn")
    return db_path(tmp_path / "data")


CHILD = Path(__file__).with_name("durability_child.py")
#: Hang guard for a process to end; never reached in a passing run.
GUARD = 60.0
REPO = Path(__file__).resolve().parents[2]


def open_at_once(location: Any, openers: int = 4) -> list[BaseException]:
    """Open (and close) a ``Database`` at ``location`` from ``openers`` threads released at
    the same moment; what any of them raised."""
    from store import Database

    errors: list[BaseException] = []
    start = threading.Barrier(openers)

    def open_one() -> None:
        try:
            start.wait()
            Database(location).close()
        except BaseException as exc:  # pragma: no cover - reported to the caller
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(openers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def child_env() -> dict[str, str]:
    """The environment of a child Python that imports this checkout first."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }


def wait_gone(pid: int) -> None:
    """Wait (at most ``GUARD`` seconds) until process ``pid`` has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        readable, _, _ = select.select([fd], [], [], GUARD)
        assert readable, f"process {pid} still runs"
    finally:
        os.close(fd)


def kill_child_after(path: Path, *args: str, acks: int, delay: float = 0.0) -> list[str]:
    """Run ``durability_child.py path *args``, SIGKILL it ``delay`` seconds after its
    ``acks``-th acknowledgement line, and return every acknowledgement it printed (those
    printed after the ones read were acknowledged too). Returns only once the child's store
    process has ended as well: it dies with its host, but a commit it had begun may land after
    the host is gone, and the caller must read the store as it will stay."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=child_env(),
    )
    acked: list[str] = []
    try:
        assert child.stdout is not None
        first = child.stdout.readline().split()
        if first[:1] != ["store"]:
            error = child.stderr.read() if child.stderr else ""
            raise AssertionError(f"child did not start: {error}")
        store_pid = int(first[1])
        while len(acked) < acks:
            line = child.stdout.readline()
            assert line, f"child ended early: {child.stderr.read() if child.stderr else ''}"
            acked.append(line.strip())
        if delay:
            time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
        wait_gone(store_pid)
        acked.extend(line.strip() for line in child.stdout if line.endswith("\n"))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    return acked


def kill_host_with_stopped_store(script: str, path: Path) -> None:
    """Run ``python -c script path`` (a host that prints its store process's pid once it has
    stored something), stop that process, SIGKILL the host, and return once the store process
    has ended as well: stopped, it cannot notice its pipe close, so only being killed with the
    host ends it. No process is left behind, even when the check fails."""
    host = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=child_env(),
    )
    child = 0
    try:
        assert host.stdout is not None
        child = int(host.stdout.readline())
        os.kill(child, signal.SIGSTOP)
        host.send_signal(signal.SIGKILL)
        host.wait(GUARD)
        wait_gone(child)
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
        if host.stdout is not None:
            host.stdout.close()
        if child > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def run_sql(where: Any, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (``?`` placeholders) on the store at ``where``, outside the store's
    own code, on either backend, committed at once; the rows it returns."""
    if is_dsn(where):
        from store.postgres import PgConnection

        pg = PgConnection(where)
        try:
            cursor = pg.execute(statement, params)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description else []
        finally:
            pg.close()
    conn = sqlite3.connect(where)
    try:
        with conn:
            return conn.execute(statement, params).fetchall()
    finally:
        conn.close()
