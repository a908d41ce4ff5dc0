"""Message ids the toolkit makes up are unique across a server's runs: the host keeps what it
stored under each id, so a restarted server counting from 1 again would have every new message
dropped as already stored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRINT_IDS = (
    "from actors.serverkit.channels import new_message_id as n; print(n('msg'), n('msg'), n('evt'))"
)


def _one_run() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PRINT_IDS], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_two_runs_of_a_server_never_make_up_the_same_message_id() -> None:
    first, second = _one_run(), _one_run()
    assert len(set(first)) == 3 and len(set(second)) == 3
    assert not set(first) & set(second)
    assert all(i.startswith(p) for i, p in zip(first, ("msg-", "msg-", "evt-"), strict=True))
