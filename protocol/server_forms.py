"""The params of what an MCPL server sends, built without I/O.

Each builder takes plain values (ids and timestamps are parameters: nothing here reads a clock
or draws a random number) and returns the params object of one server→host method, with every
optional member left out when it is not given -- the host reads an absent member and an empty
one differently (``threadId`` absent is the legacy form, RFC-011; ``coalesce`` absent means no
coalescing, RFC-006).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["content_of", "incoming_message", "inference_params", "push_params"]

Content = str | Sequence[Mapping[str, Any]]


def content_of(value: Content) -> list[dict[str, Any]]:
    """Content blocks from a string (one text block) or a list of blocks (copied)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    blocks = [dict(b) for b in value]
    if not all(isinstance(b.get("type"), str) for b in blocks):
        raise ValueError("every content block needs a string 'type'")
    return blocks


def push_params(
    content: Content,
    *,
    feature_set: str,
    event_id: str,
    timestamp: str,
    tags: Iterable[str] = (),
    origin: Mapping[str, Any] | None = None,
    coalesce: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``push/event`` params (SPEC §9): the feature set, the idempotency key, the time and the
    content; ``tags``, ``origin`` and ``coalesce`` only when given. Tags are a set: repeats
    are sent once, in first-seen order."""
    if not event_id:
        raise ValueError("a push needs a non-empty event id")
    params: dict[str, Any] = {
        "featureSet": feature_set,
        "eventId": event_id,
        "timestamp": timestamp,
        "payload": {"content": content_of(content)},
    }
    unique = list(dict.fromkeys(tags))
    if unique:
        params["tags"] = unique
    if origin is not None:
        params["origin"] = dict(origin)
    if coalesce is not None:
        params["coalesce"] = dict(coalesce)
    return params


def incoming_message(
    content: Content,
    *,
    channel_id: str,
    message_id: str,
    author: str | Mapping[str, Any],
    timestamp: str,
    thread_id: str | None = None,
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    event_id: str | None = None,
    coalesce: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One message of ``channels/incoming`` (SPEC §14.3). An author given as a string is
    ``{id, name}`` with both set to it. A coalesced message must carry an ``eventId``
    (RFC-006 §13)."""
    if coalesce is not None and not event_id:
        raise ValueError("a coalesced message needs an event id")
    if thread_id == "":
        raise ValueError("a thread id is a non-empty string")
    who = {"id": author, "name": author} if isinstance(author, str) else dict(author)
    message: dict[str, Any] = {
        "channelId": channel_id,
        "messageId": message_id,
        "author": who,
        "timestamp": timestamp,
        "content": content_of(content),
    }
    if thread_id is not None:
        message["threadId"] = thread_id
    unique = list(dict.fromkeys(tags))
    if unique:
        message["tags"] = unique
    if metadata is not None:
        message["metadata"] = dict(metadata)
    if event_id is not None:
        message["eventId"] = event_id
    if coalesce is not None:
        message["coalesce"] = dict(coalesce)
    return message


def inference_params(
    messages: str | Sequence[Mapping[str, Any]],
    *,
    feature_set: str,
    conversation_id: str | None = None,
    stream: bool = False,
    max_tokens: int | None = None,
    temperature: float | None = None,
) -> dict[str, Any]:
    """``inference/request`` params (SPEC §11); a string is one user message."""
    if isinstance(messages, str):
        msgs = [{"role": "user", "content": messages}]
    else:
        msgs = [dict(m) for m in messages]
    params: dict[str, Any] = {"featureSet": feature_set, "messages": msgs}
    if conversation_id is not None:
        params["conversationId"] = conversation_id
    if stream:
        params["stream"] = True
    prefs: dict[str, Any] = {}
    if max_tokens is not None:
        prefs["maxTokens"] = max_tokens
    if temperature is not None:
        prefs["temperature"] = temperature
    if prefs:
        params["preferences"] = prefs
    return params
