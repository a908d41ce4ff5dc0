"""``actors.interpreter.LoopWatch``: the longest task step, the stalls it reports, and a host
that reports a task holding its loop (in the transcript and in its status file)."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors import Host
from actors.interpreter import STALL_REPORT_S, LoopWatch

TIMEOUT = 60


def steps(watch: LoopWatch, durations: list[tuple[str, float]], clock: list[float]) -> None:
    """Drive the instrument's hooks as trio would, each step taking its duration."""
    for name, held in durations:
        task = types.SimpleNamespace(name=name)
        watch.before_task_step(task)  # type: ignore[arg-type]
        clock[0] += held
        watch.after_task_step(task)  # type: ignore[arg-type]


@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 1)), max_size=30))
def test_the_longest_step_and_the_stalls(durations: list[tuple[str, float]]) -> None:
    clock = [1000.0]
    reports: list[tuple[str, float]] = []
    watch = LoopWatch(lambda task, held: reports.append((task, held)), clock=lambda: clock[0])
    steps(watch, durations, clock)
    held = [d for _, d in durations]
    assert watch.longest == pytest.approx(max(held, default=0.0))
    if durations:
        first_longest = next(n for n, d in durations if d == max(held))
        assert watch.longest_task == first_longest or watch.longest == pytest.approx(0.0)
    slow = [(n, d) for n, d in durations if d >= STALL_REPORT_S]
    assert [name for name, _ in reports] == [name for name, _ in slow]
    assert watch.stalls == len(slow)
    assert watch.summary()["stalls"] == len(slow)


@pytest.mark.slow
async def test_a_task_that_holds_the_loop_is_named(tmp_path: Path) -> None:
    rules = tmp_path / "quiet.toml"
    rules.write_text("", encoding="utf-8")  # a model that never speaks
    config = {
        "host": {"data_dir": str(tmp_path / "data")},
        "agents": [{"name": "Ada", "model": f"scripted:{rules}"}],
    }
    with trio.fail_after(TIMEOUT):
        async with Host.open(config, status_file=False) as host:
            seen: list[str] = []

            async def watch_trace() -> None:
                async for event in host.trace(kinds={"loop-stall"}):
                    seen.append(event.data["task"])  # (the host's start may be one too)
                    if event.data["task"] == "the-hog":
                        return

            def hog() -> None:
                time.sleep(STALL_REPORT_S + 0.05)  # holds the loop: no other task runs

            async def hogging_task() -> None:
                hog()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_trace)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(hogging_task, name="the-hog")
            assert seen[-1] == "the-hog"
            summary = host.ctx.loop_watch.summary()
            assert summary["longest_step_task"] == "the-hog" and summary["stalls"] >= 1
