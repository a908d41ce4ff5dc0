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
    """Send every push at once; their answers, in the same order (read in one pass over the
    control events: a wait per push would rescan them all each time)."""
    mark = ctl.mark()
    for event_id, coalesce in pushes:
        ctl.send({"cmd": "push", "eventId": event_id, "text": event_id, "coalesce": coalesce})
    wanted = {event_id for event_id, _ in pushes}
    answers: dict[str, dict[str, Any]] = {}
    is_answer = answered("push/event")

    def collect(event: dict[str, Any]) -> bool:
        if is_answer(event) and event["request"]["params"]["eventId"] in wanted:
            answers[event["request"]["params"]["eventId"]] = event["response"]
        return len(answers) == len(wanted)

    # no deadline of its own: the test's fail_after bounds the whole run
    await ctl.wait_for(collect, f"answers to {len(pushes)} pushes", since=mark, timeout=None)
    return [answers[event_id] for event_id, _ in pushes]


def fallbacks(host: Any, key: str) -> list[dict[str, Any]]:
    """The stored items of subject ``key`` that are a deferred batch's fallback."""
    return [m for m in host.history("Ada") if m["metadata"].get("coalesce_key") == key]


async def test_the_subject_cap_forgets_the_least_recently_touched(tmp_path: Path) -> None:
    (tmp_path / "gate.toml").write_text(SKIP_ALL, encoding="utf-8")
    agent = {"model": f"scripted:{tmp_path / 'a.toml'}", "gate": str(tmp_path / "gate.toml")}
    (tmp_path / "a.toml").write_text("", encoding="utf-8")
    with trio.fail_after(240):
        # thousands of pushes at once: on a loaded machine the lobby's own 30 s wait for an
        # answer is too short, so it waits as long as the test does
        async with running_lobby(tmp_path, {"Ada": agent}, "--request-timeout", "240") as lb:
            host, ctl = lb.host, lb.ctl
            # the oldest subject holds a deferred batch never rendered (nothing is read)
            [pending] = await push_many(ctl, [("d0", {"key": "KD", "deferred": True})])
            assert pending["result"]["coalesce"]["outcome"] == "first"
            firsts = await push_many(
                ctl, [(f"k{i}", {"key": f"K{i}", "initial": True}) for i in range(MAX_SUBJECTS - 1)]
            )
            assert {a["result"]["coalesce"]["outcome"] for a in firsts} == {"first"}
            # at the cap: every subject is still tracked, the oldest one's batch included
            [k1] = await push_many(ctl, [("k1-again", {"key": "K1"})])
            assert k1["result"]["coalesce"] == {"outcome": "replaced", "priorEventId": "k1"}
            await host.run_until_idle()
            assert fallbacks(host, "KD") == []  # the batch still waits for its render
            # two subjects past it: KD and K0, touched least recently, are forgotten
            news = await push_many(
                ctl,
                [("n0", {"key": "N0", "initial": True}), ("n1", {"key": "N1", "initial": True})],
            )
            assert {a["result"]["coalesce"]["outcome"] for a in news} == {"first"}
            [k0] = await push_many(ctl, [("k0-again", {"key": "K0"})])
            assert k0["result"]["coalesce"]["outcome"] == "appended"  # its item was kept
            # K1, touched since, is still tracked (K0 coming back forgot K2 instead)
            [k1] = await push_many(ctl, [("k1-third", {"key": "K1"})])
            assert k1["result"]["coalesce"] == {"outcome": "replaced", "priorEventId": "k1-again"}
            await host.run_until_idle()
            # the forgotten batch was not lost: its fallback is stored
            [item] = fallbacks(host, "KD")
    assert "d0" in " ".join(b.get("text", "") for b in item["blocks"])
