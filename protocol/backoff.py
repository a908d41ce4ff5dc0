"""How a connection backs off before it dials a server again: the retry count, and the longest
wait before each retry.

A link that ends counts as one more failed attempt unless it was ready for at least
``healthy_after`` seconds. So a server that connects but never becomes ready (its handshake
times out, say, however long that took), or one that dies soon after, waits longer each time,
the wait doubling up to the cap; a server that was ready for a while starts again from the first
retry.

Pure: no I/O, no clock (the caller measures how long a link was ready) and no randomness (the
caller draws the jitter under :func:`ceiling`).
"""

from __future__ import annotations

#: Doublings past this many add nothing (the ceiling is long at the cap by then); bounds the power.
MAX_DOUBLINGS = 64


def next_attempt(previous: int, ready_for: float | None, healthy_after: float) -> int:
    """The number of the retry after a link ended, 1 for the first in a row.

    ``previous`` is the number of the retry that dialled this link (0 for a first link);
    ``ready_for`` is how long the link was ready, None when it never was. Only a link ready for
    ``healthy_after`` seconds or more resets the count; any other counts one more failure.
    """
    if previous < 0:
        raise ValueError("retries count from 0")
    if ready_for is not None and ready_for >= healthy_after:
        return 1
    return previous + 1


def ceiling(attempt: int, base: float, cap: float) -> float:
    """The longest wait before retry ``attempt`` (from 1): ``min(cap, base * 2**(attempt-1))``."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    return min(cap, base * 2.0 ** min(attempt - 1, MAX_DOUBLINGS))
