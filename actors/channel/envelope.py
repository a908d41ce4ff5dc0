"""What a channel freezes of an item when it arrives: its source envelope (the metadata every
stored copy carries), who gets a copy, and whom it wakes.

Pure functions of the item and of what the channel knows at that moment; the ``ChannelActor``
calls them once per item and keeps the state (receipts, subjects' places, open states).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping
from typing import Any

import attrs

from actors.messages import Wake
from protocol.authors import origin_author
from protocol.lanes import IncomingMessage, PushEvent
from store import MessageRecord

from .items import invitation_record

WAKE_TEXT_CHARS = 2000  # what a wake carries of the body, for the gate's filters

_ID_PREFIX = secrets.token_hex(4)  # per process, so ids never repeat across restarts
_id_counter = itertools.count(1)


def new_id() -> str:
    """A unique id for a stored message: a random per-process prefix and a counter."""
    return f"m_{_ID_PREFIX}{next(_id_counter):08x}"


@attrs.frozen
class BatchView:
    """What every item of one ingest batch reads of the channel: taken once per batch (nothing
    changes it while the batch is converted; the actor handles one message at a time)."""

    label: str | None
    place: str | None  # where prose may go in this channel (``ChannelActor.speech_place``)
    registered: bool
    open: frozenset[str]  # the hearers for whom the channel is open


@attrs.define
class Envelope:
    """One item's source as frozen on arrival. ``meta`` is the stored metadata (the header,
    marking and digests are added when it is sealed); ``author`` the name a wake shows;
    ``author_agent`` the agent whose post this is the echo of (known by its receipt)."""

    lane: str
    meta: dict[str, Any]
    dedupe: tuple[str, str, str]
    tags: tuple[str, ...]
    author: str = ""
    author_id: str = ""
    author_agent: str | None = None
    from_self: bool = False
    message_id: str | None = None
    thread_id: str | None = None
    source_message: str | None = None
    reply_to: str | None = None


def incoming_envelope(
    m: IncomingMessage,
    server_id: str,
    channel_id: str | None,
    tags: tuple[str, ...],
    author_agent: str | None,
    occurrence_id: str | None,
) -> Envelope:
    """The envelope of a ``channels/incoming`` message. ``author_agent``: the agent whose
    publish receipt names this message; ``occurrence_id``: the eventId of a coalesced edit
    (it keeps its messageId, so the occurrence is what makes it new)."""
    meta: dict[str, Any] = {
        "server_id": server_id,
        "channel_id": channel_id,
        "thread_id": m.thread_id,
        "message_id": m.message_id,
        "author": {"id": m.author.id, "name": m.author.name},
        "timestamp": m.timestamp,
        "tags": list(tags),
    }
    if m.metadata:
        meta["adapter_metadata"] = dict(m.metadata)
    key = f"{channel_id}\x00{m.message_id}"
    if occurrence_id is not None:
        key = f"{key}\x00{occurrence_id}"
    reply_to = m.reply_to
    if reply_to is None and m.metadata and isinstance(m.metadata.get("replyTo"), str):
        reply_to = m.metadata["replyTo"]
    return Envelope(
        lane="incoming",
        meta=meta,
        dedupe=("incoming", server_id, key),
        tags=tags,
        author=m.author.name or m.author.id,
        author_id=m.author.id,
        author_agent=author_agent,
        from_self=author_agent is not None or "chat:from-self" in tags,
        message_id=m.message_id,
        thread_id=m.thread_id,
        source_message=m.message_id,
        reply_to=reply_to,
    )


def push_envelope(
    e: PushEvent, server_id: str, channel_id: str | None, tags: tuple[str, ...]
) -> Envelope:
    """The envelope of a ``push/event``: its thread is ``origin.threadId`` in a channel."""
    meta: dict[str, Any] = {
        "server_id": server_id,
        "channel_id": channel_id,
        "event_id": e.event_id,
        "timestamp": e.timestamp,
        "feature_set": e.feature_set,
        "tags": list(tags),
    }
    if e.origin:
        meta["adapter_origin"] = dict(e.origin)
    pushed_by = origin_author(e.origin)
    if pushed_by is not None:  # shown to the model with the item, like a message's
        meta["author"] = pushed_by.as_metadata()
    thread = e.origin.get("threadId") if e.origin and channel_id is not None else None
    return Envelope(
        lane="push",
        meta=meta,
        dedupe=("event", server_id, e.event_id),
        tags=tags,
        author_id=pushed_by.id if pushed_by is not None else "",
        thread_id=thread if isinstance(thread, str) and thread else None,
    )


def render_meta(
    *,
    server_id: str,
    channel_id: str | None,
    event_id: str,
    timestamp: str,
    feature_set: str | None,
    tags: tuple[str, ...],
    origin: object,
) -> dict[str, Any]:
    """The metadata of a materialized deferred batch (RFC-006 §5), shaped as a push's."""
    meta: dict[str, Any] = {
        "server_id": server_id,
        "channel_id": channel_id,
        "event_id": event_id,
        "timestamp": timestamp,
        "feature_set": feature_set,
        "tags": list(tags),
    }
    if isinstance(origin, Mapping) and origin:
        meta["adapter_origin"] = dict(origin)
    return meta


def inbound_source(
    lane: str,
    server_id: str,
    channel_id: str | None,
    *,
    thread: str | None,
    message: str | None,
    label: str | None,
    reply_to: str | None,
    accepted_at: str,
) -> dict[str, Any]:
    """The ``inbound_source`` metadata: where the item came in, as the header names it."""
    return {
        "lane": lane,
        "server": server_id,
        "channel": channel_id,
        "thread": thread,
        "message": message,
        "label": label,
        "reply_to": reply_to,
        "accepted_at": accepted_at,
    }


def copies(
    hearers: tuple[str, ...],
    env: Envelope,
    stored: tuple[Mapping[str, Any], ...],
    invited: frozenset[str],
    where: tuple[str, str | None, str],
    now: float,
) -> tuple[MessageRecord, ...]:
    """The stored copies of one item: one per hearer except the agent whose post it echoes;
    an invited agent's copy carries its invitation, the others share one blocks and metadata
    object (stored as one item)."""
    records: list[MessageRecord] = []
    first: MessageRecord | None = None
    for agent in hearers:
        if agent == env.author_agent:
            continue
        if agent in invited:
            records.append(
                invitation_record(
                    record_id=new_id(),
                    agent=agent,
                    stored=stored,
                    meta=env.meta,
                    author=env.author,
                    where=where,
                    now=now,
                )
            )
        elif first is None:
            first = MessageRecord(
                id=new_id(),
                agent=agent,
                role="user",
                blocks=stored,
                metadata=env.meta,
                created_at=now,
            )
            records.append(first)
        else:
            records.append(first.for_agent(agent, new_id()))
    return tuple(records)


def wakes_of(
    hearers: tuple[str, ...],
    view: BatchView,
    env: Envelope,
    *,
    server_id: str,
    channel_id: str | None,
    echo: bool,
    addressed: bool,
    blocks: list[dict[str, Any]],
    own_of: frozenset[str] = frozenset(),
    replies_to: frozenset[str] = frozenset(),
    direct: bool = False,
) -> tuple[tuple[str, Wake], ...]:
    """Who one item wakes: nobody for what the host itself published (``echo``); in a closed
    channel only those it is ``addressed`` to. ``own_of``: the agents whose posts the server
    echoed under this item's author (each agent's wake decides what that means for it);
    ``replies_to``: the agents whose messages it answers; ``direct``: a direct message channel."""
    if echo:
        return ()
    woken = [agent for agent in hearers if addressed or agent in view.open]
    if not woken:
        return ()
    text = "\n".join([str(b.get("text", "")) for b in blocks if b.get("type") == "text"])
    wake = Wake(
        lane=env.lane,
        server_id=server_id,
        channel_id=channel_id,
        message_id=env.message_id,
        thread_id=env.thread_id,
        addressed=addressed,
        text=text[:WAKE_TEXT_CHARS],
        tags=env.tags,
        author=env.author or None,
        author_id=env.author_id or None,
        own_of=own_of,
        replies_to=replies_to,
        direct=direct,
        place=view.place,
        registered=view.registered,
        occurrence=env.meta.get("occurrence"),
    )
    return tuple((agent, wake) for agent in woken)
