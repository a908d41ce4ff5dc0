"""What every actor of one host shares: the work counter, the trace bus, the store and the
directory of actor refs. The directory is written only by the Host and by a ConnectionActor when a
server registers a channel (channel actors live in the host's channel nursery, so they outlive a
reconnect). Each server may have at most ``MAX_CHANNELS_PER_SERVER`` channels (its unscoped lane
is not one); a channel past it is refused with ``ChannelLimit``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio

from protocol.fairness import contended, ingest_slice
from protocol.leases import agent_resource
from protocol.state import Lineages
from store import Append, Fence, PutState, RecordUsage, TrimJournal

from .config import HostConfig, host_redactor
from .directory import ChannelDirectory, SavedOpen, is_open
from .interpreter import LoopWatch
from .kernel import ActorRef, Work
from .messages import Register, Unregister
from .renders import SharedRenders
from .storage import StoreClient
from .trace import TraceBus
from .turn_token import TurnToken

MAX_CHANNELS_PER_SERVER = 1000
_Op = TypeVar("_Op", Append, PutState, RecordUsage, TrimJournal)


class ChannelLimit(Exception):
    pass


class HostContext:
    def __init__(self, config: HostConfig, store: StoreClient, trace: TraceBus, work: Work) -> None:
        self.config = config
        self.host_id = config.host_id or ""  # the host's id (``Host.open`` sets the kept one)
        self.store = store
        self.trace = trace
        self.work = work
        self.rng = random.Random()
        # configured credentials, replaced in whatever the host prints or writes for operators
        self.redactor = host_redactor(config)
        self.agents: dict[str, ActorRef[Any]] = {}
        # On a PostgreSQL store, the epoch of each agent's lease held here (written only by the
        # lease keeper, actors.leasing); its agents are the only ones in ``agents``. Empty on
        # the embedded store, where every configured agent runs.
        self.lease_epochs: dict[str, int] = {}
        # On a PostgreSQL store, the fence of each lease this host took (``agent:Ada``,
        # ``server:lobby``; written only by the lease keeper): the writes made for it carry it
        # (:meth:`fenced`). Kept after the lease is let go, so a write still under way for it is
        # refused by the store rather than made unfenced. One per configured agent and server.
        self.fences: dict[str, Fence] = {}
        # On a PostgreSQL store, the epoch of each server's lease held here: only those servers
        # have a connection on this host (empty on the embedded store).
        self.server_epochs: dict[str, int] = {}
        # On a PostgreSQL store, what carries the fleet's wakes and outbox between hosts
        # (actors.fleet.bus.FleetBus); None on the embedded store.
        self.fleet: Any = None
        self.connections: dict[str, ActorRef[Any]] = {}
        # Each connection's latest status, an immutable snapshot that only that connection
        # replaces; one entry per configured server.
        self.statuses: dict[str, Any] = {}
        # Each connection's vitals (actors.link.vitals.LinkVitals), one per configured server,
        # written only by that connection; readers take its immutable snapshot().
        self.vitals: dict[str, Any] = {}
        # Each agent's latest AgentStatus, replaced only by that agent; one per configured agent.
        self.agent_statuses: dict[str, Any] = {}
        # Each agent's newest model request of a turn (a LastRequest), replaced only by that
        # agent; one per configured agent.
        self.last_requests: dict[str, Any] = {}
        # The channel actors started (on first use: a registered channel without one is only
        # in the directory)
        self.channels: dict[tuple[str, str | None], ActorRef[Any]] = {}
        # Every known channel's latest ChannelInfo (at most MAX_CHANNELS_PER_SERVER per
        # server), and the registrations of those without an actor.
        self.channel_directory = ChannelDirectory()
        # the agents hearing each configured server (the config's agents are fixed while running)
        self.hearing = {s.id: tuple(self.agents_hearing(s.id)) for s in config.servers}
        self.saved_open = SavedOpen(store, self.hearing)
        self.channel_nursery: trio.Nursery | None = None
        # (server, channel id, its Registration or None) -> a ChannelActor
        self.channel_factory: Callable[[str, str | None, Any], Any] | None = None
        self._create_lock = trio.Lock()
        self.closing = False
        # Set by the Host: the InferenceRouter every connection shares, and the reference
        # registry's ref.
        self.inference: Any = None
        self.references: Any = None
        self.coalescer: Any = None  # the CoalescerActor's ref
        # today's tokens and cost of all agents against the [host] budgets
        # (actors.agent.budget.DayLedger), shared by the agents on this loop
        self.day: Any = None
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
        # When each connection last read something from its server: one entry per configured
        # server, written only by its own reader (dropped when its link ends).
        self.last_read: dict[str, float] = {}
        # The record of agents told about source headers: its names once read (kept in step
        # with every write since), and the lock that orders its updates.
        self.explained_names: list[str] | None = None
        self.explained_lock = trio.Lock()
        # Renderings of stored messages, shared by the agents' context readers.
        self.renders = SharedRenders()
        self.turns = TurnToken()  # agents' turns take the interpreter one after another
        # how long task steps hold the loop (the host installs it as a trio instrument)
        self.loop_watch = LoopWatch(self._stalled)

    def fenced(self, resource: str, op: _Op) -> _Op:
        """``op`` carrying the fence of ``resource``'s lease (``agent:Ada``), when this host
        took one (a fleet's store): it lands only while that lease is still this host's."""
        fence = self.fences.get(resource)
        return op if fence is None else attrs.evolve(op, fence=fence)

    def agent_fenced(self, agent: str, op: _Op) -> _Op:
        """``op`` fenced by ``agent``'s lease (see :meth:`fenced`)."""
        return self.fenced(agent_resource(agent), op)

    def _stalled(self, task: str, held_s: float) -> None:
        self.trace.emit("loop-stall", data={"task": task, "held_ms": round(held_s * 1000)})

    def _load(self, server_id: str) -> dict[str, Any]:
        """What :mod:`protocol.fairness` weighs for ``server_id`` now."""
        return {
            "server": server_id,
            "now": trio.current_time(),
            "last_read": self.last_read,
            "others_turning": self.others_turning(server_id),
        }

    def contended(self, server_id: str) -> bool:
        """Whether others need the host beside ``server_id`` (see
        :func:`protocol.fairness.contended`)."""
        return contended(**self._load(server_id))

    def ingest_slice(self, server_id: str, full: int) -> int:
        """``server_id``'s share of the host per scheduling step (see
        :func:`protocol.fairness.ingest_slice`)."""
        return ingest_slice(full=full, **self._load(server_id))

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
        """The channel actor of (server, channel), started on first use (taking over what its
        server registered)."""
        ref = self.channels.get((server_id, channel_id))
        if ref is not None:
            return ref
        key = (server_id, channel_id)
        async with self._create_lock:
            ref = self.channels.get(key)
            if ref is not None:
                return ref
            if channel_id is not None and not self.channel_directory.knows(server_id, channel_id):
                self._check_room(server_id)
            assert self.channel_nursery is not None and self.channel_factory is not None
            actor = self.channel_factory(
                server_id, channel_id, self.channel_directory.take(server_id, channel_id)
            )
            ref = await self.channel_nursery.start(self._run_channel, actor, key)
            self.channels[key] = ref
            return ref

    async def register_channel(self, server_id: str, desc: Any, timeout: float) -> None:
        """Put a channel descriptor in force. A channel without an actor is registered in the
        directory (no actor is started for it); one with an actor is told, and has taken it
        when this returns. Raises ``ChannelLimit`` for a new channel past the server's cap."""
        saved = await self.saved_open.of_channel(server_id, desc.id)
        key = (server_id, desc.id)
        ref = self.channels.get(key)
        if ref is None and self._create_lock.locked():  # an actor may be starting: wait for it
            async with self._create_lock:
                ref = self.channels.get(key)
        if ref is None:  # no await from the check to the update: no actor can start meanwhile
            if not self.channel_directory.knows(*key):
                self._check_room(server_id)
            open_for = {a: is_open(saved, a, desc) for a in self.hearing.get(server_id, ())}
            undeclared = self.config.publish_undeclared(server_id)
            self.channel_directory.register(server_id, desc, open_for, undeclared)
            return
        await ref.ask(Register(descriptor=desc), timeout=timeout)

    async def unregister_channel(self, server_id: str, channel_id: str) -> None:
        """A channel its server removed: marked so in the directory, or told to its actor."""
        if not self.channel_directory.unregister(server_id, channel_id):
            await (await self.channel(server_id, channel_id)).tell(Unregister())

    def _check_room(self, server_id: str) -> None:
        count = self.channel_directory.count(server_id)
        if count >= MAX_CHANNELS_PER_SERVER:
            raise ChannelLimit(
                f"{server_id} already has {count} channels "
                f"(at most {MAX_CHANNELS_PER_SERVER} per server)"
            )

    async def _run_channel(
        self,
        actor: Any,
        key: tuple[str, str | None],
        *,
        task_status: trio.TaskStatus[ActorRef[Any]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run a channel actor; when it ends, it leaves the directory (and its server's count)."""
        relay = _Relay(task_status)  # this frame keeps no start-up nursery alive
        del task_status
        try:
            await actor.run(task_status=relay)
        finally:
            if actor.ref is not None and self.channels.get(key) is actor.ref:
                del self.channels[key]
                self.channel_directory.forget(*key)


class _Relay:
    """Passes ``started`` on once, then lets go of the task status (and with it the nursery the
    task started in), so a long-lived task does not keep them alive."""

    def __init__(self, status: trio.TaskStatus[Any]) -> None:
        self._status: trio.TaskStatus[Any] | None = status

    def started(self, value: Any = None) -> None:
        status, self._status = self._status, None
        if status is not None:
            status.started(value)
