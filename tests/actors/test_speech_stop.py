"""What an agent is told of a publish the host's stop broke: words naming the stop, never an
exception's own text (trio's ``Nursery is closed to new arrivals`` once reached the user)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio

from actors.agent.speech import CUT_SHORT, publish
from protocol.receipts import Place


async def test_a_publish_the_stop_broke_says_it_was_cut_short() -> None:
    async def channel(server_id: str, channel_id: str) -> Any:
        raise RuntimeError("Nursery is closed to new arrivals")

    ctx = SimpleNamespace(closing=True, channel=channel, fleet=None)
    place = Place(server_id="kit", channel_id="kit:room")
    with trio.fail_after(10):
        outcome, raw = await publish(ctx, "Ada", place, "Hi room.")  # type: ignore[arg-type]
    assert (outcome.status, outcome.reason, raw) == ("unconfirmed", CUT_SHORT, None)
