"""Rolling an agent's context back (SPEC §8): set aside everything after a message, and ask each
server whose state the agent's tool calls checkpointed to return to the checkpoint in force at
that message.

The set-aside messages stay stored; a ``rollback`` system marker names them, and the context
reader leaves them out from then on. The host-wide current checkpoint of every lineage (server,
feature set) lives in the store's state table under ``CHECKPOINTS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.context import HostContext
from actors.messages import Call
from protocol.state import read_rollback_result, rollback_params, rollback_targets
from store import PutState

from .history import store_message
from .rollback_plan import MAX_ROLLBACK_SPAN as MAX_ROLLBACK_SPAN
from .rollback_plan import checkpointed_servers, plan_rollback

#: Namespace and key of the host-wide current checkpoints in the store's state table.
CHECKPOINTS = ("checkpoints", "current")


async def record_checkpoints(ctx: HostContext, checkpoints: Sequence[Mapping[str, Any]]) -> None:
    """Make the checkpoints that tool results reported current, and store the lineages."""
    lineages = ctx.lineages
    for c in checkpoints:
        lineages.record((c["server"], c["feature_set"]), c["checkpoint"])
    await ctx.store.write(
        PutState(namespace=CHECKPOINTS[0], key=CHECKPOINTS[1], value=lineages.to_state())
    )


async def roll_back(
    ctx: HostContext, agent: str, to: str, trace: Callable[..., Any]
) -> dict[str, Any]:
    """Roll the agent's context back to message ``to``; the report of what was done.

    The history is read in pages (:func:`~actors.agent.rollback_plan.plan_rollback`): the messages
    after ``to`` and the tool results and markers before it, never the whole history at once."""
    plan = await ctx.store.read(plan_rollback, ctx.store.reader, agent, to)
    set_aside, recorded = list(plan.set_aside), plan.recorded
    lineages = ctx.lineages
    current = {r.lineage: c for r in recorded if (c := lineages.current(r.lineage))}
    targets = rollback_targets(recorded, to, plan.order, current)
    state: list[dict[str, Any]] = []
    for (sid, feature_set), checkpoint in targets.items():
        state.append(await _roll_back_server(ctx, sid, feature_set, checkpoint))
    if any(s.get("checkpoint") for s in state):
        await ctx.store.write(
            PutState(namespace=CHECKPOINTS[0], key=CHECKPOINTS[1], value=lineages.to_state())
        )
    note = f"context rolled back to {to}; {len(set_aside)} later messages set aside"
    await store_message(
        ctx,
        agent,
        "system",
        [{"type": "text", "text": note}],
        system=True,
        kind="rollback",
        to=to,
        set_aside=set_aside,
        state=state,
    )
    trace("rolled-back", to=to, set_aside=len(set_aside), state=state)
    return {"to": to, "set_aside": len(set_aside), "state": state}


async def _roll_back_server(
    ctx: HostContext, sid: str, feature_set: str, checkpoint: str
) -> dict[str, Any]:
    """Ask one server to roll a lineage back; the outcome as stored in the marker."""
    entry: dict[str, Any] = {"server": sid, "feature_set": feature_set, "requested": checkpoint}
    status = ctx.statuses.get(sid)
    declared = status.feature_sets.get(feature_set) if status is not None else None
    ref = ctx.connections.get(sid)
    if ref is None or status is None or not status.ready:
        entry["error"] = f"server {sid} is not connected"
        return entry
    if not isinstance(declared, Mapping) or declared.get("rollback") is not True:
        entry["error"] = f"{sid} does not declare rollback for feature set {feature_set}"
        return entry
    try:
        result = await ref.ask(
            Call(method="state/rollback", params=rollback_params(feature_set, checkpoint)),
            timeout=ctx.config.request_timeout(sid) + 5,
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
        ctx.lineages.record((sid, feature_set), outcome.checkpoint)
    return entry


async def checkpointing_servers(ctx: HostContext, agent: str, among: Sequence[str]) -> set[str]:
    """The servers of ``among`` whose state the agent's tool calls checkpointed, read in pages."""
    return await ctx.store.read(checkpointed_servers, ctx.store.reader, agent, among)
