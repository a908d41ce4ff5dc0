"""A throwaway PostgreSQL cluster for tests: found, started, and gone at the end.

The system's server programs are used (nothing is downloaded). :func:`find_bin_dir` looks for a
folder holding ``initdb`` and ``postgres``: ``$MCPLIVE_PG_BIN`` (then no other), else ``PATH``,
Debian's ``/usr/lib/postgresql/<version>/bin`` (newest first), and ``/usr/local/bin``.

:func:`start` makes a cluster in a new temporary folder (``initdb`` with trust authentication,
a superuser named :data:`SUPERUSER`) and runs its server listening on ``127.0.0.1`` only, on a
free port, with its Unix socket in that folder. PostgreSQL refuses to run as root, so when we
are root the folder is given to an unprivileged user (``postgres``, else ``nobody``) and the
server runs as that user.

Nothing is left running, however the test run ends:

- the server runs in a session of its own (a Ctrl-C in the terminal reaches the tests, which
  stop it in order); its processes are known by their working folder, the cluster's, and each
  gets a final ``SIGKILL`` if a shutdown leaves it running;
- :meth:`Cluster.stop` is registered with :mod:`atexit` (an interpreter that exits without the
  fixture's teardown still stops it);
- the server's main process gets ``SIGQUIT`` (PostgreSQL's immediate shutdown) when the process
  that started it dies, even by ``SIGKILL`` (Linux's parent-death signal); its other processes
  exit when they see it gone;
- a folder left behind by a killed run is removed by the next :func:`start`.

Used by the ``pg_cluster`` and ``pg_dsn`` fixtures (``tests/conftest.py``). Run as a script
(standard library only), ``python3 tests/pgcluster.py --bin`` prints the folder found (for
``.ci/run``) and ``--check`` starts and stops a cluster.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: The environment variable naming the folder of PostgreSQL's server programs.
BIN_ENV = "MCPLIVE_PG_BIN"
#: The superuser ``initdb`` makes (trust authentication: no password).
SUPERUSER = "mcplive"
#: Where a temporary cluster lives: ``<tmp>/mcplive-pg-<random>``.
PREFIX = "mcplive-pg-"
#: Seconds allowed for the server to accept connections, and then for it to stop.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
#: Settings for a test server: no waiting on the disk (a crashed test cluster is thrown away
#: anyway) and small memory.
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "log_min_messages": "warning",
}
#: Over :data:`SETTINGS` for a durable cluster (the benchmark's): commits wait for the disk, as
#: the embedded store's do.
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
_PR_SET_PDEATHSIG = 1


class ClusterError(Exception):
    """No cluster: PostgreSQL's programs are not found, or the cluster cannot be made or
    started (the message says which)."""


def find_bin_dir() -> Path | None:
    """The folder of PostgreSQL's server programs (``initdb`` and ``postgres``), or None. A
    folder named by ``$MCPLIVE_PG_BIN`` is the only one looked in."""
    named = os.environ.get(BIN_ENV)
    if named:  # the folder named, and no other
        candidates = [Path(named)]
    else:
        candidates = _usual_places()
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in ("initdb", "postgres")):
            return folder.resolve()
    return None


def _usual_places() -> list[Path]:
    candidates: list[Path] = []
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).resolve().parent)
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.replace(".", "").isdigit()]
        versions.sort(key=lambda p: [int(n) for n in p.name.split(".")], reverse=True)
        candidates.extend(p / "bin" for p in versions)
    candidates.append(Path("/usr/local/bin").resolve())
    return candidates


def server_user() -> pwd.struct_passwd | None:
    """The user the server runs as: None (ourselves) unless we are root, then ``postgres`` or
    ``nobody``."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ClusterError("running as root, and there is no postgres or nobody user to run as")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the server's process, before it starts: get SIGQUIT when our process dies. Set after
    the switch of user (which clears it), as ``subprocess`` switches before calling this."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGQUIT, 0, 0, 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(tmp: Path) -> None:
    """Remove the folders of clusters whose test run was killed (their ``owner`` process is
    gone; the server went with it, see the module's notes)."""
    for folder in tmp.glob(f"{PREFIX}*"):
        try:
            owner = int((folder / "owner").read_text(encoding="ascii"))
        except (OSError, ValueError):
            continue
        if not _alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


class Cluster:
    """A running throwaway cluster: :attr:`dsn` reaches its ``postgres`` database as the
    superuser; :meth:`create_database` makes a fresh one; :meth:`stop` ends it and removes its
    folder (also at exit)."""

    def __init__(
        self,
        bin_dir: Path,
        folder: Path,
        user: pwd.struct_passwd | None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.settings = {**SETTINGS, **(settings or {})}
        self.bin_dir = bin_dir
        self.folder = folder
        self.data = folder / "data"
        self.socket_dir = folder / "socket"
        self.log = folder / "server.log"
        self.user = user
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._names = itertools.count(1)
        self._stopped = False

    # -- where it is

    def dsn_of(self, dbname: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    @property
    def dsn(self) -> str:
        """The ``postgres`` database's DSN (trust: no password)."""
        return self.dsn_of("postgres")

    @property
    def version(self) -> str:
        return (self.data / "PG_VERSION").read_text(encoding="ascii").strip()

    # -- starting

    def _as_user(self) -> dict[str, object]:
        """``subprocess`` options running a program as the server's user."""
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C", TZ="UTC")
        if self.user is not None:
            env.update(HOME=str(self.folder), USER=self.user.pw_name, LOGNAME=self.user.pw_name)
        return env

    def init(self) -> None:
        """``initdb``: an empty cluster with trust authentication."""
        for folder in (self.data, self.socket_dir):
            folder.mkdir(mode=0o700)
        if self.user is not None:
            for path in (self.folder, self.data, self.socket_dir):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        done = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "--pgdata",
                str(self.data),
                "--username",
                SUPERUSER,
                "--auth",
                "trust",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ],
            cwd=self.folder,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            **self._as_user(),  # type: ignore[call-overload]
        )
        if done.returncode != 0:
            raise ClusterError(f"initdb failed ({done.returncode}): {done.stderr.strip()[-2000:]}")

    def start(self, attempts: int = 3) -> None:
        """Run the server on a free loopback port (another if that one was taken meanwhile)
        and wait until it accepts connections."""
        for attempt in range(attempts):
            self.port = free_port()
            self._spawn()
            if self._wait_ready():
                return
            self._kill()
            text = self.log.read_text(encoding="utf-8", errors="replace")
            if "could not bind" not in text or attempt == attempts - 1:
                raise ClusterError(f"the server did not start: {text.strip()[-2000:]}")
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        command = [str(self.bin_dir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        command += ["-c", f"unix_socket_directories={self.socket_dir}"]
        for key, value in self.settings.items():
            command += ["-c", f"{key}={value}"]
        with open(self.log, "ab") as log:
            if self.user is not None:
                os.chown(self.log, self.user.pw_uid, self.user.pw_gid)
            self.process = subprocess.Popen(
                command,
                cwd=self.folder,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                **self._as_user(),  # type: ignore[call-overload]
            )

    def _wait_ready(self) -> bool:
        """Poll until the server accepts connections (True) or has exited (False)."""
        assert self.process is not None
        isready = self.bin_dir / "pg_isready"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if isready.is_file():
                probe = [str(isready), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
                ready = subprocess.run([*probe, "-U", SUPERUSER], env=self._env()).returncode
                if ready == 0:
                    return True
            else:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", self.port), timeout=1),
                ):
                    return True
            time.sleep(0.05)  # a poll's pause, bounded by the deadline
        raise ClusterError(f"the server did not accept connections within {START_TIMEOUT} s")

    # -- using

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` with ``psql`` (no Python driver needed); its output, unaligned."""
        dsn = self.dsn_of(dbname)
        done = subprocess.run(
            [str(self.bin_dir / "psql"), "-XqAt", "-v", "ON_ERROR_STOP=1", "-c", sql, dsn],
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        if done.returncode != 0:
            raise ClusterError(f"psql: {done.stderr.strip()}")
        return done.stdout

    def create_database(self, name: str | None = None) -> str:
        """A new, empty database (named ``test_<n>`` unless ``name``); its DSN."""
        name = name or f"test_{next(self._names)}"
        self.psql(f'CREATE DATABASE "{name}"')
        return self.dsn_of(name)

    # -- stopping

    def pids(self) -> list[int]:
        """The server's processes still running: every process working in the cluster's data
        folder (PostgreSQL's processes run there, each in a session of its own)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = Path(os.readlink(entry / "cwd"))
                state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
            except OSError:
                continue
            if cwd == self.data and state != "Z":
                found.append(int(entry.name))
        return found

    def _kill(self) -> None:
        """SIGKILL to the server's main process and to each of its processes; reap the main
        one."""
        if self.process is None:
            return
        for pid in [self.process.pid, *self.pids()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """Stop the server (a fast shutdown, then an immediate one, then SIGKILL to its group)
        and remove the cluster's folder. Does nothing the second time."""
        if self._stopped:
            return
        self._stopped = True
        process = self.process
        if process is not None and process.poll() is None:
            for signum, wait in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 5.0)):
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)
                try:
                    process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def start(bin_dir: Path | None = None, *, durable: bool = False) -> Cluster:
    """Make and start a throwaway cluster (see the module's notes); ``durable``: its commits
    wait for the disk (:data:`DURABLE`). Raises :class:`ClusterError` when there are no server
    programs or it cannot start."""
    bin_dir = bin_dir or find_bin_dir()
    if bin_dir is None:
        raise ClusterError(f"no PostgreSQL server programs found ({where_looked()})")
    tmp = Path(tempfile.gettempdir())
    sweep_leftovers(tmp)
    user = server_user()
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=tmp))
    (folder / "owner").write_text(str(os.getpid()), encoding="ascii")
    cluster = Cluster(bin_dir, folder, user, DURABLE if durable else None)
    atexit.register(cluster.stop)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running(bin_dir: Path | None = None) -> Iterator[Cluster]:
    """A cluster for the ``with`` block."""
    cluster = start(bin_dir)
    try:
        yield cluster
    finally:
        cluster.stop()


def where_looked() -> str:
    named = os.environ.get(BIN_ENV)
    if named:
        return f"{BIN_ENV}={named} holds no initdb and postgres"
    return (
        f"looked in ${BIN_ENV}, PATH, /usr/lib/postgresql/*/bin and /usr/local/bin; "
        "install the postgresql package or set "
        f"{BIN_ENV} to the folder holding initdb"
    )


def main(argv: list[str]) -> int:
    bin_dir = find_bin_dir()
    if argv == ["--bin"]:
        if bin_dir is None:
            print(f"pgcluster: no PostgreSQL ({where_looked()})", file=sys.stderr)
            return 1
        print(bin_dir)
        return 0
    if argv == ["--check"]:
        try:
            with running(bin_dir) as cluster:
                cluster.psql("SELECT 1")
                print(f"PostgreSQL {cluster.version} ({cluster.bin_dir}): a cluster starts")
        except ClusterError as exc:
            print(f"pgcluster: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: pgcluster.py --bin | --check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
