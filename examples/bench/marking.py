"""Benchmark: ``python -m examples.bench.marking``.

Times :func:`protocol.source.mark_openings` on the input that once froze a host: one
320,000-byte block holding 40,000 header-shaped openings. For comparison it also times a block
of the same size with no opening, larger blocks (1 MiB and 2 MiB of openings), and 200,000 small
blocks with an opening split across each pair. Marking is linear, so each figure should be a
small fraction of a second and doubling the input should about double the time.

Each figure comes with its baseline: a plain :mod:`re` scan of the same text with the opening
pattern (the pattern marking uses, compiled by :mod:`re`, its matches' starts collected), and
the ratio of marking to it. Figures are from one run on one machine; nothing here is a test.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from protocol import source
from protocol.source import mark_openings

OPENING = "[source:"
#: How many times as long as a plain scan marking may take (the goal).
GOAL_RATIO = 10.0


def opening_pattern() -> re.Pattern[str]:
    """The opening pattern marking uses, compiled by :mod:`re` (it has no Unicode property the
    plain module lacks); a pattern of the same shape if marking no longer exposes one."""
    compiled = getattr(source, "_OPENING", None)
    pattern = getattr(compiled, "pattern", None)
    if not isinstance(pattern, str):
        fill = r"[\t-\r \x00-\x1f\x7f-\x9f\u00a0\u200b-\u200f\u2028\u2029\ufeff]*+"
        pattern = (
            r"\["
            + fill
            + fill.join(("[sS\u017f]", "[oO]", "[uU]", "[rR]", "[cC]", "[eE]", r"[:\]]"))
        )
    return re.compile(pattern)


_PLAIN = opening_pattern()


def baseline(blocks: list[str | None]) -> list[int]:
    """The plain scan: the starts of every opening in the blocks' joined text."""
    joined = "".join(text for text in blocks if text is not None)
    return [m.start() for m in _PLAIN.finditer(joined)]


def seconds(run: Callable[[], object], repeat: int = 3) -> float:
    """The best of ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def block(count: int) -> str:
    return OPENING * count


def measure(blocks: list[str | None], openings: int) -> tuple[float, float]:
    """Seconds to mark ``blocks`` (checked to add one mark per opening) and seconds the
    plain scan takes over the same text (checked to find as many openings)."""
    marked = mark_openings(blocks)
    added = sum(len(text) for text in marked if text is not None) - sum(
        len(text) for text in blocks if text is not None
    )
    assert added == openings, (added, openings)
    assert len(baseline(blocks)) == openings, "the plain scan disagrees"
    return seconds(lambda: mark_openings(blocks)), seconds(lambda: baseline(blocks))


def report(label: str, blocks: list[str | None], openings: int) -> None:
    size = sum(len(text.encode()) for text in blocks if text is not None)
    taken, plain = measure(blocks, openings)
    ratio = taken / plain if plain > 0 else float("inf")
    print(
        f"{label}: {size} bytes, {openings} openings: {taken:.3f} s; plain re scan "
        f"{plain:.3f} s; marking / plain = {ratio:.1f}x (target <= {GOAL_RATIO:.0f}x)"
    )


def main() -> None:
    report("marking", [block(40_000)], 40_000)
    report("marking", ["[sourcex" * 40_000], 0)
    report("marking", [block(131_072)], 131_072)
    report("marking", [block(262_144)], 262_144)
    report("marking (200000 blocks)", ["[sou", "rce:"] * 100_000, 100_000)


if __name__ == "__main__":
    main()
