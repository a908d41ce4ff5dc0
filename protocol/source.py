"""Stored source headers, and marking of header-shaped text in what senders wrote.

Every channel item is stored with a first line the host renders itself::

    [source: <server> / <channel-id> · <label> · thread <id> · reply to <id>]
    [source: <server> · unscoped]

The label, thread and reply parts appear only when the item has them. Every value comes from a
connector, so a value that could read as part of the grammar, break the line, or hide characters
from a reader is written as a JSON string literal with those characters escaped
(:func:`header_value`, :func:`label_value`, :func:`quoted`). The same two functions show a
connector's values in host notices (:func:`notice_value`, :func:`notice_label`).

A sender's own text may contain something that looks like such a header. :func:`mark_openings`
puts a backslash before the bracket of every header-shaped opening (``[source:``,
``[source]`` or ``[summary:`` in any case, with any whitespace, control or invisible character
inside), so no text but the host's own lines can read as provenance or as a summary of
context. Marking runs once, when an item is stored; it is not idempotent.

Character classes are those of Unicode 17, written out below. Everything here is pure and runs
in time linear in its input.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

__all__ = [
    "HeaderFields",
    "channel_header",
    "header_value",
    "label_value",
    "mark_blocks",
    "mark_openings",
    "mark_text",
    "notice_label",
    "notice_value",
    "parse_header",
    "quoted",
    "unscoped_header",
]

PREFIX: Final = "[source: "
SEPARATOR: Final = " / "
PART: Final = " · "
UNSCOPED_SUFFIX: Final = " · unscoped]"
THREAD_WORD: Final = "thread "
REPLY_WORD: Final = "reply to "

# Whitespace as JavaScript's ``\s`` has it (Python's ``\s`` differs: it adds U+001C-U+001F and
# U+0085 and lacks U+FEFF).
_JS_SPACE: Final = r"\t\n\x0b\x0c\r\x20\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def _class(listing: str) -> str:
    """Regex class text (without brackets) for a listing such as ``U+00AD, U+0600–U+0605``."""
    parts: list[str] = []
    for item in listing.split(","):
        low, _, high = item.strip().partition("–")
        parts.append(f"\\U{int(low[2:], 16):08x}")
        if high:
            parts.append(f"-\\U{int(high[2:], 16):08x}")
    return "".join(parts)


# The classes are Unicode 17's, written out rather than taken from a library's Unicode properties:
# those follow newer Unicode versions (18 already moves Extended_Pictographic), and a header must
# render the same as on every other host of this rule. Written out, every pattern here is plain
# ``re``: no feature of the ``regex`` package is needed, and ``re`` scans these classes several
# times faster.

#: Invisible: general category Cf, or Default_Ignorable_Code_Point.
_INVISIBLE: Final = _class(
    "U+00AD, U+034F, U+0600–U+0605, U+061C, U+06DD, U+070F, U+0890–U+0891, U+08E2, U+115F–U+1160,"
    "U+17B4–U+17B5, U+180B–U+180F, U+200B–U+200F, U+202A–U+202E, U+2060–U+206F, U+3164,"
    "U+FE00–U+FE0F, U+FEFF, U+FFA0, U+FFF0–U+FFFB, U+110BD, U+110CD, U+13430–U+1343F,"
    "U+1BCA0–U+1BCA3, U+1D173–U+1D17A, U+E0000–U+E0FFF"
)
#: Space separators (Zs) other than U+0020.
_WIDE_SPACE: Final = _class("U+00A0, U+1680, U+2000–U+200A, U+202F, U+205F, U+3000")
_EMOJI_MODIFIER: Final = _class("U+1F3FB–U+1F3FF")
_EXTENDED_PICTOGRAPHIC: Final = _class(
    "U+00A9, U+00AE, U+203C, U+2049, U+2122, U+2139, U+2194–U+2199, U+21A9–U+21AA, U+231A–U+231B,"
    "U+2328, U+23CF, U+23E9–U+23F3, U+23F8–U+23FA, U+24C2, U+25AA–U+25AB, U+25B6, U+25C0,"
    "U+25FB–U+25FE, U+2600–U+2604, U+260E, U+2611, U+2614–U+2615, U+2618, U+261D, U+2620,"
    "U+2622–U+2623, U+2626, U+262A, U+262E–U+262F, U+2638–U+263A, U+2640, U+2642, U+2648–U+2653,"
    "U+265F–U+2660, U+2663, U+2665–U+2666, U+2668, U+267B, U+267E–U+267F, U+2692–U+2697, U+2699,"
    "U+269B–U+269C, U+26A0–U+26A1, U+26A7, U+26AA–U+26AB, U+26B0–U+26B1, U+26BD–U+26BE,"
    "U+26C4–U+26C5, U+26C8, U+26CE–U+26CF, U+26D1, U+26D3–U+26D4, U+26E9–U+26EA, U+26F0–U+26F5,"
    "U+26F7–U+26FA, U+26FD, U+2702, U+2705, U+2708–U+270D, U+270F, U+2712, U+2714, U+2716, U+271D,"
    "U+2721, U+2728, U+2733–U+2734, U+2744, U+2747, U+274C, U+274E, U+2753–U+2755, U+2757,"
    "U+2763–U+2764, U+2795–U+2797, U+27A1, U+27B0, U+27BF, U+2934–U+2935, U+2B05–U+2B07,"
    "U+2B1B–U+2B1C, U+2B50, U+2B55, U+3030, U+303D, U+3297, U+3299, U+1F004, U+1F02C–U+1F02F,"
    "U+1F094–U+1F09F, U+1F0AF–U+1F0B0, U+1F0C0, U+1F0CF–U+1F0D0, U+1F0F6–U+1F0FF, U+1F170–U+1F171,"
    "U+1F17E–U+1F17F, U+1F18E, U+1F191–U+1F19A, U+1F1AE–U+1F1E5, U+1F201–U+1F20F, U+1F21A,"
    "U+1F22F, U+1F232–U+1F23A, U+1F23C–U+1F23F, U+1F249–U+1F25F, U+1F266–U+1F321,"
    "U+1F324–U+1F393, U+1F396–U+1F397, U+1F399–U+1F39B, U+1F39E–U+1F3F0, U+1F3F3–U+1F3F5,"
    "U+1F3F7–U+1F3FA, U+1F400–U+1F4FD, U+1F4FF–U+1F53D, U+1F549–U+1F54E, U+1F550–U+1F567,"
    "U+1F56F–U+1F570, U+1F573–U+1F57A, U+1F587, U+1F58A–U+1F58D, U+1F590, U+1F595–U+1F596,"
    "U+1F5A4–U+1F5A5, U+1F5A8, U+1F5B1–U+1F5B2, U+1F5BC, U+1F5C2–U+1F5C4, U+1F5D1–U+1F5D3,"
    "U+1F5DC–U+1F5DE, U+1F5E1, U+1F5E3, U+1F5E8, U+1F5EF, U+1F5F3, U+1F5FA–U+1F64F,"
    "U+1F680–U+1F6C5, U+1F6CB–U+1F6D2, U+1F6D5–U+1F6E5, U+1F6E9, U+1F6EB–U+1F6F0,"
    "U+1F6F3–U+1F6FF, U+1F7DA–U+1F7FF, U+1F80C–U+1F80F, U+1F848–U+1F84F, U+1F85A–U+1F85F,"
    "U+1F888–U+1F88F, U+1F8AE–U+1F8AF, U+1F8BC–U+1F8BF, U+1F8C2–U+1F8CF, U+1F8D9–U+1F8FF,"
    "U+1F90C–U+1F93A, U+1F93C–U+1F945, U+1F947–U+1F9FF, U+1FA58–U+1FA5F, U+1FA6E–U+1FAFF,"
    "U+1FC00–U+1FFFD"
)
_PICTOGRAPH: Final = f"[{_EXTENDED_PICTOGRAPHIC}][{_EMOJI_MODIFIER}\\ufe0e\\ufe0f]?"

#: An emoji sequence: a pictograph with an optional modifier or presentation selector, joined by
#: ZWJ to further such pictographs. Greedy, left to right, non-overlapping.
_EMOJI: Final = re.compile(rf"{_PICTOGRAPH}(?:\u200d{_PICTOGRAPH})*")

#: Characters that make a value quoted wherever they stand: the grammar's own characters, the
#: quote and backslash, C0 controls, DEL, C1 controls, and the line and paragraph separators.
_STRUCTURAL: Final = re.compile(r"[\[\]\u00b7\"\\\x00-\x1f\x7f-\x9f\u2028\u2029]")

#: Characters a reader does not see; they make a value quoted when they stand outside an emoji.
_UNSEEN: Final = re.compile(f"[{_INVISIBLE}{_WIDE_SPACE}]")

#: One pass of :func:`quoted`: an emoji sequence (kept), or a character to escape.
_QUOTE_SCAN: Final = re.compile(
    rf"(?P<emoji>{_EMOJI.pattern})"
    rf"|[\"\\\x00-\x1f\x7f-\x9f\u2028\u2029{_INVISIBLE}{_WIDE_SPACE}\ud800-\udfff]"
)

_SHORT_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}

#: A label that begins with one of the header's own words, matched ASCII-case-insensitively only.
_HEADER_WORD: Final = re.compile(
    rf"[{_JS_SPACE}]*"
    r"(?:[Tt][Hh][Rr][Ee][Aa][Dd]"
    rf"|[Rr][Ee][Pp][Ll][Yy][{_JS_SPACE}]+[Tt][Oo]"
    r"|[Uu][Nn][Ss][Cc][Oo][Pp][Ee][Dd])"
    rf"(?:[{_JS_SPACE}]|\Z)"
)

# Marking. Filler: JS whitespace, any control (Cc), any invisible character.
_FILL: Final = rf"[{_JS_SPACE}\x00-\x1f\x7f-\x9f{_INVISIBLE}]*+"
_LETTERS: Final = _FILL.join(("", "[sS\u017f]", "[oO]", "[uU]", "[rR]", "[cC]", "[eE]", r"[:\]]"))
#: ``[`` then the letters of "source" (with Unicode simple case folding, so ``ſ`` counts as an
#: ``s``), filler anywhere between, then ``:`` or ``]``. ``[`` is neither filler nor letter, so
#: an attempt never runs past the next ``[`` and openings never overlap.
#: The letters of "summary" then ``:``, the same way: the opening of the line the host writes
#: before a summary of an agent's older context (:mod:`protocol.folds`).
_SUMMARY_LETTERS: Final = _FILL.join(
    ("", "[sS\u017f]", "[uU]", "[mM]", "[mM]", "[aA]", "[rR]", "[yY]", ":")
)
_OPENING: Final = re.compile(r"\[(?:" + _LETTERS + "|" + _SUMMARY_LETTERS + ")")
#: The bracket of an opening, the rest looked at but not taken: substituting ``\[`` for each
#: match marks a whole text in one pass of C code. Since an opening holds no ``[`` but its first,
#: consuming only the bracket finds exactly the openings :data:`_OPENING` finds.
_OPENING_BRACKET: Final = re.compile(r"\[(?=" + _LETTERS + "|" + _SUMMARY_LETTERS + ")")

_JSON: Final = json.JSONDecoder(strict=True)


def _utf16_escape(char: str) -> str:
    point = ord(char)
    if point < 0x10000:
        return f"\\u{point:04x}"
    point -= 0x10000
    return f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}"


def _escape(match: re.Match[str]) -> str:
    found: str = match.group()
    if match.group("emoji") is not None:
        return found
    short = _SHORT_ESCAPES.get(found)
    if short is not None:
        return short
    return _utf16_escape(found)


def quoted(text: str) -> str:
    """``text`` as a JSON string literal that reads as one line and hides nothing.

    What ``JSON.stringify`` writes, then every DEL, C1 control, line or paragraph separator,
    invisible character (Cf or default-ignorable), non-ASCII space and lone surrogate outside an
    emoji sequence escaped as ``\\uXXXX`` per UTF-16 unit. A JSON parser gives ``text`` back.
    """
    body: str = _QUOTE_SCAN.sub(_escape, text)
    return '"' + body + '"'


def _needs_quoting(text: str) -> bool:
    if _STRUCTURAL.search(text) is not None or SEPARATOR in text:
        return True
    return _UNSEEN.search(_EMOJI.sub("", text)) is not None


@functools.lru_cache(maxsize=4096)  # ids and labels repeat from item to item
def header_value(text: str) -> str:
    """A server id, channel id, thread id or reply id as the header shows it.

    As it is, unless it holds a grammar character, a control, a line separator, the sequence
    ``" / "``, or (outside emoji sequences) an invisible character or a non-ASCII space; then
    :func:`quoted`.
    """
    return quoted(text) if _needs_quoting(text) else text


@functools.lru_cache(maxsize=4096)
def label_value(text: str) -> str:
    """A channel label as the header shows it.

    Quoted when it begins (after optional whitespace) with a header word — ``thread``,
    ``reply to`` or ``unscoped``, ASCII case-insensitively, followed by whitespace or nothing —
    so it cannot read as a thread or reply part; otherwise as :func:`header_value` has it.
    """
    if _HEADER_WORD.match(text) is not None:
        return quoted(text)
    return header_value(text)


def notice_value(text: str) -> str:
    """An id, thread or surface named in a host notice: the header's rule for ids."""
    return header_value(text)


def notice_label(text: str) -> str:
    """A label named in a host notice: the header's rule for labels."""
    return label_value(text)


def channel_header(
    server: str,
    channel_id: str,
    label: str | None = None,
    thread: str | None = None,
    reply_to: str | None = None,
) -> str:
    """The stored header of a channel item; an empty or missing label, thread or reply is left
    out."""
    parts = [PREFIX, header_value(server), SEPARATOR, header_value(channel_id)]
    if label:
        parts += [PART, label_value(label)]
    if thread:
        parts += [PART, THREAD_WORD, header_value(thread)]
    if reply_to:
        parts += [PART, REPLY_WORD, header_value(reply_to)]
    parts.append("]")
    return "".join(parts)


def unscoped_header(server: str) -> str:
    """The stored header of a push that names no channel."""
    return PREFIX + header_value(server) + UNSCOPED_SUFFIX


@attrs.frozen(kw_only=True)
class HeaderFields:
    """What a header names. ``channel_id`` is ``None`` for the unscoped form."""

    server: str
    channel_id: str | None = None
    label: str | None = None
    thread: str | None = None
    reply_to: str | None = None

    @property
    def unscoped(self) -> bool:
        return self.channel_id is None

    def render(self) -> str:
        if self.channel_id is None:
            return unscoped_header(self.server)
        return channel_header(self.server, self.channel_id, self.label, self.thread, self.reply_to)


def _read_value(text: str, start: int, stops: tuple[str, ...]) -> tuple[str, int] | None:
    """The value at ``start`` and where it ends: a JSON string, or raw text up to a stop."""
    if text.startswith('"', start):
        try:
            value, end = _JSON.raw_decode(text, start)
        except ValueError:
            return None
        return (value, end) if isinstance(value, str) else None
    ends = [found for stop in stops if (found := text.find(stop, start)) >= 0]
    if not ends:
        return None
    end = min(ends)
    return text[start:end], end


def _read_parts(text: str, start: int, server: str, channel_id: str) -> HeaderFields | None:
    """The optional parts from ``start`` (just after the channel id) to the closing ``]``."""
    found: dict[str, str] = {}
    at = start
    while text.startswith(PART, at):
        at += len(PART)
        key = "label"
        if text.startswith(THREAD_WORD, at):
            key, at = "thread", at + len(THREAD_WORD)
        elif text.startswith(REPLY_WORD, at):
            key, at = "reply_to", at + len(REPLY_WORD)
        read = _read_value(text, at, (PART, "]"))
        if read is None or key in found:
            return None
        found[key], at = read
    if at != len(text) - 1 or not text.endswith("]"):
        return None
    return HeaderFields(
        server=server,
        channel_id=channel_id,
        label=found.get("label"),
        thread=found.get("thread"),
        reply_to=found.get("reply_to"),
    )


def _candidates(text: str) -> list[HeaderFields]:
    body = len(PREFIX)
    out: list[HeaderFields] = []
    if text.endswith(UNSCOPED_SUFFIX):
        read = _read_value(text, body, (UNSCOPED_SUFFIX,))
        if read is not None and read[1] == len(text) - len(UNSCOPED_SUFFIX):
            out.append(HeaderFields(server=read[0]))
    if text.startswith('"', body):
        read = _read_value(text, body, ())
        splits = [] if read is None else [read]
    else:
        # A raw server never holds " / ", so only the first occurrence, or the one two places
        # on (a server ending in " /"), can end it.
        first = text.find(SEPARATOR, body)
        splits = [(text[body:end], end) for end in (first, first + 2) if first >= 0]
    for server, end in splits:
        if not text.startswith(SEPARATOR, end):
            continue
        channel = _read_value(text, end + len(SEPARATOR), (PART, "]"))
        if channel is not None:
            fields = _read_parts(text, channel[1], server, channel[0])
            if fields is not None:
                out.append(fields)
    return out


def parse_header(text: str) -> HeaderFields | None:
    """The fields of a header exactly as :func:`channel_header` or :func:`unscoped_header`
    renders it; ``None`` for any other text.

    The grammar leaves one case open: a raw server ending in ``" /"`` or a raw channel id
    beginning with ``"/ "`` give the same text as moving that slash across the separator. Such
    a header is read with the shorter server.
    """
    if not text.startswith(PREFIX):
        return None
    for fields in _candidates(text):
        if fields.render() == text:
            return fields
    return None


def mark_openings(texts: Sequence[str | None]) -> list[str | None]:
    """Mark every header-shaped opening in an item's text blocks.

    ``texts`` holds each block's text in order, ``None`` for a block that is not text. The texts
    are read as one string (a non-text block contributes nothing), so an opening split across
    blocks is found; its backslash goes into the block that holds the ``[``. Returns a new list
    of the same length; blocks without an opening come back as they were. One pass of ``re``
    over the joined text and one walk over the blocks: linear in the total length.
    """
    present = [text for text in texts if text is not None]
    if len(present) == 1:  # one text: marked in a single substitution, no walk
        return [text if text is None else _mark_one(text) for text in texts]
    joined = "".join(present)
    if "[" not in joined:  # every opening starts with a bracket: the common case, at C speed
        return list(texts)
    starts = [match.start() for match in _OPENING.finditer(joined)]
    if not starts:
        return list(texts)
    out: list[str | None] = []
    next_start = 0
    offset = 0
    for text in texts:
        if text is None:
            out.append(None)
            continue
        end = offset + len(text)
        if next_start < len(starts) and starts[next_start] < end:
            pieces: list[str] = []
            cut = 0
            while next_start < len(starts) and starts[next_start] < end:
                at = starts[next_start] - offset
                pieces += [text[cut:at], "\\"]
                cut = at
                next_start += 1
            pieces.append(text[cut:])
            text = "".join(pieces)
        out.append(text)
        offset = end
    return out


def _mark_one(text: str) -> str:
    if "[" not in text:
        return text
    return _OPENING_BRACKET.sub(r"\\[", text)


def mark_blocks(blocks: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Content blocks with :func:`mark_openings` applied across their text blocks (a block
    whose ``text`` is not a string counts as a non-text block). A block with nothing to mark
    comes back as it was; a marked one is a new dict. The input is untouched."""
    texts = [
        text if b.get("type") == "text" and isinstance(text := b.get("text"), str) else None
        for b in blocks
    ]
    if all(text is None or "[" not in text for text in texts):  # nothing can open: as it was
        return list(blocks)
    marked = mark_openings(texts)
    return [
        b if new is None or new == old else {**b, "text": new}
        for b, old, new in zip(blocks, texts, marked, strict=True)
    ]


def mark_text(text: str) -> str:
    """:func:`mark_openings` for a single text."""
    return _mark_one(text)
