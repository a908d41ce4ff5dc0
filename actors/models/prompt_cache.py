"""Where a Messages API request marks its prompt-cache breakpoints.

The Anthropic Messages API reads a request as tools, then system, then messages. A block marked
``"cache_control": {"type": "ephemeral"}`` (a *breakpoint*; at most four per request) asks the API
to keep the request's prefix up to and including that block; a later request whose prefix up to
a breakpoint is the same, byte for byte, reads it from the cache (its usage counts it in
``cache_read_input_tokens``) instead of processing it again, and what a request stores is counted
in ``cache_creation_input_tokens``. At a breakpoint the API also looks for entries a little
(about twenty blocks) further back. A prefix shorter than the model's minimum (1,024 tokens or
more, by model) is not cached, silently; an entry lasts minutes after its last use.

:func:`mark_request` places at most four marks:

1. the end of the stable system text (its first block, when the turn added text after it), which
   covers the tool definitions before it; with no system text, the last tool;
2. the *read point*: the furthest message block whose prefix an earlier request of the same agent
   marked (so the cache should hold it), wherever the messages added since put it;
3. the *stable point*: the last message block this request shares with what the agent's next turn
   sends (the messages before this turn's injections, see ``ModelRequest.stable_messages``);
4. the last message block, for the next tool round of the same turn.

Marks that fall on one block are placed once. :class:`CacheMemory` remembers, per agent, a digest
of each message prefix the latest request marked; a digest covers the tools, the whole system and
the message blocks up to the mark, with each block's role and turn boundary, and no marks.
"""

from __future__ import annotations

import collections
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["EPHEMERAL", "MAX_MARKS", "CacheMemory", "Marked", "mark_request", "system_blocks"]

#: The ``cache_control`` value of a breakpoint.
EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}
#: The most breakpoints the API takes in one request.
MAX_MARKS = 4
#: Agents :class:`CacheMemory` remembers by default; past it the one unused longest is forgotten.
MEMORY_AGENTS = 256


@attrs.frozen(kw_only=True)
class Marked:
    """A request with its marks: what to send, and the digests of the marked message prefixes
    (for :meth:`CacheMemory.remember`)."""

    tools: list[dict[str, Any]]
    system: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    marks: frozenset[bytes]

    @property
    def count(self) -> int:
        """The breakpoints placed."""
        return sum(
            "cache_control" in block
            for block in (*self.tools, *self.system, *_blocks(self.messages))
        )


class CacheMemory:
    """The message-prefix digests each agent's latest request marked.

    Bounded: at most ``limit`` agents, each with the marks of one request (at most
    ``MAX_MARKS``); remembering a new agent past the limit forgets the one unused longest."""

    def __init__(self, limit: int = MEMORY_AGENTS) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._limit = limit
        self._marks: collections.OrderedDict[str, frozenset[bytes]] = collections.OrderedDict()

    def recall(self, agent: str) -> frozenset[bytes]:
        marks = self._marks.get(agent)
        if marks is None:
            return frozenset()
        self._marks.move_to_end(agent)
        return marks

    def remember(self, agent: str, marks: frozenset[bytes]) -> None:
        self._marks[agent] = marks
        self._marks.move_to_end(agent)
        while len(self._marks) > self._limit:
            self._marks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._marks)


def system_blocks(system: str, stable: int | None) -> list[dict[str, Any]]:
    """``system`` as text blocks: the first ``stable`` characters in one, the rest (this turn's
    additions) in a second; one block when nothing was added, none for no text. A part that is
    only whitespace is not a block of its own (the API refuses such blocks)."""
    if not system.strip():
        return []
    cut = len(system) if stable is None else max(0, min(stable, len(system)))
    head, rest = system[:cut], system[cut:]
    if not head.strip() or not rest.strip():
        return [_text(system)]
    return [_text(head), _text(rest)]


def mark_request(
    tools: Sequence[Mapping[str, Any]],
    system: Sequence[Mapping[str, Any]],
    messages: Sequence[Mapping[str, Any]],
    *,
    next_turn: Sequence[Mapping[str, Any]] | None = None,
    remembered: frozenset[bytes] = frozenset(),
) -> Marked:
    """The request with its breakpoints (see the module docstring). The inputs are not changed.

    Args:
        tools, system, messages: the request's ``tools``, ``system`` blocks (see
            :func:`system_blocks`; the first is the stable one) and Messages API ``messages``.
        next_turn: the converted messages the agent's next turn starts with (the ones before
            this turn's injections); None when that is all of ``messages``.
        remembered: what :meth:`CacheMemory.recall` returned for the agent.
    """
    out_tools = [dict(t) for t in tools]
    out_system = [dict(b) for b in system]
    out_messages = [{**turn, "content": [dict(b) for b in turn["content"]]} for turn in messages]
    head = _head_digest(out_tools, out_system)
    if out_system:
        out_system[0]["cache_control"] = dict(EPHEMERAL)
    elif out_tools:
        out_tools[-1]["cache_control"] = dict(EPHEMERAL)

    digests = _prefix_digests(head, out_messages)
    if not digests:
        return Marked(tools=out_tools, system=out_system, messages=out_messages, marks=frozenset())
    positions = {len(digests) - 1}
    read = max((i for i, d in enumerate(digests) if d in remembered), default=None)
    if read is not None:
        positions.add(read)
    if next_turn is not None:
        shared = _shared_blocks(digests, _prefix_digests(head, next_turn))
        if shared:
            positions.add(shared - 1)
    flat = list(_blocks(out_messages))
    for i in positions:
        flat[i]["cache_control"] = dict(EPHEMERAL)
    return Marked(
        tools=out_tools,
        system=out_system,
        messages=out_messages,
        marks=frozenset(digests[i] for i in positions),
    )


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _blocks(messages: Sequence[Mapping[str, Any]]) -> Iterator[dict[str, Any]]:
    for turn in messages:
        yield from turn["content"]


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


def _head_digest(tools: Sequence[Mapping[str, Any]], system: Sequence[Mapping[str, Any]]) -> bytes:
    return hashlib.sha256(
        _encode([_unmarked(t) for t in tools]) + b"\0" + _encode([_unmarked(b) for b in system])
    ).digest()


def _unmarked(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _prefix_digests(head: bytes, messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """The digest of the request's prefix through each message block, in order."""
    out: list[bytes] = []
    digest = head
    for turn in messages:
        for j, block in enumerate(turn["content"]):
            step = _encode([turn["role"], j == 0, _unmarked(block)])
            digest = hashlib.sha256(digest + step).digest()
            out.append(digest)
    return out


def _shared_blocks(ours: Sequence[bytes], theirs: Sequence[bytes]) -> int:
    """How many leading message blocks two requests share."""
    n = 0
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            break
        n += 1
    return n
