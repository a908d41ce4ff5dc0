"""Who wrote an inbound item, as the host shows it to a model and to an operator.

A channel message names its author (``channels/incoming``: ``author: {id, name}``); a push may
name one in its ``origin`` (``origin.author``, the same object, or a bare name). The host keeps
it under ``metadata["author"]`` as ``{"id", "name"}`` and never in the stored source header: the
author is added when a message is rendered, as a line of its own right after the header::

    [source: discord / discord:g1:room · #room (Guild One)]
    [author: alice]
    the sender's text

``[author id: 42]`` when the server gave only an id; nothing when it gave neither. The line is
the host's: a name is shown by the rule for labels in host notices, an id by the rule for ids
(:func:`protocol.source.notice_label`, :func:`protocol.source.notice_value`), so a name that
holds a bracket, a quote, a line break or an invisible character is one JSON string literal on
that one line, and cannot start a header or a line of its own. It is never marked: marking is
for what senders wrote, and the sender's text keeps its own.

Pure, deterministic and linear: the same stored message renders to the same bytes every turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from .display import clip
from .source import notice_label, notice_value

__all__ = [
    "MAX_AUTHOR_CHARS",
    "Author",
    "author_from",
    "author_line",
    "origin_author",
    "shown_author",
    "stored_author",
]

#: A name or id longer than this is shown clipped (ending with "…").
MAX_AUTHOR_CHARS: Final = 256
LINE_PREFIX: Final = "[author: "
ID_LINE_PREFIX: Final = "[author id: "


@attrs.frozen(kw_only=True)
class Author:
    """An author as its server named it; either part may be empty, not both."""

    id: str = ""
    name: str = ""

    def as_metadata(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name}


def author_from(value: Any) -> Author | None:
    """An author from a server's value: ``{"id", "name"}`` (a part that is not a string counts
    as absent) or a bare name; ``None`` when it names no one."""
    if isinstance(value, str):
        return Author(name=value) if value else None
    if not isinstance(value, Mapping):
        return None
    found = {k: v for k in ("id", "name") if isinstance(v := value.get(k), str)}
    if not any(found.values()):
        return None
    return Author(**found)


def origin_author(origin: Mapping[str, Any] | None) -> Author | None:
    """The author a push names in its ``origin`` (``origin.author``), if any."""
    return author_from(origin.get("author")) if isinstance(origin, Mapping) else None


def stored_author(metadata: Any) -> Author | None:
    """The author of a stored message (``metadata["author"]``), if it has one."""
    return author_from(metadata.get("author")) if isinstance(metadata, Mapping) else None


def shown_author(author: Author) -> str:
    """The author as one host-written value: the name (quoted as a label is in notices), else
    the id (quoted as an id is)."""
    if author.name:
        return notice_label(clip(author.name, MAX_AUTHOR_CHARS))
    return notice_value(clip(author.id, MAX_AUTHOR_CHARS))


def author_line(author: Author) -> str:
    """The host's line naming the author: ``[author: <name>]``, or ``[author id: <id>]`` when
    the server gave no name."""
    prefix = LINE_PREFIX if author.name else ID_LINE_PREFIX
    return prefix + shown_author(author) + "]"
