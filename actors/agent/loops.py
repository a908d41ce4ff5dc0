"""An agent's guard against the loops its own speech can make through a server.

The rules are :mod:`protocol.loops`'s; this applies them to the agent's channel wakes on the
host's clock, and tells the operator:

* before the gate, :meth:`LoopGuard.withholds`: an item whose author is the agent's own
  (``agent:<name>``, or an account its channel saw echo one of its posts: ``Wake.own_of``) or
  whose text repeats one of its recent posts in that channel does not wake it (a
  ``wake-withheld`` trace event, shown with ``-v``);
* after the gate let an item through, :meth:`LoopGuard.defers`: the loop breaker, which hears
  an item's author by its id (else its name), and every agent of the host as one author
  (:data:`HOST_AGENTS`), and an answer's pace from when the agent's post was sent (a person's
  answer never counts toward a loop). Its trip is one ``wakes-deferred`` line (``! Ada: wakes
  from lobby lobby:#general deferred: …``), its end one ``wakes-resumed`` line; each item
  deferred in between is a ``wake-withheld`` event.

What is withheld or deferred is stored all the same: the agent reads it with its next turn.
:meth:`LoopGuard.published` is told each post the agent's speech sends (before it is sent:
a server may echo a post before it answers it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

import trio

from actors.messages import Wake
from protocol.conversation import conversation_id
from protocol.loops import LoopBreaker, RecentPosts

__all__ = ["HOST_AGENTS", "LoopGuard"]


#: The breaker's one voice for every agent of this host: agents answering each other in turn
#: through a server are one partner.
HOST_AGENTS = ("agents", "of this host")


class LoopGuard:
    """The loop rules of one agent (``trace`` is the agent's: kind, place, data); ``agents``
    are the names of every agent of the host."""

    def __init__(self, agent: str, trace: Callable[..., Any], agents: Iterable[str] = ()) -> None:
        self.agent = agent
        self.own_id = conversation_id(agent)
        self.agent_ids = frozenset(conversation_id(a) for a in agents) | {self.own_id}
        self._trace = trace
        self.posts = RecentPosts()
        self.breaker = LoopBreaker()

    def published(self, place: Any, text: str) -> None:
        """The agent is posting ``text`` to ``place`` (a server id and a channel id)."""
        channel = (place.server_id, place.channel_id)
        now = trio.current_time()
        self.posts.note(channel, text, now)
        self.breaker.published(channel, now)

    def _why_withheld(self, wake: Wake) -> str | None:
        if wake.author_id == self.own_id or self.agent in wake.own_of:
            return "own"
        if wake.channel_id is None or not wake.text:
            return None
        channel = (wake.server_id, wake.channel_id)
        if self.posts.repeats(channel, wake.text, trio.current_time()):
            return "repeat"
        return None

    def withholds(self, wake: Wake) -> bool:
        """Whether a channel item is the agent's own post or repeats one (it does not wake
        the agent)."""
        why = self._why_withheld(wake)
        if why is None:
            return False
        self._trace("wake-withheld", _place(wake), reason=why, author=wake.author)
        return True

    def defers(self, wake: Wake) -> bool:
        """Whether the loop breaker defers a channel item the gate let through."""
        if wake.channel_id is None:
            return False
        channel = (wake.server_id, wake.channel_id)
        if wake.own_of or wake.author_id in self.agent_ids:
            voice: Hashable = HOST_AGENTS
        else:
            voice = wake.author_id or wake.author or ""
        verdict = self.breaker.observe(channel, voice, trio.current_time(), len(wake.text or ""))
        place = _place(wake)
        if verdict.released is not None:
            self._trace("wakes-resumed", place, reason=verdict.released, held=verdict.held)
        if verdict.tripped:
            self._trace(
                "wakes-deferred",
                place,
                answers=verdict.answers,
                seconds=round(verdict.seconds, 1),
                window_s=self.breaker.window_s,
                author=wake.author,
            )
        if not verdict.wake:
            self._trace("wake-withheld", place, reason="loop", author=wake.author)
        return not verdict.wake


def _place(wake: Wake) -> Wake | None:
    """The wake as the trace's place when it names a channel, else None."""
    return wake if wake.server_id and wake.channel_id else None
