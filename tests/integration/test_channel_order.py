"""A channel announced and used in the same write: the use finds the channel.

``tests.dm_server`` writes a ``channels/changed`` notification that adds a DM channel (or a
``channels/register`` request for it) and, in the same ``os.write``, a ``push/event`` naming it
(``origin.mcplChannelId``) or the channel's first ``channels/incoming`` message. The host
applies a connection's messages in arrival order, so the item is stored scoped to the new
channel and the agent's plain reply goes back there. Each case runs several times: a race would
show in some runs only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from tests.chat_servers import stored_channel_items
from tests.helpers import config, scripted

pytestmark = pytest.mark.slow

DM_SERVER = [sys.executable, "-m", "tests.dm_server"]
HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "hi dee"\n'
RUNS = range(5)


@asynccontextmanager
async def running_dm(tmp_path: Path) -> AsyncIterator[Host]:
    servers = [{"id": "dm", "command": DM_SERVER}]
    agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", HELLO)}]
    async with Host.open(config(tmp_path, servers, agents)) as host:
        trace = host.trace()
        async for event in trace:
            if event.kind == "ready":
                break
        yield host


async def cue(host: Host, what: str) -> dict[str, Any]:
    """Have the server announce a channel and use it in one write; the host's answer to the
    push or message."""
    result = await host.execute_tool_call("Ada", "dm--cue", {"what": what})
    assert not result["is_error"], result
    answer: dict[str, Any] = json.loads(result["content"][0]["text"])
    return answer


async def published(host: Host) -> list[dict[str, Any]]:
    result = await host.execute_tool_call("Ada", "dm--published", {})
    out: list[dict[str, Any]] = json.loads(result["content"][0]["text"])
    return out


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize(
    ("form", "channel"),
    [("push", "dm:d1"), ("register", "dm:d3")],
    ids=["channels-changed-notification", "channels-register-request"],
)
async def test_a_push_naming_a_channel_announced_just_before_it_is_scoped_to_it(
    tmp_path: Path, form: str, channel: str, run: int
) -> None:
    with trio.fail_after(60):
        async with running_dm(tmp_path) as host:
            answer = await cue(host, form)
            assert answer["result"] == {"accepted": True}
            await host.run_until_idle()
            (push,) = stored_channel_items(host)
            meta = push["metadata"]
            assert meta["channel_id"] == channel
            assert "unscoped" not in meta["source_header"]
            assert channel in meta["source_header"]
            # the reply route: the agent's plain answer goes back to the DM
            sent = await published(host)
            assert [(p["channelId"], p["content"][0]["text"]) for p in sent] == [
                (channel, "hi dee")
            ]


@pytest.mark.parametrize("run", RUNS)
async def test_a_first_direct_message_in_a_channel_announced_just_before_it_is_stored(
    tmp_path: Path, run: int
) -> None:
    with trio.fail_after(60):
        async with running_dm(tmp_path) as host:
            answer = await cue(host, "dm")
            (result,) = answer["result"]["results"]
            assert result["accepted"] is True, result
            await host.run_until_idle()
            (message,) = stored_channel_items(host)
            meta = message["metadata"]
            assert meta["channel_id"] == "dm:d2"
            assert "unscoped" not in meta["source_header"]
            assert "dm:d2" in meta["source_header"]
            sent = await published(host)
            assert [(p["channelId"], p["content"][0]["text"]) for p in sent] == [
                ("dm:d2", "hi dee")
            ]
