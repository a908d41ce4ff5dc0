"""The coalescer's subject cap over a real lobby: at 4096 subjects every one is still tracked;
more forget the least recently touched: an unread occurrence stays as an ordinary item (the next
occurrence of that subject is appended after it instead of replacing it), and a pending deferred
batch is stored as its fallback. Real clock, order-only assertions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.coalesce import MAX_SUBJECTS
from tests.helpers import answered, running_lobby

pytestmark = pytest.mark.slow

SKIP_ALL = 'default = "skip"\n'  # nothing wakes the agent, so nothing is read meanwhile


async def push_many(ctl: Any, pushes: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send every push at once; their answers, in the same order."""
    mark = ctl.mark()
    for event_id, coalesce in pushes:
        ctl.send({"cmd": "push", "eventId": event_id, "text": event_id, "coalesce": coalesce})
    answers = []
    for event_id, _ in pushes:
        event = await ctl.wait_for(
            answered("push/event", "eventId", event_id), event_id, since=mark
        )
        answers.append(event["response"])
    return answers


@pytest.mark.parametrize("subjects", [MAX_SUBJECTS, MAX_SUBJECTS + 2])
async def test_the_subject_cap_forgets_the_least_recently_touched(
    tmp_path: Path, subjects: int
) -> None:
    (tmp_path / "gate.toml").write_text(SKIP_ALL, encoding="utf-8")
    agent = {"model": f"scripted:{tmp_path / 'a.toml'}", "gate": str(tmp_path / "gate.toml")}
    (tmp_path / "a.toml").write_text("", encoding="utf-8")
    with trio.fail_after(240):
        # thousands of pushes at once: on a loaded machine the lobby's own 30 s wait for an
        # answer is too short, so it waits as long as the test does
        async with running_lobby(tmp_path, {"Ada": agent}, "--request-timeout", "240") as lb:
            # the oldest subject holds a deferred batch never rendered (nothing is read)
            [pending] = await push_many(lb.ctl, [("d0", {"key": "KD", "deferred": True})])
            assert pending["result"]["coalesce"]["outcome"] == "first"
            firsts = await push_many(
                lb.ctl, [(f"k{i}", {"key": f"K{i}", "initial": True}) for i in range(subjects - 1)]
            )
            assert {a["result"]["coalesce"]["outcome"] for a in firsts} == {"first"}
            [k0, k1] = await push_many(
                lb.ctl, [("k0-again", {"key": "K0"}), ("k1-again", {"key": "K1"})]
            )
            await lb.host.run_until_idle()
            fallback = [
                m for m in lb.host.history("Ada") if m["metadata"].get("coalesce_key") == "KD"
            ]
    if subjects == MAX_SUBJECTS:  # at the cap: every subject is still tracked
        assert k0["result"]["coalesce"] == {"outcome": "replaced", "priorEventId": "k0"}
        assert fallback == []  # the batch still waits for its render
    else:  # past it: KD and K0, touched least recently, were forgotten
        assert k0["result"]["coalesce"]["outcome"] == "appended"  # its item was kept
        # the evicted batch was not lost: its fallback is stored
        [item] = fallback
        assert "d0" in " ".join(b.get("text", "") for b in item["blocks"])
    assert k1["result"]["coalesce"]["outcome"] in ("replaced", "appended")
