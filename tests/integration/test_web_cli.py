"""``mcplive run`` with the console: the address printed once, the console answering there, and
``mcplive check`` on console keys it cannot use (real processes, the real clock, order only)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from tests.helpers import LOBBY, ready, send_incoming
from tests.integration.test_transcript import MCPLIVE, ROOT, mcplive, stdio_server
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

CONSOLE_LINE = re.compile(r"· console at (http://127\.0\.0\.1:(\d+)/)")
HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi there! Ada here."\n'


def write_config(tmp_path: Path, host_keys: str, servers: list[str]) -> Path:
    (tmp_path / "ada.toml").write_text(HELLO, encoding="utf-8")
    cfg = tmp_path / "host.toml"
    cfg.write_text(
        f'[host]\ndata_dir = "{tmp_path / "data"}"\n{host_keys}\n\n'
        + "\n".join(servers)
        + '[[agents]]\nname = "Ada"\nmodel = "scripted:ada.toml"\n',
        encoding="utf-8",
    )
    return cfg


async def test_run_prints_the_console_address_and_serves_it(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            lobby = stdio_server("lobby", [*LOBBY, "--control-connect", listener.address])
            cfg = write_config(tmp_path, 'web = "127.0.0.1:0"', [lobby])
            async with mcplive("run", str(cfg), cwd=tmp_path) as out:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                await out.wait_for(
                    lambda lines: any(CONSOLE_LINE.search(line) for line in lines), "the address"
                )
                [url] = [m[1] for line in out.lines if (m := CONSOLE_LINE.search(line))]
                async with httpx.AsyncClient(base_url=url) as http:
                    health = (await http.get("/healthz")).json()
                    assert health["agents"] == {"Ada": "idle"}
                    page = (await http.get("/")).text
                    key = re.search(r'name="mcplive-action-key" content="([^"]+)"', page)
                    assert key is not None
                    send_incoming(ctl, "lobby:#general", "c1", "hello Ada")
                    await out.wait_for(
                        lambda lines: any("Ada → Hi there!" in line for line in lines), "reply"
                    )
                    posted = await http.post(
                        "/api/agents/Ada/post",
                        json={"text": "hello from the console"},
                        headers={"x-mcplive-action": key[1]},
                    )
                    assert posted.status_code == 200
                    await out.wait_for(
                        lambda lines: any(
                            "operator → Ada: hello from the console" in line for line in lines
                        ),
                        "the local line in the terminal too",
                    )
    assert sum(1 for line in out.lines if "· console at" in line) == 1


async def test_a_console_token_variable_that_is_not_set_stops_run(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'web = "0.0.0.0:0"\nweb_token_env = "NO_SUCH_TOKEN_VAR"', [])
    done = await trio.run_process(
        [*MCPLIVE, "run", str(cfg)],
        cwd=tmp_path,
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    [line] = done.stderr.decode().splitlines()
    assert line.startswith("mcplive: host.web_token_env: NO_SUCH_TOKEN_VAR is not set")


def test_check_reports_a_console_address_off_loopback_in_one_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, 'web = "0.0.0.0:7340"', [])
    done = subprocess.run(
        [sys.executable, "-m", "actors.cli", "check", str(cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode != 0
    problems = [line for line in (done.stdout + done.stderr).splitlines() if "host.web" in line]
    assert len(problems) == 1 and "not a loopback address" in problems[0], done
