"""HTTP clients load only when something needs them: ``httpx`` for a reference fetch,
``anthropic`` (which imports httpx) for an ``anthropic:`` model. Checked in a fresh interpreter,
where nothing else has imported them yet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LOBBY = [sys.executable, "-m", "tests.lobby", "--script", "none"]

SCRIPT = """
import sys
import trio

import actors.cli.command  # the CLI's own start-up (the command and what it loads)
assert not {"httpx", "anthropic"} & set(sys.modules), "imported by actors.cli.command"

from actors import Host

async def main():
    async with Host.open(CONFIG) as host:
        async for event in host.trace(kinds={"ready"}):
            break  # the lobby connected and was granted what it asked for
        await host.post_local("Ada", "hello")
        await host.run_until_idle()
        print([m["role"] for m in host.history("Ada") if m["role"] != "system"])

trio.run(main)
print(sorted({"httpx", "anthropic"} & set(sys.modules)))
"""


def run_host(tmp_path: Path, before: str = "") -> subprocess.CompletedProcess[str]:
    """:data:`SCRIPT` in a fresh interpreter (after ``before``): a host with the lobby and a
    scripted Ada, asked once."""
    rules = tmp_path / "ada.toml"
    rules.write_text('[[rules]]\nwhen = "hello"\nsay = "hi"\n', encoding="utf-8")
    config = {
        "host": {"data_dir": str(tmp_path / "data")},
        "servers": [{"id": "lobby", "command": LOBBY}],
        "agents": [{"name": "Ada", "model": f"scripted:{rules}"}],
    }
    return subprocess.run(
        [sys.executable, "-c", f"{before}CONFIG = {config!r}\n{SCRIPT}"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_host_that_fetches_nothing_never_imports_httpx(tmp_path: Path) -> None:
    done = run_host(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['user', 'assistant']", "[]"]


def test_a_fetch_still_finds_httpx() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from actors.references.fetcher import make_client, _request_url\n"
            "assert 'httpx' not in sys.modules\n"
            "make_client(); print(_request_url('http://127.0.0.1:8/a#b'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "http://127.0.0.1:8/a"


def test_a_host_on_the_embedded_store_runs_without_psycopg(tmp_path: Path) -> None:
    """psycopg is the ``postgresql`` extra's: a host on the embedded store, ``status`` and the
    rest of the CLI start without it (an import of it fails here, as where it is not installed)."""
    blocked = 'import sys\nsys.modules["psycopg"] = None  # "not installed"\n'
    done = run_host(tmp_path, blocked)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['user', 'assistant']", "[]"]
    status = subprocess.run(
        [sys.executable, "-c", f"{blocked}from actors.cli.command import main\n"
         f"raise SystemExit(main(['status', '--data-dir', {str(tmp_path / 'data')!r}]))"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert status.returncode == 3 and "no host running" in status.stdout, status.stderr
