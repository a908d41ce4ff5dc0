"""Where an agent's unaddressed prose goes, and what a publish result says happened (RFC-011).

:func:`decide_route` looks at the candidates that woke a turn and gives one conversation to
speak into, a :class:`Hold` when several conversations compete, an :class:`Unroutable` when
the one conversation cannot take prose, or ``None`` when nothing woke the turn. It never
guesses between conversations.

A channel declares where a publish lands in ``capabilities.publish.target``: ``"exact"`` (a
``threadId`` lands in that thread, ``null`` at the root), ``"root"`` (no threads; ``null`` is
honoured, a string refused), or nothing (no guarantee: no ``threadId`` is sent and no prose is
routed there). A server whose operator set ``publish_undeclared`` has its undeclared channels
take prose anyway, in RFC-011's legacy form (no ``threadId``, never into a thread), and what
lands there is never counted as delivered: :func:`speech_place` gives that effective place
(:data:`LEGACY`) and :func:`legacy_outcome` the outcome. :func:`place_problem` applies this;
:func:`publish_thread_param` gives the ``threadId`` a request carries;
:func:`classify_publish` reads the ``channels/publish`` result.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Final

import attrs

__all__ = [
    "ABSENT",
    "LEGACY",
    "PLACES",
    "Candidate",
    "Conversation",
    "Hold",
    "PublishOutcome",
    "Route",
    "Unroutable",
    "classify_error",
    "classify_publish",
    "decide_route",
    "declared_target",
    "legacy_outcome",
    "place_problem",
    "publish_thread_param",
    "speech_place",
    "suspends",
]

#: ``(server_id, channel_id, thread_id)``; ``thread_id`` is ``None`` for the channel root.
Conversation = tuple[str, str, str | None]

#: The declared publish targets this host understands; any other value counts as undeclared.
PLACES: Final = ("exact", "root")
#: The effective place of an undeclared channel whose server's operator set
#: ``publish_undeclared``: prose goes to the channel without a ``threadId``, outcome unconfirmed.
LEGACY: Final = "legacy"

UNTARGETABLE: Final = "untargetable"
THREAD: Final = "thread"
UNRESOLVED: Final = "unresolved"


@attrs.frozen(kw_only=True)
class Candidate:
    """One wake of a turn: a message (or marker) in a channel, with what the host knows of it.

    ``conversational`` is false for reactions and system markers, which never count.
    ``place`` is the channel's declared publish target; ``registered`` whether the channel is
    registered now.
    """

    server_id: str
    channel_id: str
    thread_id: str | None = None
    message_id: str | None = None
    addressed: bool = False
    conversational: bool = True
    place: str | None = None
    registered: bool = True

    @property
    def conversation(self) -> Conversation:
        return (self.server_id, self.channel_id, self.thread_id)


@attrs.frozen(kw_only=True)
class Route:
    """Where a turn's unaddressed prose goes. ``deliberate`` routes come from ``channel_open``
    and are never suspended by later arrivals."""

    server_id: str
    channel_id: str
    thread_id: str | None = None
    reply_to: str | None = None
    deliberate: bool = False

    @property
    def conversation(self) -> Conversation:
        return (self.server_id, self.channel_id, self.thread_id)


@attrs.frozen(kw_only=True)
class Hold:
    """Several conversations compete: prose is held. ``conversations`` in order of first
    appearance; ``multiple_unknown`` when some competing ones are not listed."""

    conversations: tuple[Conversation, ...]
    multiple_unknown: bool = False


@attrs.frozen(kw_only=True)
class Unroutable:
    """One conversation woke the turn but cannot take prose: ``reason`` is ``"untargetable"``
    (no declared target), ``"thread"`` (a thread in a channel without exact threads) or
    ``"unresolved"`` (the channel is not registered now)."""

    reason: str
    conversation: Conversation


def declared_target(capabilities: object) -> str | None:
    """The ``capabilities.publish.target`` a channel descriptor declares, when this host knows
    it (one of :data:`PLACES`); ``None`` otherwise."""
    publish = capabilities.get("publish") if isinstance(capabilities, Mapping) else None
    target = publish.get("target") if isinstance(publish, Mapping) else None
    return target if isinstance(target, str) and target in PLACES else None


def speech_place(declared: object, publish_undeclared: bool) -> str | None:
    """Where prose may go in a channel whose descriptor declares ``declared`` as its
    ``capabilities.publish.target``: the declared place when this host knows it, else
    :data:`LEGACY` when the operator allows publishing to undeclared channels, else ``None``."""
    if isinstance(declared, str) and declared in PLACES:
        return declared
    return LEGACY if publish_undeclared else None


def place_problem(place: str | None, thread_id: str | None) -> str | None:
    """Why prose may not be published to ``thread_id`` (``None`` = root) of a channel whose
    effective place is ``place``; ``None`` when it may. A :data:`LEGACY` channel takes prose
    only without a thread: the server chooses where it lands, never a thread the host names."""
    if place == LEGACY:
        return THREAD if thread_id is not None else None
    if place not in PLACES:
        return UNTARGETABLE
    if thread_id is not None and place != "exact":
        return THREAD
    return None


def decide_route(
    candidates: Sequence[Candidate],
    *,
    evicted: Collection[Conversation] = (),
    evicted_overflow: bool = False,
) -> Route | Hold | Unroutable | None:
    """The route for a turn's unaddressed prose, from the candidates that woke it.

    The pool is the addressed conversational candidates if any, else all conversational ones.
    ``evicted`` (conversations of wakes dropped from a bounded buffer) and ``evicted_overflow``
    (more were dropped than were tracked) count only against a non-addressed pool. One
    conversation gives a :class:`Route` replying to its newest candidate, or an
    :class:`Unroutable`; several give a :class:`Hold`; none gives ``None``. A lone conversation
    known only from ``evicted`` is held: there is no candidate to check its place against.
    """
    conversational = [c for c in candidates if c.conversational]
    addressed = [c for c in conversational if c.addressed]
    pool = addressed or conversational
    newest: dict[Conversation, Candidate] = {}
    for candidate in pool:
        # Re-inserting keeps the first-appearance order and the newest value.
        newest[candidate.conversation] = candidate
    order: list[Conversation] = list(newest)
    overflow = False
    if not addressed:
        for conversation in evicted:
            if conversation not in order:
                order.append(conversation)
        overflow = evicted_overflow
    if not order:
        return None
    if overflow or len(order) > 1:
        return Hold(conversations=tuple(order), multiple_unknown=overflow)
    only = order[0]
    chosen = newest.get(only)
    if chosen is None:
        return Hold(conversations=(only,))
    if not chosen.registered:
        return Unroutable(reason=UNRESOLVED, conversation=only)
    problem = place_problem(chosen.place, chosen.thread_id)
    if problem is not None:
        return Unroutable(reason=problem, conversation=only)
    return Route(
        server_id=chosen.server_id,
        channel_id=chosen.channel_id,
        thread_id=chosen.thread_id,
        reply_to=chosen.message_id,
    )


def suspends(
    route: Route, arrival: Candidate, *, engaged: Collection[tuple[str, str]] = ()
) -> bool:
    """Whether ``arrival`` mid-turn suspends an inferred ``route``: it is conversational, from
    another conversation, and addressed or in a ``(server, channel)`` already sent into this
    turn."""
    if route.deliberate or not arrival.conversational:
        return False
    if arrival.conversation == route.conversation:
        return False
    return arrival.addressed or (arrival.server_id, arrival.channel_id) in engaged


# Publish outcomes (RFC-011 §5).

DELIVERED: Final = "delivered"
UNCONFIRMED: Final = "unconfirmed"
FAILED: Final = "failed"
UNKNOWN: Final = "unknown"


@attrs.frozen(kw_only=True)
class PublishOutcome:
    """What a ``channels/publish`` did: ``status`` is ``"delivered"``, ``"unconfirmed"``,
    ``"failed"`` or ``"unknown"``."""

    status: str
    message_id: str | None = None
    thread_id: str | None = None
    reason: str | None = None


class _Absent:
    """The type of :data:`ABSENT`."""

    def __repr__(self) -> str:
        return "ABSENT"


#: A request that carried no ``threadId`` member.
ABSENT: Final = _Absent()


def publish_thread_param(place: str | None, thread_id: str | None) -> str | object | None:
    """The ``threadId`` a publish carries: :data:`ABSENT` when the channel declares no known
    target (also :data:`LEGACY`), else ``thread_id`` (``None`` is sent as JSON ``null``, the
    root)."""
    if place not in PLACES:
        return ABSENT
    return thread_id


def _message_id(result: Mapping[str, object]) -> str | None:
    value = result.get("messageId")
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _echoes(result: Mapping[str, object], sent_thread: object) -> bool:
    if "threadId" not in result:
        return False
    echoed = result["threadId"]
    if sent_thread is None:
        return echoed is None
    return isinstance(echoed, str) and echoed == sent_thread


def classify_publish(result: object, sent_thread: str | object | None) -> PublishOutcome:
    """The outcome of a ``channels/publish`` whose JSON result is ``result`` and whose request
    carried ``sent_thread`` as ``threadId`` (a string, ``None`` for JSON ``null``, or
    :data:`ABSENT`).

    A delivery whose request named a place counts only when the result echoes that
    ``threadId``; anything malformed or contradictory is unconfirmed, never failed.
    """
    if not isinstance(result, Mapping):
        return PublishOutcome(status=UNCONFIRMED, reason="malformed result")
    if result.get("outcome") == UNKNOWN:
        return PublishOutcome(status=UNKNOWN, reason="the server did not report an outcome")
    message_id = _message_id(result)
    delivered = result.get("delivered")
    if delivered is True:
        if sent_thread is ABSENT:
            echoed = result.get("threadId")
            return PublishOutcome(
                status=DELIVERED,
                message_id=message_id,
                thread_id=echoed if isinstance(echoed, str) else None,
            )
        if not _echoes(result, sent_thread):
            return PublishOutcome(
                status=UNCONFIRMED,
                message_id=message_id,
                reason="the server did not confirm the place",
            )
        assert sent_thread is None or isinstance(sent_thread, str)
        return PublishOutcome(status=DELIVERED, message_id=message_id, thread_id=sent_thread)
    if delivered is False:
        if message_id is not None:
            return PublishOutcome(
                status=UNCONFIRMED, message_id=message_id, reason="contradictory result"
            )
        reason = result.get("reason")
        return PublishOutcome(
            status=FAILED, reason=reason if isinstance(reason, str) else "refused"
        )
    return PublishOutcome(
        status=UNCONFIRMED, message_id=message_id, reason="malformed result: no delivered flag"
    )


UNDECLARED_REASON: Final = "the server does not declare where posts land in this channel"


def legacy_outcome(outcome: PublishOutcome) -> PublishOutcome:
    """The outcome of a post published in RFC-011's legacy form (no ``threadId``, to a channel
    that declares no place): prose under :data:`LEGACY` and an explicit post alike. A delivery
    is only unconfirmed, since the server never said where it lands; anything else stands."""
    if outcome.status != DELIVERED:
        return outcome
    return PublishOutcome(
        status=UNCONFIRMED, message_id=outcome.message_id, reason=UNDECLARED_REASON
    )


def classify_error(reason: str) -> PublishOutcome:
    """The outcome of a publish that ended in a JSON-RPC error, a timeout or a lost connection
    after it was sent: unconfirmed, since it may have landed."""
    return PublishOutcome(status=UNCONFIRMED, reason=reason)
