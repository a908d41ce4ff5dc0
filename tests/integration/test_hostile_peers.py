"""Hostile peers against a live host beside a healthy agent (``examples.bench.hostile``): a model
endpoint that streams what no decoder should choke on, config and gate files that are FIFOs or
nested past any parser's depth, and console requests of the same kind. Under each, the healthy
agent answers every post, the hostile act ends in one line saying what was wrong, and the host
answers once more afterwards. Order only: the benchmark prints how long the loop was held."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from actors import Host
from actors.errors import ConfigError
from examples.bench.hostile import CASES, run_case

pytestmark = pytest.mark.slow

DEADLINE_S = 120
ANSWERS = 4

#: What each case's act ends with: a word of its one-line refusal or error.
ENDS_WITH = {
    "sse-empty-lines": "malformed stream",
    "sse-big-event": "malformed stream",
    "prose-flood": "answered",
    "tool-args": "malformed arguments",
    "deep-json": "nested too deeply",
    "deep-500": "server error (500), retry 1",
    "deep-config": "nested too deeply",
    "fifo-config": "could not be read within",
    "fifo-gate": "could not be read within",
    "console-deep-post": "400",
    "console-search": "200",
}


@pytest.mark.parametrize("case", [c for c in CASES if c != "quiet"])
async def test_the_healthy_agent_answers_under_a_hostile_peer(tmp_path: Path, case: str) -> None:
    with trio.fail_after(DEADLINE_S):
        outcome = await run_case(tmp_path, case, answers=ANSWERS, scale=0.05, read_limit_s=0.5)
    assert outcome.answers == ANSWERS
    assert outcome.running
    assert outcome.acts, "the hostile act never ended"
    first = outcome.acts[0]
    assert ENDS_WITH[case] in first
    assert "\n" not in first and "Traceback" not in first


async def test_a_fifo_for_a_config_fails_host_open_and_holds_no_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("actors.reload.READ_LIMIT_S", 0.5)
    fifo = tmp_path / "host.toml"
    os.mkfifo(fifo)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.01)

    try:
        with trio.fail_after(DEADLINE_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick)
                await trio.sleep(0.02)
                before = ticks
                with pytest.raises(ConfigError, match=r"could not be read within 0\.5 s"):
                    async with Host.open(fifo, status_file=False):
                        pass
                assert ticks > before  # the loop ran on while the read hung
                nursery.cancel_scope.cancel()
    finally:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the hung read ends
