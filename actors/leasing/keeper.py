"""The lease keeper: on a PostgreSQL store, only the holder of an agent's lease runs its turns.

Every ``renew_s`` (:data:`protocol.leases.RENEW_S`) the keeper steps the lease table
(:meth:`store.leases.LeaseTable.step`) for ``agent:<name>`` of every configured agent, in a
worker thread on a connection of its own (never on the trio loop). Then, for each agent:

* **newly held** (taken, or held again under a new epoch): its :class:`AgentActor` starts here,
  in the keeper's nursery, and enters ``ctx.agents`` (so the channels' wakes reach it); traced as
  ``agent-lease`` (``state="runs"``, its epoch);
* **let go** to spread the agents over the live hosts: it is stopped *inside* the step's
  transaction, before the release commits (``before_release``), so no other host can take it
  while a turn of it still runs here;
* **lost**, or **due to stop**: its lease has less than :data:`protocol.leases.SAFETY_S` left
  since the last step that renewed it (:func:`protocol.leases.must_stop`, on the host's clock,
  counted from before that step began). A watcher task checks this apart from the steps, so a
  step that hangs on an unreachable database does not keep a turn running past the lease.

Stopping an agent cancels its actor's scope (a running turn is cut), waits a moment
(:data:`STOP_WAIT_S`) for it to end, and removes it from ``ctx.agents`` and ``ctx.lease_epochs``:
what arrives for it is stored all the same, its wakes are not delivered here, and its holder
reads its history at its next turn. Traced as ``agent-lease`` (``state="moved"``, ``reason``
``released``, ``lost`` or ``expired``).

A clean stop of the host (:meth:`LeaseKeeper.leave`, after its actors have stopped) releases
every lease at once, so other hosts take them over at their next step.

Servers are leased the same way (``server:<id>``): only the holder runs the server's
:class:`ConnectionActor` (in ``ctx.connections`` and ``ctx.server_epochs``; traced as
``server-lease``), started before the agents of the same step. Every actor started here gets
its lease's fence in ``ctx.fences`` first, so its writes carry it from the first one
(:meth:`HostContext.fenced`); :meth:`LeaseKeeper.lease_ok` is what a publish checks just before
it goes out.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.agent.actor import AgentActor
from actors.context import HostContext
from actors.kernel import ActorRef
from actors.link.connection import ConnectionActor
from actors.messages import Wake, Wakes
from actors.models.base import Model
from protocol.leases import (
    AGENT,
    LEASE_S,
    RENEW_S,
    SAFETY_S,
    SERVER,
    Lease,
    agent_resource,
    kind_of,
    must_stop,
    name_of,
    server_resource,
)
from store import Fence
from store.leases import LeaseTable, StepResult

from .catchup import LOOK_BACK, missed_wakes

log = logging.getLogger(__name__)

__all__ = ["LEAVE_WAIT_S", "STOP_WAIT_S", "LeaseKeeper"]

#: How long stopping an agent waits for its task to end (a turn's shielded writes finishing).
STOP_WAIT_S = 2.0
#: How long a clean stop waits for its leases to be released.
LEAVE_WAIT_S = 5.0


@attrs.define
class _Running:
    """An agent running here: its lease's epoch, its task's scope and end, and its local
    times: when the step that last renewed it began, and when its lease expires."""

    epoch: int
    scope: trio.CancelScope
    done: trio.Event
    ref: ActorRef[Any]
    renewed_at: float
    expires_at: float


class LeaseKeeper:
    """Runs this host's share of the agents (see the module). ``table`` builds the lease table
    (in the worker thread that first uses it); ``renew_s``: the time between two steps."""

    def __init__(
        self,
        ctx: HostContext,
        models: Mapping[str, Model],
        table: Callable[[], LeaseTable],
        *,
        renew_s: float = RENEW_S,
    ) -> None:
        if not (math.isfinite(renew_s) and renew_s > 0):
            raise ValueError(f"renew_s must be a positive number of seconds, not {renew_s!r}")
        self.ctx = ctx
        self._models = models
        self._make_table = table
        self.renew_s = renew_s
        self.last: StepResult | None = None  # the last step that succeeded
        self._running: dict[str, _Running] = {}
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()  # one step at a time
        self._wake = trio.Event()  # a step is asked for now
        self._changed = trio.Event()  # the running agents' deadlines changed
        # the worker thread's side: the table, and whether it is in use or to be closed
        self._table: LeaseTable | None = None
        self._thread_lock = threading.Lock()
        self._in_use = False
        self._closed = False

    @property
    def running(self) -> dict[str, int]:
        """The agents running here, each with its lease's epoch."""
        return self._held(AGENT)

    @property
    def connected(self) -> dict[str, int]:
        """The servers whose connection this host holds, each with its lease's epoch."""
        return self._held(SERVER)

    def _held(self, kind: str) -> dict[str, int]:
        return {
            name_of(r): run.epoch for r, run in sorted(self._running.items()) if kind_of(r) == kind
        }

    def _slots(self, resource: str) -> tuple[dict[str, ActorRef[Any]], dict[str, int], str, str]:
        """Where a resource running here is entered: the directory its actor is reached
        through, the epochs of its kind, its trace kind and the trace field naming it."""
        if kind_of(resource) == SERVER:
            return self.ctx.connections, self.ctx.server_epochs, "server-lease", "server_id"
        return self.ctx.agents, self.ctx.lease_epochs, "agent-lease", "agent"

    async def run(
        self, *, task_status: trio.TaskStatus[LeaseKeeper] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Step at once (the agents and connections this host holds run when this has
        started), then every ``renew_s`` or when :meth:`ask_step` asks; they run inside this
        task."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.step_now()
            nursery.start_soon(self._watch)
            task_status.started(self)
            while True:
                with trio.move_on_after(self.renew_s):
                    await self._wake.wait()
                self._wake = trio.Event()
                await self.step_now()

    def ask_step(self) -> None:
        """Have the keeper's loop step now rather than at its next interval."""
        self._wake.set()

    def _names(self) -> list[str]:
        cfg = self.ctx.config
        return [agent_resource(a.name) for a in cfg.agents] + [
            server_resource(s.id) for s in cfg.servers
        ]

    async def step_now(self) -> StepResult | None:
        """One step, and the agents and connections started and stopped as it says; None when
        it failed (traced as an ``error``; what is due to stop is stopped)."""
        async with self._lock:
            names = self._names()
            began = trio.current_time()

            def before_release(resources: tuple[str, ...]) -> None:
                trio.from_thread.run(self._let_go, list(resources), "released")

            try:
                result = await trio.to_thread.run_sync(
                    self._step_in_thread, names, before_release, abandon_on_cancel=True
                )
            except Exception as exc:
                # (a connection error may quote the DSN: its password is hidden)
                error = self.ctx.redactor.text(f"lease step failed: {type(exc).__name__}: {exc}")
                self.ctx.trace.emit("error", data={"error": error, "where": "leases"})
                await self._stop_due()
                return None
            self.last = result
            fleet = self.ctx.fleet
            if fleet is not None:  # where posts land in the channels of servers held elsewhere,
                await fleet.learn_channels()  # known before the agents it starts catch up
            await self._apply(result, began)
            if fleet is not None:  # and the channels of the servers held here, for the others
                await fleet.share_held_channels()
        return result

    def _step_in_thread(
        self, names: Sequence[str], before_release: Callable[[tuple[str, ...]], None]
    ) -> StepResult:
        with self._thread_lock:
            if self._closed:
                raise RuntimeError("the lease keeper is closed")
            self._in_use = True
        try:
            if self._table is None:
                self._table = self._make_table()
            try:
                return self._table.step(self.ctx.host_id, names, before_release=before_release)
            except Exception:
                # the connection may be broken: the next step opens a new one
                table, self._table = self._table, None
                _close_quietly(table)
                raise
        finally:
            with self._thread_lock:
                self._in_use = False
                closing = self._closed
            if closing:
                table, self._table = self._table, None
                _close_quietly(table)

    async def _apply(self, result: StepResult, began: float) -> None:
        await self._let_go(list(result.lost), "lost")
        now = trio.current_time()
        # connections first: an agent started after them finds its servers' links dialling
        order = sorted(result.held.items(), key=lambda kv: (kind_of(kv[0]) != SERVER, kv[0]))
        for resource, held in order:
            # the lease's expiry on this host's clock: counted from before the step began, so
            # never later than the database's
            expires_at = began + (held.expires_at - result.now)
            running = self._running.get(resource)
            if running is not None and running.epoch != held.epoch:
                await self._let_go([resource], "lost")
                running = None
            if running is not None:
                running.renewed_at, running.expires_at = began, expires_at
                continue
            lease = Lease(resource, self.ctx.host_id, held.epoch, expires_at)
            if not must_stop(lease, self.ctx.host_id, began, now):
                await self._start(resource, held.epoch, began, expires_at)
        self._changed.set()

    def _actor(self, resource: str) -> Any:
        """The actor that runs ``resource`` here (None: no longer configured)."""
        name, cfg = name_of(resource), self.ctx.config
        if kind_of(resource) == SERVER:
            server = cfg.server(name)
            return None if server is None else ConnectionActor(server, self.ctx)
        agent = next((a for a in cfg.agents if a.name == name), None)
        return None if agent is None else AgentActor(agent, self._models[name], self.ctx)

    async def _start(self, resource: str, epoch: int, renewed_at: float, expires_at: float) -> None:
        if self._nursery is None or self.ctx.closing:
            return
        actor = self._actor(resource)
        if actor is None:
            return
        name = name_of(resource)
        # its writes carry the lease's fence from its first one on
        self.ctx.fences[resource] = Fence(resource, self.ctx.host_id, epoch)
        scope = trio.CancelScope()
        done = trio.Event()
        ref: ActorRef[Any] = await self._nursery.start(self._run_actor, actor, scope, done)
        self._running[resource] = _Running(epoch, scope, done, ref, renewed_at, expires_at)
        directory, epochs, trace_kind, field = self._slots(resource)
        epochs[name] = epoch
        directory[name] = ref
        data = {"state": "runs", "epoch": epoch}
        self.ctx.trace.emit(trace_kind, data=data, **{field: name})
        if kind_of(resource) == AGENT:
            self._nursery.start_soon(self._catch_up, name, ref)

    async def _catch_up(self, name: str, ref: ActorRef[Any]) -> None:
        """Wake an agent just started here with what it missed while it moved
        (:mod:`actors.leasing.catchup`)."""
        reader = self.ctx.store.reader

        def newest() -> list[Any]:
            rows = reader.walk(agent=name, newest_first=True, limit=LOOK_BACK, page=LOOK_BACK)
            return list(rows)[::-1]

        try:
            rows = await self.ctx.store.read(newest)
        except Exception as exc:
            error = f"what {name} missed while it moved could not be read: {exc}"
            self.ctx.trace.emit("error", agent=name, data={"error": error, "where": "leases"})
            return
        wakes = tuple(self._placed(w) for w in missed_wakes(rows, time.time()))
        if wakes and self.ctx.agents.get(name) is ref:
            reason = f"{len(wakes)} items it missed while it moved between hosts"
            self.ctx.trace.emit("awake", agent=name, data={"reason": reason})
            await ref.tell_promptly(Wakes(items=wakes))

    def _placed(self, wake: Wake) -> Wake:
        """``wake`` with where prose may go in its channel, as this host knows it."""
        sid, cid = wake.server_id, wake.channel_id
        if sid is None or cid is None:
            return wake
        info = self.ctx.channel_directory.get(sid, cid, self.ctx.config.publish_undeclared(sid))
        if info is None:
            return wake
        return attrs.evolve(wake, place=info.place, registered=info.registered)

    @staticmethod
    async def _run_actor(
        actor: AgentActor | ConnectionActor,
        scope: trio.CancelScope,
        done: trio.Event,
        *,
        task_status: trio.TaskStatus[ActorRef[Any]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with scope:
                await actor.run(task_status=task_status)
        finally:
            done.set()

    async def _let_go(self, resources: Sequence[str], reason: str) -> None:
        """Stop each of ``resources`` running here: out of the directory first (no wake or
        call reaches it from now on), then its scope cancelled, and their ends awaited together
        (for :data:`STOP_WAIT_S` at most)."""
        stopped = [(r, run) for r in resources if (run := self._running.pop(r, None)) is not None]
        for resource, running in stopped:
            name = name_of(resource)
            directory, epochs, _, _ = self._slots(resource)
            if directory.get(name) is running.ref:
                del directory[name]
            epochs.pop(name, None)
            running.scope.cancel()
        with trio.move_on_after(STOP_WAIT_S):
            for _, running in stopped:
                await running.done.wait()
        for resource, running in stopped:
            name = name_of(resource)
            if kind_of(resource) == SERVER:
                self.ctx.statuses.pop(name, None)
            else:
                self.ctx.turning.pop(name, None)
                self.ctx.agent_statuses.pop(name, None)
            _, _, trace_kind, field = self._slots(resource)
            data: dict[str, Any] = {"state": "moved", "reason": reason, "epoch": running.epoch}
            self.ctx.trace.emit(trace_kind, data=data, **{field: name})

    def _due(self, now: float) -> list[str]:
        host = self.ctx.host_id
        return [
            resource
            for resource, r in sorted(self._running.items())
            if must_stop(Lease(resource, host, r.epoch, r.expires_at), host, r.renewed_at, now)
        ]

    def lease_ok(self, resource: str) -> bool:
        """Whether ``resource`` runs here under a lease that is not due to stop now (on this
        host's clock): what a publish checks just before it goes out."""
        r = self._running.get(resource)
        if r is None:
            return False
        host = self.ctx.host_id
        lease = Lease(resource, host, r.epoch, r.expires_at)
        return not must_stop(lease, host, r.renewed_at, trio.current_time())

    async def _stop_due(self) -> None:
        await self._let_go(self._due(trio.current_time()), "expired")

    async def _watch(self) -> None:
        """Stops each agent whose lease was not renewed in time, whatever the steps do."""
        while True:
            host = self.ctx.host_id
            first = math.inf
            for name, r in self._running.items():
                lease = Lease(name, host, r.epoch, r.expires_at)
                # the first time must_stop holds: SAFETY_S before the earlier of the two bounds
                first = min(first, _stop_time(lease, r.renewed_at))
            with trio.move_on_at(first):
                await self._changed.wait()
            self._changed = trio.Event()
            await self._stop_due()

    async def leave(self) -> tuple[str, ...]:
        """A clean stop, once the agents have stopped: every lease of this host is released (on
        a new connection, within :data:`LEAVE_WAIT_S`) so other hosts take them at once. What
        was released (empty when it could not be done: the leases then expire)."""
        with self._thread_lock:
            self._closed = True
            idle = not self._in_use
        if idle:
            table, self._table = self._table, None
            if table is not None:
                await trio.to_thread.run_sync(_close_quietly, table)
        host = self.ctx.host_id

        def release() -> tuple[str, ...]:
            with self._make_table() as table:
                return table.release_all(host)

        released: tuple[str, ...] = ()
        with trio.move_on_after(LEAVE_WAIT_S):
            try:
                released = await trio.to_thread.run_sync(release, abandon_on_cancel=True)
            except Exception as exc:
                log.warning("releasing the leases of host %s failed: %s", host, exc)
        return released


def _stop_time(lease: Lease, renewed_at: float) -> float:
    """When :func:`protocol.leases.must_stop` starts to hold for a lease its holder keeps."""
    return min(lease.expires_at, renewed_at + LEASE_S) - SAFETY_S


def _close_quietly(table: LeaseTable | None) -> None:
    if table is None:
        return
    try:
        table.close()
    except Exception as exc:  # a broken connection: nothing more to do with it
        log.debug("closing a lease table failed: %s", exc)
