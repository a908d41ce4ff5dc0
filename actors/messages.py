"""Immutable messages exchanged between actors."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import attrs

from protocol.lanes import ChannelDescriptor, IncomingMessage, PushEvent
from protocol.routes import Candidate

#: Tags of items that are not conversation (they never count for the speech route).
NOT_CONVERSATIONAL = frozenset({"chat:reaction", "chat:system"})

# --- to a ConnectionActor ------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Call:
    """Send one request to the server; the answer is its result (or the ``RpcError``).

    With ``notify_fallback``, a -32601 answer makes the host send the notification form and
    answer ``{"outcome": "unknown"}``: the server took it, but said nothing of delivery.
    """

    method: str
    params: Mapping[str, Any]
    notify_fallback: bool = False
    timeout: float | None = None  # None: the server's request_timeout_s
    hook: bool = False  # a context hook or a render: the server may not infer meanwhile
    key: str | None = None  # names the call for a later ``CancelCall``


@attrs.frozen(kw_only=True)
class CancelCall:
    """The asker of the ``Call`` with this key gave up: stop waiting for the server's answer
    (the server is told with ``notifications/cancelled``)."""

    key: str


@attrs.frozen(kw_only=True)
class Notify:
    """Send a notification if the server is ready; best effort, never waits (SPEC §10.5)."""

    method: str
    params: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class Status:
    pass


@attrs.frozen(kw_only=True)
class ConnStatus:
    """A server's connection as the host sees it: ``connected``, ``ready``, ``mcp_only``, its
    ``grant``, ``tools``, registered ``channels`` and enabled ``feature_sets``, and for operators
    ``connects``, ``last_error`` (one line, never a credential) and ``stderr_tail``."""

    server_id: str
    connected: bool
    ready: bool
    mcp_only: bool
    grant: frozenset[str]
    tools: tuple[Mapping[str, Any], ...]
    channels: tuple[str, ...]
    feature_sets: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)  # enabled ones
    # The policy last in force (grant, enabled feature sets), kept while the server is away:
    # RFC-006 authority belongs to the binding, and a reconnect alone does not revoke it.
    policy_grant: frozenset[str] = frozenset()
    policy_feature_sets: frozenset[str] = frozenset()
    # For operators (``mcplive status``): links opened so far, why the last one ended or failed
    # (one line, never a credential), and the server's last stderr lines.
    connects: int = 0
    last_error: str | None = None
    stderr_tail: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class AgentStatus:
    """An agent's state for operators, replaced by the agent whenever it changes (read by
    ``mcplive status`` through the host's status file)."""

    name: str
    paused: str | None = None  # why its turns are paused (its model refused the credential)
    held: bool = False  # held by the operator (``Host.hold``)
    turn_running: bool = False
    queued: int = 0  # wakes waiting for the next turn
    turns: int = 0  # turns started since the host started
    wakes: int = 0  # wakes received since the host started (the gate's refusals included)
    model_errors: int = 0  # its model's calls that failed since the host started (retried too)
    last_turn_at: float | None = None  # wall-clock time the last turn ended
    last_outcome: str | None = None  # completed, aborted or failed
    usage: Mapping[str, int] = attrs.field(factory=dict)  # token usage summed over its turns
    #: today's tokens and cost, each with its daily limit and what is left (None: no limit)
    today: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class LastRequest:
    """The newest model request of an agent's turns as its provider sent it ("what did the
    model see?"), replaced by the agent at each model call of a turn (``ctx.last_requests``)."""

    agent: str
    at: float  # wall-clock time it was sent
    model: str
    turn: int  # the turn's index (counted from the host's start)
    round: int  # the tool round within the turn, from 0
    body: Mapping[str, Any] = attrs.field(eq=False, repr=False)  # what the provider sent
    #: every input token the provider counted for it (uncached, cache read and cache write);
    #: None until its reply came
    input_tokens: int | None = None
    context_budget: int = 0  # the agent's ``context_tokens``


# --- to a ChannelActor ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Register:
    descriptor: ChannelDescriptor


@attrs.frozen(kw_only=True)
class Unregister:
    pass


@attrs.frozen(kw_only=True)
class IngestBatch:
    """Items for one channel, in arrival order, all accepted at ``accepted_at``; the answer is
    a ``Prepared`` or an ``RpcError`` per item."""

    items: tuple[IncomingMessage | PushEvent, ...]
    accepted_at: str
    specs: tuple[Any, ...] = ()  # per item, its valid RFC-006 ``CoalesceSpec`` or None
    # False: the channel hands back each item's write (``Prepared.op``, no future) for the
    # caller to hand to the store with other channels' writes in one go (items without specs)
    write: bool = True


@attrs.frozen(kw_only=True)
class Prepared:
    """An item handed to the store. ``future`` resolves when it is durable; ``wakes`` are sent
    once it is (and only if it was new)."""

    future: Any
    blocks: tuple[Mapping[str, Any], ...]
    wakes: tuple[tuple[str, Wake], ...] = ()
    author: str = ""
    coalesce: Mapping[str, Any] | None = None  # the RFC-006 result, for a coalesced item
    op: Any = None  # the write not handed over yet (``IngestBatch.write`` False), else None


@attrs.frozen(kw_only=True)
class Publish:
    """Post into the channel. The answer is ``(PublishOutcome, raw result)``.

    The channel applies RFC-011: where its server declares the place of a post, the request
    names it (``threadId``: the thread, or null for the root); where it does not, no thread is
    sent, a thread is refused, and so is ``prose`` (speech is only published where its place is
    known), unless the server's ``publish_undeclared`` is set: then prose goes without a thread
    and its delivery is reported unconfirmed. Nothing refused is sent."""

    agent: str
    blocks: tuple[Mapping[str, Any], ...]
    thread_id: str | None = None
    key: str | None = None  # idempotency key
    prose: bool = False


@attrs.frozen(kw_only=True)
class Materialized:
    """Build the stored copies of a materialized RFC-006 deferred batch: ``content`` (a
    ``push/render`` result, converted here with lane ``"render"`` and its references bound to
    this channel's server; or the batch's fallback, converted when the notice was admitted)
    with the source header, marked, with digests. The answer is the records (one per agent of
    ``contexts``); a result that is not valid content is an ``RpcError``."""

    occurrence: str  # the batch id
    contexts: tuple[str, ...]
    content: tuple[Any, ...]
    converted: bool  # the fallback: already converted at admission
    key: str
    event_id: str
    feature_set: str
    tags: tuple[str, ...] = ()
    timestamp: str | None = None
    origin: Any = None


@attrs.frozen(kw_only=True)
class SetOpen:
    agent: str
    open: bool


@attrs.frozen(kw_only=True)
class Describe:
    pass


@attrs.frozen(kw_only=True)
class ChannelInfo:
    server_id: str
    channel_id: str | None
    label: str
    labels: tuple[str, ...]  # label history, oldest first (at most MAX_LABELS)
    type: str
    registered: bool
    open_for: Mapping[str, bool]
    descriptor: Mapping[str, Any]
    # where prose may go (RFC-011): "exact", "root", "legacy" (undeclared, and the server's
    # publish_undeclared is set) or None (undeclared: prose is held)
    place: str | None = None
    declared: str | None = None  # the descriptor's capabilities.publish.target, if any


# --- to an AgentActor ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Wake:
    """Something the agent should attend to was stored."""

    lane: str  # "incoming" | "push" | "local"
    server_id: str | None = None
    channel_id: str | None = None
    message_id: str | None = None
    thread_id: str | None = None
    count: int = 1  # wakes folded into this one
    addressed: bool = False
    text: str = ""  # the body, cut short: what the gate's filters read
    tags: tuple[str, ...] = ()
    author: str | None = None  # the author's name (else its id), as the gate reads it
    author_id: str | None = None  # the author's id, as the server gave it
    # the agents whose posts this server echoed under this author (``protocol.loops``)
    own_of: frozenset[str] = frozenset()
    # the agents whose messages this item replies to or threads under (their receipts)
    replies_to: frozenset[str] = frozenset()
    direct: bool = False  # it came in a direct message channel
    place: str | None = None  # where prose may go (as ``ChannelInfo.place``)
    registered: bool = True
    deferred: bool = False  # an RFC-006 deferred notice: its batch is rendered at assembly
    occurrence: str | None = None  # a coalesced item's occurrence (see ``Withdraw``)

    @functools.cached_property
    def candidate(self) -> Candidate | None:
        """The route candidate this wake stands for: channel items only (a gate batch or local
        input names no conversation). Made once, however many agents the wake reaches."""
        if self.lane not in ("incoming", "push") or not self.server_id or not self.channel_id:
            return None
        return Candidate(
            server_id=self.server_id,
            channel_id=self.channel_id,
            thread_id=self.thread_id,
            message_id=self.message_id,
            addressed=self.addressed,
            conversational=not NOT_CONVERSATIONAL.intersection(self.tags),
            place=self.place,
            registered=self.registered,
        )


@attrs.frozen(kw_only=True)
class Withdraw:
    """RFC-006: the coalesced occurrence was replaced or retracted before the agent read it, so
    its wake no longer counts (its replacement, if any, brings its own)."""

    occurrence: str


@attrs.frozen(kw_only=True)
class Wakes:
    """The wakes of one batch of stored items, in order, for one agent."""

    items: tuple[Wake, ...]


@attrs.frozen(kw_only=True)
class WakeTarget:
    server_id: str
    channel_id: str
    message_id: str | None
    thread_id: str | None


# --- to an AgentActor or a ConnectionActor ---------------------------------------------------


@attrs.frozen(kw_only=True)
class Reconfigure:
    """A config reload: the actor's new ``AgentConfig`` or ``ServerConfig`` (only the keys that
    may change while the host runs differ). An agent answers whether its gate policy changed; a
    connection answers the grant in force after re-applying its masks (None: not connected)."""

    cfg: Any


@attrs.frozen(kw_only=True)
class Reconnect:
    """An operator's request to a connection: end the link in force (if any) and open a new one
    now, without waiting out the backoff. The answer says what was ended (see
    ``actors.link.reconnect``)."""
