"""Loops an agent's own speech can make through a server, and the rules that stop them.

A server that posts an agent's words back as a new message, or that answers every post, can
wake the agent with what its own turns caused, for ever. Three rules, per agent:

* **Own posts** (:class:`OwnAuthors`): an item whose author is the agent's own (the
  ``conversationId`` the host sends with its posts, ``agent:<name>``, or the account the server
  echoed one of its posts under) never wakes it. A channel learns the accounts from its echoes.
* **Repeats** (:class:`RecentPosts`): an item whose text repeats what the agent posted in that
  channel in the last ``window_s`` seconds never wakes it. Texts are compared by
  :func:`repeat_keys`: case-folded, whitespace collapsed, the first :data:`KEY_CHARS`
  characters, with or without a short ``Name:`` prefix a server may put before an echo.
* **The loop breaker** (:class:`LoopBreaker`), per agent and channel. A post of the agent's
  *arms* the channel; the first item to wake the agent there after it *answers* the post (it is
  what the agent's turn triggered), and its author is the chain's *partner*. The breaker keeps
  the channel's *chain*: the times its posts were answered by the partner in the last
  ``window_s`` seconds. An answer by another author starts the chain again with that answer.
  An item that answers nothing (the agent has not posted since the last item that woke it)
  ends the chain when it is by another author than the partner: someone spoke of their own
  accord, so the agent is in a conversation, not a loop; the partner going on (a second
  message) changes nothing. Only answers at a machine's pace count: an answer that arrives
  later after the post than a person could have typed it (:func:`typed_by_a_person`:
  :data:`PERSON_MIN_S` plus a character per :data:`PERSON_CPS`-th of a second) is a person's,
  and it ends the chain too, so a person talking with the agent, however quickly, never trips
  it. When the chain holds more than ``limit`` answers, the breaker
  *trips*: that item and every later one by the partner are deferred (stored, not waking)
  until another author speaks (that item wakes the agent), the channel has been quiet for
  ``quiet_s`` (no deferred item), or ``cool_down_s`` have passed since the trip; the item that
  ends the deferral is then taken as a new start.

  Authors are compared as the caller names them (its *voice*): the caller may name several
  authors one voice (the host names all its agents one, so that agents answering each other in
  turn are one partner). Not recognised: a loop whose every answer comes from a new voice, in
  which other voices speak unanswered between the answers, or whose partner answers slower than
  a person types (a slow model's bot); the other two rules, and the budgets, still hold.

Bounds: :class:`RecentPosts` keeps at most ``cap`` posts (the oldest forgotten first, and
anything older than its window); :class:`OwnAuthors` at most ``cap`` accounts (the least
recently seen forgotten first); :class:`LoopBreaker` at most ``max_channels`` channels (the
least recently active forgotten first: its chain starts again) with at most ``limit + 1``
answers each.

Pure: no I/O, no clock (``now`` is passed in, in seconds, never going back).
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Final

import attrs

__all__ = [
    "COOL_DOWN_S",
    "KEY_CHARS",
    "LIMIT",
    "MAX_CHANNELS",
    "MAX_OWN_AUTHORS",
    "MAX_POSTS",
    "PERSON_CPS",
    "PERSON_MIN_S",
    "QUIET_S",
    "REPEAT_WINDOW_S",
    "WINDOW_S",
    "LoopBreaker",
    "OwnAuthors",
    "RecentPosts",
    "Verdict",
    "normalise",
    "repeat_keys",
    "typed_by_a_person",
]

#: Posts an agent's repeat memory keeps (all channels together); the oldest forgotten first.
MAX_POSTS: Final = 64
#: How long a post is remembered for the repeat rule (seconds).
REPEAT_WINDOW_S: Final = 300.0
#: A text is compared by its first this many characters, once normalised.
KEY_CHARS: Final = 500
#: A speaker's prefix (``Ada: ``) a server may add is at most this many characters.
PREFIX_CHARS: Final = 40
#: Accounts a channel knows as an agent's own; the least recently seen forgotten first.
MAX_OWN_AUTHORS: Final = 16
#: The breaker trips when more than ``LIMIT`` posts were answered in ``WINDOW_S`` seconds.
LIMIT: Final = 5
WINDOW_S: Final = 60.0
#: A deferral ends after this long without a deferred item ...
QUIET_S: Final = 60.0
#: ... or this long after the trip, whatever arrives meanwhile.
COOL_DOWN_S: Final = 300.0
#: Channels the breaker follows per agent; the least recently active forgotten first.
MAX_CHANNELS: Final = 64
#: An answer arriving later than this many seconds after the post ...
PERSON_MIN_S: Final = 2.0
#: ... plus its length at this many characters a second could have been typed by a person.
PERSON_CPS: Final = 15.0


def typed_by_a_person(seconds: float, length: int) -> bool:
    """Whether an answer of ``length`` characters that arrived ``seconds`` after the post it
    answers came at a person's pace: later than :data:`PERSON_MIN_S` plus the time to type it
    at :data:`PERSON_CPS` characters a second (a fast typist types some 8)."""
    return seconds > PERSON_MIN_S + max(0, length) / PERSON_CPS


_SPACE = re.compile(r"\s+")
_PREFIX = re.compile(rf"[^:\n]{{1,{PREFIX_CHARS}}}:")


def normalise(text: str) -> str:
    """``text`` case-folded, its runs of whitespace made one space, without the ends."""
    return _SPACE.sub(" ", text.casefold()).strip()


def repeat_keys(text: str) -> tuple[str, ...]:
    """The keys a text is compared by: its normalised form (the first :data:`KEY_CHARS`
    characters) and, when it starts with a short ``Name:`` prefix, the same without it. An
    empty text has none (it repeats nothing)."""
    whole = normalise(text)
    keys = [whole[:KEY_CHARS]] if whole else []
    prefix = _PREFIX.match(whole)
    if prefix is not None:
        rest = whole[prefix.end() :].strip()[:KEY_CHARS]
        if rest and rest not in keys:
            keys.append(rest)
    return tuple(keys)


@attrs.frozen
class _Post:
    at: float
    channel: Hashable
    key: str


class RecentPosts:
    """What one agent posted lately, to recognise an item that repeats it (see the module
    docstring): at most ``cap`` posts, the oldest forgotten first, none older than
    ``window_s``."""

    def __init__(self, *, cap: int = MAX_POSTS, window_s: float = REPEAT_WINDOW_S) -> None:
        if cap < 1 or window_s <= 0:
            raise ValueError("cap must be at least 1 and window_s positive")
        self.cap = cap
        self.window_s = window_s
        self._posts: deque[_Post] = deque()

    def __len__(self) -> int:
        return len(self._posts)

    def note(self, channel: Hashable, text: str, now: float) -> None:
        """The agent posted ``text`` in ``channel`` at ``now``."""
        self._expire(now)
        keys = repeat_keys(text)
        if not keys:
            return
        self._posts.append(_Post(at=now, channel=channel, key=keys[0]))
        while len(self._posts) > self.cap:
            self._posts.popleft()

    def repeats(self, channel: Hashable, text: str, now: float) -> bool:
        """Whether ``text``, arriving in ``channel`` at ``now``, repeats a post of the agent's
        there within the window."""
        self._expire(now)
        keys = repeat_keys(text)
        return any(p.channel == channel and p.key in keys for p in self._posts)

    def _expire(self, now: float) -> None:
        while self._posts and now - self._posts[0].at > self.window_s:
            self._posts.popleft()


class OwnAuthors:
    """The accounts a server has shown to be agents' own in one channel (it echoed their posts
    under them), each with the agents it stands for: at most ``cap`` accounts, the least
    recently seen forgotten first."""

    def __init__(self, cap: int = MAX_OWN_AUTHORS) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        self._agents: OrderedDict[str, frozenset[str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._agents)

    def note(self, author_id: str, agent: str) -> None:
        """The echo of ``agent``'s post came from ``author_id``."""
        if not author_id:
            return
        self._agents[author_id] = self._agents.get(author_id, frozenset()) | {agent}
        self._agents.move_to_end(author_id)
        while len(self._agents) > self.cap:
            self._agents.popitem(last=False)

    def agents(self, author_id: str | None) -> frozenset[str]:
        """The agents ``author_id`` is known to post for (none for an unknown account)."""
        if not author_id:
            return frozenset()
        return self._agents.get(author_id, frozenset())


@attrs.frozen(kw_only=True)
class Verdict:
    """What the breaker says of one item: ``wake`` or not. ``tripped``: this item tripped it
    (``answers`` posts answered in the ``seconds`` before); ``released``: a deferral ended
    before this item (why, and ``held`` items were deferred in it)."""

    wake: bool
    tripped: bool = False
    answers: int = 0
    seconds: float = 0.0
    released: str | None = None
    held: int = 0


_WAKE: Final = Verdict(wake=True)
_DEFER: Final = Verdict(wake=False)
_NOBODY: Final = object()  # the partner of a chain that has none


@attrs.define
class _Chain:
    armed: bool = False  # the agent posted here since the last item that woke it
    posted_at: float | None = None  # when it last posted here (None: not known)
    partner: Hashable = _NOBODY  # the author of the chain's answers
    answers: deque[float] = attrs.field(factory=deque)  # when its posts were answered
    tripped_at: float | None = None  # deferring since
    last_held: float = 0.0  # the latest deferred item
    held: int = 0  # items deferred since the trip

    def end(self) -> None:
        self.partner = _NOBODY
        self.answers.clear()
        self.tripped_at = None
        self.held = 0


class LoopBreaker:
    """The loop breaker of one agent (see the module docstring)."""

    def __init__(
        self,
        *,
        limit: int = LIMIT,
        window_s: float = WINDOW_S,
        quiet_s: float = QUIET_S,
        cool_down_s: float = COOL_DOWN_S,
        max_channels: int = MAX_CHANNELS,
    ) -> None:
        if limit < 1 or max_channels < 1:
            raise ValueError("limit and max_channels must be at least 1")
        if window_s <= 0 or quiet_s <= 0 or cool_down_s <= 0:
            raise ValueError("window_s, quiet_s and cool_down_s must be positive")
        self.limit = limit
        self.window_s = window_s
        self.quiet_s = quiet_s
        self.cool_down_s = cool_down_s
        self.max_channels = max_channels
        self._chains: OrderedDict[Hashable, _Chain] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chains)

    def deferring(self, channel: Hashable) -> bool:
        """Whether the channel's items by its partner are deferred."""
        chain = self._chains.get(channel)
        return chain is not None and chain.tripped_at is not None

    def answers(self, channel: Hashable) -> int:
        """How many of the agent's posts the channel's chain counts as answered."""
        chain = self._chains.get(channel)
        return len(chain.answers) if chain is not None else 0

    def published(self, channel: Hashable, now: float | None = None) -> None:
        """The agent posted in ``channel`` (at ``now``, when known): the next item there
        answers it."""
        chain = self._chains.get(channel)
        if chain is None:
            chain = self._chains[channel] = _Chain()
            while len(self._chains) > self.max_channels:
                self._chains.popitem(last=False)
        else:
            self._chains.move_to_end(channel)
        chain.armed = True
        chain.posted_at = now

    def observe(self, channel: Hashable, voice: Hashable, now: float, length: int = 0) -> Verdict:
        """An item by ``voice``, of ``length`` characters, that would wake the agent in
        ``channel`` at ``now``."""
        chain = self._chains.get(channel)
        if chain is None:
            return _WAKE  # the agent has not posted there (or it was forgotten)
        self._chains.move_to_end(channel)
        released: str | None = None
        held = 0
        if chain.tripped_at is not None:
            released = self._release(chain, voice, now)
            if released is None:
                chain.armed = False  # it answered the post all the same
                chain.last_held = now
                chain.held += 1
                return _DEFER
            held = chain.held
            chain.end()
        answered, chain.armed = chain.armed, False
        if voice != chain.partner:
            chain.end()  # someone else: an answer starts the chain again, anything else ends it
            if answered:
                chain.partner = voice
        if answered and chain.posted_at is not None:
            if typed_by_a_person(now - chain.posted_at, length):
                chain.end()  # a person's answer: a conversation, not a loop
                return Verdict(wake=True, released=released, held=held)
        if not answered:
            return Verdict(wake=True, released=released, held=held)
        while chain.answers and now - chain.answers[0] > self.window_s:
            chain.answers.popleft()
        chain.answers.append(now)
        if len(chain.answers) <= self.limit:
            return Verdict(wake=True, released=released, held=held)
        seconds = now - chain.answers[0]
        count = len(chain.answers)
        chain.answers.popleft()  # at most ``limit + 1`` answers are ever kept
        chain.tripped_at = chain.last_held = now
        chain.held = 1
        return Verdict(wake=False, tripped=True, answers=count, seconds=seconds)

    def _release(self, chain: _Chain, voice: Hashable, now: float) -> str | None:
        """Why the deferral ends before this item, or None when the item is deferred too."""
        assert chain.tripped_at is not None
        if voice != chain.partner:
            return "another voice"
        if now - chain.last_held >= self.quiet_s:
            return "quiet"
        if now - chain.tripped_at >= self.cool_down_s:
            return "cool-down"
        return None
