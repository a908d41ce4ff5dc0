"""An agent's stored history, as its turns read and extend it.

:func:`store_message` appends one message (DESIGN §5's shape) and returns it as read back.
:class:`ContextReader` assembles the context a turn sends the model: the messages still live (no
rollback marker, nothing a marker set aside, no coalesced item hidden before it was read), each
introduced by its source, the newest whole units within the agent's token budget. It reads only
what was stored since the previous turn and keeps the trimmed tail between turns.

Trimming goes in steps: when the context outgrows its budget, the oldest units are taken off
until it fits in ``TRIM_TARGET`` of it, so the turns after that send the same start of the
context, only growing at its end, until it outgrows the budget again (a provider's prompt cache
serves that unchanged start; trimming a unit at a time would change it on every turn). With a
:class:`~actors.agent.folding.Folder`, the span taken off is folded into a summary shown before
the raw messages (:mod:`protocol.folds`). When a context is rebuilt (its first read, or after a
rollback) the summaries are read back from the store, with the raw messages after the newest one
they cover; what of those does not fit is folded then (a fold cut short by a restart, messages that
arrived while the agent never read its context).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors.channel.coalescer import Assembled, is_hidden_marker
from actors.channel.envelope import new_id
from actors.config import AgentConfig
from actors.context import HostContext
from actors.models.base import Model
from actors.renders import SharedRenders
from protocol.authors import author_line, guard_body_start, shown_author, stored_author
from protocol.folds import (
    MIN_MESSAGE_TOKENS,
    FoldingTail,
    covered_ends,
    estimate_tokens,
    is_summary,
    render_summary,
)
from store import Append, CorruptRecord, MessageRecord, Reader
from store.items import WrittenRow

from .folding import Folder, Trace, summary_model

#: No stored message counts for fewer tokens than this.
#: Messages read from the store at a time while assembling a context (newest first).
CONTEXT_PAGE = 64
#: Messages rendered between two shares of the interpreter when a turn reads a big batch.
RENDER_SLICE = 64
#: A batch shares the interpreter only past this many messages: turns woken by the same busy
#: channel read less each and stay one after another; a flooded agent's backlog is shared.
SHARE_FROM = 2 * RENDER_SLICE
#: Messages read from the store at a time by :func:`read_history`.
HISTORY_PAGE = 512
#: The share of its budget a context is trimmed down to once it outgrows the budget.
TRIM_TARGET = 0.75
#: System messages read back, newest first, looking for the summaries of a rebuilt context.
SUMMARY_SCAN = 4096


def new_record(
    agent: str, role: str, blocks: Sequence[Mapping[str, Any]], **meta: Any
) -> MessageRecord:
    """A new message of the agent's own history, stamped now."""
    return MessageRecord(
        id=new_id(),
        agent=agent,
        role=role,
        blocks=tuple(blocks),
        metadata=meta,
        created_at=time.time(),
    )


async def store_message(
    ctx: HostContext, agent: str, role: str, blocks: Sequence[Mapping[str, Any]], **meta: Any
) -> dict[str, Any]:
    """Append one message to the agent's history; the stored message once it is durable."""
    record = new_record(agent, role, blocks, **meta)
    await ctx.store.write(ctx.agent_fenced(agent, Append(records=(record,))))
    return {
        "id": record.id,
        "agent": record.agent,
        "role": role,
        "blocks": list(blocks),
        "metadata": meta,
    }


async def store_said(
    ctx: HostContext,
    agent: str,
    role: str,
    blocks: Sequence[Mapping[str, Any]],
    *,
    last: bool = False,
    **meta: Any,
) -> dict[str, Any]:
    """:func:`store_message` for what a turn said or got back (its reply, its tools' results):
    the turn lets the turn token go while the commit is awaited, so the replies of turns in
    hand commit together instead of one after another, and takes it back before turns that
    have not started (:class:`actors.turn_token.TurnToken`); the ``last`` reply of a turn does
    not take it back."""
    if last:
        ctx.turns.let_go()
        return await store_message(ctx, agent, role, blocks, **meta)
    async with ctx.turns.away():
        return await store_message(ctx, agent, role, blocks, **meta)


def read_history(
    reader: Reader,
    agent: str,
    *,
    after_seq: int = 0,
    before_seq: int | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The agent's stored messages with a seq above ``after_seq`` and below ``before_seq``,
    oldest first; ``limit`` keeps the newest N of them. Read a page at a time (newest first
    when there is a limit, so only what is kept is read)."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    rows = reader.walk(
        agent=agent,
        after_seq=after_seq,
        before_seq=before_seq,
        newest_first=limit is not None,
        page=HISTORY_PAGE,
        limit=limit,
    )
    messages = [r.message for r in rows]
    if limit is not None:
        messages.reverse()
    return messages


def fit_budget(messages: Sequence[Mapping[str, Any]], budget: int) -> list[Mapping[str, Any]]:
    """Drop the oldest whole units until the rest fits; an assistant message and the tool
    results after it form one unit, so a tool call is never separated from its result."""
    tail = ContextTail(budget)
    tail.extend(messages)
    return tail.messages()


class ContextTail:
    """The newest whole units of an agent's context within a token budget, kept incrementally:
    new messages are appended and, when they make the total outgrow ``budget``, the oldest units
    are dropped until it is at most ``target`` (``budget`` unless given; at least the newest unit
    stays). Each unit's size is computed once. With ``target == budget`` dropping only ever
    removes the oldest units, so trimming as messages arrive keeps the same units as trimming
    everything at once; with a lower target the start of the tail stays put until the budget
    is outgrown again."""

    def __init__(self, budget: int, target: int | None = None) -> None:
        self.budget = budget
        self.target = budget if target is None else min(target, budget)
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
        if self.total <= self.budget:
            return
        while self.total > self.target and len(self._units) > 1:
            self._units.popleft()
            self.total -= self._sizes.popleft()

    def messages(self) -> list[Mapping[str, Any]]:
        return [m for unit in self._units for m in unit]


def render_for_model(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as every model sees it: an inbound item is introduced by its source
    (the stored header, or for an item stored without one, a short intro) and then by its
    author, on a line the host writes (:func:`protocol.authors.author_line`); a push or message
    whose server named no author gets no such line. The stored message is not changed, and
    the same message renders to the same bytes on every turn. ``prefix`` counts the leading
    blocks the host wrote, before the sender's body."""
    blocks = list(message.get("blocks", ()))
    meta = message.get("metadata") or {}
    out = {"role": message["role"], "blocks": blocks, "metadata": message.get("metadata", {})}
    src = meta.get("inbound_source") if isinstance(meta, Mapping) else None
    if message["role"] != "user" or not isinstance(src, Mapping):
        return out
    author = stored_author(meta)
    header = meta.get("source_header")
    if isinstance(header, str):
        first = blocks[0] if blocks else None
        at = 1 if isinstance(first, Mapping) and first.get("text") == header else 0
        _guard_body(blocks, at)
        if author is not None:
            blocks.insert(at, {"type": "text", "text": author_line(author)})
            out["prefix"] = at + 1
        return out
    where = f"{src.get('server')}" + (
        f" {src.get('label') or src.get('channel')}" if src.get("channel") else " push event"
    )
    intro = f"[{where}] {shown_author(author)}:" if author is not None else f"[{where}]"
    _guard_body(blocks, 0)
    out["blocks"] = [{"type": "text", "text": intro}, *blocks]
    out["prefix"] = 1
    return out


class _NotPlain(Exception):
    """A fresh row whose message needs more than rendering (:func:`_plain`)."""


def _plain(message: Mapping[str, Any]) -> bool:
    """Whether a stored message is in context as it is rendered: not a rollback marker, a
    summary or a hidden marker (:meth:`ContextReader.read` reads those in full), nor a coalesced
    item (the coalescer says whether it is still shown)."""
    meta = message.get("metadata")
    if isinstance(meta, Mapping) and isinstance(meta.get("occurrence"), str):
        return False
    return not (is_rollback(message) or is_hidden_marker(message) or is_summary(message))


def _rendered(message: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`render_for_model` with its token estimate under ``tokens``."""
    out = render_for_model(message)
    out["tokens"] = estimate_tokens(out)
    return out


def _guard_body(blocks: list[Any], at: int) -> None:
    """The body starting at ``blocks[at]`` cannot begin with a line read as the host's author
    line (:func:`protocol.authors.guard_body_start`); the stored block is not changed."""
    first = blocks[at] if at < len(blocks) else None
    if isinstance(first, Mapping) and first.get("type") == "text":
        text = str(first.get("text", ""))
        guarded = guard_body_start(text)
        if guarded is not text:
            blocks[at] = {**first, "text": guarded}


def is_rollback(message: Mapping[str, Any]) -> bool:
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
    hidden = {i for m in messages if is_rollback(m) for i in m["metadata"].get("set_aside", ())}
    replaced = {m["metadata"].get("occurrence") for m in messages if is_hidden_marker(m)}
    return [
        m
        for m in messages
        if not is_rollback(m)
        and m["id"] not in hidden
        and not is_hidden_marker(m)
        and (not replaced or m["metadata"].get("occurrence") not in replaced)
    ]


def place_injections(
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


class ContextReader:
    """One agent's context as of its last turn (used only by that agent's turns, one at a
    time)."""

    def __init__(
        self,
        ctx: HostContext,
        agent: str,
        budget: int,
        renders: SharedRenders | None = None,
        folder: Folder | None = None,
    ) -> None:
        self.ctx = ctx
        self.agent = agent
        self.budget = budget
        #: Renderings shared with the other agents' readers (each reader its own if None).
        self.renders = renders if renders is not None else SharedRenders()
        #: Folds what leaves the context into summaries (an :class:`actors.agent.folding.Folder`);
        #: None: it is dropped.
        self.folder = folder
        self._tail = self._new_tail()
        self._seen_seq = 0

    def _new_tail(self) -> FoldingTail:
        return FoldingTail(self.budget, int(self.budget * TRIM_TARGET), estimate_tokens)

    async def read(self) -> list[Mapping[str, Any]]:
        """The agent's context from the store: only what was stored since the last read is read
        and decoded, newest first a page at a time, until the budget is full; the kept tail is
        trimmed in steps (see :class:`~protocol.folds.FoldingTail`) to the token budget, oldest
        whole units first, and what is trimmed is folded into a summary when the reader has a
        folder."""
        rebuild = self._seen_seq == 0
        taken = self.ctx.store.feeds.take_rows(self.agent, self._seen_seq)
        if taken is not None and not rebuild:
            try:  # the common case: rows of recent commits that only need rendering
                rendered = await self._in_slices(taken[0], self._render_row)
            except _NotPlain:
                pass  # read in full below
            except CorruptRecord:
                self.ctx.store.feeds.forget(self.agent)
                taken = None  # read from the store below, which reports it and reads on
            else:
                self._seen_seq = taken[1]
                return await self._extended(rendered)
        if rebuild and self.folder is not None:
            summaries = await self.ctx.store.read(
                _read_summaries, self.ctx.store.reader, self.agent, self._tail.summary_cap
            )
        else:
            summaries = []
        fresh, seen = await self._fresh(taken)
        if any(is_rollback(m) for m in fresh) and self._seen_seq:
            # Something already in the tail was set aside: rebuild from the store.
            self._tail, self._seen_seq = self._new_tail(), 0
            return await self.read()
        self._seen_seq = seen
        live = [m for m in live_messages(fresh) if not is_summary(m)]
        if summaries:
            live = _after_covered(live, summaries)
            merged = [s for s in summaries if s["metadata"]["summarizes"].get("summaries")]
            for summary in summaries:
                if summary not in merged:
                    shown = render_summary(summary)
                    self._tail.add_summary(shown, estimate_tokens(shown))
            for summary in merged:  # first, as when it was made
                shown = render_summary(summary)
                self._tail.add_front(shown, estimate_tokens(shown))
        occurrences = tuple(
            o for m in live if isinstance(o := m["metadata"].get("occurrence"), str)
        )
        if occurrences and self.ctx.coalescer is not None:
            # read now: these are consumed for this agent, and any replaced meanwhile is left out
            hidden = await self.ctx.coalescer.ask(
                Assembled(context=self.agent, occurrences=occurrences), timeout=60
            )
            live = [m for m in live if m["metadata"].get("occurrence") not in hidden]
        return await self._extended(await self._in_slices(live, self._render))

    async def _extended(self, shown: list[dict[str, Any]]) -> list[Mapping[str, Any]]:
        """The context once ``shown`` (rendered, oldest first) is added to the kept tail, what
        that trims off folded when there is a folder."""
        span = self._tail.extend(shown)
        if span and self.folder is not None:
            await self._fold(span)
        return self._tail.messages()

    async def _in_slices(
        self, items: Sequence[Any], convert: Callable[[Any], dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``convert`` applied to each of ``items`` in order, sharing the interpreter between
        slices of a big batch (a turn reading a flooding server's backlog does not hold up the
        other agents' turns). An error of ``convert`` ends it."""
        out: list[dict[str, Any]] = []
        for start in range(0, len(items), RENDER_SLICE):
            if start >= SHARE_FROM:
                await self.ctx.turns.share()
            out.extend(convert(item) for item in items[start : start + RENDER_SLICE])
        return out

    def _render(self, message: Mapping[str, Any]) -> dict[str, Any]:
        shown = self.renders.render(message, _rendered)
        shown["id"] = message["id"]
        return shown

    def _render_row(self, row: WrittenRow) -> dict[str, Any]:
        """A fresh row rendered; :class:`_NotPlain` when its message needs more (see
        :func:`_plain`)."""
        shown = self.renders.render_row(row, self.ctx.store.feeds.decode, _plain, _rendered)
        if shown is None:
            raise _NotPlain
        return shown

    async def _fold(self, span: list[Mapping[str, Any]]) -> None:
        """Fold ``span`` into a summary shown before the raw tail; when that fails the span
        is left out (the folder says so). Cancelled meanwhile, the next read rebuilds."""
        assert self.folder is not None
        done = False
        try:
            summary = await self.folder.fold(span, self._tail.summary_cap)
            done = True
        finally:
            if not done:
                self._tail, self._seen_seq = self._new_tail(), 0
        if summary is None:
            return
        shown = render_summary(summary)
        gone = self._tail.add_summary(shown, estimate_tokens(shown))
        if gone:
            await self._merge(gone)

    async def _merge(self, gone: list[Mapping[str, Any]]) -> None:
        """Merge the summaries that left the view into one shown first (the rest's room in the
        summaries' share); when that fails they stay out of view (the folder says so)."""
        assert self.folder is not None
        room = self._tail.summary_cap - self._tail.summary_total
        done = False
        try:
            merged = await self.folder.merge(gone, room)
            done = True
        finally:
            if not done:
                self._tail, self._seen_seq = self._new_tail(), 0
        if merged is not None:
            shown = render_summary(merged)
            self._tail.add_front(shown, estimate_tokens(shown))

    async def _fresh(
        self, taken: tuple[list[WrittenRow], int] | None
    ) -> tuple[list[dict[str, Any]], int]:
        """What was stored since the last read, oldest first, and the newest seq among it:
        the rows ``taken`` from the fresh feed when there are (decoded here), else read from
        the store.

        Pages are read newest first and reading stops once the live messages read fill the
        budget from the start of a unit (older messages could only be trimmed away, as a whole
        unit is never split; a stored message is never larger than its rendering; what sets a
        message aside is newer than it, so it is read first), or at
        ``budget // MIN_MESSAGE_TOKENS + 1`` messages (no message costs less, so older ones
        could never fit)."""
        store = self.ctx.store
        if taken is not None:  # the rows of recent commits: no trip to the reading thread
            rows, newest = taken
            try:
                return await self._in_slices(rows, store.feeds.decode), newest
            except CorruptRecord:
                store.feeds.forget(self.agent)  # the store read reports it and reads on
        return await store.read(
            _read_fresh, store.reader, self.agent, self._seen_seq, self.budget
        )  # one hand-over to the reading thread, however many pages it takes


def _read_fresh(
    reader: Reader, agent: str, seen_seq: int, budget: int
) -> tuple[list[dict[str, Any]], int]:
    """:meth:`ContextReader._fresh`'s pages, read in the calling (reading) thread."""
    cap = budget // MIN_MESSAGE_TOKENS + 1
    pages: list[list[dict[str, Any]]] = []
    count, newest = 0, seen_seq
    before: int | None = None
    while count < cap:
        rows = reader.rows(
            agent=agent,
            after_seq=seen_seq,
            before_seq=before,
            newest_first=True,
            limit=min(CONTEXT_PAGE, cap - count),
            shared=True,  # read only: rendering copies what it changes
        )
        if not rows:
            break
        if before is None:
            newest = rows[0].seq
        before = rows[-1].seq
        page = [r.message for r in reversed(rows)]
        pages.append(page)
        count += len(page)
        if page[0].get("role") != "tool" and count < cap:
            read = [m for p in reversed(pages) for m in p]
            if sum(estimate_tokens(m) for m in live_messages(read)) > budget:
                break
    return [m for page in reversed(pages) for m in page], newest


def _read_summaries(reader: Reader, agent: str, cap: int) -> list[dict[str, Any]]:
    """The summaries that open the agent's context, oldest first, looked for among its newest
    ``SUMMARY_SCAN`` system messages (a summary a rollback set aside is left out): its newest
    summary of summaries (shown first) and every summary newer than what that one merged; with
    none merged yet, the newest summaries that fit in ``cap`` tokens (at least one, if any)."""
    found: list[dict[str, Any]] = []
    hidden: set[str] = set()  # set aside by a rollback (a marker is newer than what it hides)
    merged: dict[str, Any] | None = None
    taken_in: set[str] = set()  # what the newest summary of summaries stands for
    for row in reader.walk(agent=agent, roles=("system",), newest_first=True, limit=SUMMARY_SCAN):
        m = row.message
        if is_rollback(m):
            hidden.update(m["metadata"].get("set_aside", ()))
        if not is_summary(m) or m["id"] in hidden:
            continue
        parts = m["metadata"]["summarizes"].get("summaries") or ()
        if m["id"] in taken_in:
            if not parts:
                break  # a span the newest merge took in: everything older is in it (or left)
            taken_in.update(parts)  # an older merge, taken in by a newer one
            continue
        if parts:
            merged = merged or m  # the newest: it took in every older one
            taken_in.update(parts)
            continue
        found.append(m)  # newest first
    if merged is not None:
        return [merged, *reversed(found)]
    kept: list[dict[str, Any]] = []
    total = 0
    for m in found:
        size = estimate_tokens(render_summary(m))
        if kept and total + size > cap:
            break
        kept.append(m)
        total += size
    kept.reverse()
    return kept


def _after_covered(
    live: list[dict[str, Any]], summaries: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The messages after the newest one the summaries cover (older ones were folded, or left
    the context before the newest fold)."""
    covered = {i for s in summaries for i in s["metadata"]["summarizes"].get("ids", ())}
    covered.update(e for s in summaries for e in covered_ends(s["metadata"]["summarizes"]) if e)
    last = max((n for n, m in enumerate(live) if m["id"] in covered), default=-1)
    return live[last + 1 :]


def context_reader(ctx: Any, cfg: AgentConfig, model: Model, trace: Trace) -> ContextReader:
    """The agent's context reader, folding with its summary model when it has one."""
    summarizer = summary_model(cfg, model)
    folder = Folder(ctx, cfg.name, summarizer, trace) if summarizer is not None else None
    return ContextReader(ctx, cfg.name, cfg.context_tokens, ctx.renders, folder)
