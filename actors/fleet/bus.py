"""The fleet's bus: PostgreSQL ``NOTIFY`` between the hosts of one store.

A server's connection is held by one host of a fleet; the agents that hear it may run on others.
The holder stores what arrives and acknowledges it as on one host; then, after the commit, it
wakes the agents that run elsewhere with one ``NOTIFY`` on :data:`WAKES` per agent and batch,
whose payload is the batch's wakes (:func:`wakes_payload`). Every host listens; the one running
the agent hands the wakes to it as if its own connection had stored them. The agent reads the
items from the store at its turn, so a wake carries only what the gate and the speech route
read, cut to fit PostgreSQL's 8000-byte payload (:data:`MAX_PAYLOAD`).

``NOTIFY`` is not durable: a wake sent while the agent moves between hosts reaches no one.
What it stood for is stored all the same (the agent reads it at its next turn), and the
outbox's notices (:data:`OUTBOX_QUEUED`, :data:`OUTBOX_DONE`) only hasten what the outbox's
readers also do every :data:`OUTBOX_POLL_S`.

One thread listens, on a connection of its own (never on the trio loop), and hands each notice
to the loop; one task sends, a batch of notices per round trip in a worker thread. At most
:data:`MAX_PENDING` notices wait to be sent; past that the oldest is dropped and counted (a wake
lost costs a late answer, never an item). A notice that cannot be read is counted and dropped.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from protocol.depth import deeper_than
from protocol.errors import RpcError
from protocol.jsonrpc import decode
from protocol.lanes import ChannelDescriptor, structure
from protocol.leases import server_resource
from protocol.routes import declared_target
from store import PutState
from store.leases import FleetTable

from ..context import HostContext
from ..directory import wire_of
from ..messages import Wake, Wakes

log = logging.getLogger(__name__)

__all__ = [
    "MAX_PAYLOAD",
    "MAX_PENDING",
    "OUTBOX_DONE",
    "OUTBOX_QUEUED",
    "WAKES",
    "FleetBus",
    "WakeNotice",
    "read_notice",
    "wakes_payload",
]

#: The channels of the fleet's notices.
WAKES = "mcplive_wakes"
OUTBOX_QUEUED = "mcplive_outbox"
OUTBOX_DONE = "mcplive_outbox_done"
#: PostgreSQL's limit on a notice's payload is 8000 bytes; ours stays under it.
MAX_PAYLOAD = 7900
#: Notices waiting to be sent; past it the oldest is dropped.
MAX_PENDING = 4096
#: Notices sent per round trip.
SEND_BATCH = 256
#: How long the listener waits for notices between checks that it should stop.
LISTEN_POLL_S = 0.5
#: The longest pause between two attempts to listen again after the connection failed.
RELISTEN_MAX_S = 5.0
#: How often the outbox's readers look without a notice.
OUTBOX_POLL_S = 1.0
#: The longest body text a remote wake carries (the gate reads its start).
WAKE_TEXT_CHARS = 400
#: The state namespace where each server's holder keeps its channels for the other hosts.
CHANNELS_NS = "fleet-channels"
#: Channels learned per server and read (the host's own cap per server is higher).
MAX_LEARNED = 1000
#: How deep a notice's JSON may nest (a descriptor's capabilities are the deepest part).
MAX_DEPTH = 10
#: The most the channels' descriptors of one notice take (bytes of JSON).
MAX_CHANNELS_BYTES = 3000

_SETS = ("own_of", "replies_to")
_BOOLS = frozenset({"addressed", "direct", "registered", "deferred"})
_WAKE_FIELDS = frozenset(a.name for a in attrs.fields(Wake))
# what a wake keeps when nothing else fits
_ESSENTIAL = frozenset({"lane", "server_id", "channel_id", "message_id", "thread_id", "count"})
#: The longest name a wake that fits only in part keeps (7 of them stay under the limit,
#: each character escaped).
MAX_NAME_CHARS = 150


def wakes_payload(
    host_id: str,
    agent: str,
    wakes: Sequence[Wake],
    channels: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> str:
    """The JSON payload that wakes ``agent`` with ``wakes``, under :data:`MAX_PAYLOAD` bytes:
    texts are cut to :data:`WAKE_TEXT_CHARS`, then the oldest wakes are folded into the
    newest one's count until it fits. ``channels`` (server id, descriptor) tell the agent's
    host where a post to the wakes' channels lands; left out when they take more than
    :data:`MAX_CHANNELS_BYTES`."""
    items = [_wake_dict(w) for w in wakes]
    described = [[sid, dict(d)] for sid, d in channels]
    if len(json.dumps(described).encode()) > MAX_CHANNELS_BYTES:
        described = []
    while True:
        data = {"host": host_id, "agent": agent, "wakes": items, "channels": described}
        body = json.dumps(data, ensure_ascii=False)
        if len(body.encode()) <= MAX_PAYLOAD:
            return body
        if len(items) > 1:
            dropped = items.pop(0)
            items[0]["count"] = int(items[0].get("count", 1)) + int(dropped.get("count", 1))
            continue
        if described:
            described = []
            continue
        # one wake too big alone: only where it is and what it counts (the agent reads the
        # item from the store), each name cut short
        wake = {k: v for k, v in items[0].items() if k in _ESSENTIAL}
        items = [{k: v[:MAX_NAME_CHARS] if isinstance(v, str) else v for k, v in wake.items()}]
        host_id, agent = host_id[:MAX_NAME_CHARS], agent[:MAX_NAME_CHARS]


def _wake_dict(wake: Wake) -> dict[str, Any]:
    d = attrs.asdict(wake, recurse=False)
    d["text"] = wake.text[:WAKE_TEXT_CHARS]
    d["tags"] = list(wake.tags)
    for name in _SETS:
        d[name] = sorted(d[name])
    return d


@attrs.frozen
class WakeNotice:
    """A :func:`wakes_payload` as read: the sending host, the agent, its wakes, and the
    channels it describes (server id, descriptor)."""

    host: str
    agent: str
    wakes: tuple[Wake, ...]
    channels: tuple[tuple[str, ChannelDescriptor], ...] = ()


def _channels_of(found: Any) -> tuple[tuple[str, ChannelDescriptor], ...]:
    """The channels a notice describes (none when they cannot be read: they only help)."""
    out = []
    for item in found if isinstance(found, list) else ():
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
            try:
                out.append((item[0], structure(item[1], ChannelDescriptor)))
            except RpcError:
                return ()
    return tuple(out)


def read_notice(payload: str) -> WakeNotice:
    """The :class:`WakeNotice` of a :func:`wakes_payload`, read once; ValueError for anything
    else."""
    if len(payload) > MAX_PAYLOAD * 2:
        raise ValueError("not a wake notice: too long")
    data = decode(payload)
    if not isinstance(data, Mapping) or deeper_than(data, MAX_DEPTH):
        raise ValueError("not a wake notice: not an object, or nested too deep")
    host, agent, items = data.get("host"), data.get("agent"), data.get("wakes")
    if not isinstance(host, str) or not isinstance(agent, str) or not isinstance(items, list):
        raise ValueError("not a wake notice: host, agent or wakes missing")
    wakes: list[Wake] = []
    for item in items[:256]:
        if not isinstance(item, Mapping) or not _WAKE_FIELDS.issuperset(item):
            raise ValueError("not a wake notice: a wake with unknown fields")
        fields = dict(item)
        for name, value in fields.items():
            if not _fits(name, value):
                raise ValueError(f"not a wake notice: {name} is {type(value).__name__}")
        fields["tags"] = tuple(str(t) for t in fields.get("tags") or ())
        for name in _SETS:
            fields[name] = frozenset(str(a) for a in fields.get(name) or ())
        try:
            wakes.append(Wake(**fields))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not a wake notice: {exc}") from None
    return WakeNotice(host, agent, tuple(wakes), _channels_of(data.get("channels")))


def _fits(name: str, value: Any) -> bool:
    """Whether a wake's field ``name`` may hold ``value`` as read from a notice."""
    if name == "count":
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if name in _BOOLS:
        return isinstance(value, bool)
    if name == "tags" or name in _SETS:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if name == "lane":
        return isinstance(value, str)
    return value is None or isinstance(value, str)


class FleetBus:
    """The notices of the host of ``ctx`` to and from the fleet on the store at ``dsn``.
    :meth:`run` listens and sends until cancelled; ``on_outbox`` is called on the loop with
    each outbox notice's channel and payload."""

    def __init__(self, ctx: HostContext, dsn: str) -> None:
        self.ctx = ctx
        self.dsn = dsn
        self.on_outbox: Callable[[str, str], None] | None = None
        # set by the host: whether a lease held here is not due to stop (the lease keeper's),
        # and the outbox's agent side (actors.fleet.outbox.FleetOutbox)
        self.lease_ok: Callable[[str], bool] | None = None
        self.outbox: Any = None
        self.dropped = 0  # notices dropped unsent (the queue was full)
        self.unreadable = 0  # notices received that could not be read
        self._pending: deque[tuple[str, str]] = deque()
        self._shared: dict[str, dict[str, Any]] = {}  # per held server: what it last shared
        self._more = trio.Event()
        self._listening = threading.Event()

    # -- sending ------------------------------------------------------------------------------
    def wake_elsewhere(self, agent: str, wakes: Sequence[Wake]) -> None:
        """Wake ``agent``, which runs on another host of the fleet (or on none just now)."""
        payload = wakes_payload(self.ctx.host_id, agent, wakes, self._described(wakes))
        self.notify(WAKES, payload)

    def _described(self, wakes: Sequence[Wake]) -> list[tuple[str, dict[str, Any]]]:
        """The descriptors of the wakes' channels, as this host knows them."""
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for w in wakes:
            if w.server_id is None or w.channel_id is None:
                continue
            wire = self._wire(w.server_id, w.channel_id)
            if wire is not None:
                out[(w.server_id, w.channel_id)] = wire
        return [(sid, wire) for (sid, _), wire in out.items()]

    def _wire(self, server_id: str, channel_id: str) -> dict[str, Any] | None:
        """A registered channel's descriptor as another host registers it (None: unknown)."""
        info = self.ctx.channel_directory.get(server_id, channel_id, False)
        if info is None or not info.registered:
            return None
        wire = dict(info.descriptor)
        if info.declared is not None:
            wire["capabilities"] = {"publish": {"target": info.declared}}
        return wire

    # -- the channels of the servers held elsewhere -------------------------------------------
    async def share_held_channels(self) -> None:
        """Share the channels of every server whose connection is held here (after each lease
        step)."""
        for sid in sorted(self.ctx.server_epochs):
            await self.share_channels(sid)

    async def share_channels(self, server_id: str) -> None:
        """On the holder of ``server_id``'s connection: keep its registered channels in the
        store (state ``fleet-channels``, under the connection's fence) for the other hosts."""
        if server_id not in self.ctx.connections:
            return
        wires = {}
        for info in self.ctx.channel_directory.infos([server_id], self.ctx.config):
            if info.channel_id is not None and (wire := self._wire(server_id, info.channel_id)):
                wires[info.channel_id] = wire
        if wires == self._shared.get(server_id):
            return
        op = PutState(namespace=CHANNELS_NS, key=server_id, value=wires)
        try:
            await self.ctx.store.write(self.ctx.fenced(server_resource(server_id), op))
            self._shared[server_id] = wires
        except Exception as exc:
            self.told(f"the channels of {server_id} could not be shared", exc)

    async def learn_channels(self) -> None:
        """On every host: register the channels the holders of the other servers shared that
        this host does not know yet (its agents' speech then finds where a post lands); nothing
        to read when every server is connected here."""
        if all(s.id in self.ctx.connections for s in self.ctx.config.servers):
            return
        try:
            shared = await self.ctx.store.read(self.ctx.store.reader.state, CHANNELS_NS)
        except Exception as exc:
            self.told("the fleet's channels could not be read", exc)
            return
        for sid, wires in sorted(shared.items()):
            if not isinstance(wires, Mapping):
                continue
            for wire in list(wires.values())[:MAX_LEARNED]:
                await self._learn_one(sid, wire)

    async def _learn_one(self, sid: str, wire: Any) -> None:
        """Register one channel of a server held elsewhere, unless this host knows it as it
        is (``wire``: a descriptor, or its JSON form)."""
        if self.ctx.config.server(sid) is None or sid in self.ctx.connections:
            return
        try:
            desc = (
                wire if isinstance(wire, ChannelDescriptor) else structure(wire, ChannelDescriptor)
            )
        except RpcError:
            return
        info = self.ctx.channel_directory.get(sid, desc.id, False)
        known = None if info is None or not info.registered else (info.descriptor, info.declared)
        if known == (wire_of(desc.id, desc), declared_target(desc.capabilities)):
            return
        try:
            await self.ctx.register_channel(sid, desc, 10.0)
        except Exception as exc:
            self.told(f"channel {desc.id} of {sid} could not be noted", exc)

    def notify(self, channel: str, payload: str) -> None:
        """Queue one notice (sent after what was committed before this call)."""
        if len(self._pending) >= MAX_PENDING:
            self._pending.popleft()
            self.dropped += 1
        self._pending.append((channel, payload))
        self._more.set()

    async def _send(self) -> None:
        table: FleetTable | None = None
        try:
            while True:
                await self._more.wait()
                self._more = trio.Event()
                while self._pending:
                    size = min(SEND_BATCH, len(self._pending))
                    batch = [self._pending.popleft() for _ in range(size)]
                    try:
                        if table is None:
                            table = await trio.to_thread.run_sync(FleetTable, self.dsn)
                        await trio.to_thread.run_sync(table.notify, batch)
                    except Exception as exc:
                        self.dropped += len(batch)
                        self.told("fleet notices not sent", exc)
                        if table is not None:
                            await trio.to_thread.run_sync(_close, table)
                        table = None
                        await trio.sleep(RELISTEN_MAX_S / 5)
        finally:
            if table is not None:
                _close(table)

    # -- listening -----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        send, recv = trio.open_memory_channel[tuple[str, str]](MAX_PENDING)
        token = trio.lowlevel.current_trio_token()
        stop = threading.Event()
        thread = threading.Thread(
            target=self._listen, args=(token, send, stop), name="mcplive-fleet-bus", daemon=True
        )
        thread.start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send)
                # listening before the host goes on: no notice sent after start is missed
                await trio.to_thread.run_sync(self._listening.wait, 10.0)
                task_status.started()
                async for channel, payload in recv:
                    await self._deliver(channel, payload)
        finally:
            stop.set()
            # the listener ends within one wait for notices (bounded by the join's own timeout:
            # a trio deadline would fire at once on an autojumping test clock)
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join, LISTEN_POLL_S * 4)

    async def _deliver(self, channel: str, payload: str) -> None:
        if channel == WAKES:
            try:
                notice = read_notice(payload)
            except ValueError as exc:
                self.unreadable += 1
                self.told("a fleet notice could not be read", exc)
                return
            ref = self.ctx.agents.get(notice.agent)
            if ref is not None and notice.host != self.ctx.host_id and notice.wakes:
                for sid, desc in notice.channels:
                    await self._learn_one(sid, desc)
                await ref.tell_promptly(Wakes(items=notice.wakes))
        elif self.on_outbox is not None:
            self.on_outbox(channel, payload)

    def _listen(
        self,
        token: trio.lowlevel.TrioToken,
        send: trio.MemorySendChannel[tuple[str, str]],
        stop: threading.Event,
    ) -> None:
        import psycopg  # a fleet's store only

        pause = 0.2
        while not stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                    for channel in (WAKES, OUTBOX_QUEUED, OUTBOX_DONE):
                        conn.execute(f"LISTEN {channel}")
                    self._listening.set()
                    pause = 0.2
                    while not stop.is_set():
                        for notice in conn.notifies(timeout=LISTEN_POLL_S):
                            item = (notice.channel, notice.payload)
                            try:
                                trio.from_thread.run_sync(send.send_nowait, item, trio_token=token)
                            except trio.WouldBlock:
                                self.dropped += 1
                            except trio.RunFinishedError:
                                return
            except Exception as exc:
                log.warning("fleet bus: listening failed: %s", self.ctx.redactor.text(str(exc)))
                stop.wait(pause)
                pause = min(pause * 2, RELISTEN_MAX_S)

    def may_act(self, resource: str) -> bool:
        """Whether this host may still act for ``resource`` (its lease is not due to stop)."""
        return self.lease_ok is None or self.lease_ok(resource)

    def told(self, what: str, exc: Exception) -> None:
        """Tell operators that ``what`` failed (one ``error`` line, the DSN's password hidden)."""
        error = self.ctx.redactor.text(f"{what}: {type(exc).__name__}: {exc}")
        self.ctx.trace.emit("error", data={"error": error, "where": "fleet"})


def _close(table: FleetTable) -> None:
    try:
        table.close()
    except Exception as exc:
        log.debug("closing the fleet bus's connection failed: %s", exc)
