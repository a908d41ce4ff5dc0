"""The stored copies of an item that arrived on a channel: its header, its marked body and
digests (refs-and-headers F), and the invitation copy for an agent the item addressed in a
channel it has not opened."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from protocol.digests import body_digest, body_digests
from protocol.source import mark_blocks, mark_text, notice_label, notice_value
from store import MessageRecord

__all__ = ["invitation_record", "seal"]


def seal(
    meta: dict[str, Any], header: str, blocks: list[dict[str, Any]]
) -> tuple[tuple[Mapping[str, Any], ...], list[Mapping[str, Any]]]:
    """The stored blocks of an item (``header`` first, then the sender's blocks marked so that
    nothing in them reads as the host's own attribution) and the marked body; ``meta`` gains
    the references, the header and both digests."""
    refs = [b["ref_id"] for b in blocks if "ref_id" in b]
    if refs:
        meta["references"] = refs
    body = mark_blocks(blocks)
    stored = ({"type": "text", "text": header}, *body)
    meta["source_body_digest"], meta["stored_body_digest"] = body_digests(blocks, stored)
    meta["source_header"] = header
    return stored, body


def invitation_record(
    *,
    record_id: str,
    agent: str,
    stored: tuple[Mapping[str, Any], ...],
    meta: Mapping[str, Any],
    author: str,
    where: tuple[str, str | None, str],
    now: float,
) -> MessageRecord:
    """The copy of an item for an agent invited to a channel it has not opened: the item with a
    host notice after it (names shown by the notice rule, ids as JSON strings, the whole marked
    like what the sender wrote), stored as a host notice. ``where`` is ``(server id, channel
    id, label)``."""
    server_id, channel_id, label = where
    place = notice_label(label) if label else notice_value(channel_id or "")
    text = mark_text(
        f"[invitation] {notice_label(author or '?')} addressed you in {place} on "
        f"{notice_value(server_id)}, a channel you have not opened. To follow it, call "
        f"channel_open with channel_id {json.dumps(channel_id)} and server_id "
        f"{json.dumps(server_id)} (add backscroll to read what came before); or leave it "
        "closed and ignore this."
    )
    blocks = (*stored, {"type": "text", "text": text})
    invited = {
        **meta,
        "system": True,
        "kind": "channel-invitation",
        "stored_body_digest": body_digest(blocks),
    }
    return MessageRecord(
        id=record_id, agent=agent, role="user", blocks=blocks, metadata=invited, created_at=now
    )
