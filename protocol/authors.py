"""Who wrote an inbound item, as the host shows it to a model and to an operator.

A channel message names its author (``channels/incoming``: ``author: {id, name}``); a push may
name one in its ``origin``, in any of the shapes the public servers use (:func:`origin_author`:
``author`` as that object or a bare name, ``authorName``/``authorId``, ``user``/``username``/
``userId``). The host keeps
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

import functools
from collections.abc import Mapping
from typing import Any, Final

import attrs
import regex

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
        return _author("", value) if value else None
    if not isinstance(value, Mapping):
        return None
    author_id, name = value.get("id"), value.get("name")
    author_id = author_id if isinstance(author_id, str) else ""
    name = name if isinstance(name, str) else ""
    return _author(author_id, name) if author_id or name else None


@functools.lru_cache(maxsize=1024)  # a channel's authors repeat from message to message
def _author(author_id: str, name: str) -> Author:
    return Author(id=author_id, name=name)


def origin_author(origin: Mapping[str, Any] | None) -> Author | None:
    """The author a push names in its ``origin``, if any, from the first shape that names one:

    * ``author``: ``{"id", "name"}`` or a bare name (the shape of a channel message);
    * ``authorName`` / ``authorId`` (discord-mcpl, the Claude Code bridge's toy server);
    * ``user``: ``{"id", "name"}`` (or ``"username"`` for the name), or a bare name;
      ``username`` / ``userId`` beside it.

    An id may be a string or an integer (shown as its digits); any other value counts as
    absent, so a shape that names no one gives way to the next."""
    if not isinstance(origin, Mapping):
        return None
    found = author_from(origin.get("author"))
    if found is None:
        found = _named(origin.get("authorId"), origin.get("authorName"))
    if found is None:
        user = origin.get("user")
        if isinstance(user, Mapping):
            name = user.get("name")
            found = _named(
                user.get("id"), name if isinstance(name, str) and name else user.get("username")
            )
        else:
            found = author_from(user)
    if found is None:
        found = _named(origin.get("userId"), origin.get("username"))
    return found


def _named(author_id: Any, name: Any) -> Author | None:
    if isinstance(author_id, int) and not isinstance(author_id, bool):
        author_id = str(author_id)
    author_id = author_id if isinstance(author_id, str) else ""
    name = name if isinstance(name, str) else ""
    return _author(author_id, name) if author_id or name else None


def stored_author(metadata: Any) -> Author | None:
    """The author of a stored message (``metadata["author"]``), if it has one."""
    return author_from(metadata.get("author")) if isinstance(metadata, Mapping) else None


def shown_author(author: Author) -> str:
    """The author as one host-written value: the name (quoted as a label is in notices), else
    the id (quoted as an id is)."""
    if author.name:
        return notice_label(clip(author.name, MAX_AUTHOR_CHARS))
    return notice_value(clip(author.id, MAX_AUTHOR_CHARS))


@functools.lru_cache(maxsize=1024)
def author_line(author: Author) -> str:
    """The host's line naming the author: ``[author: <name>]``, or ``[author id: <id>]`` when
    the server gave no name."""
    prefix = LINE_PREFIX if author.name else ID_LINE_PREFIX
    return prefix + shown_author(author) + "]"


#: A text whose first line would read as the host's author line: ``[`` then the letters of
#: "author" at its very start, with the filler the source-opening rule skips (whitespace,
#: controls, invisible characters) anywhere before or between them, ASCII letters in any case.
_AUTHOR_SHAPED: Final = regex.compile(
    r"[\s\x00-\x1f\x7f-\x9f\p{Cf}]*+\["
    + "".join(f"[\\s\\x00-\\x1f\\x7f-\\x9f\\p{{Cf}}]*+[{c}{c.upper()}]" for c in "author")
)


def guard_body_start(text: str) -> str:
    """A sender's body as shown after the host's lines: when it begins like an author line, a
    backslash goes before it (as a sender's ``[source`` opening is marked), so the only line
    that reads ``[author`` after a header is the host's; any other text is returned as it is."""
    return "\\" + text if _AUTHOR_SHAPED.match(text) else text
