"""What every actor of one host shares: the work counter, the trace bus, the store and the
directory of actor refs. The directory is written only by the Host and by a ConnectionActor when a
server registers a channel (channel actors live in the host's channel nursery, so they outlive a
reconnect).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import trio

from protocol.state import Lineages

from .config import HostConfig, host_redactor
from .kernel import ActorRef, Work
from .storage import StoreClient
from .trace import TraceBus

MAX_CHANNELS_PER_SERVER = 1000


class ChannelLimit(Exception):
    pass


class HostContext:
    def __init__(self, config: HostConfig, store: StoreClient, trace: TraceBus, work: Work) -> None:
        self.config = config
        self.store = store
        self.trace = trace
        self.work = work
        self.rng = random.Random()
        # configured credentials, replaced in whatever the host prints or writes for operators
        self.redactor = host_redactor(config)
        self.agents: dict[str, ActorRef[Any]] = {}
        self.connections: dict[str, ActorRef[Any]] = {}
        # Each connection's latest status, an immutable snapshot that only that connection
        # replaces; one entry per configured server.
        self.statuses: dict[str, Any] = {}
        # Each agent's latest AgentStatus, replaced only by that agent; one per configured agent.
        self.agent_statuses: dict[str, Any] = {}
        self.channels: dict[tuple[str, str | None], ActorRef[Any]] = {}
        self.channel_nursery: trio.Nursery | None = None
        self.channel_factory: Callable[[str, str | None], Any] | None = None
        self._create_lock = trio.Lock()
        self.closing = False
        # Set by the Host: the InferenceRouter every connection shares, and the reference
        # registry's ref.
        self.inference: Any = None
        self.references: Any = None
        self.coalescer: Any = None  # the CoalescerActor's ref
        # Servers whose deprecated context injections were already reported (RFC-010): at most
        # one entry per configured server.
        self.injections_noticed: set[str] = set()
        # The current checkpoint of every state lineage (server, feature set), host-wide.
        self.lineages = Lineages()
        # Agents whose turn runs now, with the servers each hears (None: every server): one
        # entry per configured agent at most. A flooding server gives way to the others' turns.
        self.turning: dict[str, tuple[str, ...] | None] = {}
        # Hot-lane requests each connection has prepared and not answered yet: one entry per
        # configured server, each written only by its own connection (dropped when its link
        # ends).
        self.hot_in_flight: dict[str, int] = {}
        # The record of agents told about source headers: its names once read (kept in step
        # with every write since), and the lock that orders its updates.
        self.explained_names: list[str] | None = None
        self.explained_lock = trio.Lock()

    def others_turning(self, server_id: str) -> bool:
        """Whether an agent that does not hear ``server_id`` is in a turn now."""
        return any(hears is not None and server_id not in hears for hears in self.turning.values())

    def binding(self, server_id: str) -> str:
        """The identity of a server's binding for RFC-006 subjects: its id and where it is
        reached, so the same id configured for another endpoint is another binding."""
        server = self.config.server(server_id)
        if server is None:
            return server_id
        where = server.endpoint or server.url or " ".join(server.command or ())
        return f"{server_id}|{where}"

    def agents_hearing(self, server_id: str) -> list[str]:
        return [a.name for a in self.config.agents if a.hears(server_id)]

    async def channel(self, server_id: str, channel_id: str | None) -> ActorRef[Any]:
        """The channel actor of (server, channel), started on first use."""
        key = (server_id, channel_id)
        ref = self.channels.get(key)
        if ref is not None:
            return ref
        async with self._create_lock:
            ref = self.channels.get(key)
            if ref is not None:
                return ref
            count = sum(1 for s, _ in self.channels if s == server_id)
            if count >= MAX_CHANNELS_PER_SERVER:
                raise ChannelLimit(f"{server_id} already has {count} channels")
            assert self.channel_nursery is not None and self.channel_factory is not None
            actor = self.channel_factory(server_id, channel_id)
            ref = await self.channel_nursery.start(actor.run)
            self.channels[key] = ref
            return ref
