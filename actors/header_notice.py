"""The one-time notice that explains source headers to an agent (refs-and-headers G).

Before an agent's first turn whose history holds an item with a source header (however far back),
the host stores a system notice saying what the headers are, then records the agent as told in
the store's state table (one list for every agent, at most ``MAX_EXPLAINED`` names). A notice
already stored counts as given (only the host's own: ``system`` true and its kind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from store import PutState

from .agent_history import store_message
from .context import HostContext
from .tools import AUTHORITY

#: Where the names of the agents already told about source headers are kept (a JSON list).
EXPLAINED = ("framework", "source_headers_explained")
MAX_EXPLAINED = 10_000  # names kept; the oldest go first
NOTICE_KIND = "source-header-notice"
SCAN_ALL = 2**62  # the scan reads everything stored since the last one
HEADER_NOTICE = (
    "[source] Messages from connected servers begin with a header the host writes, naming where "
    "each came from: [source: <server> / <channel-id> · <label> · thread <id> · reply to <id>], "
    "with the label, thread and reply parts only when known. A push that belongs to no channel "
    "reads [source: server · unscoped]. When the server names who wrote a message, the host "
    "writes that on the next line, [author: <name>] (or [author id: <id>]); the sender's text "
    "follows. " + AUTHORITY
)


class HeaderNotice:
    """One agent's side of the notice: how far its history was scanned, and what was seen."""

    def __init__(self, ctx: HostContext, agent: str, trace: Callable[..., Any]) -> None:
        self.ctx = ctx
        self.agent = agent
        self._trace = trace
        self._scan_seq = 0
        self._sees_header = False
        self._notice_given = False

    async def explain(self) -> None:
        """Store the notice if this agent needs it now, and record the agent as told."""
        # the record is one list for every agent: one read-modify-write at a time
        async with self.ctx.explained_lock:
            await self._explain_locked()

    async def _explain_locked(self) -> None:
        try:
            state = await self.ctx.store.read(self.ctx.store.reader.state, EXPLAINED[0])
        except Exception:
            return  # no record to read: no notice this turn
        told = state.get(EXPLAINED[1])
        names = [n for n in told if isinstance(n, str)] if isinstance(told, list) else []
        if self.agent in names:
            return
        sees, given = await self._scan()
        if not given:
            if not sees:
                return
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
        names = [*names, self.agent][-MAX_EXPLAINED:]
        await self.ctx.store.write(PutState(namespace=EXPLAINED[0], key=EXPLAINED[1], value=names))

    async def _scan(self) -> tuple[bool, bool]:
        """(some stored item has a source header, the notice is already stored), reading only
        what was stored since the last scan."""
        fresh, self._scan_seq = await self.ctx.store.read(
            self.ctx.store.reader.history_after, self.agent, self._scan_seq, SCAN_ALL
        )
        for m in fresh:
            meta = m.get("metadata") or {}
            self._sees_header |= isinstance(meta.get("source_header"), str)
            self._notice_given |= meta.get("system") is True and meta.get("kind") == NOTICE_KIND
        return self._sees_header, self._notice_given
