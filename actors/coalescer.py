"""The CoalescerActor: RFC-006 event coalescing for the whole host.

Every transition of :class:`protocol.coalesce.Coalescer` is one message handled by this actor,
so transitions never interleave (no lock is held across an await: the actor's own loop is the
serialization). A transition's effects and its journal records go to the store as **one** op:
the item's stored copies (an ``Append`` effect), the markers hiding an unread occurrence it
replaced or retracted (``Hide``), and the journal entries, committed together. The caller
answers the server only once that op is durable.

On start the coalescer is rebuilt from the journal (stream ``coalesce``) and then recovers
conservatively (:meth:`~protocol.coalesce.Coalescer.recover`): what was unread before a restart
stays as an ordinary item rather than being silently rewritten.

Hidden occurrences are stored as host markers (a ``system`` message of kind
``coalesce-hidden`` naming the occurrence) for each agent the hidden item reached; an agent's
context leaves out both the markers and what they hide. ``Assembled`` closes the race between
an agent reading its context and a replacement: it marks what the agent's request included as
read, and answers which of those were hidden meanwhile (the agent drops them).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from protocol.coalesce import (
    Append as AppendEffect,
)
from protocol.coalesce import (
    Audit,
    Coalescer,
    CoalesceSpec,
    Hide,
    Step,
)
from protocol.mcpl import HOST_COALESCING
from store import Append, JournalEntry, MessageRecord

from .context import HostContext
from .kernel import Actor, Reply
from .storage import SettledFuture

STREAM = "coalesce"
HIDDEN_KIND = "coalesce-hidden"
#: Occurrences remembered as hidden, for the race with an agent's read; oldest forgotten first.
MAX_HIDDEN = 100_000

#: What this host advertises (``experimental.mcpl.eventCoalescing``).
ADVERTISED = HOST_COALESCING


@attrs.frozen(kw_only=True)
class Admit:
    """Admit one coalesced item. ``records`` are its stored copies (one per agent it reaches);
    they are stored only if the coalescer appends the occurrence. The answer is
    ``(Step, future)``: the future settles when the op is durable."""

    spec: CoalesceSpec
    binding: str
    occurrence: str
    contexts: tuple[str, ...]
    records: tuple[MessageRecord, ...]
    dedupe: tuple[str, str, str] | None
    feature_set: str | None = None
    channel_id: str | None = None
    content: tuple[Any, ...] = ()


@attrs.frozen(kw_only=True)
class Assembled:
    """An agent's request included these occurrences; the answer is the set of them that are
    hidden (replaced or retracted before the read counted)."""

    context: str
    occurrences: tuple[str, ...]


def hidden_marker(agent: str, occurrence: str, new_id: str) -> MessageRecord:
    return MessageRecord(
        id=new_id,
        agent=agent,
        role="system",
        blocks=(),
        metadata={"system": True, "kind": HIDDEN_KIND, "occurrence": occurrence},
        created_at=time.time(),
    )


def is_hidden_marker(message: Mapping[str, Any]) -> bool:
    meta = message.get("metadata")
    return (
        message.get("role") == "system"
        and isinstance(meta, Mapping)
        and meta.get("kind") == HIDDEN_KIND
    )


class CoalescerActor(Actor):
    mailbox_size = 1024

    def __init__(self, ctx: HostContext, new_id: Any) -> None:
        super().__init__("coalescer", ctx.work)
        self.ctx = ctx
        self.co = Coalescer()
        self._new_id = new_id
        self._hidden: OrderedDict[str, None] = OrderedDict()

    async def on_start(self) -> None:
        rows = await self.ctx.store.read(self.ctx.store.reader.journal, STREAM)
        self.co = Coalescer.replay(record for _, record in rows)
        steps = [self.co.advertise(ADVERTISED)]
        if rows:
            steps.append(self.co.recover())
        entries = tuple(JournalEntry(STREAM, r) for s in steps for r in s.records)
        if entries:
            await self.ctx.store.write(Append(records=(), journal=entries))

    def _now(self) -> int:
        return int(time.time() * 1000)

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Admit):
            reply.value(await self._admit(msg))
        elif isinstance(msg, Assembled):
            reply.value(await self._assembled(msg))
        else:
            raise TypeError(f"unexpected message {msg!r}")

    async def _admit(self, msg: Admit) -> tuple[Step, Any]:
        step = self.co.admit(
            msg.spec,
            binding=msg.binding,
            occurrence=msg.occurrence,
            contexts=msg.contexts,
            now=self._now(),
            feature_set=msg.feature_set,
            channel_id=msg.channel_id,
            content=msg.content,
        )
        if step.duplicate or not (step.effects or step.records):
            return step, SettledFuture(stored=False)
        records = self._apply(step, msg.records)
        op = Append(
            records=tuple(records),
            dedupe=msg.dedupe if any(r in msg.records for r in records) else None,
            journal=tuple(JournalEntry(STREAM, r) for r in step.records),
        )
        [future] = await self.ctx.store.submit_many([op])
        return step, future

    def _apply(self, step: Step, item: Sequence[MessageRecord]) -> list[MessageRecord]:
        """The records a step stores: the item's copies it appends, and hiding markers."""
        out: list[MessageRecord] = []
        for effect in step.effects:
            if isinstance(effect, AppendEffect):
                out.extend(r for r in item if r.agent in effect.contexts)
            elif isinstance(effect, Hide):
                self._hidden[effect.occurrence] = None
                while len(self._hidden) > MAX_HIDDEN:
                    self._hidden.popitem(last=False)
                out.extend(
                    hidden_marker(agent, effect.occurrence, self._new_id())
                    for agent in sorted(effect.contexts)
                )
            elif isinstance(effect, Audit):
                self.ctx.trace.emit(
                    "coalesce-audit",
                    server_id=effect.subject.binding if effect.subject else None,
                    data={"kind": effect.kind, "event_ids": list(effect.event_ids)},
                )
        return out

    async def _assembled(self, msg: Assembled) -> frozenset[str]:
        hidden = frozenset(o for o in msg.occurrences if o in self._hidden)
        step = self.co.assembled(msg.context, (o for o in msg.occurrences if o not in hidden))
        if step.records:
            entries = tuple(JournalEntry(STREAM, r) for r in step.records)
            await self.ctx.store.write(Append(records=(), journal=entries))
        return hidden
