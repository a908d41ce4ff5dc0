"""Which incoming items may be the server's echo of a post the host has not yet had answered.

A server may echo a post before it answers the publish. The echo is recognised by the
``messageId`` the publish result names (known only once it is answered) or by the tag
``chat:from-self``; until the answer, an item that could be that echo waits, and only such an
item. :class:`EchoWatch` says which: an item tagged ``chat:from-self``, one whose author is an
account the server has already shown to be the host's own (the author of an earlier echo), or
one whose text is the text of a post still waiting for its answer. Anything else (a push event,
another person's message) cannot be the echo and never waits.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from protocol.lanes import IncomingMessage, PushEvent
from protocol.tags import expand_tags

FROM_SELF = "chat:from-self"


def body_text(blocks: Iterable[Any]) -> str:
    """The text blocks of a body joined by newlines, without surrounding whitespace."""
    texts = [
        str(b.get("text", "")) for b in blocks if isinstance(b, Mapping) and b.get("type") == "text"
    ]
    return "\n".join(texts).strip()


class EchoWatch:
    """The posts of one channel waiting for their answer (by text), and the accounts known to
    be the host's own there: at most ``cap`` of them, the least recently seen forgotten first.
    The pending texts are one per publish in flight, each removed when its publish settles."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._pending: Counter[str] = Counter()
        self._own: OrderedDict[str, None] = OrderedDict()

    def begin(self, blocks: Iterable[Any]) -> str:
        """A publish of ``blocks`` is in flight; returns the token :meth:`end` takes."""
        text = body_text(blocks)
        self._pending[text] += 1
        return text

    def end(self, token: str) -> None:
        """The publish that :meth:`begin` returned ``token`` for has settled (or failed)."""
        self._pending[token] -= 1
        if self._pending[token] <= 0:
            del self._pending[token]

    @property
    def pending(self) -> int:
        """How many publishes are in flight."""
        return self._pending.total()

    def seen(self, author_id: str, *, own: bool) -> None:
        """``author_id`` posted an item; ``own``: it was an echo of ours, so ``author_id`` is the
        host's account on this server."""
        if not own or not author_id:
            return
        self._own[author_id] = None
        self._own.move_to_end(author_id)
        while len(self._own) > self.cap:
            self._own.popitem(last=False)

    def may_be_echo(self, item: IncomingMessage | PushEvent) -> bool:
        """Whether ``item`` could be the echo of one of the host's own posts."""
        if not isinstance(item, IncomingMessage):
            return False
        if item.tags and FROM_SELF in expand_tags(item.tags)[0]:
            return True
        if item.author.id in self._own:
            return True
        text = body_text(item.content)
        return bool(text) and text in self._pending

    def may_hold(self, items: Iterable[IncomingMessage | PushEvent]) -> bool:
        """Whether any of ``items`` could be the echo of one of the host's own posts."""
        return any(self.may_be_echo(item) for item in items)
