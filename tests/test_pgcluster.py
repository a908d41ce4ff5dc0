"""The throwaway PostgreSQL of the tests (``tests/pgcluster.py``) and its fixtures: a cluster
starts, takes connections and tables, and leaves nothing running, even when the process that
started it is killed."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests import pgcluster
from tests.cli_helpers import REPO, child_env

pytestmark = pytest.mark.slow


def wait_gone(pids: list[int], timeout: float = 60.0) -> list[int]:
    """Wait until each process has exited (through a pidfd, no polling); the ones still there
    after ``timeout``."""
    left = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                left.append(pid)
        finally:
            os.close(fd)
    return left


def test_a_fresh_database_takes_a_table(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        tables = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        assert conn.execute(tables).fetchone() == (0,)
        conn.execute("CREATE TABLE notes (id BIGINT PRIMARY KEY, body BYTEA NOT NULL)")
        conn.execute("INSERT INTO notes VALUES (1, %s)", (b"\x00hello",))
        assert conn.execute("SELECT body FROM notes").fetchone() == (b"\x00hello",)
        assert conn.info.host == "127.0.0.1"


def test_each_test_gets_its_own_database(pg_cluster: pgcluster.Cluster, pg_dsn: str) -> None:
    other = pg_cluster.create_database()
    assert other != pg_dsn
    with psycopg.connect(other) as conn:
        assert conn.execute("SELECT current_database()").fetchone() != (pg_dsn.rsplit("/", 1)[1],)


def test_the_server_listens_on_loopback_only_and_not_as_root(
    pg_cluster: pgcluster.Cluster,
) -> None:
    assert pg_cluster.psql("SHOW listen_addresses").strip() == "127.0.0.1"
    assert pg_cluster.process is not None
    owner = Path(f"/proc/{pg_cluster.process.pid}").stat().st_uid
    assert owner != 0


def test_a_stopped_cluster_leaves_no_process_and_no_folder(
    pg_cluster: pgcluster.Cluster,
) -> None:
    cluster = pgcluster.start(pg_cluster.bin_dir)
    # a backend of its own, open while the cluster stops
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute("SELECT 1")
        pids = cluster.pids()
        assert cluster.process is not None and cluster.process.pid in pids
        assert len(pids) > 1  # the postmaster and its helpers
        cluster.stop()
    assert cluster.pids() == []
    assert wait_gone(pids) == []
    assert not cluster.folder.exists()
    cluster.stop()  # a second time does nothing


STARTER = """
import sys
from tests import pgcluster

cluster = pgcluster.start()
print(cluster.folder, *cluster.pids(), flush=True)
sys.stdin.read()  # until killed
"""


def test_a_killed_test_run_leaves_no_server(pg_cluster: pgcluster.Cluster) -> None:
    env = child_env(**{pgcluster.BIN_ENV: str(pg_cluster.bin_dir)})
    with subprocess.Popen(
        [sys.executable, "-c", STARTER],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as starter:
        assert starter.stdout is not None
        folder, *pids = starter.stdout.readline().split()
        assert pids, "the cluster did not start"
        starter.send_signal(signal.SIGKILL)  # no atexit, no teardown
        starter.wait()
    assert wait_gone([int(pid) for pid in pids]) == []
    assert Path(folder).is_dir()  # left behind by the killed run ...
    pgcluster.sweep_leftovers(Path(folder).parent)
    assert not Path(folder).exists()  # ... and removed by the next one


def test_the_folder_named_by_the_variable_is_the_only_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("initdb", "postgres"):
        (tmp_path / name).write_text("#!/bin/sh\n", encoding="ascii")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv(pgcluster.BIN_ENV, str(tmp_path))
    assert pgcluster.find_bin_dir() == tmp_path.resolve()
    monkeypatch.setenv(pgcluster.BIN_ENV, str(tmp_path / "none"))
    assert pgcluster.find_bin_dir() is None
    assert "holds no initdb" in pgcluster.where_looked()


FIXTURE_USER = """
def test_uses_postgresql(pg_dsn):
    assert pg_dsn.startswith("postgresql://")
"""


PYTEST = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-rs"]


@pytest.mark.parametrize(("required", "outcome"), [({}, "skipped"), ({"CI": "true"}, "errors")])
def test_without_postgresql_the_fixture_skips_except_in_ci(
    tmp_path: Path, required: dict[str, str], outcome: str
) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pg_cluster, pg_dsn  # noqa: F401\n", encoding="ascii"
    )
    (tmp_path / "test_user.py").write_text(FIXTURE_USER, encoding="ascii")
    unset: dict[str, str | None] = {"CI": None, "MCPLIVE_PG_REQUIRED": None}
    env = child_env(**{**unset, pgcluster.BIN_ENV: str(tmp_path / "none"), **required})
    done = subprocess.run(
        [*PYTEST, "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = done.stdout.strip().splitlines()[-1]
    assert f"1 {'error' if outcome == 'errors' else 'skipped'}" in summary, done.stdout
    assert "no PostgreSQL cluster" in done.stdout
    assert f"{pgcluster.BIN_ENV}={tmp_path / 'none'} holds no initdb" in done.stdout
