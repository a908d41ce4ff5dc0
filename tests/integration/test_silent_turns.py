"""Silence is cheap: an agent that decides to say nothing, turn after turn, sends a prompt whose
start is the same bytes as the turn before, so the provider's prompt cache serves most of it.

A real Host (real store in a temp dir) and a toolkit chat server in this process; the agent's
model is the Anthropic or the OpenAI-compatible provider against its fake on loopback HTTP, with
the fake's prompt cache on (it counts cache reads from the request bytes, as the API does). The
figures are read from the store's usage ledger.

Real clock, generous deadlines, no timing asserts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from examples.bench import silence
from store import Reader, db_path

pytestmark = pytest.mark.slow

DEADLINE_S = 120
TURNS = 6
#: The least share of a silent turn's input read from the cache, from the second turn on.
LEAST_SHARE = 0.8


@pytest.mark.parametrize("provider", silence.PROVIDERS)
async def test_silent_turns_are_mostly_cache_reads(tmp_path: Path, provider: str) -> None:
    with trio.fail_after(DEADLINE_S):
        run = await silence.run(tmp_path, provider, TURNS)
    assert len(run.turns) == TURNS
    # every turn ended on purpose with nothing said: silent, not failed
    assert all(t.phase == "completed" and t.silent for t in run.turns)
    first, *later = run.turns
    assert first.cache_read_tokens == 0  # nothing was cached before it
    for turn in later:
        assert turn.share >= LEAST_SHARE, (provider, [t.share for t in run.turns])
    assert run.share_after_first >= LEAST_SHARE
    # each turn reads what the turns before it sent: the part read grows with the history
    assert later[-1].cache_read_tokens > later[0].cache_read_tokens
    # the ledger's own totals say the same
    with Reader(db_path(tmp_path / "data"), read_only=True) as reader:
        [total] = reader.usage(agent="Ada")
    assert (total.turns, total.silent_turns, total.failed_turns) == (TURNS, TURNS, 0)
    assert total.cache_read_tokens == sum(t.cache_read_tokens for t in run.turns)


@pytest.mark.parametrize("provider", silence.PROVIDERS)
async def test_a_clock_injected_after_the_newest_message_does_not_spoil_the_cache(
    tmp_path: Path, provider: str
) -> None:
    # a server injects a line that changes every turn (afterUser): it is sent after the
    # history, so what comes before it is still read from the cache
    with trio.fail_after(DEADLINE_S):
        run = await silence.run(tmp_path, provider, TURNS, volatile=True)
    assert len(run.turns) == TURNS and all(t.silent for t in run.turns)
    later = run.turns[1:]
    for turn in later:
        assert turn.share >= LEAST_SHARE, (provider, [t.share for t in run.turns])
    # the history before the clock is read, not only the tools and the configured prompt
    assert later[-1].cache_read_tokens > later[0].cache_read_tokens
