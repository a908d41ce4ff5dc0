"""``Publish.echo`` under the real host: a toolkit server (``tests/echo_kit_server.py``, a
stdio subprocess) echoes what an agent published, and the echo arrives at the host as the
message the publish was confirmed as, under the agent's name, and wakes nobody.

Real processes, the real clock with generous deadlines, order-only asserts.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio

from actors import Host
from actors.trace import TraceEvent
from tests.helpers import config, scripted, texts, wait_trace

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("own_ids", [False, True])]

SERVER = [sys.executable, "-m", "tests.echo_kit_server"]
#: matches the agent's own reply too: were the echo to wake her, she would answer it
RULES = '[[rules]]\nwhen = "echo"\nsay = "Hi, echo."\n'


async def test_the_echo_arrives_as_the_confirmed_message_by_the_agent(
    tmp_path: Path, own_ids: bool
) -> None:
    command = [*SERVER, "--own-ids"] if own_ids else SERVER
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", RULES)}]
    cfg = config(tmp_path, [{"id": "echo", "command": command}], agents)
    seen: list[TraceEvent] = []
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            published = await wait_trace(
                stream, lambda e: e.kind == "published", "Ada's reply published", seen
            )
            message_id = published.data["receipt"]["messageId"]
            echo = await wait_trace(
                stream,
                lambda e: e.kind == "incoming" and e.data.get("message_id") == message_id,
                "the echo",
                seen,
            )
            await host.run_until_idle()
            history = host.history("Ada")
    assert published.agent == "Ada" and published.data["outcome"] == "delivered"
    assert published.channel_id == echo.channel_id == "echo:room"
    assert message_id.startswith("own-") is own_ids
    assert echo.data["author"] == "Ada" and echo.data["text"] == "Hi, echo."
    # the host knew the echo for Ada's own words: it woke no second turn, and was not stored
    # again for her
    assert texts(history, role="assistant") == ["Hi, echo."]
    assert [t for t in texts(history, role="user") if "Hi, echo." in t] == []
