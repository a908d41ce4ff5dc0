"""The text of a stored message that search matches against ("what was said").

A channel item or push is stored with a host-rendered source header as its first text block, and
``metadata["source_header"]`` holds that exact text. Readers of what was said skip it, so a
channel's label or id matches only where a sender wrote it, and ``^`` anchors at the body's start.
The store never splits one item, so only the first block can be the header.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any


def _text_of(block: object) -> str | None:
    if isinstance(block, Mapping) and block.get("type") == "text":
        text = block.get("text")
        if isinstance(text, str):
            return text
    return None


def body_text(message: Mapping[str, Any]) -> str:
    """The message's text blocks joined with ``"\\n"``, without its stored source header.

    The first block is left out when ``metadata["source_header"]`` exists and equals that block's
    text; any other block is kept even if its text equals the header.
    """
    blocks: list[Any] = list(message.get("blocks") or ())
    metadata = message.get("metadata")
    header = metadata.get("source_header") if isinstance(metadata, Mapping) else None
    start = 0
    if header is not None and len(blocks) > 0 and _text_of(blocks[0]) == header:
        start = 1
    texts = (_text_of(b) for b in blocks[start:])
    return "\n".join(t for t in texts if t is not None)


def text_matcher(text: str, *, regex: bool = False) -> Callable[[str], bool]:
    """A predicate over body text.

    Substring mode is case-insensitive (Unicode case folding). Regex mode is a Python :mod:`re`
    search, so ``^`` anchors at the body's start; a bad pattern raises :class:`re.error`.
    """
    if regex:
        pattern = re.compile(text)
        return lambda body: pattern.search(body) is not None
    needle = text.casefold()
    return lambda body: needle in body.casefold()
