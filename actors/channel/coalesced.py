"""A coalesced channel item (RFC-006) on its way through the host's coalescer: the channel has
built its write; the coalescer decides whether it is stored and whom it wakes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from actors.context import HostContext
from actors.messages import Prepared
from protocol.coalesce import Append as AppendEffect
from protocol.lanes import IncomingMessage, PushEvent
from store import Append

from .coalescer import Admit

COALESCE_ASK_S = 60.0  # the coalescer's answer (its store write is submitted, not awaited)


def _visible(block: Mapping[str, Any]) -> bool:
    """A block that shows something (an empty or blank text block does not): a retraction
    whose notice shows nothing is a pure withdrawal."""
    return block.get("type") != "text" or bool(str(block.get("text", "")).strip())


async def admit(
    ctx: HostContext,
    server_id: str,
    channel_id: str | None,
    msg: IncomingMessage | PushEvent,
    spec: Any,
    built: tuple[Append, tuple[Any, ...], Any, str],
    converted: list[dict[str, Any]],
) -> Prepared:
    """Admit one coalesced item through the coalescer: it is stored (and wakes) only if the
    coalescer appends it; the answer carries the RFC-006 result. A deferred notice is never
    stored; an admitted one wakes as a push does (its wakes say ``deferred``: the batch is
    rendered when a turn assembles its context). ``built`` is the channel's write of the item
    and its body, wakes and author; ``converted`` the content as converted, before header and
    marking: a deferred notice's fallback."""
    op, blocks, wakes, author = built
    occurrence = op.records[0].metadata["occurrence"] if op.records else ""
    push = msg if isinstance(msg, PushEvent) else None
    step, future = await ctx.coalescer.ask(
        Admit(
            spec=spec,
            binding=ctx.binding(server_id),
            occurrence=occurrence,
            contexts=tuple(r.agent for r in op.records),
            records=op.records,
            dedupe=op.dedupe,
            feature_set=push.feature_set if push is not None else None,
            channel_id=channel_id,
            content=tuple(b for b in converted if _visible(b)),
            timestamp=push.timestamp if push is not None else "",
            tags=tuple(op.records[0].metadata.get("tags", ())) if op.records else (),
            origin=dict(push.origin) if push is not None and push.origin else None,
        ),
        timeout=COALESCE_ASK_S,
    )
    appended = any(isinstance(e, AppendEffect) and e.occurrence == occurrence for e in step.effects)
    if spec.deferred and not step.duplicate and step.outcome in ("first", "replaced"):
        wakes = tuple((agent, attrs.evolve(w, deferred=True)) for agent, w in wakes)
        appended = True
    return Prepared(
        future=future,
        blocks=blocks,
        wakes=wakes if appended else (),
        author=author,
        coalesce=step.result(),
    )
