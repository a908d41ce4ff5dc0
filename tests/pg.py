"""A throwaway PostgreSQL cluster for the tests that run on PostgreSQL.

:func:`start_cluster` makes a cluster in a temporary folder (``initdb -U mcplive
--auth=trust``), starts it on a free loopback port with its socket in that folder, and
:meth:`Cluster.fresh_database` gives each test a database of its own (``CREATE DATABASE …
TEMPLATE template0``), dropped after it. The cluster is stopped and its folder removed at the
end of the session.

Binaries: ``$MCPLIVE_PG_BIN`` (a folder), else ``pg_ctl`` on ``PATH``, else the newest
``/usr/lib/postgresql/*/bin`` (Debian's packages). Without them the PostgreSQL tests are
skipped, saying why, except when ``CI`` is set: then they fail.

PostgreSQL refuses to run as root. Run as root (a container), the cluster runs as the
``postgres`` user when there is one, else as ``nobody``, through ``runuser`` (util-linux):
its folder is made under the system's temp folder (pytest's own is readable by root alone)
and given to that user.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

USER = "mcplive"
#: Hang guard for the server to start or stop; never reached when it works.
START_TIMEOUT_S = 60


def find_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or None."""
    given = os.environ.get("MCPLIVE_PG_BIN")
    if given:
        return Path(given)
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def _run_as() -> tuple[list[str], str | None]:
    """The command prefix that runs the server as a user it accepts, and that user's name
    (None: the current user)."""
    if os.geteuid() != 0:
        return [], None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise RuntimeError("run as root and no runuser to run PostgreSQL as another user")
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return [runuser, "-u", name, "--"], name
    raise RuntimeError("run as root and no postgres or nobody user to run PostgreSQL as")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A running cluster: ``dsn(name)`` connects to database ``name`` as the superuser."""

    def __init__(self, bin_dir: Path, root: Path, prefix: list[str]) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.prefix = prefix
        self.port = 0
        self._names = itertools.count()

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), *args],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )

    def start(self) -> None:
        init = subprocess.run(
            [
                *self.prefix,
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {init.stderr.strip() or init.stdout.strip()}")
        last = ""
        for _ in range(3):  # a port found free may be taken before the server binds it
            self.port = _free_port()
            options = (
                f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
                " -c fsync=off -c full_page_writes=off -c max_connections=200"
            )
            log = self.root / "server.log"
            started = self._pg_ctl("-o", options, "-l", str(log), "-w", "start")
            if started.returncode == 0:
                return
            last = log.read_text() if log.exists() else started.stderr
        raise RuntimeError(f"pg_ctl start failed: {last.strip()[-500:]}")

    def fresh_database(self) -> str:
        """The DSN of a new, empty database."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8'")
        return self.dsn(name)

    def drop(self, dsn: str) -> None:
        import psycopg

        name = dsn.rsplit("/", 1)[1]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        self._pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def unavailable() -> str | None:
    """Why no cluster can be started here (None: it can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgresql]')"
    bin_dir = find_bin()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        return "no PostgreSQL binaries (initdb, pg_ctl) found; set MCPLIVE_PG_BIN"
    return None


def start_cluster() -> Cluster:
    """A started cluster; skips the test (fails it under ``CI``) when none can be started."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL tests cannot run in CI: {reason}")
        pytest.skip(reason)
    bin_dir = find_bin()
    assert bin_dir is not None
    prefix, user = _run_as()
    root = Path(tempfile.mkdtemp(prefix="mcplive-pg-"))
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    cluster = Cluster(bin_dir, root, prefix)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster
