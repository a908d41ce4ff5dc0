"""How a connection runs the server's handlers: each in a task of its own, in order where MCPL
needs it, and never waiting on the host for something only the handler itself could release.

The rules (the toolkit guide states them for authors):

- Every host request and notice is handled in a task of its own while the connection reads on,
  so a handler may await any toolkit call: the host's answer to it comes in through the reader,
  whatever the handler is doing.
- Publishes into one channel (``channels/publish``, request or notice) are handled in the order
  they arrived: each one's handler starts once the one before has its answer. Lifecycle notices
  are handled one at a time, in order.
- A publish is answered by the time its handler first calls the host. A host may hold what
  could be the echo of a post until the post is answered (mcplive does), so a handler that
  waited for the echo's answer before answering would wait for ever. The answer then is the
  one the handler would get by returning nothing: delivered, under
  :attr:`~actors.serverkit.Publish.message_id`; what it returns or raises after that call is
  too late to change it, and a different decision is logged.
- At most ``max_handlers`` host requests are handled at once; a publish answered early frees its
  place for the rest of its handler.

Each task keeps its :class:`Serving` in a context variable, so the link's sending calls find
the answer they must write first. A task the handler starts in a nursery of its own inherits
it (its calls count as the handler's); one started with ``server.spawn`` runs beside the
connection and does not (the handler's return still decides the answer).
"""

from __future__ import annotations

import contextvars
from collections import deque
from collections.abc import Hashable, Mapping
from typing import Any, Final

import attrs
import trio

from protocol.jsonrpc import Id

__all__ = ["CURRENT", "UNSET", "Lanes", "Serving", "Turn", "lane_of"]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: No early answer is armed.
UNSET: Final = _Unset()


def lane_of(method: str, params: Mapping[str, Any]) -> Hashable | None:
    """The lane a host message is handled in, one after the other: one per channel for
    publishes, one for lifecycle notices; None for a message handled beside every other."""
    if method == "channels/publish":
        cid = params.get("channelId")
        return ("channels/publish", cid) if isinstance(cid, str) else None
    if method == "inference/lifecycle":
        return ("inference/lifecycle",)
    return None


@attrs.define(eq=False)
class Turn:
    """One handler's place in its lane: :attr:`go` is set when it may start."""

    key: Hashable
    go: trio.Event = attrs.field(factory=trio.Event)


class Lanes:
    """Handlers taking turns, first come first served, per lane.

    A turn is taken in the reader, as the message is read (so the order is the order of the
    wire), and given back once its message is settled (answered, or its handler done). Bounded
    by what may wait: the link takes a turn only for a request the session admitted (at most
    its ``max_inbound`` unanswered; it refuses more) or a notice within the link's
    ``MAX_NOTICES`` (it drops more)."""

    def __init__(self) -> None:
        self._lanes: dict[Hashable, deque[Turn]] = {}

    def take(self, key: Hashable) -> Turn:
        """A turn at the end of ``key``'s lane (its ``go`` already set when the lane is empty)."""
        turn = Turn(key)
        lane = self._lanes.setdefault(key, deque())
        lane.append(turn)
        if len(lane) == 1:
            turn.go.set()
        return turn

    def give_back(self, turn: Turn) -> None:
        """``turn`` is over (done, or given up before it came): the next one in its lane goes."""
        lane = self._lanes.get(turn.key)
        if lane is None or turn not in lane:
            return
        first = lane[0] is turn
        lane.remove(turn)
        if not lane:
            del self._lanes[turn.key]
        elif first:
            lane[0].go.set()


@attrs.define(eq=False)
class Serving:
    """One host request (``id``) or notice (``id`` None) being handled: its turn, its handler
    place, and the answer armed to be written should the handler call the host first."""

    owner: object  # the link serving it
    method: str
    id: Id | None
    turn: Turn | None = None
    holds_place: bool = False
    early: Any = UNSET
    answered: bool = False


#: The message the current task handles (a task a handler starts inherits it).
CURRENT: contextvars.ContextVar[Serving | None] = contextvars.ContextVar(
    "mcpl_serving", default=None
)
