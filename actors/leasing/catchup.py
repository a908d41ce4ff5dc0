"""What an agent missed while it moved between the hosts of a fleet.

A wake for an agent on another host goes by ``NOTIFY``, which reaches only the host running
the agent at that moment. While the agent moves (its last host died, and its lease has not yet
been taken), such wakes reach no one; the items are stored all the same. So when the lease
keeper starts an agent, it reads the newest :data:`LOOK_BACK` messages of its history and wakes
it with what came in after its last answer, stored at most :data:`WITHIN_S` before the start
(older items were the business of a holder that ran then). The wakes are rebuilt from what was
stored; the agent's gate decides as it does for any wake, so a line that does not concern the
agent still starts no turn.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from actors.messages import Wake
from protocol.display import one_line
from store.bodytext import without_header

__all__ = ["LOOK_BACK", "WAKE_TEXT_CHARS", "WITHIN_S", "missed_wakes"]

#: How many of the agent's newest messages are read.
LOOK_BACK = 20
#: How long before the start an item may have been stored and still wake the agent.
WITHIN_S = 60.0
#: The longest body text a rebuilt wake carries (what the gate reads).
WAKE_TEXT_CHARS = 400


def missed_wakes(rows: Iterable[Any], now: float) -> tuple[Wake, ...]:
    """The wakes of the channel items among ``rows`` (stored rows with ``message`` and
    ``created_at``, oldest first) that came after the last of the agent's own messages and
    within :data:`WITHIN_S` of ``now``."""
    since_answer: list[Any] = []
    for row in rows:
        if row.message.get("role") == "assistant":
            since_answer = []
        else:
            since_answer.append(row)
    return tuple(
        wake
        for row in since_answer
        if now - float(row.created_at) <= WITHIN_S
        if (wake := _wake_of(row.message)) is not None
    )


def _wake_of(message: dict[str, Any]) -> Wake | None:
    meta = message.get("metadata") or {}
    if message.get("role") != "user" or meta.get("system") or meta.get("invitation"):
        return None
    server_id, channel_id = meta.get("server_id"), meta.get("channel_id")
    if not isinstance(server_id, str) or not isinstance(channel_id, str):
        return None
    blocks = without_header(message.get("blocks") or [], meta)
    text = " ".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
    said = meta.get("author")
    author: dict[str, Any] = said if isinstance(said, dict) else {}
    tags = tuple(str(t) for t in meta.get("tags") or () if isinstance(t, str))
    return Wake(
        lane="push" if "event_id" in meta else "incoming",
        server_id=server_id,
        channel_id=channel_id,
        message_id=_text_or_none(meta.get("message_id")),
        thread_id=_text_or_none(meta.get("thread_id")),
        text=one_line(text, WAKE_TEXT_CHARS),
        tags=tags,
        author=_text_or_none(author.get("name")) or _text_or_none(author.get("id")),
        author_id=_text_or_none(author.get("id")),
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
