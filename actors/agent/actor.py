"""AgentActor: one per configured agent.

Its mailbox takes wakes, local input and tool calls run on its behalf; each turn runs in its own
child task (:class:`actors.agent.turn.Turn`), so the mailbox stays live while a model streams or
a tool waits. Wakes that arrive during a turn are folded into one follow-up turn (the newest
conversation wins the reply): the context is read from the store, so nothing is lost by folding.

A turn: read the agent's stored messages, keep the newest whole turns within the token budget,
call the model, run its tool calls (at most ``MAX_TOOL_ROUNDS`` rounds), store everything, then
publish the final text to the conversation of the newest message that woke it. A wake by pushes
alone publishes nothing.

What its own speech caused does not wake it (:mod:`actors.agent.loops`): its own posts echoed
back, repeats of them, and a channel whose items keep answering its posts too fast.

Turns wait, while everything is still stored and wakes are buffered (at most 100, the oldest
dropped), when the operator holds them (``Host.hold``), when the agent's speech has not settled,
or when the agent is paused: a turn whose model refused the credential (or has none) pauses the
agent, and no model call is made for it until ``Host.resume``; that turn's wakes wait with the
others, so the first turn after the resume answers them all. A daily token budget
(``budget_daily_tokens``, :mod:`protocol.budget`) pauses it too: today's tokens are read from the
usage ledger when it starts and each turn's are added as it ends; at 80 % one warning
(``budget-warning``), at 100 % a pause (``budget-paused``) until the next UTC day or
``Host.resume`` (a budget still reached pauses it again at the end of the next turn).

The agent publishes its :class:`~actors.messages.AgentStatus` into ``ctx.agent_statuses`` each
time it changes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

import attrs
import trio

from actors.channel.envelope import new_id
from actors.config import AgentConfig
from actors.context import HostContext
from actors.kernel import Actor, Reply
from actors.messages import AgentStatus, Reconfigure, Wake, Wakes, Withdraw
from actors.models.base import Model, ModelAuthError, Usage
from protocol.conversation import conversation_id
from protocol.gate import Drained, WakeBuffer
from protocol.prices import Price, price_of, prices
from protocol.source import mark_text
from store import Append, MessageRecord, PutState

from .budget import (
    AgentBudget,
    DayLedger,
    host_ledger,
    limits_of,
    today_since,
    used_since,
)
from .gate import GATE_RELOAD_S, WakeGate
from .header_notice import HEADER_NOTICE, HeaderNotice
from .history import (
    ContextTail,
    context_reader,
    estimate_tokens,
    fit_budget,
    live_messages,
    new_record,
    render_for_model,
)
from .loops import LoopGuard
from .rollback import CHECKPOINTS, record_checkpoints, roll_back
from .speech import Drafts, SpeechSender, TurnSpeech
from .tools import ToolRuntime
from .turn import MAX_TOOL_ROUNDS, Turn
from .wakes import candidate_of, merge_drained

__all__ = [
    "CHECKPOINTS",
    "GATE_RELOAD_S",
    "HEADER_NOTICE",
    "MAX_TOOL_ROUNDS",
    "AbortTurn",
    "AgentActor",
    "ContextTail",
    "ExecuteTool",
    "HoldTurns",
    "PostLocal",
    "Resume",
    "Rollback",
    "estimate_tokens",
    "fit_budget",
    "live_messages",
    "render_for_model",
]

DEFAULT_PROMPT = (
    "You are {name}, an agent in live chat communities, connected through the mcplive host. "
    "Each incoming message is introduced by where it came from and who wrote it. Reply briefly; "
    "your reply goes to the conversation that woke you. Use the tools when they help."
)

#: Withdrawn occurrences remembered per agent, for a wake that arrives after its withdrawal.
MAX_WITHDRAWN = 1024


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
class Resume:
    """Lift the pause a refused credential or the daily budget put on the agent; the answer
    says whether it was paused. The wakes that waited start a turn at once."""


@attrs.frozen(kw_only=True)
class AbortTurn:
    """Cancel the running turn, if any; the answer says whether one was running."""


@attrs.frozen(kw_only=True)
class Rollback:
    """Set aside everything after ``to`` (a message id) and roll servers' state back to the
    checkpoints in force at that message."""

    to: str


def pause_reason(exc: ModelAuthError) -> str:
    """Why the agent is paused, in one line: the provider, what it did, and its own words."""
    detail = str(exc).removeprefix(f"{exc.provider}: ")
    return f"{exc.provider} {exc.problem} ({detail})"


def pause_remedy(exc: ModelAuthError) -> str:
    """What the operator does about it, in one line."""
    return (
        f"fix the key ({exc.credential}), then resume: SIGHUP resumes paused agents "
        "(a key changed in the environment needs a restart)"
    )


class AgentActor(Actor):
    mailbox_size = 256

    def __init__(self, cfg: AgentConfig, model: Model, ctx: HostContext) -> None:
        super().__init__(f"agent:{cfg.name}", ctx.work)
        self.cfg = cfg
        self.model = model
        self.ctx = ctx
        self.servers = tuple(s.id for s in ctx.config.servers if cfg.hears(s.id))
        self.system = cfg.system_prompt or DEFAULT_PROMPT.format(name=cfg.name)
        self.conversation_id = conversation_id(cfg.name)
        self.history = context_reader(ctx, cfg, model, self.trace)
        self.header_notice = HeaderNotice(ctx, cfg.name, self.trace)
        # the wakes waiting for the next turn; a paused turn's own wakes wait in ``_carried``
        self.buffer: WakeBuffer[Wake] = WakeBuffer()
        self._carried: Drained[Wake] | None = None
        self.turn: Turn | None = None  # the running turn
        self.turn_running = False  # a turn or a rollback runs: no other turn starts
        self.held = False  # turns held by the operator (``Host.hold``)
        self.paused: str | None = None  # why the model may not be called (``Host.resume``)
        self._budget_paused = False  # the pause is a daily budget's (lifted at the next day)
        if ctx.day is None:  # the host's shared ledger (a host that has none yet counts from 0)
            ctx.day = host_ledger(ctx.config)
        self.host_day: DayLedger = ctx.day
        self.budget = AgentBudget(cfg.name, self.host_day, self.trace)
        self._day_timer = False
        # RFC-006 occurrences withdrawn (replaced or retracted unread), newest last: a wake of
        # one that arrives after its withdrawal is dropped too
        self._withdrawn: OrderedDict[str, None] = OrderedDict()
        self._turns = 0  # turnIndex of the next turn (counted from this process's start)
        self._wakes = 0  # wakes received since the start (the gate's refusals included)
        self._model_errors = 0  # model calls that failed (retried ones too) since the start
        self._usage = Usage()  # summed over the turns
        self._last_turn: tuple[float, str] | None = None  # (wall-clock end, outcome)
        # speech: the outgoing queue, the drafts, and how many ended turns still wait for
        # their speech to settle (their receipts)
        # the loops its own speech can make, through a server
        self.loops = LoopGuard(cfg.name, self.trace, (a.name for a in ctx.config.agents))
        self.sender = SpeechSender(
            ctx, cfg.name, self.spawn, self._maybe_start, self.trace, on_send=self.loops.published
        )
        self.drafts = Drafts(ctx, cfg.name)
        self._settling = 0
        self._parked = False
        self.gate = WakeGate(
            cfg.gate, self.trace, self._wake_self, cfg.gate_policy, *self._names(cfg)
        )
        self._publish_status()

    async def on_start(self) -> None:
        await self.drafts.load()
        await self._load_budget()
        self.spawn(self.gate.run_timers, counted=False)
        self.spawn(self.gate.watch, counted=False)

    def trace(self, kind: str, place: Any = None, **data: Any) -> None:
        """A trace event of this agent; ``place`` is anything naming a ``server_id`` and a
        ``channel_id`` (a wake target, a speech place), or None."""
        self.ctx.trace.emit(
            kind,
            agent=self.cfg.name,
            server_id=place.server_id if place is not None else None,
            channel_id=place.channel_id if place is not None else None,
            data=data,
        )

    @property
    def speech(self) -> TurnSpeech | None:
        """The running turn's speech, if a turn runs."""
        return self.turn.speech if self.turn is not None else None

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Wake):
            self._note_wake(msg, start=False)
            self._start_if_due()
            reply.value(None)
        elif isinstance(msg, Wakes):
            await self._take_wakes(msg.items)
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
                self.trace("turns-held" if msg.on else "turns-released", waiting=self._queued())
            reply.value(changed)
            self._maybe_start()
        elif isinstance(msg, Resume):
            reply.value(self._resume())
        elif isinstance(msg, AbortTurn):
            scope = self.turn.scope if self.turn is not None else None
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
        self._publish_status()

    def serve_inline(self, msg: Any) -> Awaitable[None] | None:
        """Wakes are taken in the telling task while the agent is idle (see
        :mod:`actors.kernel`): taking them never waits, and the loop's round would cost more
        than the taking."""
        if isinstance(msg, Wakes) and self.idle:
            return self._take_wakes(msg.items)
        return None

    async def _take_wakes(self, wakes: tuple[Wake, ...]) -> None:
        for wake in wakes:  # a turn starts (or not) once the batch is taken
            self._note_wake(wake, start=False)
        self._maybe_start()

    # -- wakes ------------------------------------------------------------------------------
    def _note_wake(self, wake: Wake, *, start: bool = True) -> None:
        """Take a wake: the loop guard and the gate decide whether a channel item wakes the
        agent at all (it is stored either way): the agent's own post or a repeat of one never
        does, then the gate decides, then the loop breaker may defer it. What wakes is buffered
        for the next turn (at most 100; the oldest go first, their conversations still counted
        for the route). With ``start`` false the caller starts the turn, once for a batch, and
        publishes the status."""
        self._wakes += 1
        if wake.occurrence is not None and wake.occurrence in self._withdrawn:
            return  # replaced or retracted before it got here: it wakes nobody
        if wake.lane in ("incoming", "push"):
            if self.loops.withholds(wake) or not self.gate.admits(wake):
                return
            if self.loops.defers(wake):
                return
        candidate = candidate_of(wake)
        speech = self.speech
        if speech is not None and candidate is not None:
            speech.arrival(candidate)
        self.buffer.add(wake, candidate.conversation if candidate is not None else None)
        if start:
            self._maybe_start()

    def _wake_self(self, wake: Wake) -> None:
        """A wake of the agent's own (a gate batch, the end of a sleep): no conversation."""
        self.buffer.add(wake, None)
        self._maybe_start()

    def _withdraw(self, occurrence: str) -> None:
        """An occurrence was replaced or retracted before this agent read it: its wake, waiting
        in the buffer or in a debounce batch, no longer counts (RFC-006 §7: no inference starts
        for a displaced cause alone)."""
        self._withdrawn[occurrence] = None
        while len(self._withdrawn) > MAX_WITHDRAWN:
            self._withdrawn.popitem(last=False)
        removed = self.buffer.remove(lambda w: w.occurrence == occurrence)
        carried = self._carried
        if carried is not None:
            kept = tuple(w for w in carried.items if w.occurrence != occurrence)
            removed += len(carried.items) - len(kept)
            self._carried = attrs.evolve(carried, items=kept)
        if self.gate.withdraw(occurrence):
            removed += 1
        if removed:
            self.trace("wake-withdrawn", occurrence=occurrence)

    def go_to_sleep(self, seconds: float) -> float:
        """Sleep: only privileged authors wake the agent until ``seconds`` pass, then it wakes
        by itself. Returns the deadline."""
        return self.gate.sleep(seconds)

    def wake_up(self) -> bool:
        """End a sleep now; False when the agent was not asleep."""
        return self.gate.wake_up()

    def _queued(self) -> int:
        return len(self.buffer) + (len(self._carried.items) if self._carried is not None else 0)

    # -- turns ------------------------------------------------------------------------------
    def _maybe_start(self) -> None:
        try:
            self._start_if_due()
        finally:
            self._publish_status()

    def _start_if_due(self) -> None:
        if not len(self.buffer) and self._carried is None:
            return
        if self.sender.unsettled or self._settling:
            # this agent's speech has not settled: its wake waits for it, nothing else does
            if not self._parked:
                self._parked = True
                self.trace("wake-parked", unsettled=self.sender.unsettled)
            return
        if self.turn_running or self.held or self.paused is not None:
            return
        reason = self.budget.before_turn(self._queued()) if self.host_day.limited else None
        if reason is not None:
            self._budget_pause(reason)
            return
        self._parked = False
        drained = self.buffer.drain()
        if self._carried is not None:
            drained, self._carried = merge_drained(self._carried, drained), None
        self.turn_running = True
        self.turn = Turn(self, drained, self._turns)
        self._turns += 1
        self.spawn(self._turn, self.turn)

    async def _turn(self, turn: Turn) -> None:
        self.ctx.turning[self.cfg.name] = self.cfg.servers
        try:
            await turn.run()
        finally:
            self.ctx.turning.pop(self.cfg.name, None)
            self.turn = None
            if turn.speech is not None:
                self._settling += 1
                self.spawn(self._settle, turn.speech)
            self._usage += turn.usage
            self._model_errors += turn.retries + (turn.failure is not None)
            self._last_turn = (time.time(), turn.phase)
            if isinstance(turn.failure, ModelAuthError):
                self._pause(turn.failure, turn.drained)
            reason = self.budget.count(turn.usage, self._price(), self._queued())
            if reason is not None and self.paused is None:
                self._budget_pause(reason)
            self.turn_running = False
            self._maybe_start()

    def _pause(self, exc: ModelAuthError, drained: Drained[Wake]) -> None:
        """No model call until resumed; the failed turn's wakes wait for the next turn."""
        self._carried = drained
        self.paused = pause_reason(exc)
        self.trace(
            "agent-paused",
            reason=self.paused,
            remedy=pause_remedy(exc),
            model=self.model.name,
            provider=exc.provider,
            waiting=self._queued(),
        )

    # -- the daily budgets (:mod:`actors.agent.budget`) -------------------------------------
    def _price(self) -> Price | None:
        return price_of(self.model.name, prices(self.ctx.config.prices))

    async def _load_budget(self) -> None:
        """Count today's tokens and cost from the usage ledger (off the loop), and pause at once
        when a limit is reached (a restart the same day starts paused)."""
        limits = limits_of(self.cfg)
        used: dict[str, float] = {}
        if any(v is not None for v in limits.values()):
            store = self.ctx.store
            table = prices(self.ctx.config.prices)
            since = today_since(self.ctx.config)
            used = await store.read(used_since, store.reader, since, table, self.cfg.name)
        self.budget.start(limits, used)
        if self._price() is None:
            self.budget.unpriced(self.model.name)
        if self.budget.watched and not self._day_timer:
            self._day_timer = True  # only an agent with a limit keeps a timer for the day's end
            self.spawn(self._budget_days, counted=False)
        if self.paused is None and (reason := self.budget.pause_if_reached(self._queued())):
            self._budget_pause(reason)
        self._publish_status()

    async def _budget_days(self) -> None:
        """At each new day: lift a budget pause when no limit is reached any more."""
        while True:
            await trio.sleep(self.budget.seconds_to_next_day())
            if self._budget_paused and self.budget.clear():
                self._resume()
            self._publish_status()

    def _budget_pause(self, reason: str) -> None:
        """No turn until the next day (or ``Host.resume``); wakes wait in the buffer."""
        self.paused = reason
        self._budget_paused = True

    def _reconfigure(self, cfg: AgentConfig) -> bool:
        """A config reload: the system prompt applies from the next turn, the gate file is
        re-read now, new budgets count from the next turn's end. True when the gate's
        policies changed."""
        if limits_of(cfg) != limits_of(self.cfg) or not self._day_timer:
            self.spawn(self._load_budget, counted=False)
        self.cfg = cfg
        self.system = cfg.system_prompt or DEFAULT_PROMPT.format(name=cfg.name)
        return self.gate.reconfigure(cfg.gate, cfg.gate_policy, *self._names(cfg))

    def _names(self, cfg: AgentConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The agent's name and aliases, and those of the host's other agents."""
        others = tuple(
            n for a in self.ctx.config.agents if a.name != cfg.name for n in (a.name, *a.aliases)
        )
        return (cfg.name, *cfg.aliases), others

    def _resume(self) -> bool:
        if self.paused is None:
            return False
        self.paused = None
        self._budget_paused = False
        self.budget.grace = True  # resumed: the next turn runs even with the host's total reached
        self.trace("agent-resumed", waiting=self._queued())
        self._maybe_start()
        return True

    async def _settle(self, speech: TurnSpeech) -> None:
        """Once the turn's speech has settled: store its notices and its receipt and save the
        drafts (if they changed) in one write, and let a parked wake start the next turn."""
        try:
            said: list[tuple[str, str]] = []
            for text in await speech.settle():
                kind = "delivered-receipt" if text.startswith("[delivered]") else "speech-notice"
                said.append((kind, text))
            records = tuple(
                new_record(
                    self.cfg.name,
                    "system",
                    [{"type": "text", "text": text}],
                    system=True,
                    kind=kind,
                )
                for kind, text in said
            )
            said_op = self.ctx.agent_fenced(self.cfg.name, Append(records=records))
            ops: list[Append | PutState] = [said_op] if records else []
            drafts = self.drafts.save_op()  # fenced too
            if drafts is not None:
                ops.append(drafts)
            for future in await self.ctx.store.submit_many(ops) if ops else ():
                await future.wait()
            if drafts is not None:
                self.drafts.saved(drafts)
            for kind, text in said:
                self.trace(kind, text=text)
            if speech.rewake:
                self.trace("awake", reason="a segment asked to go on ( ! )")
                self.buffer.add(Wake(lane="self"), None)
        finally:
            self._settling -= 1
            self._maybe_start()

    def _publish_status(self) -> None:
        """Replace the agent's status for operators when it changed."""
        last = self._last_turn
        status = AgentStatus(
            name=self.cfg.name,
            paused=self.paused,
            held=self.held,
            turn_running=self.turn is not None,
            queued=self._queued(),
            turns=self._turns,
            wakes=self._wakes,
            model_errors=self._model_errors,
            last_turn_at=last[0] if last is not None else None,
            last_outcome=last[1] if last is not None else None,
            usage=self._usage.as_dict(),
            today=self.budget.snapshot(),
        )
        if self.ctx.agent_statuses.get(self.cfg.name) != status:
            self.ctx.agent_statuses[self.cfg.name] = status

    # -- the rest of the mailbox's work ------------------------------------------------------
    async def _store_local(self, record: MessageRecord, reply: Reply) -> None:
        await self.ctx.store.write(self.ctx.agent_fenced(self.cfg.name, Append(records=(record,))))
        self.trace("local", text=record.blocks[0]["text"])
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
            await record_checkpoints(self.ctx, [state])
        reply.value(outcome)

    async def _rollback(self, to: str, reply: Reply) -> None:
        try:
            reply.value(await roll_back(self.ctx, self.cfg.name, to, self.trace))
        except Exception as exc:
            reply.error(exc)
        finally:
            self.turn_running = False
            self._maybe_start()
