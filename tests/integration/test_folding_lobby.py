"""A long conversation in the bundled lobby (a stdio subprocess) with an agent whose context
budget is small: its older messages fold into summaries, and it still answers about the first
message, through ``recall``. Real clock, generous deadlines, order-only assertions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.folds import is_summary
from tests.helpers import incoming_answered, running_lobby, scripted, send_incoming

pytestmark = pytest.mark.slow

RULES = """
[[rules]]
when = "(?i)what was the codeword"
calls = [{ tool = "recall", arguments = { query = "codeword is", limit = 1 } }]
say = "From my history: {result}"

[summary]
item_chars = 300
"""
ROOM = "lobby:#general"
CHATTER = 300


def answer_holding(word: str) -> Any:
    return lambda e: (
        e["event"] == "received"
        and e["message"].get("method") == "channels/publish"
        and word in str(e["message"]["params"]["content"])
    )


async def test_an_agent_with_a_small_budget_still_answers_about_an_early_message(
    tmp_path: Path,
) -> None:
    ada = {"model": scripted(tmp_path, "ada", RULES), "context_tokens": 1500}
    with trio.fail_after(240):
        async with running_lobby(tmp_path, {"Ada": ada}) as lb:
            send_incoming(lb.ctl, ROOM, "m0", "Remember this: the codeword is Marmalade.")
            await lb.ctl.wait_for(incoming_answered("m0"), "the codeword stored")
            await lb.host.run_until_idle()
            for n in range(1, CHATTER + 1):
                send_incoming(lb.ctl, ROOM, f"m{n}", f"chatter {n}: " + "lorem ipsum " * 8)
                if n % 25 == 0:  # a turn now and then, as a live room gives
                    await lb.ctl.wait_for(incoming_answered(f"m{n}"), f"message {n}")
                    await lb.host.run_until_idle()
            send_incoming(lb.ctl, ROOM, "q", "Ada, what was the codeword?")
            event = await lb.ctl.wait_for(answer_holding("Marmalade"), "an answer naming it")
            await lb.host.run_until_idle()
            history = lb.host.history("Ada")
    answer = str(event["message"]["params"]["content"])
    assert "the codeword is Marmalade" in answer
    summaries = [m for m in history if is_summary(m)]
    assert summaries  # the conversation outgrew the budget and was folded
    first = next(m for m in history if m["metadata"].get("message_id") == "m0")
    covering = [s for s in summaries if first["id"] in s["metadata"]["summarizes"]["ids"]]
    # the early message left the raw context through a summary that names where it was said
    assert len(covering) == 1
    assert "Marmalade" in covering[0]["blocks"][0]["text"]
    assert covering[0]["metadata"]["summarizes"]["channels"] == [f"lobby/{ROOM}"]
