"""What the wakes an agent drained for a turn mean: the conversations they stand for, and where
the turn's reply goes (the speech route of ``protocol.routes``).

:func:`merge_drained` joins the wakes of a turn that could not run (its model refused the
credential) with those that arrived after it, so the next turn answers both.
"""

from __future__ import annotations

import attrs

from actors.messages import Wake, WakeTarget
from protocol.gate import MAX_CONVERSATIONS, Drained
from protocol.routes import Candidate, Hold, Route, Unroutable, decide_route


def candidate_of(wake: Wake) -> Candidate | None:
    """The route candidate a wake stands for (:attr:`Wake.candidate`)."""
    return wake.candidate


@attrs.frozen(kw_only=True)
class RouteChoice:
    """The route decision for a turn's wakes, and its target when it names one."""

    candidates: tuple[Candidate, ...]
    decision: Route | Hold | Unroutable | None
    target: WakeTarget | None


def route_of(drained: Drained[Wake]) -> RouteChoice:
    candidates = tuple(c for w in drained.items if (c := candidate_of(w)) is not None)
    # the buffer forgets in which order the dropped ones came: listed sorted, not at random
    evicted = sorted(
        ((s, c, t) for s, c, t in drained.evicted if c is not None),
        key=lambda k: (k[0], k[1], k[2] or ""),
    )
    decision = decide_route(list(candidates), evicted=evicted, evicted_overflow=drained.overflow)
    target = (
        WakeTarget(
            server_id=decision.server_id,
            channel_id=decision.channel_id,
            message_id=decision.reply_to,
            thread_id=decision.thread_id,
        )
        if isinstance(decision, Route)
        else None
    )
    return RouteChoice(candidates=candidates, decision=decision, target=target)


def merge_drained(older: Drained[Wake], newer: Drained[Wake]) -> Drained[Wake]:
    """One drain standing for two, ``older`` first: items in order, drops added up, evicted
    conversations joined (past ``MAX_CONVERSATIONS`` they collapse into ``overflow``, as in the
    buffer). Items are not capped again: each side is at most one buffer's worth."""
    evicted = older.evicted | newer.evicted
    overflow = older.overflow or newer.overflow or len(evicted) > MAX_CONVERSATIONS
    return Drained(
        items=older.items + newer.items,
        dropped=older.dropped + newer.dropped,
        evicted=frozenset() if overflow else evicted,
        overflow=overflow,
    )
