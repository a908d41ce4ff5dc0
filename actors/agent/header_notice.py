"""The one-time notice that explains source headers to an agent (refs-and-headers G).

Before an agent's first turn whose history holds an item with a source header (however far back),
the host stores a system notice saying what the headers are, then records the agent as told in
the store's state table (one list for every agent, at most ``MAX_EXPLAINED`` names). A notice
already stored counts as given (only the host's own: ``system`` true and its kind).

Whether the history holds a header, and whether the notice is stored, comes from the store's
facts index (:mod:`store.facts`): one indexed read, however long the history. Once the agent is
known to be told, later turns cost nothing. The record is read once per host and kept in step with
its writes; a host-wide lock orders them, held only to hand a write over, never over a commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.context import HostContext
from store import HEADER_FACT, NOTICE_FACT, NOTICE_KIND, PutState

from .history import store_message
from .tools import AUTHORITY

#: Where the names of the agents already told about source headers are kept (a JSON list).
EXPLAINED = ("framework", "source_headers_explained")
MAX_EXPLAINED = 10_000  # names kept; the oldest go first
HEADER_NOTICE = (
    "[source] Messages from connected servers begin with a header the host writes, naming where "
    "each came from: [source: <server> / <channel-id> · <label> · thread <id> · reply to <id>], "
    "with the label, thread and reply parts only when known. A push that belongs to no channel "
    "reads [source: server · unscoped]. When the server names who wrote a message, the host "
    "writes that on the next line, [author: <name>] (or [author id: <id>]); the sender's text "
    "follows. " + AUTHORITY
)


class HeaderNotice:
    """One agent's side of the notice. Once the agent is known to be told (its name found in the
    record, or just written there), every later turn returns at once: no lock, no read."""

    def __init__(self, ctx: HostContext, agent: str, trace: Callable[..., Any]) -> None:
        self.ctx = ctx
        self.agent = agent
        self._trace = trace
        self._told = False

    async def explain(self) -> None:
        """Store the notice if this agent needs it now, and record the agent as told."""
        if self._told:
            return
        store = self.ctx.store
        try:
            facts = await store.read(store.reader.agent_facts, self.agent)
        except Exception:
            return  # nothing known this turn: no notice (the next turn asks again)
        if not facts & {HEADER_FACT, NOTICE_FACT}:
            return  # nothing to explain and no notice stored, whatever the record holds
        names = await self._names()
        if names is None:
            return  # no record to read: no notice this turn
        if self.agent in names:
            self._told = True
            return
        if NOTICE_FACT not in facts:  # so the agent's history holds a header to explain
            try:
                await store_message(
                    self.ctx,
                    self.agent,
                    "system",
                    [{"type": "text", "text": HEADER_NOTICE}],
                    system=True,
                    kind=NOTICE_KIND,
                )
            except Exception:
                return  # not stored: not recorded either, so the next turn tries again
            self._trace("header-notice")
        self._told = await self._record()

    async def _names(self) -> list[str] | None:
        """The names in the record: read once per host, kept in step with every write since;
        None when it cannot be read."""
        ctx = self.ctx
        async with ctx.explained_lock:
            if ctx.explained_names is None:
                try:
                    state = await ctx.store.read(ctx.store.reader.state, EXPLAINED[0])
                except Exception:
                    return None
                told = state.get(EXPLAINED[1])
                ctx.explained_names = (
                    [n for n in told if isinstance(n, str)] if isinstance(told, list) else []
                )
            return list(ctx.explained_names)

    async def _record(self) -> bool:
        """Add this agent to the record; whether the write committed. The lock is held only
        to hand the write over (writes commit in the order they are handed over, so each
        carries every name before it), never while a commit is awaited."""
        ctx = self.ctx
        async with ctx.explained_lock:
            assert ctx.explained_names is not None
            names = [*ctx.explained_names, self.agent][-MAX_EXPLAINED:]
            try:
                future = await ctx.store.submit(
                    PutState(namespace=EXPLAINED[0], key=EXPLAINED[1], value=names)
                )
            except Exception:
                return False
            ctx.explained_names = list(names)  # the handed-over value is never changed
        try:
            await future.wait()
        except Exception:
            async with ctx.explained_lock:  # not recorded: the next turn records it then
                if ctx.explained_names is not None and self.agent in ctx.explained_names:
                    ctx.explained_names.remove(self.agent)
            return False
        return True
