"""AgentActor: one per configured agent.

Its mailbox takes wakes, local input and tool calls run on its behalf; each turn runs in its own
child task, so the mailbox stays live while a model streams or a tool waits. Wakes that arrive
during a turn are folded into one follow-up turn (the newest conversation wins the reply): the
context is read from the store, so nothing is lost by folding.

A turn: read the agent's stored messages, keep the newest whole turns within the token budget,
call the model, run its tool calls (at most ``MAX_TOOL_ROUNDS`` rounds), store everything, then
publish the final text to the conversation of the newest message that woke it. A wake by pushes
alone publishes nothing.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from protocol.coalesce import inference_needed
from protocol.gate import Drained, Gate, GateConfig, GateEvent, WakeBuffer
from protocol.routes import Candidate, Route, decide_route
from protocol.source import mark_text
from protocol.state import Recorded, read_rollback_result, rollback_params, rollback_targets
from store import Append, MessageRecord, PutState

from .calls import notify
from .channel import new_id
from .coalescer import (
    RENDER_TIMEOUT_S,
    Assembled,
    BeginAssembly,
    RenderWait,
    is_hidden_marker,
    render,
)
from .config import AgentConfig, load_gate
from .context import HostContext
from .hooks import TurnHooks, injection_messages
from .kernel import Actor, Reply
from .messages import Call, Reconfigure, Wake, Wakes, WakeTarget, Withdraw
from .models import Model, ModelError, ModelRequest
from .scripted import body_of
from .speech import (
    SILENCING_TOOLS,
    Drafts,
    SpeechSender,
    TurnSpeech,
    Typing,
    channel_views,
    typing_allowed,
)
from .tools import AUTHORITY, ToolRuntime

MAX_TOOL_ROUNDS = 8
TOOL_TIMEOUT_S = 120.0

DEFAULT_PROMPT = (
    "You are {name}, an agent in live chat communities, connected through the mcplive host. "
    "Each incoming message is introduced by where it came from and who wrote it. Reply briefly; "
    "your reply goes to the conversation that woke you. Use the tools when they help."
)


@attrs.frozen(kw_only=True)
class PostLocal:
    text: str


@attrs.frozen(kw_only=True)
class ExecuteTool:
    tool: str
    arguments: Any


@attrs.frozen(kw_only=True)
class HoldTurns:
    """Hold the agent's turns (``on``) or let them run again. While held, everything is stored
    and wakes wait in the agent's wake buffer (its cap and policy); a running turn goes on.
    The answer says whether the hold changed."""

    on: bool


@attrs.frozen(kw_only=True)
class AbortTurn:
    """Cancel the running turn, if any; the answer says whether one was running."""


@attrs.frozen(kw_only=True)
class Rollback:
    """Set aside everything after ``to`` (a message id) and roll servers' state back to the
    checkpoints in force at that message."""

    to: str


#: Where the names of the agents already told about source headers are kept (a JSON list).
EXPLAINED = ("framework", "source_headers_explained")
MAX_EXPLAINED = 10_000  # names kept; the oldest go first
NOTICE_KIND = "source-header-notice"
SCAN_ALL = 2**62  # the scan reads everything stored since the last one
HEADER_NOTICE = (
    "[source] Messages from connected servers begin with a header the host writes, naming where "
    "each came from: [source: <server> / <channel-id> · <label> · thread <id> · reply to <id>], "
    "with the label, thread and reply parts only when known. A push that belongs to no channel "
    "reads [source: server · unscoped]. " + AUTHORITY
)

#: The most messages one rollback may set aside.
MAX_ROLLBACK_SPAN = 10_000
#: Namespace and key of the host-wide current checkpoints in the store's state table.
CHECKPOINTS = ("checkpoints", "current")


#: Tags of items that are not conversation (they never count for the speech route).
NOT_CONVERSATIONAL = frozenset({"chat:reaction", "chat:system"})
#: How often (in seconds of the host's clock) the gate file's modification time is checked.
GATE_RELOAD_S = 1.0
#: How long a turn waits for a batch another turn is rendering (its render's own bound, and
#: the time to store what it materialized).
JOIN_RENDER_S = RENDER_TIMEOUT_S + 5.0
#: Withdrawn occurrences remembered per agent, for a wake that arrives after its withdrawal.
MAX_WITHDRAWN = 1024


def candidate_of(wake: Wake) -> Candidate | None:
    """The route candidate a wake stands for: channel items only (a gate batch or local input
    names no conversation)."""
    if wake.lane not in ("incoming", "push") or not wake.server_id or not wake.channel_id:
        return None
    return Candidate(
        server_id=wake.server_id,
        channel_id=wake.channel_id,
        thread_id=wake.thread_id,
        message_id=wake.message_id,
        addressed=wake.addressed,
        conversational=not NOT_CONVERSATIONAL.intersection(wake.tags),
        place=wake.place,
        registered=wake.registered,
    )


MIN_MESSAGE_TOKENS = 8


def estimate_tokens(message: Mapping[str, Any]) -> int:
    """A rough token count; a rendered message carries its own under ``tokens``."""
    cached = message.get("tokens")
    if isinstance(cached, int):
        return cached
    total = MIN_MESSAGE_TOKENS
    for b in message.get("blocks", ()):
        kind = b.get("type")
        if kind == "text":
            total += len(str(b.get("text", ""))) // 4 + 1
        elif kind in ("tool_use", "tool_result"):
            total += len(json.dumps(b, default=str)) // 4 + 1
        else:
            total += 400
    return total


def fit_budget(messages: Sequence[Mapping[str, Any]], budget: int) -> list[Mapping[str, Any]]:
    """Drop the oldest whole units until the rest fits; an assistant message and the tool
    results after it form one unit, so a tool call is never separated from its result."""
    tail = ContextTail(budget)
    tail.extend(messages)
    return tail.messages()


class ContextTail:
    """The newest whole units of an agent's context within a token budget, kept incrementally:
    new messages are appended and the oldest units dropped, with each unit's size computed
    once: dropping only ever removes the oldest units, so trimming as messages arrive keeps the
    same units as trimming everything at once."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._units: deque[list[Mapping[str, Any]]] = deque()
        self._sizes: deque[int] = deque()
        self.total = 0

    def extend(self, messages: Sequence[Mapping[str, Any]]) -> None:
        for m in messages:
            size = estimate_tokens(m)
            if (
                m.get("role") == "tool"
                and self._units
                and self._units[-1][0].get("role") == "assistant"
            ):
                self._units[-1].append(m)
                self._sizes[-1] += size
            else:
                self._units.append([m])
                self._sizes.append(size)
            self.total += size
        while self.total > self.budget and len(self._units) > 1:
            self._units.popleft()
            self.total -= self._sizes.popleft()

    def messages(self) -> list[Mapping[str, Any]]:
        return [m for unit in self._units for m in unit]


def render_for_model(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as the model sees it: inbound items are introduced by their source."""
    out = {
        "role": message["role"],
        "blocks": list(message.get("blocks", ())),
        "metadata": message.get("metadata", {}),
    }
    meta = message.get("metadata") or {}
    src = meta.get("inbound_source") if isinstance(meta, Mapping) else None
    if message["role"] == "user" and isinstance(src, Mapping) and "source_header" not in meta:
        where = f"{src.get('server')}" + (
            f" {src.get('label') or src.get('channel')}" if src.get("channel") else " push event"
        )
        author = meta.get("author") or {}
        who = author.get("name") or author.get("id") if isinstance(author, Mapping) else None
        intro = f"[{where}] {who}:" if who else f"[{where}]"
        out["blocks"] = [{"type": "text", "text": intro}, *out["blocks"]]
        out["prefix"] = 1
    return out


class AgentActor(Actor):
    mailbox_size = 256

    def __init__(self, cfg: AgentConfig, model: Model, ctx: HostContext) -> None:
        super().__init__(f"agent:{cfg.name}", ctx.work)
        self.cfg = cfg
        self.model = model
        self.ctx = ctx
        self.servers = tuple(s.id for s in ctx.config.servers if cfg.hears(s.id))
        self.buffer: WakeBuffer[Wake] = WakeBuffer()
        self.turn_running = False
        self.held = False  # turns held by the operator (``Host.hold``)
        # RFC-006 occurrences withdrawn (replaced or retracted unread), newest last: a wake of
        # one that arrives after its withdrawal is dropped too
        self._withdrawn: OrderedDict[str, None] = OrderedDict()
        self.system = cfg.system_prompt or DEFAULT_PROMPT.format(name=cfg.name)
        self._tail = ContextTail(cfg.context_tokens)  # the context as of the last turn
        self._seen_seq = 0
        self._turns = 0  # turnIndex of the next turn (counted from this process's start)
        self.conversation_id = f"agent:{cfg.name}"
        self._turn_scope: trio.CancelScope | None = None
        self._scan_seq = 0  # how far the header-notice scan has read the agent's history
        self._sees_header = False
        self._notice_given = False
        # speech: the outgoing queue, the drafts, the turn's speech while one runs, and how
        # many ended turns still wait for their speech to settle (their receipts)
        self.sender = SpeechSender(ctx, cfg.name, self.spawn, self._maybe_start, self._trace)
        self.drafts = Drafts(ctx, cfg.name)
        self.speech: TurnSpeech | None = None
        self._settling = 0
        self._parked = False
        # the event gate, its file's last seen modification time, and the timer it needs
        self.gate = Gate(load_gate(cfg.gate) if cfg.gate is not None else None)
        self._gate_mtime = _mtime(cfg.gate)
        self._gate_checked = -1e18
        self._timer_changed = trio.Event()
        self._sleep_until: float | None = None

    async def on_start(self) -> None:
        await self.drafts.load()
        self.spawn(self._timers, counted=False)

    def _trace(self, kind: str, place: Any = None, **data: Any) -> None:
        """A trace event of this agent; ``place`` is anything naming a ``server_id`` and a
        ``channel_id`` (a wake target, a speech place), or None."""
        self.ctx.trace.emit(
            kind,
            agent=self.cfg.name,
            server_id=place.server_id if place is not None else None,
            channel_id=place.channel_id if place is not None else None,
            data=data,
        )

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Wake):
            self._note_wake(msg)
            reply.value(None)
        elif isinstance(msg, Wakes):
            for wake in msg.items:
                self._note_wake(wake)
            reply.value(None)
        elif isinstance(msg, Withdraw):
            self._withdraw(msg.occurrence)
            reply.value(None)
        elif isinstance(msg, PostLocal):
            record = MessageRecord(
                id=new_id(),
                agent=self.cfg.name,
                role="user",
                # no header: the operator is not a connected server; the text is marked like
                # any sender's, so it cannot pass for one
                blocks=({"type": "text", "text": mark_text(msg.text)},),
                metadata={"lane": "local"},
                created_at=time.time(),
            )
            self.spawn(self._store_local, record, reply)
        elif isinstance(msg, ExecuteTool):
            self.spawn(self._execute, msg, reply)
        elif isinstance(msg, HoldTurns):
            changed = self.held != msg.on
            self.held = msg.on
            if changed:
                self._trace("turns-held" if msg.on else "turns-released", waiting=len(self.buffer))
            reply.value(changed)
            self._maybe_start()
        elif isinstance(msg, AbortTurn):
            scope = self._turn_scope
            if scope is not None:
                scope.cancel()
            reply.value(scope is not None)
        elif isinstance(msg, Rollback):
            if self.turn_running:
                reply.error(RuntimeError("a turn is running; roll back once it has ended"))
            else:
                self.turn_running = True  # no turn starts while the rollback runs
                self.spawn(self._rollback, msg.to, reply)
        elif isinstance(msg, Reconfigure):
            reply.value(self._reconfigure(msg.cfg))
        else:
            raise TypeError(f"unexpected message {msg!r}")

    def _note_wake(self, wake: Wake) -> None:
        """Take a wake: the gate decides whether a channel item wakes the agent at all (it is
        stored either way); what does is buffered for the next turn (at most 100; the oldest
        go first, their conversations still counted for the route)."""
        if wake.occurrence is not None and wake.occurrence in self._withdrawn:
            return  # replaced or retracted before it got here: it wakes nobody
        if wake.lane in ("incoming", "push") and not self._gate_admits(wake):
            return
        candidate = candidate_of(wake)
        if self.speech is not None and candidate is not None:
            self.speech.arrival(candidate)
        self.buffer.add(wake, candidate.conversation if candidate is not None else None)
        self._maybe_start()

    def _withdraw(self, occurrence: str) -> None:
        """An occurrence was replaced or retracted before this agent read it: its wake, waiting
        in the buffer or in a debounce batch, no longer counts (RFC-006 §7: no inference starts
        for a displaced cause alone)."""
        self._withdrawn[occurrence] = None
        while len(self._withdrawn) > MAX_WITHDRAWN:
            self._withdrawn.popitem(last=False)
        removed = self.buffer.remove(lambda w: w.occurrence == occurrence)
        if self.gate.withdraw(occurrence):
            removed += 1
            self._timer_changed.set()
        if removed:
            self._trace("wake-withdrawn", occurrence=occurrence)

    def _gate_admits(self, wake: Wake) -> bool:
        now = trio.current_time()
        self._reload_gate(now)
        event = GateEvent(
            kind=wake.lane,
            server_id=wake.server_id or "",
            channel_id=wake.channel_id,
            thread_id=wake.thread_id,
            text=wake.text,
            tags=wake.tags,
            author=wake.author,
            metadata={"addressed": wake.addressed},
            item=wake.occurrence,
        )
        decision = self.gate.decide(event, now)
        if decision.wake:
            return True
        self._trace(
            "gate-decision",
            wake if wake.server_id and wake.channel_id else None,
            wake=False,
            policy=decision.policy,
            behavior=decision.behavior,
        )
        if decision.due is not None:
            self._timer_changed.set()
        return False

    def _reload_gate(self, now: float) -> None:
        """Re-read the gate file when it changed (checked at most once a second); a file that
        does not parse leaves the running policies in force."""
        path = self.cfg.gate
        if path is None or now - self._gate_checked < GATE_RELOAD_S:
            return
        self._gate_checked = now
        mtime = _mtime(path)
        if mtime == self._gate_mtime:
            return
        self._gate_mtime = mtime
        try:
            config = load_gate(path)
        except Exception as exc:
            self._trace("diagnostic", text=f"gate file not reloaded, the old policies stay: {exc}")
            return
        for batch in self.gate.reload(config, now):
            self._gate_batch(batch)
        self._trace("gate-reloaded", path=str(path))
        self._timer_changed.set()

    def _reconfigure(self, cfg: AgentConfig) -> bool:
        """A config reload: the system prompt applies from the next turn, and the gate file (a
        new one, or the same one changed on disk) is re-read now. True when the gate's policies
        changed."""
        before = self.gate.config
        self.cfg = cfg
        self.system = cfg.system_prompt or DEFAULT_PROMPT.format(name=cfg.name)
        now = trio.current_time()
        self._gate_mtime = None  # read the file whatever its modification time says
        if cfg.gate is None:
            for batch in self.gate.reload(GateConfig(), now):
                self._gate_batch(batch)
        else:
            self._gate_checked = -math.inf
            self._reload_gate(now)
        self._timer_changed.set()
        return self.gate.config != before

    def _gate_batch(self, batch: Any) -> None:
        """A debounced batch came due: one wake carrying its count (never a speech route)."""
        self._trace("gate-batch", policy=batch.policy, count=batch.count)
        self.buffer.add(Wake(lane="gate", count=batch.count), None)
        self._maybe_start()

    async def _timers(self) -> None:
        """The gate's debounce deadlines and the end of a sleep, on the host's clock."""
        while True:
            due = self.gate.next_due()
            if self._sleep_until is not None:
                due = self._sleep_until if due is None else min(due, self._sleep_until)
            self._timer_changed = trio.Event()
            if due is None:
                await self._timer_changed.wait()
                continue
            with trio.move_on_at(due):
                await self._timer_changed.wait()
                continue
            now = trio.current_time()
            for batch in self.gate.due(now):
                self._gate_batch(batch)
            if self._sleep_until is not None and now >= self._sleep_until:
                self._sleep_until = None
                self._trace("awake", reason="the sleep is over")
                self.buffer.add(Wake(lane="self"), None)
                self._maybe_start()

    def go_to_sleep(self, seconds: float) -> float:
        """Sleep: only privileged authors wake the agent until ``seconds`` pass, then it wakes
        by itself. Returns the deadline."""
        until = trio.current_time() + seconds
        self.gate.sleep(until)
        self._sleep_until = until
        self._timer_changed.set()
        self._trace("asleep", seconds=seconds)
        return until

    def wake_up(self) -> bool:
        """End a sleep now; False when the agent was not asleep."""
        was = self._sleep_until is not None
        self.gate.wake_up()
        self._sleep_until = None
        self._timer_changed.set()
        return was

    def _maybe_start(self) -> None:
        if not len(self.buffer):
            return
        if self.sender.unsettled or self._settling:
            # this agent's speech has not settled: its wake waits for it, nothing else does
            if not self._parked:
                self._parked = True
                self._trace("wake-parked", unsettled=self.sender.unsettled)
            return
        if self.turn_running or self.held:
            return
        self._parked = False
        drained = self.buffer.drain()
        self.turn_running = True
        self.spawn(self._turn, drained)

    async def _store_local(self, record: MessageRecord, reply: Reply) -> None:
        await self.ctx.store.write(Append(records=(record,)))
        self._trace("local", text=record.blocks[0]["text"])
        reply.value(record.id)
        self._note_wake(Wake(lane="local"))

    async def _execute(self, msg: ExecuteTool, reply: Reply) -> None:
        runtime = ToolRuntime(
            self.ctx, self.cfg.name, self.servers, in_process=True, agent_actor=self
        )
        outcome = await runtime.call(msg.tool, msg.arguments)
        state = outcome.pop("state", None)
        if state is not None:
            # Nothing is stored to anchor it, but the server's state has moved.
            await self._record_checkpoints([state])
        reply.value(outcome)

    async def _store(
        self, role: str, blocks: Sequence[Mapping[str, Any]], **meta: Any
    ) -> dict[str, Any]:
        record = MessageRecord(
            id=new_id(),
            agent=self.cfg.name,
            role=role,
            blocks=tuple(blocks),
            metadata=meta,
            created_at=time.time(),
        )
        await self.ctx.store.write(Append(records=(record,)))
        return {
            "id": record.id,
            "agent": record.agent,
            "role": role,
            "blocks": list(blocks),
            "metadata": meta,
        }

    async def _turn(self, drained: Drained[Wake]) -> None:
        inference_id = f"inf_{uuid.uuid4().hex}"
        candidates = [c for w in drained.items if (c := candidate_of(w)) is not None]
        # the buffer forgets in which order the dropped ones came: listed sorted, not at random
        evicted = sorted(
            ((s, c, t) for s, c, t in drained.evicted if c is not None),
            key=lambda k: (k[0], k[1], k[2] or ""),
        )
        decision = decide_route(candidates, evicted=evicted, evicted_overflow=drained.overflow)
        route = decision if isinstance(decision, Route) else None
        target = (
            WakeTarget(
                server_id=route.server_id,
                channel_id=route.channel_id,
                message_id=route.reply_to,
                thread_id=route.thread_id,
            )
            if route is not None
            else None
        )
        hooks = TurnHooks(
            self.ctx,
            self.cfg.name,
            self.servers,
            model=self.model.info,
            inference_id=inference_id,
            conversation_id=self.conversation_id,
            turn_index=self._turns,
        )
        self._turns += 1
        phase, usage = "failed", None
        speech: TurnSpeech | None = None
        typing: Typing | None = None
        try:
            with trio.CancelScope() as scope:
                self._turn_scope = scope
                hooks.started()
                channels, places = await channel_views(self.ctx, self.servers)
                speech = TurnSpeech(
                    ctx=self.ctx,
                    agent=self.cfg.name,
                    mode=self.cfg.prose_mode,
                    decision=decision,
                    channels=channels,
                    places=places,
                    inference_id=inference_id,
                    sender=self.sender,
                    drafts=self.drafts,
                    trace=self._trace,
                )
                self.speech = speech
                here = speech.route_place()
                if (
                    here is not None
                    and self.cfg.prose_mode != "disabled"
                    and typing_allowed(
                        self.ctx, here, places.get((here.server_id, here.channel_id))
                    )
                ):
                    typing = Typing(self.ctx, here, self._trace)
                    typing.start()
                    self.spawn(typing.refresh, counted=False)
                wakes = sum(w.count for w in drained.items) + drained.dropped
                # RFC-006 rev 8: a turn caused only by deferred batches may need no inference
                deferred_only = (
                    bool(drained.items)
                    and not drained.dropped
                    and all(w.deferred for w in drained.items)
                )
                usage = await self._run_turn(
                    target, wakes, hooks, speech, candidates, deferred_only=deferred_only
                )
                if typing is not None:
                    typing.stop()  # the model is done; what is left is delivery
                await speech.sent()  # this agent's own wait: nobody else's work stops for it
                self._trace("turn-end", target)
                phase = "completed"
            if scope.cancelled_caught:
                phase = "aborted"
                self._trace("turn-aborted", target)
        except trio.Cancelled:
            phase = "aborted"
            raise
        except ModelError as exc:
            self._trace("error", target, error=str(exc), where="model")
            await self._store(
                "system",
                [{"type": "text", "text": f"turn failed: {exc}"}],
                system=True,
                kind="turn-failed",
            )
        except Exception as exc:
            self._trace("error", target, error=f"{type(exc).__name__}: {exc}", where="turn")
            raise
        finally:
            if typing is not None:
                typing.stop()
            hooks.ended(phase, usage if phase == "completed" else None)
            self._turn_scope = None
            self.speech = None
            if speech is not None:
                self._complete_streams(speech)
                self._settling += 1
                self.spawn(self._settle, speech)
            self.turn_running = False
            self._maybe_start()

    def _complete_streams(self, speech: TurnSpeech) -> None:
        """One ``channels/outgoing/complete`` per channel this turn streamed into, whatever
        way the turn ended."""
        for sid, params in speech.completes():
            if notify(self.ctx, sid, "channels/outgoing/complete", params) is False:
                self._trace("diagnostic", text=f"channels/outgoing/complete to {sid} not sent")

    async def _settle(self, speech: TurnSpeech) -> None:
        """Once the turn's speech has settled: store its notices and its receipt, save the
        drafts, and let a parked wake start the next turn."""
        try:
            for text in await speech.settle():
                kind = "delivered-receipt" if text.startswith("[delivered]") else "speech-notice"
                await self._store(
                    "system", [{"type": "text", "text": text}], system=True, kind=kind
                )
                self._trace(kind, text=text)
            await self.drafts.save()
            if speech.rewake:
                self._trace("awake", reason="a segment asked to go on ( ! )")
                self.buffer.add(Wake(lane="self"), None)
        finally:
            self._settling -= 1
            self._maybe_start()

    def _chunk(self, speech: TurnSpeech, place: Any, piece: str) -> None:
        """One streamed piece: traced with its channel id as a plain string (or None), and sent
        as ``channels/outgoing/chunk`` where streaming is allowed."""
        self._trace("tokens", place, delta=piece, inference_id=speech.inference_id)
        if place is None:
            return
        params = speech.chunk(place, piece)
        if params is None:
            return
        if notify(self.ctx, place.server_id, "channels/outgoing/chunk", params) is False:
            self._trace("diagnostic", place, text="channels/outgoing/chunk not sent")

    async def _render_deferred(self) -> list[str]:
        """RFC-006 §5: before the context is read, render the pending deferred batches this
        agent would see (each ``push/render`` concurrently, under its timeout, in this task),
        and wait until what they materialized is durable. The outcomes, one per render."""
        if self.ctx.coalescer is None:
            return []
        begun = await self.ctx.coalescer.ask(BeginAssembly(context=self.cfg.name), timeout=60)
        outcomes: list[str] = []

        async def one(job: Any) -> None:
            outcome = await render(self.ctx, job)
            if outcome is not None:
                outcomes.append(outcome)

        async def join(wait: RenderWait) -> None:
            # rendered once for every agent that sees it: wait for another turn's render
            with trio.move_on_after(JOIN_RENDER_S):
                await wait.done.wait()
            if wait.outcome is not None:
                outcomes.append(wait.outcome)

        async with trio.open_nursery() as nursery:
            for job in begun.jobs:
                nursery.start_soon(one, job)
            for wait in begun.joins:
                nursery.start_soon(join, wait)
        return outcomes

    async def _context(self) -> list[Mapping[str, Any]]:
        """The agent's context from the store: only what was stored since the last turn is read
        and decoded; the kept tail is trimmed to the token budget (oldest whole units first)."""
        # No message costs less than MIN_MESSAGE_TOKENS, so older ones could never fit.
        newest = self.cfg.context_tokens // MIN_MESSAGE_TOKENS + 1
        fresh, seen = await self.ctx.store.read(
            self.ctx.store.reader.history_after, self.cfg.name, self._seen_seq, newest
        )
        if any(_is_rollback(m) for m in fresh) and self._seen_seq:
            # Something already in the tail was set aside: rebuild from the store.
            self._tail, self._seen_seq = ContextTail(self.cfg.context_tokens), 0
            return await self._context()
        self._seen_seq = seen
        live = live_messages(fresh)
        occurrences = tuple(
            o for m in live if isinstance(o := m["metadata"].get("occurrence"), str)
        )
        if occurrences and self.ctx.coalescer is not None:
            # read now: these are consumed for this agent, and any replaced meanwhile is left out
            hidden = await self.ctx.coalescer.ask(
                Assembled(context=self.cfg.name, occurrences=occurrences), timeout=60
            )
            live = [m for m in live if m["metadata"].get("occurrence") not in hidden]
        rendered = [render_for_model(m) for m in live]
        for m in rendered:
            m["tokens"] = estimate_tokens(m)
        self._tail.extend(rendered)
        return self._tail.messages()

    async def _run_turn(
        self,
        target: WakeTarget | None,
        wakes: int,
        hooks: TurnHooks,
        speech: TurnSpeech,
        candidates: list[Candidate],
        *,
        deferred_only: bool = False,
    ) -> tuple[int, int]:
        """One turn; its token usage (input, output) summed over the model calls."""
        runtime = ToolRuntime(
            self.ctx, self.cfg.name, self.servers, speech=speech, agent_actor=self
        )
        self._trace("turn-start", target, wakes=wakes, model=self.model.name)
        await self._explain_headers()
        outcomes = await self._render_deferred()
        if not inference_needed(other_causes=not deferred_only, render_outcomes=outcomes):
            self._trace("turn-skipped", target, reason="deferred batches materialized nothing")
            return 0, 0
        context = await self._context()
        newest = next((m for m in reversed(context) if m.get("role") == "user"), None)
        by_server: dict[str, list[str]] = {}
        for c in candidates:
            if c.channel_id not in by_server.setdefault(c.server_id, []):
                by_server[c.server_id].append(c.channel_id)
        injections = await hooks.before_inference(
            body_of(newest) if newest is not None else None, target, by_server
        )
        placed = injection_messages(injections)
        system = self.system
        for m in placed["system"]:
            system += "\n\n" + "\n".join(
                str(b.get("text", "")) for b in m["blocks"] if b.get("type") == "text"
            )
        context = _place(context, placed["beforeUser"], placed["afterUser"])
        tools = await runtime.specs()
        used_in, used_out = 0, 0

        async def on_delta(delta: str) -> None:
            for place, piece in speech.stream(delta):
                self._chunk(speech, place, piece)

        for round_no in range(MAX_TOOL_ROUNDS + 1):
            request = ModelRequest(
                agent=self.cfg.name,
                system=system,
                messages=tuple(context),  # the request keeps what this round saw
                tools=tools,
            )
            speech.start_round()
            reply = await self.model.complete(request, on_delta)
            for place, piece in speech.end_stream():
                self._chunk(speech, place, piece)
            used_in += int(reply.usage.get("input_tokens", 0))
            used_out += int(reply.usage.get("output_tokens", 0))
            if not reply.blocks:
                break
            said = await self._store(
                "assistant", reply.blocks, model=reply.model, stop_reason=reply.stop_reason
            )
            context.append(render_for_model(said))
            uses = reply.tool_uses
            # The round's prose is queued before any of its calls runs, so whatever a call
            # says afterwards (the sleep announcement) follows it, where the newest pin points.
            silencer = next(
                (str(u.get("name")) for u in uses if u.get("name") in SILENCING_TOOLS), None
            )
            speech.submit(reply.text, silenced=silencer)
            if not uses:
                break
            if round_no == MAX_TOOL_ROUNDS:
                self._trace(
                    "error",
                    target,
                    error=f"stopped after {MAX_TOOL_ROUNDS} tool rounds",
                    where="turn",
                )
                break
            results = []
            checkpoints: list[dict[str, Any]] = []
            for use in uses:
                self._trace("tool-call", target, tool=use.get("name"), arguments=use.get("input"))
                outcome = await runtime.call(str(use.get("name")), use.get("input", {}))
                state = outcome.pop("state", None)
                if state is not None:
                    checkpoints.append(state)
                self._trace(
                    "tool-result",
                    target,
                    tool=use.get("name"),
                    is_error=outcome["is_error"],
                    content=outcome["content"],
                )
                results.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": use.get("id"),
                        "content": outcome["content"],
                        "is_error": outcome["is_error"],
                    }
                )
            meta = {"checkpoints": checkpoints} if checkpoints else {}
            context.append(render_for_model(await self._store("tool", results, **meta)))
            if checkpoints:
                await self._record_checkpoints(checkpoints)
            if runtime.end_turn:
                break  # skip_reply or sleep: the turn ends at the tool results
        return used_in, used_out

    # -- the one-time notice about source headers (refs-and-headers G) ---------------------
    async def _explain_headers(self) -> None:
        """Before the first turn whose history holds an item with a source header (however far
        back), store the notice explaining them; then record this agent as told. A notice
        already stored counts as given (only the host's own: ``system`` true and its kind)."""
        # the record is one list for every agent: one read-modify-write at a time
        async with self.ctx.explained_lock:
            await self._explain_headers_locked()

    async def _explain_headers_locked(self) -> None:
        try:
            state = await self.ctx.store.read(self.ctx.store.reader.state, EXPLAINED[0])
        except Exception:
            return  # no record to read: no notice this turn
        told = state.get(EXPLAINED[1])
        names = [n for n in told if isinstance(n, str)] if isinstance(told, list) else []
        if self.cfg.name in names:
            return
        sees, given = await self._scan_for_headers()
        if not given:
            if not sees:
                return
            try:
                await self._store(
                    "system",
                    [{"type": "text", "text": HEADER_NOTICE}],
                    system=True,
                    kind=NOTICE_KIND,
                )
            except Exception:
                return  # not stored: not recorded either, so the next turn tries again
            self._trace("header-notice")
        names = [*names, self.cfg.name][-MAX_EXPLAINED:]
        await self.ctx.store.write(PutState(namespace=EXPLAINED[0], key=EXPLAINED[1], value=names))

    async def _scan_for_headers(self) -> tuple[bool, bool]:
        """(some stored item has a source header, the notice is already stored), reading only
        what was stored since the last scan."""
        fresh, self._scan_seq = await self.ctx.store.read(
            self.ctx.store.reader.history_after, self.cfg.name, self._scan_seq, SCAN_ALL
        )
        for m in fresh:
            meta = m.get("metadata") or {}
            self._sees_header |= isinstance(meta.get("source_header"), str)
            self._notice_given |= meta.get("system") is True and meta.get("kind") == NOTICE_KIND
        return self._sees_header, self._notice_given

    # -- state (SPEC §8) ----------------------------------------------------------------
    async def _record_checkpoints(self, checkpoints: Sequence[Mapping[str, Any]]) -> None:
        lineages = self.ctx.lineages
        for c in checkpoints:
            lineages.record((c["server"], c["feature_set"]), c["checkpoint"])
        await self.ctx.store.write(
            PutState(namespace=CHECKPOINTS[0], key=CHECKPOINTS[1], value=lineages.to_state())
        )

    async def _rollback(self, to: str, reply: Reply) -> None:
        try:
            reply.value(await self._roll_back(to))
        except Exception as exc:
            reply.error(exc)
        finally:
            self.turn_running = False
            self._maybe_start()

    async def _roll_back(self, to: str) -> dict[str, Any]:
        history = await self.ctx.store.read(self.ctx.store.reader.history, self.cfg.name)
        live = live_messages(history)
        order = [m["id"] for m in live]
        if to not in order:
            raise ValueError(f"{self.cfg.name} has no message {to!r} in its context")
        set_aside = order[order.index(to) + 1 :]
        if len(set_aside) > MAX_ROLLBACK_SPAN:
            raise ValueError(
                f"a rollback sets aside at most {MAX_ROLLBACK_SPAN} messages, this one "
                f"{len(set_aside)}; roll back to a later message first"
            )
        recorded = [
            Recorded(
                message_id=m["id"],
                lineage=(c["server"], c["feature_set"]),
                checkpoint=c["checkpoint"],
                parent=c.get("parent"),
            )
            for m in live
            for c in m["metadata"].get("checkpoints", ())
        ]
        lineages = self.ctx.lineages
        current = {r.lineage: c for r in recorded if (c := lineages.current(r.lineage))}
        targets = rollback_targets(recorded, to, order, current)
        state: list[dict[str, Any]] = []
        for (sid, feature_set), checkpoint in targets.items():
            state.append(await self._roll_back_server(sid, feature_set, checkpoint))
        if any(s.get("checkpoint") for s in state):
            await self.ctx.store.write(
                PutState(namespace=CHECKPOINTS[0], key=CHECKPOINTS[1], value=lineages.to_state())
            )
        note = f"context rolled back to {to}; {len(set_aside)} later messages set aside"
        await self._store(
            "system",
            [{"type": "text", "text": note}],
            system=True,
            kind="rollback",
            to=to,
            set_aside=set_aside,
            state=state,
        )
        self._trace("rolled-back", to=to, set_aside=len(set_aside), state=state)
        return {"to": to, "set_aside": len(set_aside), "state": state}

    async def _roll_back_server(
        self, sid: str, feature_set: str, checkpoint: str
    ) -> dict[str, Any]:
        """Ask one server to roll a lineage back; the outcome as stored in the marker."""
        entry: dict[str, Any] = {"server": sid, "feature_set": feature_set, "requested": checkpoint}
        status = self.ctx.statuses.get(sid)
        declared = status.feature_sets.get(feature_set) if status is not None else None
        ref = self.ctx.connections.get(sid)
        if ref is None or status is None or not status.ready:
            entry["error"] = f"server {sid} is not connected"
            return entry
        if not isinstance(declared, Mapping) or declared.get("rollback") is not True:
            entry["error"] = f"{sid} does not declare rollback for feature set {feature_set}"
            return entry
        try:
            result = await ref.ask(
                Call(method="state/rollback", params=rollback_params(feature_set, checkpoint)),
                timeout=self.ctx.config.request_timeout(sid) + 5,
            )
            outcome = read_rollback_result(result, checkpoint)
        except Exception as exc:
            entry["error"] = str(exc) or type(exc).__name__
            return entry
        entry.update(
            checkpoint=outcome.checkpoint,
            success=outcome.success,
            rolled_forward=outcome.rolled_forward,
        )
        if outcome.reason is not None:
            entry["reason"] = outcome.reason
        if outcome.success:
            self.ctx.lineages.record((sid, feature_set), outcome.checkpoint)
        return entry


def _mtime(path: Any) -> float | None:
    if path is None:
        return None
    try:
        return float(os.stat(path).st_mtime_ns)
    except OSError:
        return None


def _is_rollback(message: Mapping[str, Any]) -> bool:
    meta = message.get("metadata")
    return (
        message.get("role") == "system"
        and isinstance(meta, Mapping)
        and meta.get("kind") == "rollback"
    )


def live_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages still in context: no rollback marker, and nothing a marker among them set
    aside (a marker only sets aside older messages, so the markers of the list are enough);
    no marker of a coalesced item hidden before it was read, nor that item."""
    hidden = {i for m in messages if _is_rollback(m) for i in m["metadata"].get("set_aside", ())}
    replaced = {m["metadata"].get("occurrence") for m in messages if is_hidden_marker(m)}
    return [
        m
        for m in messages
        if not _is_rollback(m)
        and m["id"] not in hidden
        and not is_hidden_marker(m)
        and (not replaced or m["metadata"].get("occurrence") not in replaced)
    ]


def _place(
    context: list[Mapping[str, Any]],
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
) -> list[Mapping[str, Any]]:
    """The context with injected messages around its newest user message (at the end when it
    has none): ``before`` just before it, ``after`` just after it."""
    if not before and not after:
        return context
    users = [i for i, m in enumerate(context) if m.get("role") == "user"]
    if not users:
        return [*context, *before, *after]
    at = users[-1]
    return [*context[:at], *before, context[at], *after, *context[at + 1 :]]
