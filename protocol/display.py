"""Text and values made safe to show: one terminal line, or one line of JSON.

What a server sends ends up in the transcript, so it is shown as data, never as instructions to
the terminal or to a JSON reader:

* :func:`printable` keeps a line one line and inert: line breaks and other whitespace controls
  become spaces; the other C0/C1 controls (an ESC starting a colour or cursor sequence) and the
  bidirectional overrides (which can make a line read differently from what it holds) are shown
  as escapes (``\\x1b``, ``\\u202e``); a lone surrogate, which cannot be written as UTF-8,
  becomes U+FFFD.
* :func:`scrub_surrogates` is what every inbound message goes through right after JSON
  decoding: a lone surrogate (``"\\ud800"`` is valid JSON but no UTF-8 text can hold it)
  becomes U+FFFD once, so what is stored, digested, shown and sent on is the same string.
* :func:`json_safe` turns a trace event's data into plain JSON values (every string well formed
  and passed through a caller's filter, e.g. a redactor, then clipped; non-finite floats,
  bytes and unknown objects as strings; nesting capped), and :func:`json_line` writes one
  without a character a line reader could split on.

Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

#: Strings longer than this are clipped in JSON output (ending with "…").
STRING_CLIP = 4096
#: Containers nested deeper than this are shown as "…".
MAX_DEPTH = 24

_WHITESPACE_CONTROLS = frozenset("\t\n\v\f\r\x1c\x1d\x1e\x1f\x85\u2028\u2029")
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    if char in _WHITESPACE_CONTROLS:
        return " "
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:
        return "\ufffd"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` as one inert terminal line (see the module docstring)."""
    if text.isprintable():
        return text
    return _UNSAFE.sub(_escape, text)


_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """``text`` with every surrogate code point replaced by U+FFFD (it can then be encoded)."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD; a high surrogate followed by a low
    one (a pair written as two code points) becomes the one character the pair encodes."""
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def scrub_surrogates(value: Any) -> Any:
    """``value`` (as ``json.loads`` returns it) with :func:`without_lone_surrogates` applied to
    every string, dict keys too; everything else, and the nesting, unchanged. Two keys that
    come out equal keep the later value, as a JSON object with a repeated key does. Returns
    ``value`` itself when it holds no surrogate."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    return value


def clip(text: str, limit: int = STRING_CLIP) -> str:
    """``text`` cut to ``limit`` characters (the last one an ellipsis when cut)."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def one_line(text: str, limit: int) -> str:
    """``text`` with its whitespace runs (line breaks included) made single spaces, clipped to
    ``limit`` characters (the last one an ellipsis when clipped)."""
    return clip(" ".join(text.split()), limit)


def _same(text: str) -> str:
    return text


def json_safe(
    value: Any,
    text: Callable[[str], str] = _same,
    *,
    clip_at: int | None = STRING_CLIP,
    _depth: int = 0,
) -> Any:
    """``value`` as plain JSON values: dicts with string keys, lists, strings, finite numbers,
    booleans and None. Every string (keys too) is made well formed, passed through ``text``
    (e.g. a redactor) and then clipped to ``clip_at`` characters (None: never clipped); a
    non-finite float, bytes or any other object becomes a string."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        shown = text(well_formed(value))
        return shown if clip_at is None else clip(shown, clip_at)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if _depth >= MAX_DEPTH:
        return "…"
    if isinstance(value, Mapping):
        deeper = _depth + 1
        return {
            json_safe(k if isinstance(k, str) else str(k), text): json_safe(
                v, text, clip_at=clip_at, _depth=deeper
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v, text, clip_at=clip_at, _depth=_depth + 1) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    try:
        shown = str(value)
    except Exception:
        shown = f"<{type(value).__name__}>"
    return json_safe(shown, text, clip_at=clip_at)


_LINE_BREAKING = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_LINE_BREAKING_RE = re.compile("[\x85\u2028\u2029]")


def json_line(value: Any, *, ascii_only: bool = False) -> str:
    """One line of compact JSON for a value :func:`json_safe` returned. Besides the newlines
    JSON escapes anyway, NEL, U+2028 and U+2029 are escaped too (``str.splitlines`` and some
    line readers split on them); ``ascii_only`` escapes every non-ASCII character."""
    out = json.dumps(value, ensure_ascii=ascii_only, allow_nan=False, separators=(",", ":"))
    if not ascii_only and not out.isascii():
        out = _LINE_BREAKING_RE.sub(lambda m: _LINE_BREAKING[m.group(0)], out)
    return out
