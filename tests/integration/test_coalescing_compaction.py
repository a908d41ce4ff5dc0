"""Journal compaction over a real host process: a host SIGKILLed between the snapshot append and
the trim recovers with nothing lost or duplicated, and compacts the long journal it finds on
start. Real clock, order-only assertions."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from store import Reader
from tests.helpers import interrupt, ready
from tests.integration.compaction_child import EVERY
from tests.integration.test_coalescing import STEPS, _host_config, _send, push
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

STREAM = "coalesce"


def journal(tmp_path: Path) -> list[tuple[int, dict[str, Any]]]:
    with Reader(tmp_path / "data" / "store.sqlite3") as reader:
        return reader.journal(STREAM)


def stored_event_ids(tmp_path: Path) -> list[str]:
    with Reader(tmp_path / "data" / "store.sqlite3") as reader:
        return [
            m["metadata"]["event_id"]
            for m in reader.history("Ada")
            if m["metadata"].get("coalesce_key") is not None
        ]


async def test_a_host_killed_between_the_snapshot_and_the_trim_loses_and_duplicates_nothing(
    tmp_path: Path,
) -> None:
    # advertise + the four steps: the fourth crosses EVERY and starts the first compaction
    assert len(STEPS) == EVERY
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            config = str(_host_config(tmp_path, listener.address))

            def argv(mode: str) -> list[str]:
                return [sys.executable, "-m", "tests.integration.compaction_child", mode, config]

            proc = await trio.lowlevel.open_process(
                argv("kill-before-trim"), stdout=subprocess.DEVNULL
            )
            try:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                before = await _send(ctl, STEPS[:-1])
                event_id, coalesce, _ = STEPS[-1]
                # its answer may or may not get out before the kill that its step leads to
                ctl.send({"cmd": "push", "eventId": event_id, "text": "x", "coalesce": coalesce})
                await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
            assert proc.returncode == -signal.SIGKILL
            # killed with the snapshot durable and nothing trimmed
            ops = [record["op"] for _, record in journal(tmp_path)]
            assert ops == ["advertise", "plain", "plain", "retract", "plain", "snapshot"]
            killed_at = journal(tmp_path)[-1][0]

            proc = await trio.lowlevel.open_process(argv("run"), stdout=subprocess.DEVNULL)
            try:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                after = await _send(ctl, STEPS)
                # the unread item of B was kept as an ordinary one: the next follows it
                follow = await push(ctl, "c5", "text of c5", key="B")
            finally:
                await interrupt(proc)
    # every retry, the one whose answer was lost included, gets its original answer
    assert [r["result"] for r in after[:-1]] == [r["result"] for r in before]
    assert after[-1]["result"]["coalesce"] == {"outcome": STEPS[-1][2]}
    assert follow["result"]["coalesce"]["outcome"] == "appended"
    stored = stored_event_ids(tmp_path)
    assert len(stored) == len(set(stored))  # nothing stored twice
    assert {e for e, c, _ in STEPS if not c.get("retract")} | {"c5"} <= set(stored)
    # the restart compacted the long journal it found: nothing from before the kill is left
    rows = journal(tmp_path)
    assert rows[0][1]["op"] == "snapshot" and rows[0][0] > killed_at
    assert len(rows) <= EVERY + 1
