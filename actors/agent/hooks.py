"""One turn's dealings with the servers an agent hears (SPEC §10): the context hooks and the
inference lifecycle.

``context/beforeInference`` goes, in parallel, to every ready server granted ``observe`` or an
``inject.*`` leaf (an inject-only server gets ``userMessage: null``), each under the server's
``hook_timeout_s``; a server that fails or stays silent is left out (fail-open). Each injection is
authorized by its own position against the grant in force when the answer arrives, and its
content goes through the block conversion naming the server that answered.

``inference/lifecycle`` is metadata only: ``started`` once, to the servers granted
``inferenceLifecycle`` at that moment, then exactly one terminal, to those of them still granted
it (a server that became ready or was granted it mid-turn never hears a terminal without its
``started``). Notifications never wait: a turn that is being cancelled still reports
``aborted``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.context import HostContext
from actors.link.calls import call_within, notify
from actors.messages import Call, WakeTarget
from actors.references.registry import resolve_references
from protocol.hooks import (
    HookAnswer,
    Injection,
    ModelInfo,
    before_inference_params,
    channel_context,
    hook_role,
    lifecycle_params,
    read_hook_result,
)

log = logging.getLogger("mcplive.hooks")

LIFECYCLE = "inferenceLifecycle"
MODEL_INFO = "modelInfo"


class TurnHooks:
    def __init__(
        self,
        ctx: HostContext,
        agent: str,
        servers: Sequence[str],
        *,
        model: ModelInfo,
        inference_id: str,
        conversation_id: str,
        turn_index: int,
    ) -> None:
        self.ctx = ctx
        self.agent = agent
        self.servers = tuple(servers)
        self.model = model
        self.inference_id = inference_id
        self.conversation_id = conversation_id
        self.turn_index = turn_index
        self._started = False
        self._ended = False
        self._told: tuple[str, ...] = ()  # the servers that heard ``started``

    def _grant(self, sid: str) -> frozenset[str]:
        status = self.ctx.statuses.get(sid)
        if status is None or not status.ready or status.mcp_only:
            return frozenset()
        grant: frozenset[str] = status.grant
        return grant

    def _trace(self, kind: str, sid: str | None = None, **data: Any) -> None:
        self.ctx.trace.emit(kind, agent=self.agent, server_id=sid, data=data)

    # -- lifecycle ------------------------------------------------------------------------
    def started(self) -> None:
        if not self._started:
            self._started = True
            self._told = self._lifecycle("started", None, self.servers)

    def ended(self, phase: str, usage: tuple[int, int] | None = None) -> None:
        """The one terminal of this inference (later calls and calls before ``started`` are
        ignored, so every exit path may call it)."""
        if self._started and not self._ended:
            self._ended = True
            self._lifecycle(phase, usage, self._told)

    def _lifecycle(
        self, phase: str, usage: tuple[int, int] | None, servers: Sequence[str]
    ) -> tuple[str, ...]:
        """Notify those of ``servers`` granted the lifecycle now; the ones it went to."""
        told: list[str] = []
        for sid in servers:
            grant = self._grant(sid)
            if LIFECYCLE not in grant:
                continue
            told.append(sid)
            params = lifecycle_params(
                phase=phase,
                inference_id=self.inference_id,
                conversation_id=self.conversation_id,
                turn_index=self.turn_index,
                model=self.model,
                model_granted=MODEL_INFO in grant,
                usage=usage,
            )
            if notify(self.ctx, sid, "inference/lifecycle", params) is False:
                self._trace("diagnostic", sid, text=f"inference/lifecycle {phase} not sent")
        return tuple(told)

    # -- context hooks --------------------------------------------------------------------
    async def before_inference(
        self,
        user_message: str | None,
        target: WakeTarget | None,
        candidates: Mapping[str, Sequence[str]],
    ) -> list[Injection]:
        """Call every hooked server at once; the injections they answered with, in configured
        server order (each server's own order kept)."""
        answers: dict[str, HookAnswer] = {}
        hooked = [(sid, role) for sid in self.servers if (role := hook_role(self._grant(sid)))]
        if not hooked:  # (a nursery costs the turn a scheduling round)
            return []
        async with self.ctx.turns.away(), trio.open_nursery() as nursery:
            for sid, role in hooked:
                nursery.start_soon(
                    self._call_hook,
                    sid,
                    role == "observe",
                    user_message,
                    target,
                    tuple(candidates.get(sid, ())),
                    answers,
                )
        injections: list[Injection] = []
        for sid in self.servers:
            if sid in answers:
                injections.extend(answers[sid].injections)
        return injections

    async def _bind_references(self, sid: str, answer: HookAnswer) -> HookAnswer:
        """Register the answer's references with ``sid``, the server whose answer carried them,
        and put their stubs in place."""
        lists = [list(i.blocks) for i in answer.injections]
        resolved = await resolve_references(self.ctx.references, lists, sid)
        if resolved is lists:  # nothing to register
            return answer
        injections = tuple(
            attrs.evolve(i, blocks=tuple(blocks))
            for i, blocks in zip(answer.injections, resolved, strict=True)
        )
        return attrs.evolve(answer, injections=injections)

    async def _call_hook(
        self,
        sid: str,
        observe: bool,
        user_message: str | None,
        target: WakeTarget | None,
        candidates: tuple[str, ...],
        answers: dict[str, HookAnswer],
    ) -> None:
        server = self.ctx.config.server(sid)
        ref = self.ctx.connections.get(sid)
        if server is None or ref is None:
            return
        here = target is not None and target.server_id == sid
        channels = channel_context(
            incoming=(target.channel_id, target.message_id, target.thread_id)
            if here and target is not None
            else None,
            default_outgoing=target.channel_id if here and target is not None else None,
            candidates=candidates,
        )
        params = before_inference_params(
            inference_id=self.inference_id,
            conversation_id=self.conversation_id,
            turn_index=self.turn_index,
            user_message=user_message,
            observe=observe,
            model=self.model,
            channels=channels,
        )
        deadline = server.hook_timeout_s
        key = f"{self.inference_id}/{sid}"
        call = Call(
            method="context/beforeInference", params=params, timeout=deadline, hook=True, key=key
        )
        try:
            result = await call_within(ref, call, deadline)
        except Exception as exc:  # fail-open: the turn goes on without this server
            self._trace("hook-failed", sid, error=str(exc) or type(exc).__name__)
            return
        # Authorized against the grant in force now, when the answer has arrived.
        answer = read_hook_result(result, sid, self._grant(sid))
        answer = await self._bind_references(sid, answer)
        for dropped in answer.dropped:
            self._trace(
                "injection-dropped",
                sid,
                index=dropped.index,
                position=dropped.position if isinstance(dropped.position, str) else None,
                reason=dropped.reason,
            )
        if answer.injections and sid not in self.ctx.injections_noticed:
            self.ctx.injections_noticed.add(sid)
            self._trace(
                "diagnostic",
                sid,
                text=f"{sid} injects context, which MCPL deprecates (RFC-010); the injections "
                "are applied for this version only",
            )
        if answer.injections:
            self._trace(
                "context-injected",
                sid,
                injections=[
                    {
                        "position": i.position,
                        "namespace": i.namespace,
                        "text": " ".join(str(b.get("text", "")) for b in i.blocks)[:200],
                    }
                    for i in answer.injections
                ],
            )
        answers[sid] = answer


def injection_messages(injections: Sequence[Injection]) -> dict[str, list[dict[str, Any]]]:
    """Rendered per position: ``system`` as text for the system prompt, the others as user
    messages introduced by the server and namespace they came from. Never stored."""
    out: dict[str, list[dict[str, Any]]] = {"system": [], "beforeUser": [], "afterUser": []}
    for inj in injections:
        intro = {"type": "text", "text": f"[context from {inj.server_id} · {inj.namespace}]"}
        out[inj.position].append(
            {
                "role": "user",
                "blocks": [intro, *inj.blocks],
                "metadata": {"injection": {"server_id": inj.server_id, "namespace": inj.namespace}},
                "prefix": 1,
            }
        )
    return out
