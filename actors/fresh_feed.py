"""Message rows just committed, kept per agent so that an agent's context reader can take what
was stored since its last read without a trip to the reading thread.

Ten agents hearing one busy channel each read the same new messages at every turn; through the
one reading thread those reads queue behind each other. The store writer
(:mod:`actors.store_writer`) reports the rows of each commit
(:data:`store.writer.CommitObserver`), which are filed here before any op of that commit is
reported done; :meth:`FreshFeeds.take` hands an agent its rows after a seq, or ``None`` when the
feed cannot prove it holds every one of them (the reader then reads the store, as before).

A feed holds every row of its agent committed after its ``complete_after`` seq. It starts at
the first row filed for the agent (all rows committed earlier have lower seqs: commits are
serial and seqs grow), and moves up when rows are taken or the oldest are dropped at the cap.
A commit that may have lost rows (a transaction undone in part) empties every feed, and the
next commit starts them again.

Bounds: at most ``rows_per_agent`` rows per feed (the oldest dropped first, which moves
``complete_after`` up) and ``agents`` feeds (the one least recently taken from or started is
dropped first). Decoded bodies are shared between agents through a cache of at most
``MAX_SHARED_BODIES`` entries (the oldest dropped first).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Any

from store import CorruptRecord
from store.items import WrittenRow
from store.reader import decode_row

ROWS_PER_AGENT = 256
AGENTS = 256


class _Feed:
    __slots__ = ("complete_after", "rows")

    def __init__(self, complete_after: int) -> None:
        self.complete_after = complete_after
        self.rows: deque[WrittenRow] = deque()


class FreshFeeds:
    """See the module docstring. Used from one thread only."""

    def __init__(self, *, rows_per_agent: int = ROWS_PER_AGENT, agents: int = AGENTS) -> None:
        if rows_per_agent < 1 or agents < 1:
            raise ValueError("rows_per_agent and agents must be at least 1")
        self.rows_per_agent = rows_per_agent
        self.agents = agents
        self._feeds: OrderedDict[str, _Feed] = OrderedDict()  # least recently used first
        self._bodies: OrderedDict[bytes, tuple[Any, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._feeds)

    def file(self, rows: Sequence[WrittenRow], gap: bool) -> None:
        """File the rows of one commit (seq order); ``gap``: rows of it may be missing, so
        every feed is emptied and none started from this commit."""
        if gap:
            self._feeds.clear()
            return
        feeds = self._feeds
        for row in rows:
            agent = row[2]
            feed = feeds.get(agent)
            if feed is None:
                if len(feeds) >= self.agents:
                    feeds.popitem(last=False)
                feed = feeds[agent] = _Feed(row[0] - 1)
            feed.rows.append(row)
            if len(feed.rows) > self.rows_per_agent:
                feed.complete_after = feed.rows.popleft()[0]

    def take(self, agent: str, after_seq: int) -> tuple[list[dict[str, Any]], int] | None:
        """The messages of ``agent`` stored after ``after_seq`` (oldest first) and the newest
        seq among them (``after_seq`` when there are none), taken out of the feed; ``None``
        when the feed cannot tell (the caller reads the store) or a body does not decode."""
        taken = self.take_rows(agent, after_seq)
        if taken is None:
            return None
        rows, newest = taken
        try:
            return [self.decode(row) for row in rows], newest
        except CorruptRecord:
            self.forget(agent)  # the store read reports it and reads on
            return None

    def take_rows(self, agent: str, after_seq: int) -> tuple[list[WrittenRow], int] | None:
        """:meth:`take` without decoding: the rows, to be decoded a slice at a time with
        :meth:`decode` (on :class:`~store.CorruptRecord` the caller calls :meth:`forget` and
        reads the store after ``after_seq``)."""
        feed = self._feeds.get(agent)
        if feed is None or feed.complete_after > after_seq:
            return None
        rows = [row for row in feed.rows if row[0] > after_seq]
        newest = rows[-1][0] if rows else after_seq
        feed.rows.clear()
        feed.complete_after = newest
        self._feeds.move_to_end(agent)  # the most recently taken from goes last
        return rows, newest

    def decode(self, row: WrittenRow) -> dict[str, Any]:
        """One taken row as a stored message (bodies shared between agents). Raises
        :class:`~store.CorruptRecord` when its body does not decode."""
        return decode_row(row, self._bodies)

    def forget(self, agent: str) -> None:
        """Drop ``agent``'s feed: its next take reads the store."""
        self._feeds.pop(agent, None)
