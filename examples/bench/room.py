"""A toolkit server with one chat channel served over a websocket on loopback, for the
benchmark's conversations (:mod:`examples.bench.community`, :mod:`examples.bench.silence`).

``accepted`` is set once the host has accepted the channel; :meth:`OneRoom.serve` serves until
cancelled and reports its ``ws://`` URL (also kept as ``url``).
"""

from __future__ import annotations

import functools
from typing import Any

import trio

from actors.serverkit import MCPLServer


class OneRoom:
    """``kit`` with the channel ``channel`` (``#general``, published to at its root)."""

    def __init__(self, kit: MCPLServer, channel: str) -> None:
        self.kit = kit
        self.channel = channel
        self.room = kit.channel(channel, label="#general", publish_target="root")
        self.url = ""
        self.accepted = trio.Event()  # set once the host accepted the channel
        kit.on_granted("channels.register")(self._registered)

    async def _registered(self) -> None:
        await self.kit.registered.wait()
        link = self.kit.link
        if link is not None and self.channel in self.kit.accepted_channels(link):
            self.accepted.set()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(
                functools.partial(self.kit.serve_websocket, "127.0.0.1", 0)
            )
            task_status.started(self.url)
