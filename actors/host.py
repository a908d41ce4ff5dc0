"""The Host: config, the supervisor nursery, the actor directory, and the Python API.

The operator's actions (pause, release, resume, reconnect, resend or dismiss drafts, abort a
turn, roll back, and the resumes of a config reload) take a ``source``: where the action came
from (``api`` by default; ``console 127.0.0.1`` from the console, ``SIGHUP`` from a reload on
the signal, ``cli`` from a command). Each is recorded in the store's audit record
(``store.RecordAudit``: the time, the action, its target, the source, whether it changed
anything and how it went) and then told as one ``operator-action`` trace event with the same
fields.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from actors.agent.actor import (
    CHECKPOINTS,
    AbortTurn,
    AgentActor,
    ExecuteTool,
    HoldTurns,
    PostLocal,
    Resume,
    Rollback,
)
from actors.agent.budget import host_day
from actors.agent.history import read_history
from actors.agent.inference import InferenceRouter
from actors.channel.actor import ChannelActor
from actors.channel.coalescer import CoalescerActor
from actors.channel.envelope import new_id
from actors.fleet.bus import FleetBus
from actors.fleet.heartbeat import Heartbeat
from actors.fleet.outbox import FleetOutbox
from actors.leasing.keeper import LeaseKeeper
from actors.link.connection import ConnectionActor
from actors.models.base import Model
from actors.models.providers import make_model, model_from_spec
from actors.references.registry import ReferenceRegistry
from protocol.display import one_line as inline
from protocol.state import Lineages
from store import RecordAudit
from store.leases import LeaseTable

from .config import HostConfig, load_config, with_gate_policies
from .context import HostContext
from .datadir import DataDirLock, host_id_of
from .errors import ConfigError
from .interpreter import short_switch_interval
from .kernel import Work
from .messages import Reconnect
from .reload import HOST_LIVE, OffLoop, apply_plan, one_line, plan_reload
from .status import StatusWriter
from .storage import open_store
from .trace import TraceBus, TraceEvent

SHUTDOWN_GRACE_S = 5.0
#: The longest outcome an audit record keeps (``detail``), and the longest source.
AUDIT_DETAIL_CHARS = 500
AUDIT_SOURCE_CHARS = 200


class Host:
    """The running host: its config, its actors and the Python API. Open one with :meth:`open`;
    everything the host runs stops when that block ends. The agent and server arguments of its
    methods are names from the config; an unknown one raises ``KeyError``, and so does an agent
    that runs on another host of a fleet (on a PostgreSQL store only the holder of an agent's
    lease runs it: :attr:`lease_keeper`)."""

    def __init__(self, ctx: HostContext) -> None:
        self.ctx = ctx
        self._source: str | os.PathLike[str] | None = None  # the config file, for reload()
        self._reloading = trio.Lock()
        self._reader = OffLoop("the config file")
        self.status_writer: StatusWriter | None = None  # keeps <data_dir>/status.json
        self.heartbeat: Heartbeat | None = None  # beats into a PostgreSQL store's hosts table
        # On a PostgreSQL store: runs the agents whose leases this host holds (None: every
        # configured agent runs here, as on the embedded store)
        self.lease_keeper: LeaseKeeper | None = None

    @property
    def config(self) -> HostConfig:
        """The configuration in force (a reload replaces it)."""
        return self.ctx.config

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        config: str | os.PathLike[str] | Mapping[str, Any] | HostConfig,
        *,
        status_file: bool = True,
    ) -> AsyncIterator[Host]:
        """Start a host on ``config``: a path or a dict as ``tomllib`` returns it (the
        documentation's Python API page says what it runs). With ``status_file``
        (the default) it keeps ``<data_dir>/status.json`` for ``mcplive status``, paced by
        wall-clock time; a test on a mock clock that waits for the host to sit idle for a
        while (``autojump_threshold`` above zero) turns it off."""
        # the files are read in a worker thread: a FIFO or a file on a hung mount holds that
        # thread, not the caller's loop
        cfg = await OffLoop("the config file").read(_read_config, config)
        models = {a.name: make_model(a) for a in cfg.agents}
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        lock = DataDirLock(cfg.data_dir)
        lock.acquire()  # one running host per data_dir; DataDirBusy names the holder
        try:
            host_id = await trio.to_thread.run_sync(host_id_of, cfg.data_dir, cfg.host_id)
            cfg = attrs.evolve(cfg, host_id=host_id)
            with short_switch_interval():
                async with cls._opened(cfg, models, status_file) as host:
                    if isinstance(config, str | os.PathLike):
                        host._source = config
                    yield host
        finally:
            lock.release()

    @classmethod
    @asynccontextmanager
    async def _opened(
        cls, cfg: HostConfig, models: Mapping[str, Model], status_file: bool
    ) -> AsyncIterator[Host]:
        work = Work()
        trace = TraceBus()
        store = open_store(cfg, work)
        store.start()
        ctx = HostContext(cfg, store, trace, work)
        store.on_skip = lambda r: trace.emit("record-skipped", data=attrs.asdict(r))
        ctx.inference = InferenceRouter(cfg, models, model_from_spec)
        saved = store.reader.state(CHECKPOINTS[0]).get(CHECKPOINTS[1])
        ctx.lineages = Lineages.from_state(saved)
        ctx.day = await host_day(ctx, None, cfg)
        host = cls(ctx)
        body_error: Exception | None = None
        trio.lowlevel.add_instrument(ctx.loop_watch)
        try:
            async with trio.open_nursery() as nursery:
                ctx.channel_nursery = nursery
                ctx.references = await nursery.start(ReferenceRegistry(cfg, work).run)
                ctx.channel_factory = lambda sid, cid, reg: ChannelActor(sid, cid, ctx, reg)
                ctx.coalescer = await nursery.start(CoalescerActor(ctx, new_id).run)
                dsn = cfg.store
                if dsn is None:  # the embedded store: one host runs every agent and server
                    for a in cfg.agents:
                        ref = await nursery.start(AgentActor(a, models[a.name], ctx).run)
                        ctx.agents[a.name] = ref
                    for s in cfg.servers:
                        ctx.connections[s.id] = await nursery.start(ConnectionActor(s, ctx).run)
                else:  # a fleet's store: the agents and servers whose leases it holds
                    ctx.fleet = bus = FleetBus(ctx, dsn)
                    await nursery.start(bus.run)
                    bus.outbox = FleetOutbox(ctx, bus, dsn)
                    await nursery.start(bus.outbox.run)
                    keeper = LeaseKeeper(ctx, models, lambda: LeaseTable(dsn))
                    bus.lease_ok = keeper.lease_ok
                    host.lease_keeper = await nursery.start(keeper.run)
                trace.emit(
                    "host-started",
                    data={
                        "host_id": ctx.host_id,
                        "servers": [s.id for s in cfg.servers],
                        "agents": [a.name for a in cfg.agents],
                        "data_dir": str(cfg.data_dir),
                        "store": store.label,
                    },
                )
                # What start-up built lives as long as the host: the collector's full passes
                # (each stalls every task) need not walk it again. Given back on close.
                gc.freeze()
                if status_file:
                    host.status_writer = StatusWriter(ctx)
                    nursery.start_soon(host.status_writer.run)
                if cfg.store is not None:  # a fleet's shared PostgreSQL store
                    host.heartbeat = Heartbeat(ctx, cfg.store)
                    await nursery.start(host.heartbeat.run)
                try:
                    yield host
                except Exception as exc:  # re-raised below, outside the nursery
                    body_error = exc
                finally:
                    ctx.closing = True
                    trace.emit("host-stopping")
                    nursery.cancel_scope.cancel()
        finally:
            if host.lease_keeper is not None:  # its agents have stopped: others take over now
                with trio.CancelScope(shield=True):
                    await host.lease_keeper.leave()
            gc.unfreeze()
            with contextlib.suppress(KeyError):  # trio drops an instrument whose hook raised
                trio.lowlevel.remove_instrument(ctx.loop_watch)
            await store.aclose()
            trace.close()
        if body_error is not None:
            raise body_error

    async def run_until_idle(self) -> None:
        """Return when no mailbox holds work, no inbound request is being handled, no write is
        uncommitted and no turn is running."""
        await self.ctx.work.wait_idle()

    async def execute_tool_call(
        self, agent: str, tool: str, arguments: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Run ``tool`` as ``agent`` would call it (a host tool such as ``fetch_reference`` or
        ``channel_open``, or a server's ``<server>--<tool>``) and return
        ``{"is_error": bool, "content": [blocks]}``. A refusal is an error result, not an
        exception. The call is not stored in the agent's history; a successful MCPL result's
        references are registered with the server, and nothing is fetched eagerly."""
        ref = self._agent(agent)
        result: dict[str, Any] = await ref.ask(
            ExecuteTool(tool=tool, arguments=dict(arguments)), timeout=300
        )
        return result

    def history(
        self,
        agent: str,
        *,
        limit: int | None = None,
        before: str | None = None,
        after: str | None = None,
    ) -> list[dict[str, Any]]:
        """The agent's stored messages (DESIGN section 5), oldest first, set-aside ones and
        markers included. ``after`` and ``before`` are message ids of this agent: only the
        messages stored after ``after`` and before ``before`` (neither included); ``limit``
        keeps the newest N of those. With none of them, the whole history. The store is read a
        page at a time, and with ``limit`` only the pages kept are read. An id this agent has
        no message with, or a negative limit, raises ValueError; an unknown agent, KeyError."""
        self._agent(agent)
        reader = self.ctx.store.reader
        try:
            bounds = {}
            for name, message_id in (("after_seq", after), ("before_seq", before)):
                if message_id is not None:
                    seq = reader.seq_of(message_id, agent)
                    if seq is None:
                        raise ValueError(f"{agent} has no message {message_id!r}")
                    bounds[name] = seq
            return read_history(reader, agent, limit=limit, **bounds)
        finally:
            self.ctx.store.report_skipped()

    async def post_local(self, agent: str, text: str) -> None:
        """Local operator input to ``agent``: stored without a source header, its text marked
        like any sender's, and it wakes the agent. Her prose in a turn no channel woke answers
        the operator (traced as ``local-reply``), not a channel."""
        await self._agent(agent).ask(PostLocal(text=text), timeout=60)

    async def hold(self, agent: str, *, source: str = "api") -> bool:
        """Hold the agent's turns: what arrives is stored and its wakes wait (at most 100, the
        oldest dropped) until :meth:`release`; a running turn goes on. False if already held.
        Recorded as ``pause`` (see the module)."""
        source = _source(source)
        held = bool(await self._agent(agent).ask(HoldTurns(on=True), timeout=60))
        await self._record("pause", agent, source, held, "" if held else "already held")
        return held

    async def release(self, agent: str, *, source: str = "api") -> bool:
        """Let a held agent's turns run again; the wakes that waited start the next turn.
        False if it was not held. Recorded as ``release``."""
        source = _source(source)
        released = bool(await self._agent(agent).ask(HoldTurns(on=False), timeout=60))
        await self._record("release", agent, source, released, "" if released else "not held")
        return released

    async def resume(self, agent: str, *, source: str = "api") -> bool:
        """Resume an agent paused because its model refused the credential (or had none), or
        because it reached its daily token budget: the wakes that waited start a turn at once;
        its first model call tries the credential again (a refusal pauses it again), and a
        budget still reached pauses it again when that turn ends. False if it was not paused.
        A config reload calls this for every paused agent. Recorded as ``resume``."""
        source = _source(source)
        resumed = bool(await self._agent(agent).ask(Resume(), timeout=60))
        await self._record("resume", agent, source, resumed, "" if resumed else "not paused")
        return resumed

    async def unpause(self, agent: str, *, source: str = "api") -> bool:
        """Let the agent run again whatever stopped it: :meth:`release` its held turns and
        :meth:`resume` it from a pause (the console's Resume). False if it was neither held
        nor paused. Recorded once, as ``resume``."""
        source = _source(source)
        ref = self._agent(agent)
        released = bool(await ref.ask(HoldTurns(on=False), timeout=60))
        resumed = bool(await ref.ask(Resume(), timeout=60))
        done = [w for w, did in (("released its turns", released), ("resumed", resumed)) if did]
        detail = " and ".join(done) if done else "neither held nor paused"
        await self._record("resume", agent, source, bool(done), detail)
        return bool(done)

    async def abort_turn(self, agent: str, *, source: str = "api") -> bool:
        """Cancel the agent's running turn (its servers hear ``aborted``); False if none ran.
        Recorded as ``abort``."""
        source = _source(source)
        aborted = bool(await self._agent(agent).ask(AbortTurn(), timeout=60))
        await self._record("abort", agent, source, aborted, "" if aborted else "no turn ran")
        return aborted

    async def reconnect(self, server_id: str, *, source: str = "api") -> str:
        """End the server's link in force and dial a new one now (its backoff cut short):
        ``"closing"`` when a link was ended, ``"dialling"`` when none was up. An unknown server
        raises KeyError. Recorded as ``reconnect``; the link's end is told as the operator's
        doing, not as a failure (``disconnected`` with ``requested``, no wait). On a fleet a
        server whose connection another host holds raises KeyError too, saying so."""
        source = _source(source)
        ref = self.ctx.connections.get(server_id)
        if ref is None:
            if self.ctx.config.server(server_id) is not None:
                raise KeyError(
                    f"server {server_id!r} is connected from another host "
                    "(another holds its connection's lease)"
                )
            raise KeyError(f"no server with id {server_id!r}")
        answer = str(await ref.ask(Reconnect(), timeout=60))
        detail = "the link closed, dialling again" if answer == "closing" else "dialling now"
        await self._record("reconnect", server_id, source, True, detail, server=True)
        return answer

    async def resend_drafts(
        self,
        agent: str,
        ids: Iterable[str],
        destination: str,
        *,
        server_id: str | None = None,
        source: str = "api",
    ) -> dict[str, Any]:
        """Post the agent's drafts ``ids``, in order, to ``destination`` (a channel id, #label
        or @name; ``server_id`` when an id is on several servers), as its ``drafts`` tool does:
        the tool's result (``is_error`` when one failed or the destination is unknown).
        Recorded as ``resend``."""
        source = _source(source)
        args: dict[str, Any] = {"action": "resend", "ids": list(ids), "destination": destination}
        if server_id is not None:
            args["server_id"] = server_id
        result = await self.execute_tool_call(agent, "drafts", args)
        await self._record("resend", agent, source, not result.get("is_error"), _text(result))
        return result

    async def dismiss_drafts(
        self, agent: str, ids: Iterable[str], *, source: str = "api"
    ) -> dict[str, Any]:
        """Forget the agent's drafts ``ids``, as its ``drafts`` tool does: the tool's result.
        Recorded as ``dismiss``."""
        source = _source(source)
        wanted = list(ids)
        args = {"action": "dismiss", "ids": wanted}
        result = await self.execute_tool_call(agent, "drafts", args)
        detail = f"{', '.join(wanted)}: {_text(result)}"
        await self._record("dismiss", agent, source, not result.get("is_error"), detail)
        return result

    async def _record(
        self,
        action: str,
        target: str,
        source: str,
        changed: bool,
        detail: str = "",
        *,
        server: bool = False,
    ) -> None:
        """Record an operator's action in the store's audit record (waiting for its commit,
        even when the caller is cancelled), then tell it as an ``operator-action`` event; a
        record the store refuses is told as an ``error`` too."""
        at = time.time()
        detail = inline(detail, AUDIT_DETAIL_CHARS)
        op = RecordAudit(
            at=at, action=action, target=target, source=source, changed=changed, detail=detail
        )
        where = {"server_id": target} if server else {"agent": target}
        with trio.CancelScope(shield=True):
            try:
                await self.ctx.store.write(op)
            except Exception as exc:  # the store is closing or full: the action stands
                error = f"{action} of {target} by {source} not recorded: {exc}"
                self.ctx.trace.emit("error", data={"error": error, "where": "audit"}, **where)
        data = {
            "action": action,
            "target": target,
            "source": source,
            "changed": changed,
            "detail": detail,
        }
        self.ctx.trace.emit("operator-action", data=data, ts=at, **where)

    async def rollback(self, agent: str, to: str, *, source: str = "api") -> dict[str, Any]:
        """Set aside the agent's messages after message ``to`` (they stay stored) and ask each
        server whose state the agent's tool calls checkpointed to roll back to the checkpoint
        in force at ``to``. The report lists each server's answer. Recorded as ``rollback``,
        refused or not."""
        source = _source(source)
        ref = self._agent(agent)
        try:
            report: dict[str, Any] = await ref.ask(Rollback(to=to), timeout=300)
        except Exception as exc:
            await self._record("rollback", agent, source, False, f"to {to}: refused: {exc}")
            raise
        detail = f"to {to}: {report.get('set_aside')} later messages set aside"
        await self._record("rollback", agent, source, True, detail)
        return report

    async def reload(
        self,
        config: str | os.PathLike[str] | Mapping[str, Any] | HostConfig | None = None,
        *,
        source: str = "api",
    ) -> dict[str, Any]:
        """Put a new config in force where that is safe while running (agents' gates and
        system prompts, servers' capability and feature-set masks; see ``actors.reload``) and
        resume agents paused after a refused credential. ``config`` defaults to the file the
        host was opened with. The report (also a ``config-reloaded`` trace event) lists what
        changed, what needs a restart and who was resumed. An invalid config leaves the running
        one in force: a ``reload-refused`` trace event says why, and the ``ConfigError`` is
        raised. Each agent resumed is recorded as a ``resume`` from ``source``."""
        by = _source(source)
        given = config if config is not None else self._source
        if given is None:
            raise ConfigError("reload: the host was not opened from a config file; pass one")
        async with self._reloading:
            try:
                new = await self._reader.read(_read_config, given)
            except ConfigError as exc:
                problems = getattr(exc, "problems", None) or [str(exc)]
                self.ctx.trace.emit("reload-refused", data={"reason": one_line(problems)})
                raise
            plan = plan_reload(self.ctx.config, new)
            if any(k in plan.changed for k in HOST_LIVE):  # the host's day: new limits or zone
                await host_day(self.ctx, self.ctx.day, plan.config)

            async def resume(agent: str) -> bool:
                return await self._resume_after_reload(agent, by)

            return await apply_plan(self.ctx, plan, resume)

    async def _resume_after_reload(self, agent: str, source: str) -> bool:
        """A reload resumes every agent paused after its model refused the credential, or
        after its daily budget was reached; recorded as a ``resume`` of the reload's source."""
        resumed = bool(await self._agent(agent).ask(Resume(), timeout=60))
        if resumed:
            await self._record("resume", agent, source, True, "after a config reload")
        return resumed

    def trace(self, kinds: Iterable[str] | None = None) -> TraceStream:
        """Trace events from now on (after a replay of recent ones); with ``kinds``, only
        events of those kinds, plus ``trace-dropped`` when some had to be dropped."""
        return TraceStream(self.ctx.trace, None if kinds is None else frozenset(kinds))

    def _agent(self, name: str) -> Any:
        ref = self.ctx.agents.get(name)
        if ref is None:
            if any(a.name == name for a in self.ctx.config.agents):
                raise KeyError(
                    f"agent {name!r} does not run on this host (another holds its lease)"
                )
            raise KeyError(f"no agent named {name!r}")
        return ref


def _source(source: str) -> str:
    """Where an operator's action came from, as one line (``api`` when empty)."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a string, got {type(source).__name__}")
    return inline(source, AUDIT_SOURCE_CHARS) or "api"


def _text(result: Mapping[str, Any]) -> str:
    """The text of a tool result, as one line."""
    blocks = result.get("content") or ()
    text = " ".join(str(b.get("text", "")) for b in blocks if isinstance(b, Mapping))
    return inline(text, AUDIT_DETAIL_CHARS)


def _read_config(config: str | os.PathLike[str] | Mapping[str, Any] | HostConfig) -> HostConfig:
    """The config with its gate files read (blocking: run off the loop)."""
    return with_gate_policies(config if isinstance(config, HostConfig) else load_config(config))


class TraceStream:
    """An async iterator of trace events, subscribed from the moment it is created; it first
    replays the bus's recent events (so a caller that subscribes right after ``open`` misses
    nothing that happened since).

    Events already buffered are handed out without a scheduler round each; every
    ``YIELD_EVERY`` events it still yields, so a busy reader never starves the host.
    """

    YIELD_EVERY = 64

    def __init__(self, bus: TraceBus, kinds: frozenset[str] | None = None) -> None:
        self._recv = bus.subscribe_nowait(replay=True, kinds=kinds)
        self._streak = 0

    def __aiter__(self) -> TraceStream:
        return self

    async def __anext__(self) -> TraceEvent:
        try:
            if self._streak < self.YIELD_EVERY:
                try:
                    event = self._recv.receive_nowait()
                    self._streak += 1
                    return event
                except trio.WouldBlock:
                    pass
            self._streak = 0
            return await self._recv.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        self._recv.close()
