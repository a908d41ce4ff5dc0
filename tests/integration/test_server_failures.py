"""What the host shows of a server's failures: how it ended and its last stderr lines, every
refusal sent to it, its declaration mismatches; and never a configured token."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from actors import Host
from actors.messages import ConnStatus
from tests.helpers import config, running_lobby, scripted, unstamped, wait_trace

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MCPLIVE = [sys.executable, "-m", "actors.cli"]
FAULTY = ["python", "-m", "tests.faulty_server"]
CRASHING = ["python", "-c", "import no_such_module"]
MISSING = "no-such-command-for-mcplive"
TOKEN = "tok-Zq8X3vL0pW9s"


def faulty(**keys: Any) -> dict[str, Any]:
    return {"id": "faulty", "command": FAULTY, "env": {"PYTHONPATH": str(ROOT)}, **keys}


async def run_until(
    args: Sequence[str], wanted: Sequence[str], cwd: Path, timeout: float = 90
) -> tuple[str, str]:
    """Run ``mcplive`` until its stdout holds every line of ``wanted`` (as substrings), then
    stop it with SIGINT; its whole stdout and stderr."""
    out, err = bytearray(), bytearray()
    with trio.fail_after(timeout):
        proc = await trio.lowlevel.open_process(
            [*MCPLIVE, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr

        async def drain_stderr() -> None:
            while chunk := await stderr.receive_some(65536):
                err.extend(chunk)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain_stderr)
                while not all(w in out.decode(errors="replace") for w in wanted):
                    chunk = await stdout.receive_some(65536)
                    assert chunk, f"mcplive exited early:\n{out.decode()}\n{err.decode()}"
                    out.extend(chunk)
                proc.send_signal(signal.SIGINT)
                while chunk := await stdout.receive_some(65536):
                    out.extend(chunk)
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    return out.decode(errors="replace"), err.decode(errors="replace")


def write_config(tmp_path: Path, servers: str) -> Path:
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    path = tmp_path / "servers.toml"
    path.write_text(
        f'[host]\ndata_dir = "data"\n\n{servers}\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n',
        encoding="utf-8",
    )
    return path


# -- how a server ended ------------------------------------------------------------------------


async def test_a_server_that_crashes_in_its_handshake_shows_its_traceback(tmp_path: Path) -> None:
    server = {"id": "broken", "command": CRASHING}
    cfg = config(tmp_path, [server], [{"name": "Ada", "model": scripted(tmp_path, "a", "")}])
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            gone = await wait_trace(stream, lambda e: e.kind == "disconnected", "the crash")
            status = host.ctx.statuses["broken"]
    assert gone.data["reason"] == "exited with code 1 during initialize"
    assert gone.data["step"] == "initialize" and gone.data["exit_code"] == 1
    tail = gone.data["stderr_tail"]
    assert tail[0] == "Traceback (most recent call last):"
    assert tail[-1] == "ModuleNotFoundError: No module named 'no_such_module'"
    assert isinstance(status, ConnStatus)
    assert status.connects == 1 and status.last_error == gone.data["reason"]
    assert status.stderr_tail == tuple(tail) and not status.connected


async def test_a_command_that_does_not_exist_is_named(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        [{"id": "ghost", "command": [MISSING, "--flag"]}],
        [{"name": "Ada", "model": scripted(tmp_path, "a", "")}],
    )
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            gone = await wait_trace(stream, lambda e: e.kind == "disconnected", "the failure")
            assert host.ctx.statuses["ghost"].last_error == f"command not found: {MISSING}"
    assert gone.data["reason"] == f"command not found: {MISSING}"
    assert gone.data["step"] is None and gone.data["stderr_tail"] == []


# -- refusals and declaration mismatches -------------------------------------------------------


async def test_every_refusal_and_mismatch_is_traced(tmp_path: Path) -> None:
    cfg = config(tmp_path, [faulty()], [{"name": "Ada", "model": scripted(tmp_path, "a", "")}])
    seen: list[Any] = []
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            gone = await wait_trace(stream, lambda e: e.kind == "disconnected", "the exit", seen)
    [mismatch] = [e.data for e in seen if e.kind == "declaration-mismatch"]
    assert mismatch["problem"] == "not-advertised"
    assert (mismatch["feature_set"], mismatch["capability"]) == ("faulty.ghost", "channels.publish")
    refused = [e for e in seen if e.kind == "refused"]
    assert [(e.data["method"], e.data["code"]) for e in refused] == [
        ("push/event", -32003),
        ("push/event", -32001),
        ("push/event", -32602),
        ("channels/incoming", None),
    ]
    nope, ghost, invalid, item = (e.data["reason"] for e in refused)
    assert nope == "Unknown feature set: faulty.nope"
    assert "faulty.ghost" in ghost
    assert "eventId" in invalid
    assert item == "unknown_channel: the channel is not registered"
    assert refused[3].channel_id == "faulty:#nowhere" and refused[3].data["message_id"] == "x1"
    assert all("request_id" in e.data for e in refused[:3])
    # the set that cannot be enabled is reported once, as the mismatch
    assert not any(e.kind == "diagnostic" and "faulty.ghost" in e.data["text"] for e in seen)
    assert gone.data["reason"] == "exited with code 3"
    assert gone.data["stderr_tail"] == ["[faulty] all answers in; exiting with code 3"]


async def test_the_transcript_shows_failures_refusals_and_mismatches(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        '[[servers]]\nid = "broken"\ncommand = ["python", "-c", "import no_such_module"]\n\n'
        f'[[servers]]\nid = "ghost"\ncommand = ["{MISSING}"]\n\n'
        '[[servers]]\nid = "faulty"\ncommand = ["python", "-m", "tests.faulty_server"]\n'
        f'env = {{ PYTHONPATH = "{ROOT}" }}\n',
    )
    wanted = [
        "! broken disconnected (exited with code 1 during initialize); reconnecting in ",
        "\n    | ModuleNotFoundError: No module named 'no_such_module'\n",
        f"! ghost disconnected (command not found: {MISSING}); reconnecting in ",
        "? faulty: feature set 'faulty.ghost' uses channels.publish, which the server did not "
        "advertise; the set cannot be enabled\n",
        "! faulty: refused push/event (-32003): Unknown feature set: faulty.nope\n",
        "! faulty: refused push/event (-32001): ",
        "! faulty: refused push/event (-32602): Invalid params",
        "! faulty faulty:#nowhere: refused an item of channels/incoming: unknown_channel: "
        "the channel is not registered\n",
        "! faulty disconnected (exited with code 3); reconnecting in ",
        "\n    | [faulty] all answers in; exiting with code 3\n",
    ]
    out, err = await run_until(["run", str(path), "--duration", "120"], wanted, tmp_path)
    assert "Traceback" not in err
    # the tail comes right under its disconnected line
    lines = unstamped(out)
    at = next(i for i, line in enumerate(lines) if line.startswith("! broken disconnected"))
    assert lines[at + 1] == "    | Traceback (most recent call last):"


async def test_a_manifest_change_reports_its_mismatches_once(tmp_path: Path) -> None:
    channels = {"register": True, "publish": True, "incoming": True, "lifecycle": True}
    chat = {"uses": ["channels.register", "channels.incoming"]}
    changed = {
        "version": "0.5",
        "channels": channels,  # pushEvents is no longer advertised
        "featureSets": {"lobby.chat": chat, "lobby.events": {"uses": ["pushEvents"]}},
    }
    seen: list[Any] = []
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lob:
            lob.ctl.send({"cmd": "manifest", "manifest": changed})
            await wait_trace(lob.stream, lambda e: e.kind == "manifest-changed", "receipt", seen)
    mismatches = [e.data for e in seen if e.kind == "declaration-mismatch"]
    assert [(m["feature_set"], m["capability"]) for m in mismatches] == [
        ("lobby.events", "pushEvents")
    ]


# -- a refused websocket upgrade never prints the token ----------------------------------------


async def echo_401(request: trio_websocket.WebSocketRequest) -> None:
    """Refuse every upgrade, echoing the request's headers in the body (a careless server)."""
    echoed = b"\r\n".join(k + b": " + v for k, v in request.headers)
    await request.reject(401, body=b"who are you?\r\n" + echoed)


async def test_a_refused_upgrade_prints_its_status_never_the_token(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        listener = await nursery.start(
            trio_websocket.serve_websocket, echo_401, "127.0.0.1", 0, None
        )
        url = f"ws://127.0.0.1:{listener.port}/mcpl"
        path = write_config(
            tmp_path, f'[[servers]]\nid = "remote"\nurl = "{url}"\ntoken = "{TOKEN}"\n'
        )
        refused = "handshake refused: HTTP 401 Unauthorized: who are you?"
        wanted = [f"! remote disconnected ({refused}"]
        out, err = await run_until(["run", str(path), "--duration", "120"], wanted, tmp_path)
        assert TOKEN not in out + err
        with trio.fail_after(90):
            check = await trio.run_process(
                [*MCPLIVE, "check", "--connect", str(path)],
                cwd=tmp_path,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        nursery.cancel_scope.cancel()
    checked = check.stdout.decode() + check.stderr.decode()
    assert check.returncode == 1
    assert f"server remote (live): could not connect: {refused}" in checked
    assert TOKEN not in checked
