"""Collapsing repeated lines: a flooding source gets a few lines and a count, not one line each.

A line's *shape* is its text with quoted values and every word holding a digit masked
(:func:`mask`), so "not JSON, skipped: 'x17'" and "not JSON, skipped: 'y9'" are one shape. The
caller keys shapes by their source (a server, an agent) and their kind.

:class:`RepeatCollapser` decides, per (source, shape), with time as a parameter:

* The first occurrence opens a *window* of ``window_s`` seconds. The first ``burst`` occurrences
  in a window are shown; later ones are counted, not shown.
* When the window has ended, a :class:`Summary` reports the count ("… 21,999 more like this from
  flood in the last 10 s"): from :meth:`~RepeatCollapser.flush` (the caller's timer, at
  :meth:`~RepeatCollapser.next_due`), or from :meth:`~RepeatCollapser.observe` when the next
  occurrence comes first, just before that occurrence opens a new window. A window in which
  nothing was held back ends silently. :meth:`~RepeatCollapser.close` reports every count still
  open (at the end of the output), so every occurrence is either shown or counted once.

Caps, so a source sending endless distinct lines cannot grow the table: at most
``shapes_per_source`` shapes are told apart per source; further shapes of that source share one
entry (a summary says "other lines" instead of "like this"). At most ``max_sources`` sources
are told apart; further sources share the entry :data:`OTHER_SOURCES`. So the table holds at most
``(max_sources + 1) * (shapes_per_source + 1)`` entries. Entries leave the table when their
window ends.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Hashable

import attrs

WINDOW_S = 10.0
BURST = 3
MAX_SOURCES = 64
SHAPES_PER_SOURCE = 32
#: A shape keeps at most this many characters of the masked text.
SHAPE_CHARS = 200

MASK = "#"
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`")
_WORD_WITH_DIGIT = re.compile(r"[^\s'\"`]*\d[^\s'\"`]*")


def _mask_quoted(match: re.Match[str]) -> str:
    quote = match.group(0)[0]
    return f"{quote}{MASK}{quote}"


def mask(text: str) -> str:
    """``text``'s shape: each quoted value ('…', "…", `…`) and each word holding a digit
    replaced by ``#``, at most :data:`SHAPE_CHARS` characters."""
    text = text[: SHAPE_CHARS * 4]
    masked = _QUOTED.sub(_mask_quoted, text)
    masked = _WORD_WITH_DIGIT.sub(MASK, masked)
    return masked[:SHAPE_CHARS]


class _OtherSources:
    def __repr__(self) -> str:
        return "OTHER_SOURCES"


class _OtherShapes:
    def __repr__(self) -> str:
        return "OTHER_SHAPES"


#: The source key shared by every source past ``max_sources``.
OTHER_SOURCES: Hashable = _OtherSources()
#: The shape key shared by a source's shapes past ``shapes_per_source``.
OTHER_SHAPES: Hashable = _OtherShapes()


@attrs.frozen(kw_only=True)
class Summary:
    """``count`` occurrences of one shape from ``source`` (or of its other shapes, when
    ``other_shapes``) were held back in the ``seconds`` before the summary; ``sample`` is the
    first line shown in that window; ``level`` the highest level held back."""

    source: Hashable
    count: int
    seconds: float
    sample: str
    level: int
    other_shapes: bool


@attrs.frozen
class Verdict:
    """Whether to show the occurrence, and the summaries due before it (oldest first)."""

    show: bool
    due: tuple[Summary, ...] = ()


@attrs.define
class _Entry:
    start: float
    sample: str
    level: int
    shown: int = 1
    held: int = 0


class RepeatCollapser:
    """The collapse decision for repeated lines (see the module docstring)."""

    def __init__(
        self,
        *,
        window_s: float = WINDOW_S,
        burst: int = BURST,
        max_sources: int = MAX_SOURCES,
        shapes_per_source: int = SHAPES_PER_SOURCE,
    ) -> None:
        if window_s <= 0 or burst < 1 or max_sources < 1 or shapes_per_source < 1:
            raise ValueError("window_s must be positive, and the other limits at least 1")
        self.window_s = window_s
        self.burst = burst
        self.max_sources = max_sources
        self.shapes_per_source = shapes_per_source
        # (source, shape) -> entry, in the order the windows opened (so the first entry is the
        # next to end, as long as ``now`` never goes back); ordered, so finding the first after
        # others were deleted does not walk their freed slots
        self._entries: OrderedDict[tuple[Hashable, Hashable], _Entry] = OrderedDict()
        self._per_source: dict[Hashable, int] = {}  # entries per source, its overflow included

    def __len__(self) -> int:
        return len(self._entries)

    def sources(self) -> int:
        """How many sources have entries (:data:`OTHER_SOURCES` included)."""
        return len(self._per_source)

    def observe(
        self, source: Hashable, shape: Hashable, now: float, *, sample: str, level: int = 0
    ) -> Verdict:
        """One occurrence of ``shape`` from ``source`` at ``now``: show it or hold it back."""
        if source not in self._per_source:
            real = len(self._per_source) - (OTHER_SOURCES in self._per_source)
            if real >= self.max_sources:
                source = OTHER_SOURCES
        due: list[Summary] = []
        key = (source, shape)
        entry = self._current(key, now, due)
        if entry is None and self._per_source.get(source, 0) >= self.shapes_per_source:
            key = (source, OTHER_SHAPES)
            entry = self._current(key, now, due)
        if entry is None:
            self._entries[key] = _Entry(start=now, sample=sample, level=level)
            self._per_source[source] = self._per_source.get(source, 0) + 1
            return Verdict(True, tuple(due))
        if entry.shown < self.burst:
            entry.shown += 1
            entry.level = max(entry.level, level)
            return Verdict(True, tuple(due))
        entry.held += 1
        entry.level = max(entry.level, level)
        return Verdict(False, tuple(due))

    def next_due(self) -> float | None:
        """When the earliest open window ends (None: no window is open)."""
        for entry in self._entries.values():
            return entry.start + self.window_s
        return None

    def flush(self, now: float) -> list[Summary]:
        """The summaries of the windows that have ended by ``now``; those entries leave."""
        out: list[Summary] = []
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now < entry.start + self.window_s:
                break
            self._forget(key)
            if entry.held:
                out.append(self._summary(key, entry, now))
        return out

    def close(self, now: float) -> list[Summary]:
        """Every count still open, whether its window has ended or not; the table is empty
        afterwards."""
        out = [self._summary(k, e, now) for k, e in self._entries.items() if e.held]
        self._entries.clear()
        self._per_source.clear()
        return out

    def _current(
        self, key: tuple[Hashable, Hashable], now: float, due: list[Summary]
    ) -> _Entry | None:
        """The entry for ``key`` if its window is still open; an ended one leaves (its
        summary, if any, goes to ``due``)."""
        entry = self._entries.get(key)
        if entry is None or now < entry.start + self.window_s:
            return entry
        self._forget(key)
        if entry.held:
            due.append(self._summary(key, entry, now))
        return None

    def _forget(self, key: tuple[Hashable, Hashable]) -> None:
        del self._entries[key]
        source = key[0]
        left = self._per_source[source] - 1
        if left:
            self._per_source[source] = left
        else:
            del self._per_source[source]

    def _summary(self, key: tuple[Hashable, Hashable], entry: _Entry, now: float) -> Summary:
        return Summary(
            source=key[0],
            count=entry.held,
            seconds=max(now - entry.start, 0.0),
            sample=entry.sample,
            level=entry.level,
            other_shapes=key[1] is OTHER_SHAPES,
        )
