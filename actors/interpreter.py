"""The interpreter's thread switch interval while hosts run.

The host's store reads run in a worker thread (``StoreClient.read``); each SQLite call there lets
go of the interpreter lock, and taking it back while the trio thread runs Python code waits for
the switch interval (Python's default is 5 ms). When the store's writer was a thread as well
(its pipe calls to the store process waited the same way), every acknowledgement to a server and
every agent's reply waited for those hand-offs on a busy host.

While at least one host runs, the interval is at most :data:`SWITCH_INTERVAL_S`; when the last
one closes, the interval it found is put back (unless something else changed it meanwhile).
Measured with ten agents hearing a channel at 1,000 msg/s, alternating runs pooled: 0.2 ms
brought the median wake-to-reply from 17.5 to 14.0 ms (four rounds) and from 28.6 to 21.5 ms
(six rounds, a slower phase of the machine); its p99 was 35 against 59 ms in the first set and
the same (about 104 ms) in the second. One agent's figures stayed within noise (5.4 / 11.9 ms
against 5.1 / 13.4 ms; 7.0 / 22.4 against 6.5 / 22.1 ms). Shorter still costs more switches than
it saves (0.1 ms made one agent's p99 worse). When the writer ran SQLite in its own thread
(about ten trips per commit), 1 ms was best. With the writer a trio task
(:mod:`actors.store_writer`) no gain is left to measure. In a slower phase (three rounds pooled)
ten agents' p50 / p99 were 12.7 / 39.3 ms at 0.2 ms against 11.3 / 40.6 ms at 5 ms, one agent's
5.0 / 13.0 against 4.6 / 10.7 ms; in a faster one (four rounds) 10.0 / 21.4 against
9.6 / 21.3 ms, and 3.8 / 7.8 against 3.7 / 8.0 ms. The interval is kept short for the reading
thread, whose reads a busy trio thread would otherwise hold back up to 5 ms each.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_INTERVAL_S = 0.0002

_running = 0
_before: float | None = None  # the interval the first running host found, if it shortened it
_set = 0.0  # the interval as the interpreter keeps it once set (in whole microseconds)


@contextmanager
def short_switch_interval() -> Iterator[None]:
    """Keep the switch interval at most :data:`SWITCH_INTERVAL_S` while inside (nestable)."""
    global _running, _before, _set
    if _running == 0:
        found = sys.getswitchinterval()
        if found > SWITCH_INTERVAL_S:
            _before = found
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            _set = sys.getswitchinterval()
    _running += 1
    try:
        yield
    finally:
        _running -= 1
        if _running == 0 and _before is not None:
            if sys.getswitchinterval() == _set:  # nobody changed it meanwhile
                sys.setswitchinterval(_before)
            _before = None
