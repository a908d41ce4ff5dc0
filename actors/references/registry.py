"""The ReferenceRegistry actor: every reference (RFC-005) the host has seen, bound to the servers
that delivered it, and the decisions about fetching it.

Registration, the eager-eligibility check and the fetch decision run in the actor's message
loop, one at a time, so no two of them see a half-updated record or budget. The network fetch
itself runs in a child task and reports back by message; concurrent fetches of one reference
share one request. A server's address is the URL the host dials for it (a websocket server's
``url``); a stdio server has none, so its references are refused as ``unknown server``.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from actors.config import HostConfig, ServerConfig
from actors.kernel import Actor, Reply, Work
from actors.models.tls import tls_context
from protocol.references import (
    Chosen,
    Record,
    RegistryState,
    Testimony,
    budget_refusal,
    choose,
    eager_eligible,
    stub_text,
    unknown_reference,
)

from .fetcher import Fetched, FetchPlan, FetchRefused, fetch, make_client

#: The most fetches running at once; past it a fetch is refused for now.
MAX_FETCHES = 32
#: The most askers sharing one fetch; past it an asker is refused for now.
MAX_WAITERS = 64
FETCH_TIMEOUT_S = 60.0
EAGER_TIMEOUT_S = 10.0


@attrs.frozen(kw_only=True)
class RefView:
    """What a stub is made of: a snapshot of one record."""

    ref_id: str
    testimony: Testimony
    server_ids: tuple[str, ...]
    fetched_path: str | None

    def stub(self, provenance: str) -> str:
        return stub_text(
            self.ref_id,
            self.testimony,
            provenance,
            saved_path=self.fetched_path,
            bound=bool(self.server_ids),
        )


@attrs.frozen(kw_only=True)
class RegisterRefs:
    """Register each testimony with the server that delivered it (None: no server)."""

    items: tuple[tuple[Testimony, str | None], ...]


@attrs.frozen(kw_only=True)
class LookupRefs:
    ref_ids: tuple[str, ...]


@attrs.frozen(kw_only=True)
class FetchRef:
    """Fetch one reference. ``eager``: only if it is eager-eligible, under the dialed server's
    eager limit and the short timeout (the answer is None when it is not eligible)."""

    ref_id: str | None
    max_bytes: int | None = None
    eager: bool = False


@attrs.frozen(kw_only=True)
class _Done:
    ref_id: str
    testimony: Testimony  # the claims the fetch checked
    server_id: str
    allowance: int
    result: Fetched | FetchRefused


class FetchError(Exception):
    """A refusal or failure; the message is the fetcher's exact text."""


@attrs.frozen(kw_only=True)
class SavedRef:
    """A fetched reference: where its verified bytes are, relative to the workspace."""

    ref_id: str
    path: str
    bytes: int
    mime_type: str
    digest_verified: bool
    digest_claimed: bool


def _saved(record: Record) -> SavedRef:
    assert record.fetched_path is not None
    return SavedRef(
        ref_id=record.ref_id,
        path=record.fetched_path,
        bytes=record.verified_bytes or 0,
        mime_type=record.verified_mime or "application/octet-stream",
        digest_verified=record.digest_verified,
        digest_claimed=record.testimony.digest is not None,
    )


def _view(record: Record) -> RefView:
    return RefView(
        ref_id=record.ref_id,
        testimony=record.testimony,
        server_ids=tuple(record.server_ids),
        fetched_path=record.fetched_path,
    )


_SAVED = re.compile(r"ref_([0-9a-z]+)_[0-9a-z]{4}\.")


def highest_saved_counter(workspace: Path) -> int:
    """The highest id counter among the files earlier runs saved under ``workspace/refs``."""
    try:
        names = [entry.name for entry in os.scandir(workspace / "refs")]
    except OSError:
        return 0
    counters = [int(m.group(1), 36) for n in names if (m := _SAVED.match(n))]
    return max(counters, default=0)


def server_addresses(config: HostConfig) -> dict[str, str | None]:
    """Each configured server's address: the websocket URL dialled for it, or None (stdio)."""
    return {s.id: s.endpoint if s.url is not None else None for s in config.servers}


class ReferenceRegistry(Actor):
    mailbox_size = 256

    def __init__(self, config: HostConfig, work: Work, *, rng: random.Random | None = None) -> None:
        super().__init__("references", work)
        self.config = config
        self.workspace = config.data_dir / "workspace"
        self.state = RegistryState(
            rng or random.Random(), counter_after=highest_saved_counter(self.workspace)
        )
        self.addresses = server_addresses(config)
        self.servers: Mapping[str, ServerConfig] = {s.id: s for s in config.servers}
        self.used: dict[str, int] = {}  # bytes charged per dialed server; never renews
        self.reserved: dict[str, int] = {}  # bytes fetches in flight may still take
        self.waiting: dict[str, list[Reply]] = {}  # ref id -> askers sharing one fetch

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, RegisterRefs):
            now = time.time()
            reply.value(tuple(_view(self.state.register(t, sid, now)) for t, sid in msg.items))
        elif isinstance(msg, LookupRefs):
            records = (self.state.get(r) for r in msg.ref_ids)
            reply.value(tuple(_view(r) if r is not None else None for r in records))
        elif isinstance(msg, FetchRef):
            self._fetch(msg, reply)
        elif isinstance(msg, _Done):
            self._done(msg)
            reply.value(None)
        else:
            raise TypeError(f"unexpected message {msg!r}")

    # -- the fetch decision (B.3 steps 1-3, then the plan) ---------------------------------
    def _fetch(self, msg: FetchRef, reply: Reply) -> None:
        record = self.state.get(msg.ref_id) if msg.ref_id is not None else None
        if record is None:
            reply.error(FetchError(unknown_reference(msg.ref_id)))
            return
        if record.fetched:
            reply.value(_saved(record))
            return
        chosen = choose(record.server_ids, self.addresses, record.testimony.uri)
        if msg.eager:
            server = self.servers.get(chosen.server_id) if isinstance(chosen, Chosen) else None
            limit = server.eager_limit_bytes if server is not None else 0
            eligible = eager_eligible(
                fetched=False,
                chosen=chosen,
                size_bytes=record.testimony.size_bytes,
                eager_limit=limit,
            )
            if not eligible:
                reply.value(None)
                return
        if record.ref_id in self.waiting:
            waiting = self.waiting[record.ref_id]
            if len(waiting) >= MAX_WAITERS:
                reply.error(FetchError(f"{MAX_WAITERS} askers already wait for this fetch; retry"))
                return
            waiting.append(reply)  # one request serves every asker
            return
        if not isinstance(chosen, Chosen):
            reply.error(FetchError(chosen.message))
            return
        server = self.servers[chosen.server_id]
        if len(self.waiting) >= MAX_FETCHES:
            reply.error(FetchError(f"too many fetches in flight ({MAX_FETCHES}); retry shortly"))
            return
        used = self.used.get(server.id, 0)
        held = self.reserved.get(server.id, 0)
        refusal = budget_refusal(used + held, server.fetch_budget_bytes)
        if refusal is not None:
            reply.error(FetchError(budget_refusal(used, server.fetch_budget_bytes) or refusal))
            return
        if msg.eager:
            ceiling, timeout = server.eager_limit_bytes, EAGER_TIMEOUT_S
        else:
            asked = msg.max_bytes if msg.max_bytes is not None else server.fetch_ceiling_bytes
            ceiling, timeout = min(asked, server.fetch_ceiling_bytes), FETCH_TIMEOUT_S
        # What this fetch may take of the budget is held until it ends, so fetches running side
        # by side can never charge the server past its budget.
        allowance = min(ceiling, server.fetch_budget_bytes - used - held)
        self.reserved[server.id] = held + allowance
        plan = FetchPlan(
            ref_id=record.ref_id,
            testimony=record.testimony,
            token=server.token,
            ceiling=ceiling,
            budget=server.fetch_budget_bytes,
            used=server.fetch_budget_bytes - allowance,
            timeout=timeout,
            workspace=self.workspace,
            now=time.time(),
        )
        self.waiting[record.ref_id] = [reply]
        self.spawn(self._run, plan, server.id, allowance)

    async def _run(self, plan: FetchPlan, server_id: str, allowance: int) -> None:
        result: Fetched | FetchRefused
        try:
            async with make_client(await tls_context()) as client:
                result = await fetch(plan, client)
        except FetchRefused as exc:
            result = exc
        except trio.Cancelled:
            raise
        except Exception as exc:  # a transport failure: its message
            result = FetchRefused(str(exc) or type(exc).__name__)
        assert self.ref is not None
        await self.ref.tell(
            _Done(
                ref_id=plan.ref_id,
                testimony=plan.testimony,
                server_id=server_id,
                allowance=allowance,
                result=result,
            )
        )

    def _done(self, msg: _Done) -> None:
        self.reserved[msg.server_id] = self.reserved.get(msg.server_id, 0) - msg.allowance
        replies = self.waiting.pop(msg.ref_id, [])
        result = msg.result
        if isinstance(result, Fetched):
            self.used[msg.server_id] = self.used.get(msg.server_id, 0) + result.bytes
            record = self.state.get(msg.ref_id)
            if record is not None:
                self.state.mark_fetched(
                    msg.ref_id,
                    path=result.path,
                    n=result.bytes,
                    mime=result.mime_type,
                    digest_verified=result.digest_verified,
                    testimony=msg.testimony,
                )
            for r in replies:
                if record is None:  # evicted while it was being fetched
                    r.error(FetchError(unknown_reference(msg.ref_id)))
                else:
                    r.value(_saved(record))
        else:
            for r in replies:
                r.error(FetchError(str(result)))


def _pending(block: Mapping[str, Any]) -> bool:
    return block.get("type") == "reference"


async def resolve_references(
    registry: Any,
    lists: list[list[dict[str, Any]]],
    server_id: str | None,
    *,
    eager: bool = False,
    on_error: Any = None,
) -> list[list[dict[str, Any]]]:
    """Each list of converted blocks with its pending references registered (with
    ``server_id``, the server that delivered them) and replaced by their stubs; one ask for all.
    With ``eager``, the eligible ones are fetched first, so their stubs already name the saved
    file; a failed eager fetch is only reported to ``on_error``. Without any reference, the
    very ``lists`` object comes back (and nothing is asked)."""
    where = [(i, j) for i, blocks in enumerate(lists) for j, b in enumerate(blocks) if _pending(b)]
    if not where:
        return lists
    items = tuple((Testimony.from_wire(lists[i][j]["testimony"]), server_id) for i, j in where)
    views: tuple[RefView, ...] = await registry.ask(RegisterRefs(items=items), timeout=30)
    if eager:
        async with trio.open_nursery() as nursery:
            for view in {v.ref_id: v for v in views}.values():
                nursery.start_soon(_eager_fetch, registry, view.ref_id, on_error)
        looked = await registry.ask(LookupRefs(ref_ids=tuple(v.ref_id for v in views)), timeout=30)
        views = tuple(new or old for new, old in zip(looked, views, strict=True))
    out = [list(blocks) for blocks in lists]
    for (i, j), view in zip(where, views, strict=True):
        provenance = str(lists[i][j].get("provenance", ""))
        out[i][j] = {"type": "text", "text": view.stub(provenance), "ref_id": view.ref_id}
    return out


async def _eager_fetch(registry: Any, ref_id: str, on_error: Any) -> None:
    try:
        await registry.ask(FetchRef(ref_id=ref_id, eager=True), timeout=EAGER_TIMEOUT_S + 5)
    except Exception as exc:  # an eager fetch is best effort: the stub still offers the fetch
        if on_error is not None:
            on_error(ref_id, str(exc) or type(exc).__name__)
