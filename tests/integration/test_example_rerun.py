"""The bundled example run twice on one data dir: the second run is not silent.

Its lobby makes up fresh ids per process, so the scripted people's messages are new again; the
one item it sends with the same id every run (the photo Alice shares) is skipped as already
stored, and the transcript says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_server_failures import run_until

pytestmark = pytest.mark.slow

SHARED = "| (push) Alice shared a photo of the board game night."
SKIPPED = "· 1 already-stored item skipped from lobby"
ALICE = "lobby lobby:#general | Alice: hello everyone! hi Ada!"  # the script's first line


def message_ids(data_dir: Path, cwd: Path) -> set[str]:
    history = subprocess.run(
        [sys.executable, "-m", "actors.cli", "history", "--json", "--data-dir", str(data_dir)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    stored = [json.loads(line) for line in history.stdout.splitlines()]
    return {m["metadata"]["message_id"] for m in stored if m["metadata"].get("message_id")}


async def test_a_second_run_of_the_example_shows_fresh_messages_and_the_skip(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    run = ["run", "--data-dir", str(data), "--duration", "120"]
    first, _ = await run_until(run, [ALICE, SHARED], tmp_path)
    assert SKIPPED not in first
    before = message_ids(data, tmp_path)
    second, _ = await run_until(run, [SKIPPED, ALICE], tmp_path)
    # the skip is said, and the lobby's people start over with new messages (before, the
    # second run's first messages had the first run's ids and were skipped without a word)
    assert second.index(ALICE) < second.index(SKIPPED)  # the script's order: tick 1, then 2.5
    assert SHARED not in second  # stored by the first run: skipped, not shown again
    fresh = message_ids(data, tmp_path) - before
    assert fresh, "the second run stored no new message"

    def tags(ids: set[str]) -> set[str]:  # "k3xq-m1" -> "k3xq": the run that made the id
        return {i.split("-", 1)[0] for i in ids}

    assert len(tags(before)) == len(tags(fresh)) == 1
    assert tags(before).isdisjoint(tags(fresh))
