"""Host notices about where an agent's speech went: receipts, holds, bounces, drafts, sleep.

Every value a connector chose (labels, channel, thread and server ids, reasons) is shown
through :func:`protocol.source.notice_label` or :func:`protocol.source.notice_value`, so it
reads as itself or as a one-line JSON string literal and never adds a line or a header to a
notice. Resend examples in :func:`drafts_list` write every value with :func:`json.dumps`, so
they can be copied into a tool call as they are.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Final

import attrs

from protocol.source import notice_label, notice_value, quoted

__all__ = [
    "Delivery",
    "DraftView",
    "Place",
    "bounce_notice",
    "delivered_receipt",
    "describe_place",
    "drafts_list",
    "hold_notice",
    "human_duration",
    "resend_how",
    "sleep_announcement",
    "target_error_notice",
    "undeclared_channel_line",
    "unroutable_notice",
]

MAX_BOUNCE_CANDIDATES: Final = 10

#: The prefix that addresses a segment of prose, by prose mode (the others have none).
_PREFIXES: Final = {"explicit": ">>target", "hybrid": ">>>target"}


def resend_how(mode: str, *, elsewhere: bool = False) -> str:
    """The ways to send a kept draft that work in prose ``mode``: the drafts tool always, the
    mode's own prefix only where it has one (``>>target`` in explicit mode, ``>>>target`` in
    hybrid), ``channel_open`` where prose is published at all. With ``elsewhere`` the draft was
    held by the place itself, so prose can only go to a channel that takes it."""
    ways = ['use the drafts tool with action "resend" and a destination']
    other = " that takes prose" if elsewhere else ""
    prefix = _PREFIXES.get(mode)
    if prefix is not None:
        ways.append(f"start a message with {prefix} naming a channel{other}")
    if mode != "disabled":
        ways.append(f"open a channel{other} with channel_open")
    if len(ways) == 1:
        return f"To send it, {ways[0]}."
    return "To send it, " + ", ".join(ways[:-1]) + ", or " + ways[-1] + "."


_DRAFTS_HOW: Final = "use the drafts tool to list, resend or dismiss them"

_UNROUTABLE_WHY: Final = {
    "untargetable": "the server does not declare where posts land in this channel",
    "thread": "the channel cannot take posts in a thread",
    "unresolved": "the channel is not registered now",
}
_TARGET_WHY: Final = {
    "unknown": "no channel matches it",
    "ambiguous": "several channels match it",
}


@attrs.frozen(kw_only=True)
class Place:
    """Where something went or was meant to go; ``thread_id`` ``None`` is the channel root."""

    server_id: str
    channel_id: str
    label: str = ""
    thread_id: str | None = None


def _segments(count: int) -> str:
    return f"{count} segment" if count == 1 else f"{count} segments"


def _label(label: str) -> str:
    shown = notice_label(label)
    if label.startswith("#") or shown != label:
        return shown
    return "#" + shown


def describe_place(p: Place) -> str:
    """A place as notices name it: ``#general (lobby / c1, thread t1)``, or without a label
    ``lobby / c1 (thread t1)``."""
    where = f"{notice_value(p.server_id)} / {notice_value(p.channel_id)}"
    thread = None if p.thread_id is None else f"thread {notice_value(p.thread_id)}"
    if p.label:
        inner = where if thread is None else f"{where}, {thread}"
        return f"{_label(p.label)} ({inner})"
    return where if thread is None else f"{where} ({thread})"


@attrs.frozen(kw_only=True)
class Delivery:
    """What became of ``count`` segments sent to ``place``: ``status`` is ``"delivered"``,
    ``"unconfirmed"``, ``"failed"`` or ``"unknown"``; ``kept`` when they were kept as drafts
    (nothing was published)."""

    place: Place
    status: str
    reason: str | None = None
    count: int = 1
    kept: bool = False


_STATUS_HEADINGS: Final = (
    ("unconfirmed", "Not confirmed"),
    ("failed", "Failed"),
    ("unknown", "Outcome unknown"),
)


def _grouped(deliveries: Sequence[Delivery], status: str) -> list[str]:
    """One entry per place and reason, in order of first appearance, with summed counts."""
    counts: dict[tuple[Place, str | None, bool], int] = {}
    for d in deliveries:
        if d.status == status:
            key = (d.place, d.reason, d.kept)
            counts[key] = counts.get(key, 0) + d.count
    entries = []
    for (place, reason, kept), count in counts.items():
        entry = f"{_segments(count)} to {describe_place(place)}"
        notes = [notice_value(reason)] if reason else []
        if kept:
            notes.append("kept as a draft" if count == 1 else "kept as drafts")
        if notes:
            entry += f" ({'; '.join(notes)})"
        entries.append(entry)
    return entries


def delivered_receipt(
    deliveries: Sequence[Delivery],
    *,
    drafts: int = 0,
    suppressed: int = 0,
    disabled: bool = False,
    operator: int = 0,
) -> str:
    """The ``[delivered]`` receipt of a turn: where speech landed, what did not land or is not
    known to have landed, how many segments were kept as drafts, and what was held back.
    ``operator`` counts the segments that answered the operator's local input (shown to them,
    not published).

    ``suppressed`` counts segments neither sent nor kept; with ``disabled`` they are the ones
    held because prose publishing is disabled for the agent. Any status other than the four
    known ones is reported as an unknown outcome.
    """
    known = {"delivered", *(status for status, _ in _STATUS_HEADINGS)}
    deliveries = [d if d.status in known else attrs.evolve(d, status="unknown") for d in deliveries]
    parts: list[str] = []
    landed = _grouped(deliveries, "delivered")
    if operator:
        landed.insert(0, f"{_segments(operator)} to the operator (local input)")
    if landed:
        parts.append("; ".join(landed))
    for status, heading in _STATUS_HEADINGS:
        entries = _grouped(deliveries, status)
        if entries:
            parts.append(f"{heading}: " + "; ".join(entries))
    if drafts:
        parts.append(f"Kept as drafts: {_segments(drafts)} ({_DRAFTS_HOW})")
    if disabled:
        held = f"Prose publishing is disabled for this agent: {_segments(suppressed)} held"
        if not landed:
            held += ", nothing published"
        parts.append(held)
    elif suppressed:
        parts.append(f"Withheld, not published: {_segments(suppressed)}")
    if not parts:
        return "[delivered] nothing"
    return "[delivered] " + ". ".join(parts) + "."


def _places(places: Sequence[Place]) -> str:
    return "; ".join(describe_place(p) for p in places)


def hold_notice(
    conversations: Sequence[Place], *, multiple_unknown: bool = False, mode: str = "locus"
) -> str:
    """The ``[held]`` notice of a turn woken by several conversations (``mode``: the agent's
    prose mode, whose ways to resend it names)."""
    listed = _places(conversations)
    if multiple_unknown:
        more = "more conversations than can be listed"
        listed = f"{listed}; and {more}" if listed else more
    return (
        "[held] This turn was woken by several conversations, so unaddressed prose was not "
        f"published; it is kept as drafts. Competing: {listed}. {resend_how(mode)}"
    )


def unroutable_notice(
    place: Place, reason: str, *, addressed: bool = False, mode: str = "locus"
) -> str:
    """The ``[held]`` notice of prose that could not go to ``place``: the one conversation of a
    turn, or, with ``addressed``, the place the prose named (``>>target``). It gives the true
    reason and only ways out that work there: for a channel without a declared target,
    ``channel_publish`` or the operator's ``publish_undeclared`` key for that server; for a
    thread, ``channel_publish`` without one; and the ways to resend that ``mode`` has
    (:func:`resend_how`), never a prefix to a place that holds prose the same way."""
    why = _UNROUTABLE_WHY.get(reason, notice_value(reason))
    where = describe_place(place)
    what = f"Prose addressed to {where}" if addressed else f"Unaddressed prose to {where}"
    text = f"[held] {what} was not published: {why}. It is kept as drafts."
    if reason == "untargetable":
        text += (
            " To post there anyway, call channel_publish with this channel (it publishes "
            "without naming a place, and the server decides where it lands), or ask the "
            "operator to set publish_undeclared = true for server "
            f"{notice_value(place.server_id)} in the host config, so replies go there."
        )
    elif reason == "thread":
        text += " To post in the channel itself, call channel_publish with it and no thread_id."
    return f"{text} {resend_how(mode, elsewhere=reason != 'unresolved')}"


def undeclared_channel_line(
    server_id: str, channel_id: str, label: str, publish_undeclared: bool
) -> str:
    """The operator's line about a channel that declares no ``capabilities.publish.target``:
    what happens to an agent's plain speech there, and the config key that changes it."""
    name = f"{_label(label)} ({notice_value(channel_id)})" if label else notice_value(channel_id)
    where = f"server {notice_value(server_id)}: channel {name} declares no publish target"
    key = f"publish_undeclared on [[servers]] {notice_value(server_id)}"
    if publish_undeclared:
        return (
            f"{where}: agents' plain speech there is published without a place and reported "
            f"unconfirmed, since {key} is true (remove it to hold that speech as drafts)"
        )
    return (
        f"{where}: agents' plain speech there is held as drafts (channel_publish still posts); "
        f"set {key} to true to publish it there, unconfirmed"
    )


def bounce_notice(draft_ids: Sequence[str], mode: str, candidates: Sequence[str]) -> str:
    """The ``[bounced]`` notice of prose without a target prefix, which the speech ``mode``
    requires (``>>`` in explicit mode, ``>>>`` in hybrid mode)."""
    prefix = ">>>" if mode == "hybrid" else ">>"
    ids = ", ".join(notice_value(i) for i in draft_ids) or "none"
    text = (
        f"[bounced] In {notice_value(mode)} mode, prose without a {prefix}target prefix is not "
        f"sent. Kept as drafts: {ids}. To send, start the message with a target, for example "
        f"{prefix}#label your text."
    )
    if candidates:
        shown = ", ".join(notice_label(c) for c in candidates[:MAX_BOUNCE_CANDIDATES])
        rest = len(candidates) - MAX_BOUNCE_CANDIDATES
        if rest > 0:
            shown += f" and {rest} more"
        text += f" Targets: {shown}."
    return text


def target_error_notice(token: str, reason: str, candidates: Sequence[Place]) -> str:
    """The ``[target]`` notice of a ``>>`` target that names no channel or several."""
    why = _TARGET_WHY.get(reason, notice_value(reason))
    text = f"[target] The target {notice_value(token)} was not used: {why}. Nothing was sent."
    if candidates:
        text += f" Candidates: {_places(candidates)}."
    return text


@attrs.frozen(kw_only=True)
class DraftView:
    """A kept draft as the drafts list shows it; ``reason`` says why it was kept and
    ``destination`` where it was meant to go, when known."""

    id: str
    text: str
    reason: str
    destination: Place | None = None


def resend_example(draft_id: str, place: Place) -> str:
    """A drafts tool call that resends ``draft_id`` to ``place``; every value is JSON."""
    parts = [
        'drafts action: "resend"',
        f"ids: {json.dumps([draft_id])}",
        f"destination: {json.dumps(place.channel_id)}",
        f"server_id: {json.dumps(place.server_id)}",
    ]
    if place.thread_id is not None:
        parts.append(f"thread_id: {json.dumps(place.thread_id)}")
    return ", ".join(parts)


def drafts_list(drafts: Sequence[DraftView], *, preview_chars: int = 200) -> str:
    """The ``[drafts]`` listing: one entry per draft with its id, reason, intended place, a
    one-line preview of its text, and a resend example when the place is known."""
    if not drafts:
        return "[drafts] none kept"
    lines = [f"[drafts] {len(drafts)} kept"]
    for d in drafts:
        preview = quoted(d.text[:preview_chars])
        if len(d.text) > preview_chars:
            more = len(d.text) - preview_chars
            preview += f" ({more} more character{'' if more == 1 else 's'})"
        entry = f"- {notice_value(d.id)} ({notice_value(d.reason)})"
        if d.destination is not None:
            entry += f" for {describe_place(d.destination)}"
        lines.append(f"{entry}: {preview}")
        if d.destination is not None:
            lines.append(f"  resend: {resend_example(d.id, d.destination)}")
    return "\n".join(lines)


def sleep_announcement(seconds: float, message: str | None = None) -> str:
    """What the agent posts when it goes quiet: ``message`` when it has text, else a default
    naming the duration."""
    if message is not None and message.strip():
        return message
    return (
        f"💤 Going quiet for {human_duration(seconds)}. "
        "I'll still see messages, but won't respond until I wake."
    )


_UNITS: Final = (("day", 86_400), ("hour", 3_600), ("minute", 60), ("second", 1))


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def human_duration(seconds: float) -> str:
    """``seconds`` in words, at most two adjacent units, the largest first: ``45 seconds``,
    ``1 hour 30 minutes``, ``2 days``.

    Rounded half up to whole seconds, then to the smaller unit shown. Negative and NaN count
    as zero; infinity is ``an unlimited time``.
    """
    if math.isnan(seconds) or seconds <= 0:
        return "0 seconds"
    if math.isinf(seconds):
        return "an unlimited time"
    total = math.floor(seconds + 0.5)
    if total == 0:
        return "0 seconds"
    index = next(i for i, (_, size) in enumerate(_UNITS) if total >= size)
    big_name, big = _UNITS[index]
    if index + 1 == len(_UNITS):
        return _count(total, big_name)
    small_name, small = _UNITS[index + 1]
    total = (total + small // 2) // small * small
    if index > 0 and total >= _UNITS[index - 1][1]:
        # Rounding carried into the next unit, of which it is an exact single.
        return _count(1, _UNITS[index - 1][0])
    words = _count(total // big, big_name)
    rest = total % big // small
    return f"{words} {_count(rest, small_name)}" if rest else words
