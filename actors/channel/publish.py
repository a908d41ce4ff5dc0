"""Publishing into one channel: the ``channels/publish`` a ``Publish`` becomes, and the receipts
kept to recognise the server's echo of what the host posted.

:func:`send_publish` refuses a publish unsent when its place cannot take it (RFC-011:
``protocol.routes.place_problem``), sends it otherwise (a request; the notification form only
where no ``threadId`` is carried), and classifies what came back. Plain speech published in the
legacy form to an undeclared channel (``publish_undeclared``) is never reported delivered.
:class:`Receipts` remembers which agent posted which platform message, at most ``cap`` of them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from actors.context import HostContext
from actors.errors import ActorDied, AskTimeout, NotConnected
from actors.link.calls import notify
from actors.messages import Call, Publish
from protocol.conversation import conversation_id
from protocol.errors import METHOD_NOT_FOUND, RpcError
from protocol.routes import (
    ABSENT,
    LEGACY,
    PublishOutcome,
    classify_error,
    classify_publish,
    legacy_outcome,
    place_problem,
    publish_thread_param,
)

__all__ = ["REFUSALS", "Receipts", "now_iso", "send_publish"]

#: Why a publish was refused before it was sent (by ``place_problem``'s answer).
REFUSALS = {
    "untargetable": "the server does not declare where a post to this channel lands",
    "thread": "this channel takes no posts in a thread",
    "unresolved": "the channel is not registered",
}


class Receipts:
    """Platform message ids the host posted, with the agent that posted each; past ``cap`` the
    oldest is forgotten (its echo is then stored as any message is)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._by_message: OrderedDict[str, str] = OrderedDict()

    def note(self, message_id: str, agent: str) -> None:
        self._by_message[message_id] = agent
        while len(self._by_message) > self.cap:
            self._by_message.popitem(last=False)

    def get(self, message_id: str) -> str | None:
        return self._by_message.get(message_id)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._by_message


def now_iso() -> str:
    """The current UTC time as RFC 3339 seconds (the ``writtenAt`` of a publish)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


async def send_publish(
    ctx: HostContext, server_id: str, channel_id: str, place: str | None, msg: Publish
) -> tuple[PublishOutcome, Any]:
    """Send one publish to ``channel_id`` of ``server_id``, whose speech place is ``place``
    (``ChannelActor.speech_place``), or refuse it unsent; its classified outcome and raw
    result."""
    conn = ctx.connections.get(server_id)
    if conn is None:
        return PublishOutcome(status="failed", reason="no such channel"), None
    problem = place_problem(place, msg.thread_id)
    if problem is not None and (msg.prose or msg.thread_id is not None):
        if place == LEGACY:  # a thread is never a place of an undeclared channel
            problem = "untargetable"
        return PublishOutcome(status="failed", reason=REFUSALS[problem]), None
    thread = publish_thread_param(place, msg.thread_id)
    params: dict[str, Any] = {
        "conversationId": conversation_id(msg.agent),
        "channelId": channel_id,
        "content": [dict(b) for b in msg.blocks],
    }
    if thread is not ABSENT:
        params["threadId"] = thread
    if msg.key is not None:
        params["idempotencyKey"] = msg.key
    params["writtenAt"] = now_iso()
    try:
        result = await conn.ask(
            # RFC-011: a publish naming its place is a request, never a notification
            Call(method="channels/publish", params=params, notify_fallback=thread is ABSENT),
            timeout=ctx.config.request_timeout(server_id) + 5,
        )
    except NotConnected as exc:
        return PublishOutcome(status="failed", reason=str(exc)), None
    except RpcError as exc:
        if exc.code == METHOD_NOT_FOUND and place == "root" and thread is None:
            # a root-only channel whose server takes only the notification form: without a
            # thread id the post lands at the root all the same; delivery stays unknown
            params.pop("threadId", None)
            if not notify(ctx, server_id, "channels/publish", params):
                return PublishOutcome(status="failed", reason="not sent"), None
            return PublishOutcome(status="unknown"), {"outcome": "unknown"}
        return classify_error(str(exc) or type(exc).__name__), None
    except (AskTimeout, ActorDied) as exc:
        return classify_error(str(exc) or type(exc).__name__), None
    outcome = classify_publish(result, thread)
    if thread is ABSENT:
        # the channel declares no place: whether prose or a tool's post, the server decides
        # where it lands, so a delivery is unconfirmed (one rule for both)
        outcome = legacy_outcome(outcome)
    return outcome, result
