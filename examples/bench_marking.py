"""Benchmark: ``python -m examples.bench_marking``.

Times :func:`protocol.source.mark_openings` on the input that once froze a host: one
320,000-byte block holding 40,000 header-shaped openings. For comparison it also times a block
of the same size with no opening, larger blocks (1 MiB and 2 MiB of openings), and 200,000 small
blocks with an opening split across each pair. Marking is linear, so each figure should be a
small fraction of a second and doubling the input should about double the time. Figures are from
one run on one machine; nothing here is a test.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from protocol.source import mark_openings

OPENING = "[source:"


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


def report(label: str, blocks: list[str | None], openings: int) -> None:
    size = sum(len(text.encode()) for text in blocks if text is not None)
    marked = mark_openings(blocks)
    added = sum(len(text) for text in marked if text is not None) - sum(
        len(text) for text in blocks if text is not None
    )
    assert added == openings, (added, openings)
    taken = seconds(lambda: mark_openings(blocks))
    print(f"{label}: {size} bytes, {openings} openings: {taken:.3f} s")


def main() -> None:
    report("marking", [block(40_000)], 40_000)
    report("marking", ["[sourcex" * 40_000], 0)
    report("marking", [block(131_072)], 131_072)
    report("marking", [block(262_144)], 262_144)
    report("marking (200000 blocks)", ["[sou", "rce:"] * 100_000, 100_000)


if __name__ == "__main__":
    main()
