"""Folding an agent's older context into summaries: which span folds, and what the agent sees.

An agent's context is its system prompt, then the summaries of its older messages (oldest first),
then its newest raw messages, within a token budget. :class:`FoldingTail` keeps the last two parts
between turns. New messages are appended at its end; when the whole outgrows the budget, the
oldest whole *units* of raw messages are taken off until it is at most the target, and handed
back as one span to fold. A unit is a message and whatever belongs to it: an ``assistant`` message
with the ``tool`` results and ``system`` notices (its delivery receipts) that follow it, so a fold
never separates a tool call from its result, nor a turn from its receipts. The caller summarizes
the span and adds the summary (:meth:`FoldingTail.add_summary`), or, when summarizing failed,
lets the span go. Between two folds the context only grows at its end, so a provider's prompt
cache keeps serving its start; only a fold changes it.

Summaries take at most ``summary_share`` of the budget: past it, the oldest leave the view, and
the caller merges them into one summary of summaries shown first (:meth:`FoldingTail.add_front`,
:func:`merged_covers`), so an agent of many months keeps a bounded but whole account of its
past: one merged summary of everything old, then the newer summaries, then the raw tail. When a
merge fails they just leave the view (they stay stored, as do the raw messages, for ``recall``).

A summary is shown under a line only the host writes (:func:`summary_header`); a sender's text
that opens the same way is marked (:func:`protocol.source.mark_openings`). What a summary covers
is recorded with it (:func:`summarizes`).

Pure: time is given, never read.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from protocol.source import header_value

__all__ = [
    "SUMMARY_KIND",
    "SUMMARY_SHARE",
    "FoldingTail",
    "covered_ends",
    "is_summary",
    "merged_covers",
    "render_summary",
    "summarizes",
    "summary_header",
]

#: ``metadata.kind`` of a stored summary.
SUMMARY_KIND: Final = "summary"
#: The share of the budget the summaries in view may take.
SUMMARY_SHARE: Final = 0.3
#: The most channels a summary header names; the rest are counted.
HEADER_CHANNELS: Final = 4

Message = Mapping[str, Any]


#: What the smallest message costs: the least any message adds to a context.
MIN_MESSAGE_TOKENS = 8


def estimate_tokens(message: Mapping[str, Any]) -> int:
    """A rough token count of a stored message: a quarter of its text, the JSON of its tool
    blocks, 400 for any other block, and ``MIN_MESSAGE_TOKENS`` for the message itself. A
    rendered message carries its own count under ``tokens``."""
    cached = message.get("tokens")
    if isinstance(cached, int):
        return cached
    total = MIN_MESSAGE_TOKENS
    for b in message.get("blocks", ()):
        kind = b.get("type")
        if kind == "text":
            total += len(str(b.get("text", ""))) // 4 + 1
        elif kind in ("tool_use", "tool_result"):
            total += len(json.dumps(b, default=str)) // 4 + 1
        else:
            total += 400
    return total


def is_summary(message: Message) -> bool:
    """Whether a stored message is a summary of older context."""
    meta = message.get("metadata")
    return (
        message.get("role") == "system"
        and isinstance(meta, Mapping)
        and meta.get("kind") == SUMMARY_KIND
        and isinstance(meta.get("summarizes"), Mapping)
    )


def _joins(message: Message, unit: list[Message]) -> bool:
    """Whether ``message`` belongs to the unit before it (a tool result or a notice after an
    assistant message)."""
    return message.get("role") in ("tool", "system") and unit[0].get("role") == "assistant"


class FoldingTail:
    """The summaries and the newest raw units of one agent's context, kept between reads.

    ``size`` gives a message's token count (computed once per message). With no summary, the
    raw tail trims exactly as a plain step-trimmed tail: units are dropped only when the total
    exceeds ``budget``, down to ``target`` (at least the newest unit stays)."""

    def __init__(
        self,
        budget: int,
        target: int,
        size: Callable[[Message], int],
        *,
        summary_share: float = SUMMARY_SHARE,
    ) -> None:
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        self.budget = budget
        self.target = min(target, budget)
        self.summary_cap = int(budget * summary_share)
        self._size = size
        self._units: deque[list[Message]] = deque()
        self._sizes: deque[int] = deque()
        self._summaries: deque[tuple[Message, int]] = deque()
        self.raw_total = 0
        self.summary_total = 0

    @property
    def total(self) -> int:
        return self.raw_total + self.summary_total

    def extend(self, messages: Iterable[Message]) -> list[Message]:
        """Append messages; the span taken off the start of the raw tail (oldest first, whole
        units; empty when the context still fits)."""
        for m in messages:
            size = self._size(m)
            if self._units and _joins(m, self._units[-1]):
                self._units[-1].append(m)
                self._sizes[-1] += size
            else:
                self._units.append([m])
                self._sizes.append(size)
            self.raw_total += size
        if self.total <= self.budget:
            return []
        span: list[Message] = []
        while self.total > self.target and len(self._units) > 1:
            span.extend(self._units.popleft())
            self.raw_total -= self._sizes.popleft()
        return span

    def add_summary(self, summary: Message, tokens: int) -> list[Message]:
        """Show a new summary after the others; the oldest summaries that no longer fit (in
        ``summary_share`` of the budget, and in the budget beside the raw tail) leave the view,
        and are returned. The newest always stays."""
        self._summaries.append((summary, tokens))
        self.summary_total += tokens
        gone: list[Message] = []
        while (self.summary_total > self.summary_cap or self.total > self.budget) and len(
            self._summaries
        ) > 1:
            old, size = self._summaries.popleft()
            self.summary_total -= size
            gone.append(old)
        return gone

    def add_front(self, summary: Message, tokens: int) -> None:
        """Show a merged summary first, before the others: it stands for the summaries that
        last left the view (``add_summary``'s answer). It is never itself sent away here (a
        later ``add_summary`` may send it away, to be merged again)."""
        self._summaries.appendleft((summary, tokens))
        self.summary_total += tokens

    def summaries(self) -> list[Message]:
        return [s for s, _ in self._summaries]

    def raw(self) -> list[Message]:
        return [m for unit in self._units for m in unit]

    def messages(self) -> list[Message]:
        """The context: summaries, oldest first, then the raw tail."""
        return [*self.summaries(), *self.raw()]


def _channel_of(message: Message) -> str | None:
    meta = message.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    server, channel = meta.get("server_id"), meta.get("channel_id")
    if not isinstance(server, str):
        return None
    return f"{server}/{channel}" if isinstance(channel, str) else server


def summarizes(
    span: Sequence[Message], times: Sequence[float], *, refused: bool = False
) -> dict[str, Any]:
    """What a summary of ``span`` covers (its ``metadata.summarizes``): the message ids, the
    channels (``server/channel``, or the server for pushes and unscoped items) in order of first
    appearance, the count, and the times of its first and last messages (``times``, one per
    message, in seconds since the epoch)."""
    channels: dict[str, None] = {}
    for m in span:
        where = _channel_of(m)
        if where is not None:
            channels.setdefault(where, None)
    return {
        "ids": [str(m.get("id")) for m in span],
        "channels": list(channels),
        "count": len(span),
        "first_at": min(times) if times else None,
        "last_at": max(times) if times else None,
    }


def merged_covers(
    covers: Sequence[Mapping[str, Any]], summary_ids: Sequence[str]
) -> dict[str, Any]:
    """What a summary of summaries covers, from what each of them covered (``covers``, oldest
    first) and their ids: the summaries it merges (``summaries``), the first and last message
    ids (``first_id``, ``last_id``), the channels in order of first appearance, the total
    count, and the earliest and latest times. ``ids`` is empty: the messages are named by the
    summaries it merges, so the record stays small however much it covers."""
    channels: dict[str, None] = {}
    for c in covers:
        for where in c.get("channels") or ():
            channels.setdefault(str(where), None)
    firsts = [_time(c.get("first_at")) for c in covers if _is_time(c.get("first_at"))]
    lasts = [_time(c.get("last_at")) for c in covers if _is_time(c.get("last_at"))]
    ends = [(_end(c, "first_id", 0), _end(c, "last_id", -1)) for c in covers]
    known = [e for e in ends if e[0] is not None]
    return {
        "ids": [],
        "summaries": [str(i) for i in summary_ids],
        "first_id": known[0][0] if known else None,
        "last_id": known[-1][1] if known else None,
        "channels": list(channels),
        "count": sum(int(c.get("count", len(c.get("ids") or ())) or 0) for c in covers),
        "first_at": min(firsts) if firsts else None,
        "last_at": max(lasts) if lasts else None,
    }


def _is_time(at: Any) -> bool:
    return isinstance(at, int | float) and not isinstance(at, bool)


def _time(at: Any) -> float:
    return float(at)


def _end(covers: Mapping[str, Any], key: str, index: int) -> str | None:
    """A summary's first or last message id: its own field when merged, else from ``ids``."""
    value = covers.get(key)
    if isinstance(value, str):
        return value
    ids = covers.get("ids") or ()
    return str(ids[index]) if ids else None


def covered_ends(covers: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The first and last message ids a summary (merged or not) covers."""
    return _end(covers, "first_id", 0), _end(covers, "last_id", -1)


def _when(at: Any) -> str:
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "?"
    try:
        return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return "?"


def summary_header(covers: Mapping[str, Any]) -> str:
    """The line the host writes before a summary, e.g.
    ``[summary: 12 messages, 2026-01-02 10:00 – 2026-01-02 11:30, channels lobby/general]``.
    Channel names are quoted when they hold anything a line could be forged with."""
    count = covers.get("count", len(covers.get("ids", ())))
    raw_channels = covers.get("channels") or ()
    channels = [header_value(str(c)) for c in raw_channels][:HEADER_CHANNELS]
    more = len(raw_channels) - len(channels)
    where = ", channels " + ", ".join(channels) if channels else ", no channel"
    if more > 0:
        where += f" and {more} more"
    noun = "message" if count == 1 else "messages"
    span = f"{_when(covers.get('first_at'))} – {_when(covers.get('last_at'))}"
    return f"[summary: {count} {noun}, {span}{where}]"


def render_summary(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored summary as the agent sees it: a user message opening with the host's header
    line, then the summary text (marked when it was stored)."""
    meta = message.get("metadata") or {}
    covers = meta.get("summarizes") or {}
    text = "\n".join(
        str(b.get("text", "")) for b in message.get("blocks", ()) if b.get("type") == "text"
    )
    return {
        "id": message.get("id"),
        "role": "user",
        "blocks": [
            {"type": "text", "text": summary_header(covers)},
            {"type": "text", "text": text},
        ],
        "metadata": meta,
        "prefix": 1,
    }
