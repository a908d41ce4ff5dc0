"""Whether a channel item addresses an agent, as the host sees it without any server's help.

An item addresses an agent when it mentions the agent's name or one of its aliases as a whole
word (case-insensitive, ``@name`` included), replies to or threads under a message the agent
wrote, is tagged ``chat:addressed`` (or ``chat:mention``) by its server, or arrives in a direct
message channel. The community gate preset (``protocol.gate.COMMUNITY_GATE``) wakes an agent on
these and on pushes, and on nothing else.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable
from typing import Final

from protocol.tags import is_addressed

#: An agent has at most this many aliases; each is at most ``MAX_ALIAS`` characters.
MAX_ALIASES: Final = 16
MAX_ALIAS: Final = 64
#: Channel types (a descriptor's ``type``, case-insensitive) that are direct messages.
DIRECT_TYPES: Final = frozenset({"dm", "direct", "im", "private", "group-dm", "mpim"})


@functools.lru_cache(maxsize=256)
def _pattern(names: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regex for the names: each a whole word (no word character on either side)."""
    words = sorted({n.casefold() for n in names if n.strip()}, key=len, reverse=True)
    if not words:
        return None
    alternatives = "|".join(re.escape(w) for w in words)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)")


def mentions(text: str, names: Iterable[str]) -> bool:
    """Whether ``text`` names one of ``names`` as a whole word, case-insensitive.

    ``@Ada``, ``Ada,`` and ``ADA?`` mention Ada; ``Adam`` and ``nevada`` do not. The text is
    read once per name at worst (literal alternatives, no nested repetition): linear time.
    """
    pattern = _pattern(tuple(names))
    return pattern is not None and pattern.search(text.casefold()) is not None


def is_direct(channel_type: str | None) -> bool:
    """Whether a channel of this type is a direct message channel."""
    return channel_type is not None and channel_type.casefold() in DIRECT_TYPES


def addresses(
    names: Iterable[str],
    *,
    agent: str,
    text: str = "",
    tags: Iterable[str] = (),
    replies_to: Collection[str] = (),
    direct: bool = False,
    others: Iterable[str] = (),
) -> bool:
    """Whether an item addresses ``agent`` (whose names, its own and its aliases, are
    ``names``): a direct channel (or a server's ``chat:dm`` tag), a reply to (or a thread
    under) one of the agent's messages (``replies_to``: the agents whose messages it answers),
    a mention, or a server's ``chat:addressed``/``chat:mention`` tag.

    Agents of one host share the server's account, so a server's tag says the account was
    addressed, not which agent: a tagged item that names one of ``others`` (the names of the
    host's other agents) and not this agent is theirs, not this agent's."""
    tags = tuple(tags)
    if direct or "chat:dm" in tags or agent in replies_to or mentions(text, (agent, *names)):
        return True
    return is_addressed(tags) and not mentions(text, others)
