"""What a rollback sets aside and which checkpoints decide its targets, read from the store in
pages with bounded memory (the whole history is never held).

:func:`plan_rollback` finds message ``to`` by its seq and reads the agent's history newest
first: every message after ``to`` (whatever its role), then ``to``, then only the tool results
and system messages before it. It keeps small derived data only: the ids of the live messages
after ``to`` (at most the span plus one before it refuses), the ids named by the rollback
markers met so far whose messages may still lie ahead, the occurrences hidden after ``to``, and
per lineage the one or two checkpoint records that :func:`protocol.state.rollback_targets` can
pick. It decides exactly what reading the whole history decides, given how the host writes it:

- a rollback marker names only messages stored before it, oldest first (so a marker is always
  read before the messages it sets aside, and once the scan passes below the first of them the
  marker's list can be dropped);
- a coalesce-hidden marker is stored after the copy it hides, and names an occurrence;
- checkpoints are recorded only on tool results (role ``tool``), and a tool result carries no
  occurrence.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from actors.channel.coalescer import is_hidden_marker
from protocol.state import Lineage, Recorded
from store import Reader, StoredRow

from .history import is_rollback

#: The most messages one rollback may set aside.
MAX_ROLLBACK_SPAN = 10_000
#: Ids named by rollback markers plus occurrences hidden after ``to``, held at once while
#: planning; past it the rollback is refused (roll back to a later message).
MAX_HELD_IDS = 100_000
#: Distinct checkpoint lineages a plan tracks on each side of ``to``; past it the rollback is
#: refused.
MAX_PLAN_LINEAGES = 1024
#: Messages read per query.
PLAN_PAGE = 512
#: The roles a plan reads before ``to``: rollback and hidden markers, and the tool results that
#: record checkpoints.
_BEFORE_ROLES = ("system", "tool")


class RollbackRefused(ValueError):
    """The rollback cannot be planned; the message says why and what to do instead."""


@attrs.frozen
class RollbackPlan:
    """What a rollback to ``to`` sets aside (the live messages after it, oldest first) and the
    checkpoint records that decide its targets: ``rollback_targets(recorded, to, order,
    current)`` returns what it would for the agent's whole history. ``recorded`` holds, per
    lineage, the checkpoint in force at ``to`` (as recorded at ``to``) and, for a lineage with
    none, the first record after ``to``; both in the order the lineages first appear."""

    to: str
    set_aside: tuple[str, ...]
    recorded: tuple[Recorded, ...]

    @property
    def order(self) -> tuple[str, ...]:
        return (self.to, *self.set_aside)


def _pages(reader: Reader, agent: str, **where: Any) -> Iterator[StoredRow]:
    """The agent's stored rows matching ``where``, newest first, a page at a time."""
    return reader.walk(agent=agent, newest_first=True, page=PLAN_PAGE, **where)


class _Liveness:
    """Which messages are still live, judged newest first: the ids the rollback markers read so
    far set aside (each marker's list kept until the scan passes below its first id), and the
    occurrences hidden by the markers read so far. Bounded by ``MAX_HELD_IDS``."""

    def __init__(self, reader: Reader) -> None:
        self._reader = reader
        self._named: dict[Any, int] = {}  # id -> how many held markers name it
        self._lists: list[tuple[int, int, tuple[Any, ...]]] = []  # heap: (-low seq, n, ids)
        self._count = itertools.count()
        self._hidden: set[Any] = set()
        self.held = 0

    def passing(self, seq: int) -> None:
        """The scan reached ``seq``: drop the lists whose ids are all newer."""
        while self._lists and -self._lists[0][0] > seq:
            _, _, ids = heapq.heappop(self._lists)
            self.held -= len(ids)
            for i in ids:
                left = self._named[i] - 1
                if left:
                    self._named[i] = left
                else:
                    del self._named[i]

    def set_aside_by(self, marker: Mapping[str, Any]) -> None:
        ids = tuple(marker["metadata"].get("set_aside", ()))
        if not ids:
            return
        first = ids[0]
        low = self._reader.seq_of(first) if isinstance(first, str) else None
        self._hold(len(ids))
        for i in ids:
            self._named[i] = self._named.get(i, 0) + 1
        heapq.heappush(self._lists, (-(low or 0), next(self._count), ids))

    def hide(self, marker: Mapping[str, Any], *, named: bool = True) -> None:
        """A coalesce-hidden marker; with ``named=False`` only one without an occurrence
        counts (it hides every message without one)."""
        occurrence = marker["metadata"].get("occurrence")
        if (named or occurrence is None) and occurrence not in self._hidden:
            self._hold(1)
            self._hidden.add(occurrence)

    def live(self, message: Mapping[str, Any]) -> bool:
        return message["id"] not in self._named and (
            not self._hidden or message["metadata"].get("occurrence") not in self._hidden
        )

    def _hold(self, n: int) -> None:
        self.held += n
        if self.held > MAX_HELD_IDS:
            raise RollbackRefused(
                f"more than {MAX_HELD_IDS} set-aside or hidden messages lie after this point; "
                "roll back to a later message"
            )


_Key = tuple[int, int]  # (seq, index among the message's checkpoints)


class _Records:
    """Per lineage, the records of one side of ``to`` that ``rollback_targets`` can pick: the
    oldest (its key orders the lineages) and the newest; at most ``MAX_PLAN_LINEAGES``."""

    def __init__(self) -> None:
        self.oldest: dict[Lineage, tuple[_Key, Recorded]] = {}
        self.newest: dict[Lineage, tuple[_Key, Recorded]] = {}

    def add(self, seq: int, message: Mapping[str, Any]) -> None:
        for index, c in enumerate(message["metadata"].get("checkpoints", ())):
            rec = Recorded(
                message_id=message["id"],
                lineage=(c["server"], c["feature_set"]),
                checkpoint=c["checkpoint"],
                parent=c.get("parent"),
            )
            key = (seq, index)
            old = self.oldest.get(rec.lineage)
            if old is None:
                if len(self.oldest) >= MAX_PLAN_LINEAGES:
                    raise RollbackRefused(
                        f"the history records checkpoints of more than {MAX_PLAN_LINEAGES} "
                        "lineages; a rollback cannot be planned"
                    )
                self.oldest[rec.lineage] = self.newest[rec.lineage] = (key, rec)
                continue
            if key < old[0]:
                self.oldest[rec.lineage] = (key, rec)
            if key > self.newest[rec.lineage][0]:
                self.newest[rec.lineage] = (key, rec)

    def lineages(self) -> list[Lineage]:
        """The lineages in the order their first records were made."""
        return sorted(self.oldest, key=lambda lineage: self.oldest[lineage][0])


def plan_rollback(reader: Reader, agent: str, to: str, span: int | None = None) -> RollbackPlan:
    """Plan rolling ``agent`` back to message ``to`` (blocking: run it where the store is read).

    ValueError (:class:`RollbackRefused`) when ``to`` is not in the agent's context, when more
    than ``span`` (default ``MAX_ROLLBACK_SPAN``) live messages follow it, or past the module's
    bounds."""
    span = MAX_ROLLBACK_SPAN if span is None else span
    cut = reader.seq_of(to, agent)
    missing = RollbackRefused(f"{agent} has no message {to!r} in its context")
    if cut is None:
        raise missing
    live = _Liveness(reader)
    after = _Records()
    later: list[str] = []  # newest first
    for row in _pages(reader, agent, after_seq=cut):
        live.passing(row.seq)
        m = row.message
        if is_rollback(m):
            live.set_aside_by(m)
        elif is_hidden_marker(m):
            live.hide(m)
        elif live.live(m):
            later.append(m["id"])
            if len(later) > span:
                raise RollbackRefused(
                    f"a rollback sets aside at most {span} messages, this one more; "
                    "roll back to a later message first"
                )
            after.add(row.seq, m)
    at = reader.rows(agent=agent, after_seq=cut - 1, before_seq=cut + 1, limit=1)
    live.passing(cut)
    if not at or is_rollback(at[0].message) or is_hidden_marker(at[0].message):
        raise missing
    if not live.live(at[0].message):
        raise missing
    before = _Records()
    before.add(cut, at[0].message)
    for row in _pages(reader, agent, before_seq=cut, roles=_BEFORE_ROLES):
        live.passing(row.seq)
        m = row.message
        if is_rollback(m):
            live.set_aside_by(m)
        elif is_hidden_marker(m):
            live.hide(m, named=False)  # a named occurrence is no tool result's
        elif m["role"] == "tool" and live.live(m):
            before.add(row.seq, m)
    recorded = _decisive(to, before, after)
    return RollbackPlan(to=to, set_aside=tuple(reversed(later)), recorded=recorded)


def _decisive(to: str, before: _Records, after: _Records) -> tuple[Recorded, ...]:
    """The records ``rollback_targets`` decides by: per lineage, the newest at or before ``to``
    (as recorded at ``to``), else the oldest after it; lineages in first-record order."""
    out: list[Recorded] = []
    for lineage in before.lineages():
        out.append(attrs.evolve(before.newest[lineage][1], message_id=to))
    for lineage in after.lineages():
        if lineage not in before.oldest:
            out.append(after.oldest[lineage][1])
    return tuple(out)


def checkpointed_servers(reader: Reader, agent: str, among: Sequence[str]) -> set[str]:
    """The servers of ``among`` whose state the agent's tool results checkpointed, read in pages
    (tool results only; stops once all of them are found)."""
    wanted, found = set(among), set[str]()
    if not wanted:
        return found
    for row in _pages(reader, agent, roles=("tool",)):
        for c in row.message["metadata"].get("checkpoints", ()):
            server = c.get("server") if isinstance(c, Mapping) else None
            if server in wanted:
                found.add(server)
        if found == wanted:
            break
    return found
