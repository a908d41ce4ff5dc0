"""What a server author sees of the toolkit: ``actors.serverkit`` lists its public API and
nothing else, and a server's process loads none of the host's heavy dependencies (checked in a
fresh interpreter, where nothing else has imported them yet)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import actors.serverkit

ROOT = Path(__file__).resolve().parents[1]
#: What the host needs and a server never should: model clients, the console, the terminal.
HOST_ONLY = {"anthropic", "httpx", "hypercorn", "starlette", "rich"}
#: The third-party modules a server's process may load, as the toolkit guide lists them (and
#: what they import in turn).
SERVER_SIDE = {
    "trio",
    "trio_websocket",
    "wsproto",
    "h11",
    "attr",
    "attrs",
    "rfc8785",
    "ada_url",
    # what those bring
    "outcome",
    "sniffio",
    "sortedcontainers",
    "idna",
    "_cffi_backend",
    "cffi",
}

SCRIPT = """
import json
import sys

at_start = set(sys.modules)  # what the interpreter's own start-up loaded (site, .pth hooks)

import trio

from actors.serverkit import MCPLServer, Publish

server = MCPLServer("probe")
room = server.channel("probe:room", label="#room", publish_target="root")


@room.on_publish
def heard(publish: Publish) -> None:
    publish.echo()


@server.tool()
def ping() -> str:
    "Pong."
    return "pong"


async def main() -> None:
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve_websocket)
        port = int(url.rstrip("/").rpartition(":")[2])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /nothing HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        answer = b""
        while chunk := await stream.receive_some(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 404"), answer
        nursery.cancel_scope.cancel()


trio.run(main)
print(json.dumps(sorted({name.split(".")[0] for name in set(sys.modules) - at_start})))
"""


def test_dir_and_all_list_the_public_api_only() -> None:
    public = actors.serverkit.__all__
    assert dir(actors.serverkit) == sorted(public)
    for name in public:
        value = getattr(actors.serverkit, name)
        assert not name.startswith("_") and not isinstance(value, types.ModuleType), name
    # the reference documents every one of them, and nothing else
    reference = (ROOT / "docs" / "serverkit" / "reference.rst").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. auto(?:class|function|data):: (\w+)", reference, re.M))
    assert documented == set(public)


@pytest.mark.slow
def test_a_server_process_loads_none_of_the_hosts_dependencies() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert not HOST_ONLY & loaded
    third_party = {m for m in loaded if m not in sys.stdlib_module_names} - {"actors", "protocol"}
    assert third_party <= SERVER_SIDE, third_party - SERVER_SIDE
    assert "store" not in loaded  # nor the host's storage
