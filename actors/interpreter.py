"""The interpreter's thread switch interval while hosts run.

The store's writer thread (:mod:`store.writer`) lets go of the interpreter lock each time it
enters SQLite (a statement, a commit) and must take it back after. While the trio thread runs
Python code, taking it back waits for the switch interval (Python's default is 5 ms), and a
commit is about ten such trips: with the trio thread busy, one commit of a few rows took about
50 ms at the default, 13 ms at 1 ms and 2 ms with the trio thread idle. Every acknowledgement
to a server and every agent's reply waits for a commit, so a busy host answered late twice.
While at least one host runs, the interval is at most :data:`SWITCH_INTERVAL_S`; when the last
one closes, the interval it found is put back (unless something else changed it meanwhile).
A shorter interval costs more switches; below about 1 ms they cost more than they save.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_INTERVAL_S = 0.001

_running = 0
_before: float | None = None  # the interval the first running host found, if it shortened it


@contextmanager
def short_switch_interval() -> Iterator[None]:
    """Keep the switch interval at most :data:`SWITCH_INTERVAL_S` while inside (nestable)."""
    global _running, _before
    if _running == 0:
        found = sys.getswitchinterval()
        if found > SWITCH_INTERVAL_S:
            _before = found
            sys.setswitchinterval(SWITCH_INTERVAL_S)
    _running += 1
    try:
        yield
    finally:
        _running -= 1
        if _running == 0 and _before is not None:
            if sys.getswitchinterval() == SWITCH_INTERVAL_S:
                sys.setswitchinterval(_before)
            _before = None
