"""Speech across the fleet: an agent's post to a server whose connection another host holds.

On a fleet each server's connection is held by one host (a lease, ``server:<id>``). An agent
that runs elsewhere posts through the store's outbox (:mod:`store.outbox`):

* **The agent's host** puts the post in the outbox, fenced by the agent's lease (a host that
  lost the agent's lease can queue nothing), with the post's idempotency key, and waits for its
  outcome: told by a notice when the holder records it, and read every
  :data:`~actors.fleet.bus.OUTBOX_POLL_S` besides. No outcome within the server's request
  timeout (plus :data:`WAIT_MARGIN_S`) is ``unconfirmed``, as a publish on one host is.
* **The holder** claims the server's queued posts (fenced by its connection's lease), publishes
  each through the channel's actor as if its own agent had spoken (the receipts, the echo rules
  and the place checks are the same), and records the outcome. A post another holder claimed
  and never finished (it was lost with its host) is claimed again and sent with the same key, so
  a server that honours idempotency keys posts it once.

The outbox is the durable way; the notices only hasten it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import attrs
import trio

from protocol.leases import agent_resource, server_resource
from protocol.receipts import Place
from protocol.routes import PublishOutcome
from store.outbox import Outbox, OutboxEntry, OutboxRow

from ..context import HostContext
from ..messages import Publish
from .bus import OUTBOX_DONE, OUTBOX_POLL_S, OUTBOX_QUEUED, FleetBus

log = logging.getLogger(__name__)

__all__ = ["MAX_WAITING", "WAIT_MARGIN_S", "FleetOutbox"]

#: How much longer than the server's request timeout an agent waits for its post's outcome.
WAIT_MARGIN_S = 15.0
#: Posts of this host's agents waiting for their outcome at once; past it a post fails at once.
MAX_WAITING = 1024
#: How long done posts stay in the outbox before they are pruned.
KEEP_DONE_S = 3600.0


class FleetOutbox:
    """Both sides of the outbox for the host of ``ctx`` (see the module). :meth:`run` sends
    the posts of the servers held here until cancelled."""

    def __init__(self, ctx: HostContext, bus: FleetBus, dsn: str) -> None:
        self.ctx = ctx
        self.bus = bus
        self.dsn = dsn
        self._outbox: Outbox | None = None  # used in worker threads, one call at a time
        self._db = trio.Lock()
        self._waiting: dict[int, trio.Event] = {}
        self._poke = trio.Event()
        bus.on_outbox = self._noticed

    async def _call(self, method: str, *args: Any) -> Any:
        async with self._db:

            def call() -> Any:
                if self._outbox is None:
                    self._outbox = Outbox(self.dsn)
                try:
                    return getattr(self._outbox, method)(*args)
                except Exception:
                    outbox, self._outbox = self._outbox, None
                    _close(outbox)
                    raise

            return await trio.to_thread.run_sync(call)

    def _noticed(self, channel: str, payload: str) -> None:
        if channel == OUTBOX_QUEUED:
            if payload in self.ctx.server_epochs:
                self._poke.set()
        elif channel == OUTBOX_DONE:
            try:
                event = self._waiting.get(int(payload))
            except ValueError:
                return
            if event is not None:
                event.set()

    # -- the agent's side ---------------------------------------------------------------------
    async def publish(
        self, agent: str, place: Place, blocks: tuple[dict[str, Any], ...], key: str, prose: bool
    ) -> tuple[PublishOutcome, Any]:
        """Post through the outbox; the outcome the holder recorded (never raises for a
        refusal or a failure)."""
        fence = self.ctx.fences.get(agent_resource(agent))
        if fence is None:
            return PublishOutcome(status="failed", reason="the agent runs on no host"), None
        if len(self._waiting) >= MAX_WAITING:
            return PublishOutcome(status="failed", reason="too many posts waiting"), None
        entry = OutboxEntry(
            server_id=place.server_id,
            channel_id=place.channel_id,
            thread_id=place.thread_id,
            agent=agent,
            key=key,
            blocks=blocks,
            prose=prose,
        )
        try:
            row_id = int(await self._call("put", entry, fence))
        except Exception as exc:
            return PublishOutcome(status="failed", reason=f"not queued: {exc}"), None
        event = self._waiting.setdefault(row_id, trio.Event())
        deadline = trio.current_time() + self.ctx.config.request_timeout(place.server_id)
        deadline += WAIT_MARGIN_S
        try:
            while True:
                with trio.move_on_at(min(deadline, trio.current_time() + OUTBOX_POLL_S)):
                    await event.wait()
                try:
                    found = (await self._call("outcomes", [row_id])).get(row_id)
                except Exception as exc:
                    log.debug("reading an outbox outcome failed: %s", exc)
                    found = None
                if found is not None:
                    return _outcome(found)
                if trio.current_time() >= deadline:
                    reason = "queued for the server's holder; no outcome yet"
                    return PublishOutcome(status="unconfirmed", reason=reason), None
        finally:
            self._waiting.pop(row_id, None)

    # -- the holder's side --------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        pruned_at = trio.current_time()
        while True:
            with trio.move_on_after(OUTBOX_POLL_S):
                await self._poke.wait()
            self._poke = trio.Event()
            for server_id, epoch in sorted(self.ctx.server_epochs.items()):
                await self._send_held(server_id, epoch)
            if trio.current_time() - pruned_at > KEEP_DONE_S / 4:
                pruned_at = trio.current_time()
                try:
                    await self._call("prune", KEEP_DONE_S)
                except Exception as exc:
                    log.debug("pruning the outbox failed: %s", exc)

    async def _send_held(self, server_id: str, epoch: int) -> None:
        host = self.ctx.host_id
        while self.ctx.server_epochs.get(server_id) == epoch:
            try:
                rows: list[OutboxRow] = await self._call("claim", server_id, host, epoch)
            except Exception as exc:
                self.bus.told(f"the outbox of {server_id} could not be read", exc)
                return
            if not rows:
                return
            for row in rows:
                if not self._may_send(server_id, epoch):
                    return  # the connection's lease is going: its next holder sends the rest
                outcome, result = await self._send(row)
                recorded = {"outcome": attrs.asdict(outcome), "result": _jsonable(result)}
                try:
                    await self._call("finish", row.id, recorded, host, epoch)
                except Exception as exc:
                    self.bus.told(f"an outbox post of {server_id} was sent, not recorded", exc)

    def _may_send(self, server_id: str, epoch: int) -> bool:
        if self.ctx.server_epochs.get(server_id) != epoch:
            return False
        return self.bus.may_act(server_resource(server_id))

    async def _send(self, row: OutboxRow) -> tuple[PublishOutcome, Any]:
        e = row.entry
        try:
            ref = await self.ctx.channel(e.server_id, e.channel_id)
            post = Publish(
                agent=e.agent, blocks=e.blocks, thread_id=e.thread_id, key=e.key, prose=e.prose
            )
            timeout = self.ctx.config.request_timeout(e.server_id) + 10
            answer: tuple[PublishOutcome, Any] = await ref.ask(post, timeout=timeout)
            return answer
        except Exception as exc:
            return PublishOutcome(status="failed", reason=str(exc) or type(exc).__name__), None


def _outcome(found: Mapping[str, Any]) -> tuple[PublishOutcome, Any]:
    said = found.get("outcome")
    if not isinstance(said, Mapping):
        return PublishOutcome(status="unknown", reason="the holder's record is unreadable"), None
    status = said.get("status")
    texts = {k: v if isinstance(v := said.get(k), str) else None for k in _OPTIONAL}
    outcome = PublishOutcome(status=status if isinstance(status, str) else "unknown", **texts)
    return outcome, found.get("result")


_OPTIONAL = ("message_id", "thread_id", "reason")


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool | list | dict):
        return value
    return str(value)


def _close(outbox: Outbox | None) -> None:
    if outbox is None:
        return
    try:
        outbox.close()
    except Exception as exc:
        log.debug("closing the outbox's connection failed: %s", exc)
