"""Running the host 24/7, as an operator and a supervisor see it: ``mcplive status`` and its
exit codes beside a real ``mcplive run`` (and after it stops), and a config reload on SIGHUP.

Real processes and files, the real clock, generous deadlines, order-only assertions: the tests
wait for transcript lines and for what ``mcplive status`` reports, never on the clock.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_util import AsyncValue

from actors.datadir import DataDirLock
from protocol import status as fmt

pytestmark = pytest.mark.slow

MCPLIVE = [sys.executable, "-m", "actors.cli"]
LOBBY = '["python", "-m", "tests.lobby", "--script", "none"]'
#: The test lobby is found from the config's folder (where the host starts it) through this.
ROOT = Path(__file__).resolve().parents[2]
FLAKY = '["python", "-c", "import sys; sys.exit(3)"]'


def write_config(tmp_path: Path, *, flaky: bool = False, extra: str = "") -> Path:
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    text = (
        f'[host]\ndata_dir = "data"\n\n[[servers]]\nid = "lobby"\ncommand = {LOBBY}\n'
        f'env = {{ PYTHONPATH = "{ROOT}" }}\n{extra}\n'
    )
    if flaky:
        text += f'[[servers]]\nid = "flaky"\ncommand = {FLAKY}\n\n'
    text += '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n'
    path = tmp_path / "host.toml"
    path.write_text(text, encoding="utf-8")
    return path


class Host:
    """A ``mcplive run`` process whose stdout lines are collected as they come."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.count = AsyncValue(0)

    async def read(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        async for chunk in self.proc.stdout:
            buf += chunk
            *done, buf = buf.split(b"\n")
            self.lines += [line.decode("utf-8", "replace") for line in done]
            self.count.value = len(self.lines)

    async def line(self, pred: Callable[[str], bool]) -> str:
        """The first line (seen so far or coming) matching ``pred``."""
        await self.count.wait_value(lambda _: any(pred(line) for line in self.lines))
        return next(line for line in self.lines if pred(line))


@asynccontextmanager
async def mcplive_run(
    config: Path, env: dict[str, str] | None = None, **options: Any
) -> AsyncIterator[Host]:
    proc = await trio.lowlevel.open_process(
        [*MCPLIVE, "run", str(config)],
        cwd=config.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        **options,
    )
    host = Host(proc)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(host.read)
            yield host
            nursery.cancel_scope.cancel()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()


async def status(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process(
        [*MCPLIVE, "status", *args], cwd=cwd, capture_stdout=True, capture_stderr=True, check=False
    )


async def status_until(
    config: Path, pred: Callable[[dict[str, Any]], bool]
) -> tuple[int, dict[str, Any]]:
    """``mcplive status --json`` again and again (each run is a fresh process) until the
    document it prints satisfies ``pred``."""
    while True:
        done = await status(str(config), "--json", cwd=config.parent)
        doc = json.loads(done.stdout)
        if doc.get("format") == fmt.FORMAT and pred(doc):
            return done.returncode, doc


def server(doc: dict[str, Any], sid: str) -> dict[str, Any]:
    return next(s for s in doc["servers"] if s["id"] == sid)


async def test_status_of_a_running_host_then_of_a_stopped_one(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    before = await status(str(config), cwd=tmp_path)
    assert before.returncode == 3
    assert before.stdout.decode().startswith(f"no host running on {tmp_path / 'data'}")
    with trio.fail_after(90):
        async with mcplive_run(config) as host:
            await host.line(lambda line: "lobby ready" in line)
            code, doc = await status_until(config, lambda d: server(d, "lobby")["state"] == "ready")
            assert code == 0
            assert doc["pid"] == host.proc.pid and doc["running"] is True
            assert "channels.incoming" in server(doc, "lobby")["grant"]
            assert [a["name"] for a in doc["agents"]] == ["Ada"]
            readable = await status(str(config), cwd=tmp_path)
            out = readable.stdout.decode()
            assert readable.returncode == 0, out
            assert f"running on {tmp_path / 'data'} as host " in out
            assert f": pid {host.proc.pid}," in out
            assert "  lobby: ready; 3 tools; reconnects 0; grants " in out
            assert "  Ada: " in out and out.rstrip().endswith("health: ok")
            by_dir = await status("--data-dir", str(tmp_path / "data"), cwd=tmp_path)
            assert by_dir.returncode == 0
            host.proc.send_signal(signal.SIGTERM)
            assert await host.proc.wait() == 0
    after = await status(str(config), cwd=tmp_path)
    out = after.stdout.decode()
    assert after.returncode == 3
    assert f"last status: pid {host.proc.pid}" in out and "(it was stopping)" in out
    # the local date and time, as the transcript prints them (the file keeps UTC)
    assert re.search(r"written \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(it was stopping\)", out), out
    stopped = await status(str(config), "--json", cwd=tmp_path)
    assert stopped.returncode == 3 and json.loads(stopped.stdout)["running"] is False


async def test_status_is_degraded_while_a_server_is_down(tmp_path: Path) -> None:
    config = write_config(tmp_path, flaky=True)
    with trio.fail_after(90):
        async with mcplive_run(config) as host:
            await host.line(lambda line: "flaky disconnected" in line)
            code, _doc = await status_until(
                config,
                lambda d: (
                    server(d, "flaky")["state"] == "disconnected"
                    and server(d, "lobby")["state"] == "ready"
                ),
            )
            assert code == 1
            readable = await status(str(config), cwd=tmp_path)
            assert readable.returncode == 1
            assert "health: degraded: flaky disconnected" in readable.stdout.decode()
            host.proc.send_signal(signal.SIGINT)
            assert await host.proc.wait() == 0


async def test_status_is_unknown_when_the_holder_keeps_no_fresh_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with DataDirLock(data):  # this process holds the lock, and writes no status
        missing = await status("--data-dir", str(data), cwd=tmp_path)
        assert missing.returncode == 4
        assert "no status yet" in missing.stdout.decode()
        old = {
            "format": fmt.FORMAT,
            "pid": os.getpid(),
            "interval_s": 5.0,
            "running": True,
            "written_at": fmt.iso(1_000_000_000.0),
            "servers": [],
            "agents": [],
        }
        (data / fmt.FILE_NAME).write_text(json.dumps(old), encoding="utf-8")
        # old content in a file touched now: a host that runs but cannot write (a full disk)
        full = await status("--data-dir", str(data), cwd=tmp_path)
        assert full.returncode == 1 and "could not be written for" in full.stdout.decode()
        # old content in a file nobody touched since: a hung host
        os.utime(data / fmt.FILE_NAME, (1_000_000_000.0, 1_000_000_000.0))
        stale = await status("--data-dir", str(data), cwd=tmp_path)
        assert stale.returncode == 4 and "ago (hung?)" in stale.stdout.decode()
        (data / fmt.FILE_NAME).write_text("{not json", encoding="utf-8")
        broken = await status("--data-dir", str(data), cwd=tmp_path)
        assert broken.returncode == 4 and "not JSON" in broken.stdout.decode()
    assert (await status("--data-dir", str(data), cwd=tmp_path)).returncode == 3


async def test_status_with_bad_arguments_is_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    both = await status(str(config), "--data-dir", "x", cwd=tmp_path)
    assert both.returncode == 2
    assert both.stderr.decode() == "mcplive: give a CONFIG or --data-dir, not both\n"
    missing = await status(str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.decode().count("\n") == 1


async def test_sighup_reloads_the_config_file(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with trio.fail_after(120):
        async with mcplive_run(config) as host:
            await host.line(lambda line: "lobby ready" in line)
            # masks changed, and an agent added (which needs a restart)
            write_config(tmp_path, extra='disabled_capabilities = ["pushEvents"]\n')
            with config.open("a", encoding="utf-8") as f:
                f.write('\n[[agents]]\nname = "Bob"\nmodel = "scripted:quiet.toml"\n')
            os.kill(host.proc.pid, signal.SIGHUP)
            line = await host.line(lambda line: "config reloaded" in line)
            assert "changed lobby.disabled_capabilities" in line
            assert line.endswith("needs a restart to apply: agent Bob added")
            # (a file written before the lobby was ready has no grant at all: wait for one)
            code, doc = await status_until(
                config,
                lambda d: (
                    "tools" in server(d, "lobby")["grant"]
                    and "pushEvents" not in server(d, "lobby")["grant"]
                ),
            )
            assert code == 0 and [a["name"] for a in doc["agents"]] == ["Ada"]
            # a config that does not parse leaves the running one in force
            config.write_text("[[agents]\n", encoding="utf-8")
            os.kill(host.proc.pid, signal.SIGHUP)
            refused = await host.line(lambda line: "config not reloaded" in line)
            assert "not valid TOML" in refused
            # nor does one nested 5,000 deep (the parser's recursion is the config's problem)
            config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
            os.kill(host.proc.pid, signal.SIGHUP)
            deep = await host.line(lambda line: "config not reloaded" in line and "nested" in line)
            assert "too deeply" in deep
            done = await status("--data-dir", str(tmp_path / "data"), "--json", cwd=tmp_path)
            assert done.returncode == 0  # still running, still healthy, masks as reloaded
            assert "pushEvents" not in server(json.loads(done.stdout), "lobby")["grant"]
            host.proc.send_signal(signal.SIGINT)
            assert await host.proc.wait() == 0
    assert not any("Traceback" in line for line in host.lines)


async def test_sighups_from_the_start_are_dropped_until_the_host_listens(tmp_path: Path) -> None:
    # systemd's notify socket, played by the test: mcplive says "starting" as its first act
    # (the SIGHUP handler is in place), and READY=1 once it listens for SIGHUP (a reload)
    config = write_config(tmp_path)
    address = str(tmp_path / "notify")
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_DGRAM)
    await listener.bind(address)
    env = {**os.environ, "NOTIFY_SOCKET": address}
    with trio.fail_after(120), listener:
        async with mcplive_run(config, env) as host:
            proc = host.proc
            assert await listener.recv(1024) == b"STATUS=starting"
            sent = 0

            async def hangups() -> None:
                # a burst of SIGHUPs while the command imports, loads its config and starts
                nonlocal sent
                while True:
                    proc.send_signal(signal.SIGHUP)
                    sent += 1
                    await trio.sleep(0.002)

            async with trio.open_nursery() as burst:
                burst.start_soon(hangups)
                ready = await listener.recv(1024)
                burst.cancel_scope.cancel()
            assert ready == b"READY=1\nSTATUS=running"
            assert sent > 0 and proc.returncode is None
            # from READY on, a SIGHUP is a reload
            proc.send_signal(signal.SIGHUP)
            await host.line(lambda line: "config reloaded" in line)
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
            assert await listener.recv(1024) == b"STOPPING=1"
    assert not any("Traceback" in line for line in host.lines)


def _hangup_ignored() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the launcher's part: inherited through exec


async def test_sighups_from_exec_on_never_end_a_host_launched_with_them_ignored(
    tmp_path: Path,
) -> None:
    # Before the interpreter runs mcplive's first line no program can catch a signal; a
    # supervisor that may send SIGHUP that early launches mcplive with it ignored (systemd's
    # Type=notify holds reloads until READY instead). Then no moment after exec is fatal, and
    # mcplive still takes SIGHUP as a reload once it listens.
    config = write_config(tmp_path)
    starts = 5
    with trio.fail_after(240):
        for start in range(starts):
            address = str(tmp_path / f"notify-{start}")
            listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_DGRAM)
            await listener.bind(address)
            env = {**os.environ, "NOTIFY_SOCKET": address}
            with listener:
                async with mcplive_run(config, env, preexec_fn=_hangup_ignored) as host:
                    proc = host.proc

                    async def hangups(proc: Any = proc) -> None:
                        while True:  # from the moment exec returned, before any of our code
                            proc.send_signal(signal.SIGHUP)
                            await trio.sleep(0.002)

                    async with trio.open_nursery() as burst:
                        burst.start_soon(hangups)
                        while (said := await listener.recv(1024)) != b"READY=1\nSTATUS=running":
                            assert said == b"STATUS=starting"
                        burst.cancel_scope.cancel()
                    assert proc.returncode is None
                    proc.send_signal(signal.SIGHUP)
                    await host.line(lambda line: "config reloaded" in line)
                    proc.send_signal(signal.SIGINT)
                    assert await proc.wait() == 0
            assert not any("Traceback" in line for line in host.lines)


async def test_a_reload_from_a_file_that_cannot_be_read_leaves_the_host_running(
    tmp_path: Path,
) -> None:
    # a FIFO with no writer: opening it hangs, as a file on a hung mount would
    config = write_config(tmp_path)
    with trio.fail_after(120):
        async with mcplive_run(config) as host:
            await host.line(lambda line: "lobby ready" in line)
            config.unlink()
            os.mkfifo(config)
            os.kill(host.proc.pid, signal.SIGHUP)
            refused = await host.line(lambda line: "config not reloaded" in line)
            assert "could not be read within" in refused
            # the loop was never held: the host stops as asked (the read ends with it)
            host.proc.send_signal(signal.SIGINT)
            assert await host.proc.wait() == 0
    assert not any("Traceback" in line for line in host.lines)
