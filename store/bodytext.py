"""The text of a stored message that readers of what was said match against (F.4).

A channel item or push is stored with a host-rendered source header as its first text block, and
``metadata["source_header"]`` holds that exact text. Readers of what was said (history search,
substring and regex alike) read the body without it, through :func:`without_header`: ``^``
anchors at the body's start, and a channel's label or id matches only where a sender wrote it, not
every item from that channel. Showing a message (``mcplive history`` without ``--search``) keeps
the header: that is the message itself, not a reader of what was said.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: The metadata key holding the exact header text stored as the first block.
SOURCE_HEADER_KEY = "source_header"


def _text_of(block: object) -> str | None:
    if isinstance(block, Mapping) and block.get("type") == "text":
        text = block.get("text")
        if isinstance(text, str):
            return text
    return None


def without_header(
    blocks: Sequence[Any], metadata: Mapping[str, Any] | None, shard_index: int = 0
) -> list[Any]:
    """``blocks`` without the stored source header (F.4); a new list, the input is not changed.

    * no ``metadata["source_header"]``, or not a string → unchanged;
    * ``shard_index > 0`` (a later shard of a sharded item) → unchanged, even when its text begins
      with something equal to the header (a split can leave a later shard starting ``[source: …``);
    * the first block is a text block equal to the header → that block is dropped;
    * the first block is a text block beginning with the header (the first shard of a sharded
      item, whose text blocks the store joined with nothing between them) → that prefix is removed
      from it, and its other fields are kept;
    * otherwise (e.g. the first block was edited, or is not text) → unchanged. Empty → empty.

    Only the first block can hold the header: the host stores it first, and mcplive's store never
    splits an item (so its readers pass ``shard_index=0``).
    """
    out = list(blocks)
    header = metadata.get(SOURCE_HEADER_KEY) if isinstance(metadata, Mapping) else None
    if not isinstance(header, str) or shard_index > 0 or not out:
        return out
    first = _text_of(out[0])
    if first is None:
        return out
    if first == header:
        return out[1:]
    if first.startswith(header):
        out[0] = {**out[0], "text": first[len(header) :]}
    return out


def body_text(message: Mapping[str, Any], *, shard_index: int = 0) -> str:
    """The message's text blocks joined with ``"\\n"``, after :func:`without_header`.

    This is what search matches against. Non-text blocks (and text blocks without string text)
    contribute nothing.
    """
    metadata = message.get("metadata")
    blocks = without_header(
        list(message.get("blocks") or ()),
        metadata if isinstance(metadata, Mapping) else None,
        shard_index,
    )
    texts = (_text_of(b) for b in blocks)
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
