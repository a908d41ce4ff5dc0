"""``mcplive run`` as an operator watches it: timestamps, ``--json``, levels, redaction, and a
flooding server next to a healthy one (real processes, the real clock, order only)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.fake_anthropic import FakeScript, HttpError, serve_fake_anthropic
from tests.helpers import LOBBY, STAMP, interrupt, ready, send_incoming
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

MCPLIVE = [sys.executable, "-m", "actors.cli"]
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ROOT = Path(__file__).resolve().parents[2]


class Output:
    """What a running ``mcplive`` printed so far, line by line."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.stderr = b""
        self._changed = trio.Event()

    async def read(self, stream: Any, into_lines: bool) -> None:
        buf = b""
        while chunk := await stream.receive_some(65536):
            if not into_lines:
                self.stderr += chunk
                continue
            buf += chunk
            *done, buf = buf.split(b"\n")
            self.lines += [line.decode() for line in done]
            self._changed.set()
            self._changed = trio.Event()
        self._changed.set()

    async def wait_for(self, pred: Callable[[list[str]], bool], what: str) -> None:
        while not pred(self.lines):
            if self.proc.returncode is not None:
                raise AssertionError(f"mcplive exited before {what}: {self.lines[-20:]}")
            await self._changed.wait()


@asynccontextmanager
async def mcplive(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> AsyncIterator[Output]:
    proc = await trio.lowlevel.open_process(
        [*MCPLIVE, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    out = Output(proc)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(out.read, proc.stdout, True)
            nursery.start_soon(out.read, proc.stderr, False)
            try:
                yield out
            finally:
                await interrupt(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def write_config(tmp_path: Path, servers: list[str], agents: str = "") -> Path:
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    cfg = tmp_path / "host.toml"
    cfg.write_text(
        f'[host]\ndata_dir = "{tmp_path / "data"}"\n\n'
        + "\n".join(servers)
        + (agents or '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n'),
        encoding="utf-8",
    )
    return cfg


def stdio_server(sid: str, argv: list[str], **keys: Any) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return f"[[servers]]\nid = {json.dumps(sid)}\ncommand = {json.dumps(argv)}\n{extra}\n"


async def test_a_flooding_server_gets_a_few_lines_and_a_count_and_a_healthy_one_every_line(
    tmp_path: Path,
) -> None:
    with trio.fail_after(150):
        async with open_control_listener() as listener:
            cfg = write_config(
                tmp_path,
                [
                    stdio_server(
                        "flood",
                        [sys.executable, "-m", "tests.flood_server", "junk"],
                        request_timeout_s=600,
                    ),
                    stdio_server("lobby", [*LOBBY, "--control-connect", listener.address]),
                ],
            )
            async with mcplive("run", str(cfg), cwd=tmp_path) as out:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                await out.wait_for(
                    lambda lines: any("? flood: not JSON" in line for line in lines), "the flood"
                )
                for n in range(40):
                    send_incoming(ctl, "lobby:#general", f"h{n}", f"healthy {n}")
                wanted = [f"lobby lobby:#general | Alice: healthy {n}" for n in range(40)]

                def all_chat(lines: list[str]) -> bool:
                    text = "\n".join(lines)
                    return all(w in text for w in wanted)

                await out.wait_for(all_chat, "every healthy line")
            lines = out.lines
    assert lines and all(STAMP.match(line) for line in lines if line), lines[:5]
    body = [STAMP.sub("", line) for line in lines if line]
    shown = [line for line in body if "| Alice: healthy" in line]
    assert shown == wanted  # every one, in order
    flood = [line for line in body if line.startswith("? flood")]
    assert 1 <= len(flood) <= 3 * 20  # a few per 10 s window, never one per line
    assert len([line for line in body if "flood" in line]) <= 4 * 20
    assert any(
        line.startswith("… ") and "more like this from flood in the last" in line for line in body
    ), body[-10:]
    assert "Traceback" not in out.stderr.decode()


async def test_json_lines_parse_and_follow_the_level(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            cfg = write_config(
                tmp_path, [stdio_server("lobby", [*LOBBY, "--control-connect", listener.address])]
            )
            async with mcplive("run", str(cfg), "--json", cwd=tmp_path) as out:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                ctl.send({"cmd": "line", "text": "not json at all"})
                send_incoming(ctl, "lobby:#general", "j1", "lone \\ud800 and [bold]")
                await out.wait_for(
                    lambda lines: any('"message_id":"j1"' in line for line in lines), "the chat"
                )
            lines = [line for line in out.lines if line]
        async with open_control_listener() as listener:
            cfg = write_config(
                tmp_path, [stdio_server("lobby", [*LOBBY, "--control-connect", listener.address])]
            )
            async with mcplive("run", str(cfg), "--json", "-q", cwd=tmp_path) as out:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                send_incoming(ctl, "lobby:#general", "j2", "quiet please")
                ctl.send({"cmd": "line", "text": "garbage after the chat"})
                await out.wait_for(
                    lambda lines: any("garbage after the chat" in line for line in lines),
                    "the diagnostic",
                )
            quiet = [line for line in out.lines if line]
    records = [json.loads(line) for line in lines]
    for record in records:
        assert list(record) == ["ts", "kind", "level", "agent", "server_id", "channel_id", "data"]
        assert ISO_UTC.match(record["ts"])
        assert record["level"] in ("info", "warning", "error")
    kinds = [r["kind"] for r in records]
    assert {"host-started", "ready", "diagnostic", "incoming"} <= set(kinds)
    chat = next(r for r in records if r["kind"] == "incoming")
    assert chat["server_id"] == "lobby" and chat["channel_id"] == "lobby:#general"
    assert "[bold]" in chat["data"]["text"]
    quiet_records = [json.loads(line) for line in quiet]
    assert quiet_records and all(r["level"] in ("warning", "error") for r in quiet_records)
    assert "incoming" not in {r["kind"] for r in quiet_records}


async def test_configured_secrets_are_redacted_from_chat_stderr_and_logs(tmp_path: Path) -> None:
    token = "lobby-token-0123456789"
    api_key = "sk-ant-test-9876543210"
    # Ada repeats the token; the lobby writes what it was sent on its stderr
    echo = '[[rules]]\nwhen = "token is ([\\\\w-]+)"\nsay = "you said {1}"\n'
    (tmp_path / "echo.toml").write_text(echo, encoding="utf-8")
    agents = '[[agents]]\nname = "Ada"\nmodel = "scripted:echo.toml"\n'
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            lobby = [*LOBBY, "--control-connect", listener.address]
            cfg = write_config(tmp_path, [stdio_server("lobby", lobby, token=token)], agents)
            env = {"ANTHROPIC_API_KEY": api_key}
            async with mcplive("run", str(cfg), "-v", cwd=tmp_path, env=env) as out:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                send_incoming(ctl, "lobby:#general", "s1", f"the token is {token}, key {api_key}")
                # the server's stderr line and the agent's speech line come in either order
                await out.wait_for(
                    lambda lines: (
                        any("stderr:" in line and "you said" in line for line in lines)
                        and any("| Ada → you said" in line for line in lines)
                    ),
                    "the server's stderr line and Ada's speech line",
                )
    printed = "\n".join(out.lines) + out.stderr.decode()
    assert token not in printed and api_key not in printed
    assert "| Alice: the token is «redacted», key «redacted»" in printed  # the chat line
    assert "| Ada → you said «redacted»" in printed  # the agent's speech
    assert any("stderr:" in line and "you said «redacted»" in line for line in out.lines)


async def test_verbose_streamed_text_is_printed_in_whole_lines(tmp_path: Path) -> None:
    """The scripted model streams word by word, as a provider does; ``-v`` prints each line of
    it once, not a line per word."""
    say = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi there! Ada here, and glad to chat."\n'
    (tmp_path / "hi.toml").write_text(say, encoding="utf-8")
    agents = '[[agents]]\nname = "Ada"\nmodel = "scripted:hi.toml"\n'
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            lobby = [*LOBBY, "--control-connect", listener.address]
            cfg = write_config(tmp_path, [stdio_server("lobby", lobby)], agents)
            async with mcplive("run", str(cfg), "-v", cwd=tmp_path) as out:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                send_incoming(ctl, "lobby:#general", "s1", "hello Ada")
                await out.wait_for(
                    lambda lines: any("| Ada → Hi there!" in line for line in lines), "the reply"
                )
    streamed = [STAMP.sub("", line) for line in out.lines if " streams: " in line]
    assert streamed == ["  Ada streams: Hi there! Ada here, and glad to chat."]


async def test_collapsed_model_retries_name_the_agent_not_the_waking_server(
    tmp_path: Path,
) -> None:
    """Ada's model keeps failing while the lobby's message waits: her retries repeat, and the
    collapsed line counting them blames Ada, never the lobby whose message woke her."""
    overloaded = HttpError(status=529, error_type="overloaded_error", message="Overloaded")
    script = FakeScript([overloaded] * 5)
    agents = '[[agents]]\nname = "Ada"\nmodel = "anthropic:claude-test"\n'
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery, open_control_listener() as listener:
            base_url = await nursery.start(serve_fake_anthropic, script)
            lobby = [*LOBBY, "--control-connect", listener.address]
            cfg = write_config(tmp_path, [stdio_server("lobby", lobby)], agents)
            env = {"ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": "sk-test"}
            async with mcplive("run", str(cfg), cwd=tmp_path, env=env) as out:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                send_incoming(ctl, "lobby:#general", "c1", "hello Ada")
                # four retries, then the turn gives up; three retry lines show, one is counted
                await out.wait_for(
                    lambda lines: any("(gave up after 5 attempts)" in line for line in lines),
                    "the turn giving up",
                )
            nursery.cancel_scope.cancel()
    retries = [line for line in out.lines if "retry" in line and "overloaded (529)" in line]
    collapsed = [line for line in out.lines if " more like this from " in line]
    assert len(retries) == 4 and len(collapsed) == 1, out.lines  # 3 shown, then the count
    assert " … 1 more like this from Ada in the last " in collapsed[0]
    assert not any("from lobby" in line for line in out.lines)


async def test_when_the_reader_goes_away_the_host_stops_with_one_line(tmp_path: Path) -> None:
    with trio.fail_after(90):
        proc = await trio.lowlevel.open_process(
            [*MCPLIVE, "run", "--data-dir", str(tmp_path / "data")],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None and proc.stderr is not None
            first = b""
            while b"\n" not in first:
                chunk = await proc.stdout.receive_some(4096)
                assert chunk, "mcplive exited before its first line"
                first += chunk
            await proc.stdout.aclose()  # as `mcplive run | head -1` does
            err = b""
            while chunk := await proc.stderr.receive_some(4096):
                err += chunk
            await proc.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert STAMP.match(first.decode())
    assert proc.returncode == 0
    assert err.decode().strip() == "mcplive: the transcript's reader went away; the host stopped"
