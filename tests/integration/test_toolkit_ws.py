"""A toolkit server's websocket with a bearer token: the host with the token is served, one
without it is refused (real processes, the real clock)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from actors import Host
from tests.helpers import config, scripted, texts, wait_trace
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow


@asynccontextmanager
async def kit_ws(address: str, token: str) -> AsyncIterator[str]:
    cmd = [sys.executable, "-m", "tests.kit_server", "--ws", "--token", token]
    proc = await trio.lowlevel.open_process(
        [*cmd, "--control-connect", address], stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        buf = b""
        while b"\n" not in buf:
            chunk = await proc.stdout.receive_some(4096)
            assert chunk, "the kit server exited before listening"
            buf += chunk
        yield buf.split(b"\n", 1)[0].decode().split(" ", 1)[1]
    finally:
        proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


@pytest.mark.parametrize("token", ["s3cret", "wrong"])
async def test_only_the_host_with_the_token_is_served(tmp_path: Path, token: str) -> None:
    agents = [{"name": "Ada", "model": scripted(tmp_path, "a", "")}]
    with trio.fail_after(60):
        async with open_control_listener() as listener, kit_ws(listener.address, "s3cret") as url:
            cfg = config(tmp_path, [{"id": "kit", "url": url, "token": token}], agents)
            async with Host.open(cfg) as host:
                stream = host.trace()
                wanted = ("ready", "disconnected")
                event = await wait_trace(stream, lambda e: e.kind in wanted, "ready or refused")
                if token == "s3cret":
                    assert event.kind == "ready"
                    ctl = await listener.accept()
                    await ctl.send({"cmd": "push", "text": "with the token", "eventId": "t1"})
                    await ctl.wait_for(lambda e: e.get("event") == "done", "push answered")
                    await host.run_until_idle()
                    assert "with the token" in texts(host.history("Ada"))
                else:
                    assert event.kind == "disconnected" and "s3cret" not in str(event.data)
