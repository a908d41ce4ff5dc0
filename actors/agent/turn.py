"""One turn of an agent, from the wakes it drained to its end.

A turn decides where its reply goes (the speech route of its wakes), tells the servers it started
(``inference/lifecycle``), shows typing where it may, renders the deferred batches it would see,
assembles the context (the stored tail, the context hooks' injections), then runs the model loop:
call the model, store the reply, run its tool calls, store their results, and call again, at most
``MAX_TOOL_ROUNDS`` rounds. Its speech is queued as it streams and published by the agent's
sender. Whatever way it ends, the servers hear one lifecycle terminal and every stream it opened
is completed.

Each model call's token usage is stored on the assistant message it produced
(``metadata.usage``), with the turn's running total (``metadata.turn_usage``, so the turn's last
assistant message holds its totals); the turn's totals are traced once at its end
(``turn-usage``) and kept in :attr:`Turn.usage`. A turn that called the model, or failed calling
it, also leaves one row in the store's usage ledger (:class:`store.RecordUsage`): handed to the
writer as the turn ends, not waited for. Each retry a provider makes is traced as it
happens (``model-retry``).

Each request tells the provider which part of it the next turn sends again (for a prompt cache):
the system prompt before the text hooks added to it (``stable_system``), and the messages before
the first one hooks injected (``stable_messages``).

The turn runs in the agent's child task and touches no agent state: the agent reads
:attr:`Turn.scope` (to abort), :attr:`Turn.speech` (to count arrivals against the route),
:attr:`Turn.phase`, :attr:`Turn.usage` and :attr:`Turn.failure` when it ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from actors.channel.coalescer import RENDER_TIMEOUT_S, BeginAssembly, RenderWait, render
from actors.config import AgentConfig
from actors.context import HostContext
from actors.link.calls import notify
from actors.messages import LastRequest, Wake, WakeTarget
from actors.models.base import (
    Model,
    ModelAuthError,
    ModelError,
    ModelReply,
    ModelRequest,
    ModelRetry,
    Usage,
    text_only,
)
from actors.models.scripted import body_of
from protocol.coalesce import inference_needed
from protocol.gate import Drained
from store import RecordUsage

from .header_notice import HeaderNotice
from .history import (
    ContextReader,
    place_injections,
    render_for_model,
    store_message,
    store_said,
)
from .hooks import TurnHooks, injection_messages
from .rollback import record_checkpoints
from .speech import (
    SILENCING_TOOLS,
    Drafts,
    SpeechSender,
    TurnSpeech,
    Typing,
    channel_views,
    typing_allowed,
)
from .tools import ToolRuntime
from .wakes import RouteChoice, route_of

MAX_TOOL_ROUNDS = 8
#: Tools whose call is no output: a turn that called only these (and wrote no text) is silent.
QUIET_TOOLS = frozenset({"skip_reply", "think", "sleep"})
#: Stop reasons of a model that ended its reply itself (not cut short at ``max_tokens``, not a
#: refusal): a turn whose last reply ends so, having said nothing, chose silence.
CHOSEN_STOPS = frozenset({"end_turn", "stop_sequence"})
#: How long a turn waits for a batch another turn is rendering (its render's own bound, and
#: the time to store what it materialized).
JOIN_RENDER_S = RENDER_TIMEOUT_S + 5.0


class TurnOwner(Protocol):
    """What a turn needs of its agent."""

    ctx: HostContext
    cfg: AgentConfig
    model: Model
    servers: tuple[str, ...]
    system: str
    conversation_id: str
    sender: SpeechSender
    drafts: Drafts
    history: ContextReader
    header_notice: HeaderNotice

    def trace(self, kind: str, place: Any = None, **data: Any) -> None: ...

    def spawn(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, counted: bool = True
    ) -> None: ...


class Turn:
    def __init__(self, owner: TurnOwner, drained: Drained[Wake], index: int) -> None:
        self.owner = owner
        self.ctx = owner.ctx
        self.agent = owner.cfg.name
        self.drained = drained
        self.index = index  # the turnIndex of the lifecycle (counted from the host's start)
        self.inference_id = f"inf_{uuid.uuid4().hex}"
        self.scope: trio.CancelScope | None = None
        self.speech: TurnSpeech | None = None
        self.phase = "failed"  # completed, aborted or failed, once it has ended
        self.usage = Usage()
        self.calls = 0  # model calls that returned a reply
        self.spoke = False  # whether a reply had text, or called a tool that is not a quiet one
        self.chose_end = False  # whether the turn ended as the model chose (see CHOSEN_STOPS)
        self.failure: ModelError | None = None  # why the model failed, if it did
        self.retries = 0  # model calls that failed and were tried again
        self.target: WakeTarget | None = None

    def _trace(self, kind: str, place: Any = None, **data: Any) -> None:
        self.owner.trace(kind, place, **data)

    async def run(self) -> None:
        """Run the turn to its end (a model failure is traced and stored, not raised)."""
        owner = self.owner
        choice = route_of(self.drained)
        self.target = choice.target
        hooks = TurnHooks(
            self.ctx,
            self.agent,
            owner.servers,
            model=owner.model.info,
            inference_id=self.inference_id,
            conversation_id=owner.conversation_id,
            turn_index=self.index,
        )
        async with self.ctx.turns.turn():  # let go while it waits outside the host
            await self._run_holding(hooks, choice)

    async def _run_holding(self, hooks: TurnHooks, choice: RouteChoice) -> None:
        owner = self.owner
        target = self.target
        typing: Typing | None = None
        try:
            with trio.CancelScope() as scope:
                self.scope = scope
                hooks.started()
                channels, places = await channel_views(self.ctx, owner.servers)
                speech = self.speech = TurnSpeech(
                    ctx=self.ctx,
                    agent=self.agent,
                    mode=owner.cfg.prose_mode,
                    decision=choice.decision,
                    channels=channels,
                    places=places,
                    inference_id=self.inference_id,
                    sender=owner.sender,
                    drafts=owner.drafts,
                    trace=self._trace,
                    local=any(w.lane == "local" for w in self.drained.items),
                )
                here = speech.route_place()
                if (
                    here is not None
                    and owner.cfg.prose_mode != "disabled"
                    and typing_allowed(
                        self.ctx, here, places.get((here.server_id, here.channel_id))
                    )
                ):
                    typing = Typing(self.ctx, here, self._trace)
                    typing.start()
                    owner.spawn(typing.refresh, counted=False)
                drained = self.drained
                wakes = sum(w.count for w in drained.items) + drained.dropped
                # RFC-006 rev 8: a turn caused only by deferred batches may need no inference
                deferred_only = (
                    bool(drained.items)
                    and not drained.dropped
                    and all(w.deferred for w in drained.items)
                )
                await self._run(hooks, speech, choice.candidates, wakes, deferred_only)
                if typing is not None:
                    typing.stop()  # the model is done; what is left is delivery
                async with self.ctx.turns.away():
                    await speech.sent()  # this agent's own wait: nobody else's work stops for it
                self._trace("turn-end", target)
                self.phase = "completed"
            if scope.cancelled_caught:
                self.phase = "aborted"
                self._trace("turn-aborted", target)
        except trio.Cancelled:
            self.phase = "aborted"
            raise
        except ModelError as exc:
            self.failure = exc
            if not isinstance(exc, ModelAuthError):  # the agent's pause says it in one line
                self._trace("error", target, error=str(exc), where="model")
            await store_message(
                self.ctx,
                self.agent,
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
            completed = self.phase == "completed"
            usage = (self.usage.input_tokens, self.usage.output_tokens)
            hooks.ended(self.phase, usage if completed else None)
            if self.speech is not None:
                self._complete_streams(self.speech)
            if self.calls:
                self._trace(
                    "turn-usage",
                    target,
                    turn=self.index,
                    phase=self.phase,
                    calls=self.calls,
                    **self.usage.as_dict(),
                )
            if self.calls or self.failure is not None:
                await self._record_usage()

    @property
    def silent(self) -> bool:
        """The turn ended on purpose with no output: it completed, said nothing (no text, no
        tool call but the quiet ones) and its model ended it itself (a reply with nothing in it
        included), or it ended at ``skip_reply`` or ``sleep``. A failed or aborted turn, or one
        whose reply was cut short (``max_tokens``) or refused, is not silent."""
        return self.phase == "completed" and not self.spoke and self.chose_end

    async def _record_usage(self) -> None:
        """Hand the turn's row of the usage ledger to the writer (durable with the writes
        around it; the turn does not wait for its commit)."""
        target = self.target
        used = self.usage
        op = RecordUsage(
            at=time.time(),
            agent=self.agent,
            model=self.owner.model.name,
            turn=max(self.index, 0),
            turn_id=self.inference_id,
            server=None if target is None else target.server_id,
            channel=None if target is None else target.channel_id,
            phase=self.phase,
            silent=self.silent,
            calls=self.calls,
            input_tokens=used.input_tokens,
            output_tokens=used.output_tokens,
            cache_read_tokens=used.cache_read_input_tokens,
            cache_write_tokens=used.cache_creation_input_tokens,
        )
        with trio.CancelScope(shield=True):  # an aborted turn is recorded too
            try:
                await self.ctx.store.submit(op)
            except Exception as exc:  # the store is closing or full: the turn still ends
                self._trace("error", target, error=f"usage not recorded: {exc}", where="turn")

    async def _run(
        self,
        hooks: TurnHooks,
        speech: TurnSpeech,
        candidates: tuple[Any, ...],
        wakes: int,
        deferred_only: bool,
    ) -> None:
        owner = self.owner
        target = self.target
        runtime = ToolRuntime(self.ctx, self.agent, owner.servers, speech=speech, agent_actor=owner)
        # the host it runs on, and on a fleet its lease epoch: a turn log shows who ran it
        lease = (
            {"epoch": self.ctx.lease_epochs[self.agent]}
            if self.agent in self.ctx.lease_epochs
            else {}
        )
        self._trace(
            "turn-start",
            target,
            wakes=wakes,
            model=owner.model.name,
            host_id=self.ctx.host_id,
            **lease,
        )
        await owner.header_notice.explain()
        outcomes = await self._render_deferred()
        if not inference_needed(other_causes=not deferred_only, render_outcomes=outcomes):
            self._trace("turn-skipped", target, reason="deferred batches materialized nothing")
            return
        context = await owner.history.read()
        newest = next((m for m in reversed(context) if m.get("role") == "user"), None)
        by_server: dict[str, list[str]] = {}
        for c in candidates:
            if c.channel_id not in by_server.setdefault(c.server_id, []):
                by_server[c.server_id].append(c.channel_id)
        injections = await hooks.before_inference(
            body_of(newest) if newest is not None else None, target, by_server
        )
        placed = injection_messages(injections)
        system = owner.system
        stable_system = len(system)  # what follows it is this turn's alone
        for m in placed["system"]:
            system += "\n\n" + "\n".join(
                str(b.get("text", "")) for b in m["blocks"] if b.get("type") == "text"
            )
        context = place_injections(context, placed["beforeUser"], placed["afterUser"])
        # the next turn sends again what comes before this turn's injections
        stable_messages = next(
            (i for i, m in enumerate(context) if "injection" in (m.get("metadata") or {})), None
        )
        tools = await runtime.specs()

        async def on_delta(delta: str) -> None:
            for place, piece in speech.stream(delta):
                self._chunk(speech, place, piece)

        def on_retry(retry: ModelRetry) -> None:
            self.retries += 1
            self._trace(
                "model-retry",
                target,
                model=owner.model.name,
                provider=retry.provider,
                failure=retry.failure,
                attempt=retry.attempt,
                retries=retry.retries,
                wait_s=retry.wait_s,
                line=retry.line,
            )

        for round_no in range(MAX_TOOL_ROUNDS + 1):

            def on_request(body: Mapping[str, Any], round_no: int = round_no) -> None:
                self.ctx.last_requests[self.agent] = LastRequest(
                    agent=self.agent,
                    at=time.time(),
                    model=owner.model.name,
                    turn=self.index,
                    round=round_no,
                    body=body,
                    context_budget=owner.cfg.context_tokens,
                )

            request = ModelRequest(
                agent=self.agent,
                max_tokens=owner.cfg.max_tokens,
                temperature=owner.cfg.temperature,
                system=system,
                # the request keeps what this round saw
                messages=tuple(context) if owner.cfg.images else tuple(text_only(context)),
                tools=tools,
                stable_system=stable_system,
                stable_messages=stable_messages,
                on_retry=on_retry,
                on_request=on_request,
            )
            speech.start_round()
            reply = await self._complete(request, on_delta)
            self.calls += 1
            seen = self.ctx.last_requests.get(self.agent)
            if seen is not None and (seen.turn, seen.round) == (self.index, round_no):
                read = Usage.of(reply.usage)
                total = read.input_tokens + read.cache_read_input_tokens
                total += read.cache_creation_input_tokens
                self.ctx.last_requests[self.agent] = attrs.evolve(seen, input_tokens=total)
            for place, piece in speech.end_stream():
                self._chunk(speech, place, piece)
            used = Usage.of(reply.usage)
            self.usage += used
            self.chose_end = reply.stop_reason in CHOSEN_STOPS
            if not reply.blocks:
                break
            uses = reply.tool_uses
            if reply.text.strip() or any(u.get("name") not in QUIET_TOOLS for u in uses):
                self.spoke = True
            said = await store_said(
                self.ctx,
                self.agent,
                "assistant",
                reply.blocks,
                last=not uses,  # the turn ends at this reply: the token is not taken back
                model=reply.model,
                stop_reason=reply.stop_reason,
                usage=used.as_dict(),
                turn_usage=self.usage.as_dict(),
            )
            context.append(render_for_model(said))
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
            context.append(render_for_model(await self._call_tools(runtime, uses)))
            if runtime.end_turn:
                self.chose_end = True
                break  # skip_reply or sleep: the turn ends at the tool results

    async def _complete(self, request: ModelRequest, on_delta: Any) -> ModelReply:
        """The model's reply; a model outside the host is waited for without the turn token."""
        model = self.owner.model
        if getattr(model, "local", False):
            await self.ctx.turns.share(whole_turn=True)  # a waiting turn may go first
            return await model.complete(request, on_delta)
        async with self.ctx.turns.away():
            return await model.complete(request, on_delta)

    async def _call_tools(
        self, runtime: ToolRuntime, uses: tuple[Mapping[str, Any], ...]
    ) -> dict[str, Any]:
        """Run one round's tool calls in order; their results, stored as one message."""
        target = self.target
        results = []
        checkpoints: list[dict[str, Any]] = []
        for use in uses:
            self._trace("tool-call", target, tool=use.get("name"), arguments=use.get("input"))
            async with self.ctx.turns.away():  # a tool may wait on a server
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
        meta: dict[str, Any] = {"checkpoints": checkpoints} if checkpoints else {}
        stored = await store_said(self.ctx, self.agent, "tool", results, **meta)
        if checkpoints:
            await record_checkpoints(self.ctx, checkpoints)
        return stored

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

    def _complete_streams(self, speech: TurnSpeech) -> None:
        """One ``channels/outgoing/complete`` per channel this turn streamed into, whatever
        way the turn ended."""
        for sid, params in speech.completes():
            if notify(self.ctx, sid, "channels/outgoing/complete", params) is False:
                self._trace("diagnostic", text=f"channels/outgoing/complete to {sid} not sent")

    async def _render_deferred(self) -> list[str]:
        """RFC-006 §5: before the context is read, render the pending deferred batches this
        agent would see (each ``push/render`` concurrently, under its timeout, in this task),
        and wait until what they materialized is durable. The outcomes, one per render, and
        one for what renders of other turns materialized here since this agent's last read."""
        coalescer = self.ctx.coalescer
        if coalescer is None:
            return []
        begun = await coalescer.ask(BeginAssembly(context=self.agent), timeout=60)
        outcomes = list(begun.landed)  # rendered by another turn before this one began

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

        if begun.jobs or begun.joins:  # (a nursery costs the turn a scheduling round)
            async with self.ctx.turns.away(), trio.open_nursery() as nursery:
                for job in begun.jobs:
                    nursery.start_soon(one, job)
                for wait in begun.joins:
                    nursery.start_soon(join, wait)
        return outcomes
