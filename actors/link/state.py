"""One link to an MCPL server, and what the parts of a ``ConnectionActor`` share about it.

A ``Link`` is everything that lives and dies with one transport: the JSON-RPC session, the
outbox, the queues between reader, dispatcher and responder, the grant and feature sets in
force, the channels registered on it. ``LinkOwner`` is the face the actor shows its parts
(``actors.link.handshake``, ``actors.link.inbound``, ``actors.link.requests``): its identity, its
trace, and the two ways to talk to the server (``request``, ``notify``). The parts never import
the actor, so the import graph stays a tree: ``connection`` → parts → ``link``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import attrs
import outcome
import trio

from actors.config import ServerConfig
from actors.context import HostContext
from actors.kernel import BatchQueue, Work
from protocol import grants, mcpl
from protocol import jsonrpc as rpc
from protocol.declarations import NotedUses
from protocol.errors import INTERNAL_ERROR, METHOD_NOT_FOUND, RpcError
from protocol.vitals import MinuteCounts

from .transport import Transport

log = logging.getLogger("mcplive.connection")

#: A connection's share of the host per scheduling step: its reader, dispatcher and responder
#: each handle at most this many messages before every other task has had its turn. A flooding
#: server so gets one slice per round, as a quiet one does, and the rest waits in its bounded
#: queues (then in its own transport: it is slowed down, never refused).
INGEST_SLICE = 16
READ_BATCH = INGEST_SLICE  # requests read together are queued together, up to this many
TAKE_LIMIT = INGEST_SLICE  # the most a dispatcher or responder takes at once
MANIFEST_FETCHES = 5  # at most this many mcpl/manifest fetches per window; the excess is dropped
MANIFEST_WINDOW_S = 60.0

#: What the transcript says of an item: (kind, channel id, message id or event id, author).
#: Only strings (and None), so the cycle collector stops tracking it at its first pass.
Trace = tuple[str, str | None, str, str | None]


class RequestTimeout(TimeoutError):
    pass


@attrs.define
class Link:
    """One live transport and everything that dies with it."""

    transport: Transport
    session: rpc.RpcSession
    outbox_send: trio.MemorySendChannel[list[str]]
    outbox_recv: trio.MemoryReceiveChannel[list[str]]
    # the server's requests, and its notifications that change channels, in arrival order
    requests: BatchQueue[rpc.Request | rpc.Notification]
    answers: BatchQueue[Any]  # inbound.Pending, answered by the responder in order
    waiters: dict[rpc.Id, trio.MemorySendChannel[outcome.Outcome[Any]]] = attrs.field(factory=dict)
    # messages read and written per minute: the connection's own counts (they outlive the link)
    traffic: MinuteCounts = attrs.field(factory=MinuteCounts)
    # the host's policy for this link is decided and in force (SPEC §6.7, host-first): its
    # featureSets/update is sent, or the link runs MCP-only; the server's requests are judged
    # under it from then on, never after the server's answer (see :meth:`decide`)
    decided: bool = False
    # the reader queues the server's requests for the dispatcher itself: set once the requests
    # that arrived before the decision are queued, in the step that finds none left
    admitting: bool = False
    # the handshake is over (tools listed): the agents may call the server; ``ready_at`` is when
    # it turned ready (trio time), what the connection's backoff asks of a link that ended
    ready: bool = False
    ready_at: float | None = None
    handshake_over: trio.Event = attrs.field(factory=trio.Event)  # ready, or never will be
    mcp_only: bool = False
    # the handshake request in flight ("initialize", "featureSets/update", "tools/list"), or
    # None: what a failure report names as the step the server died in
    step: str | None = None
    # why the host closed the link, when it did (a silent server, a failed write, a refusal)
    close_reason: str | None = None
    grant: frozenset[str] = frozenset()
    feature_sets: Mapping[str, mcpl.FeatureSet] = attrs.field(factory=dict)
    enabled_sets: frozenset[str] = frozenset()
    # capabilities the operator lets this server use outside the sets that list them
    outside_sets: frozenset[str] = frozenset()
    policy: dict[str, Any] = attrs.field(factory=dict)  # what the handshake decided, for reports
    # manifest changes (SPEC §17): the manifest in force, the MCP capabilities it came with,
    # fetches in the rate window, and whether a fetch is running or another one is wanted (one
    # announced during the handshake is wanted once it is over)
    manifest: Mapping[str, Any] = attrs.field(factory=dict)
    mcp_caps: Mapping[str, Any] = attrs.field(factory=dict)
    fetches: deque[float] = attrs.field(factory=lambda: deque(maxlen=MANIFEST_FETCHES))
    fetching: bool = False
    refetch: bool = False
    tools: tuple[Mapping[str, Any], ...] = ()
    # a tools/list refresh runs (one at a time); ``tools_stale``: asked again meanwhile
    tools_listing: bool = False
    tools_stale: bool = False
    channels: set[str] = attrs.field(factory=set)
    # the feature sets' refused uses already reported as declaration mismatches (capped)
    noted_uses: NotedUses = attrs.field(factory=NotedUses)
    # the channels whose lack of a publish target the operator was told of: a subset of
    # ``channels`` (so bounded by the channels a server may register)
    undeclared_told: set[str] = attrs.field(factory=set)
    # requests that arrived before the decision, each with the time it is refused at (-32002)
    # if the decision has not come by then; at most ``actors.link.io.EARLY_CAP`` (past it, a
    # request is refused at once)
    early: deque[tuple[rpc.Request, float]] = attrs.field(factory=lambda: deque())
    early_wake: trio.Event = attrs.field(factory=trio.Event)  # a request held, or the decision
    closed: trio.Event = attrs.field(factory=trio.Event)
    written: trio.Event = attrs.field(factory=trio.Event)  # the writer has stopped
    probing: bool = False
    nursery: trio.Nursery | None = None
    hooks_in_flight: int = 0  # our context/beforeInference calls awaiting this server
    # keyed calls that a CancelCall may stop: only hooks are keyed, one per agent's running
    # turn, so this holds at most one entry per agent; MAX_KEYED_CALLS still caps it (past it,
    # a call runs to its deadline instead of being cancellable)
    calls: dict[str, trio.CancelScope] = attrs.field(factory=dict)

    def expect(self, rid: rpc.Id) -> trio.MemoryReceiveChannel[outcome.Outcome[Any]]:
        """Where the answer to our request ``rid`` will arrive. A reader holding back
        (:meth:`actors.link.io.LinkIO.pass_on`) reads on from now: the answer may be behind
        what it holds back."""
        send, recv = trio.open_memory_channel[outcome.Outcome[Any]](1)
        self.waiters[rid] = send
        self.requests.nudge()
        return recv

    def write_now(self, lines: list[str]) -> bool:
        """Write ``lines`` in the caller's step, in the writer's place, when the writer has
        nothing in hand (nothing queued, and it waits for more) and the transport takes them
        whole at once; False, with nothing written, when they are to be queued instead."""
        # a writer waiting for lines means none is queued: they would have been handed to it
        if not self.outbox_send.statistics().tasks_waiting_receive:
            return False
        if not self.transport.send_now(lines):
            return False
        self.traffic.add(trio.current_time(), sent=len(lines))
        return True

    def decide(self) -> None:
        """The host's policy is in force from now: what the server asks from now on is judged
        under it at once, and what it asked before is released to the dispatcher (in arrival
        order, ahead of anything later). The caller has set the grant (or ``mcp_only``) and
        queued the ``featureSets/update`` announcing it in this same step, so the server reads
        the policy before any answer given under it."""
        self.decided = True
        self.early_wake.set()

    def close(self, reason: str) -> None:
        """The host ends the link (the first reason given is the one reported)."""
        if self.close_reason is None:
            self.close_reason = reason
        self.closed.set()


class LinkOwner(Protocol):
    """What the parts of a connection use of their actor."""

    sid: str
    cfg: ServerConfig
    ctx: HostContext
    work: Work

    def trace(self, kind: str, channel_id: str | None = None, **data: Any) -> None: ...

    def diagnostic(self, text: str) -> None: ...

    def refused(
        self,
        method: str,
        error: RpcError | None,
        reason: str,
        *,
        channel_id: str | None = None,
        **ids: Any,
    ) -> None: ...

    def publish_status(self) -> None: ...

    def link_ready(self) -> None: ...

    async def request(
        self, link: Link, method: str, params: Any, timeout: float | None = None
    ) -> Any: ...

    async def notify(self, link: Link, method: str, params: Any) -> None: ...

    async def send_lines(self, link: Link, lines: list[str]) -> None: ...


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def refusal_reason(error: RpcError) -> str:
    """The reason of a refusal in one line: the error's message, and the capability or feature
    set its data names when the message does not."""
    text = error.message or str(error.code)
    data = error.data if isinstance(error.data, Mapping) else {}
    for key in ("capability", "featureSet"):
        value = data.get(key)
        if isinstance(value, str) and value not in text:
            text += f" ({key} {value})"
    return text


def as_rpc_error(exc: Exception, method: str) -> RpcError:
    if isinstance(exc, RpcError):
        return exc
    log.error("internal error handling %s: %s", method, describe(exc))
    return RpcError(code=INTERNAL_ERROR, message=f"internal error handling {method}")


def describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def admit(link: Link, method: str, feature_set: Any = None) -> None:
    """The one admission point for the server's MCPL calls: raises the refusal."""
    if link.mcp_only and method not in grants.REMOVED_METHODS:
        raise RpcError(code=METHOD_NOT_FOUND, message=f"{method}: this connection runs MCP-only")
    grants.admit(
        method,
        link.grant,
        feature_set,
        declared=link.feature_sets,
        enabled=link.enabled_sets,
        outside_sets=link.outside_sets,
    )
