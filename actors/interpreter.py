"""The interpreter while hosts run: its thread switch interval, and a watch on the trio loop.

:class:`LoopWatch`, a trio instrument each host installs, records how long each task step held
the loop (the time no other task could run): the longest so far and its task go into the status
file, and a step that held it :data:`STALL_REPORT_S` or longer is reported with the task's name.
A step costs it two clock reads.

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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

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


#: A task step at least this long (seconds) is reported as a stall of the loop.
STALL_REPORT_S = 0.25


class LoopWatch(trio.abc.Instrument):
    """How long task steps hold the trio loop (see the module docstring).

    ``report(task_name, seconds)`` is called after each step of at least ``threshold``; the
    clock is real time (``time.perf_counter``), whatever clock the loop runs on."""

    def __init__(
        self,
        report: Callable[[str, float], Any],
        *,
        threshold: float = STALL_REPORT_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._report = report
        self._threshold = threshold
        self._clock = clock
        self._step_began: float | None = None  # None: installed in the middle of a step
        #: the longest step so far, in seconds, and the name of the task that took it
        self.longest = 0.0
        self.longest_task: str | None = None
        #: how many steps reached the threshold
        self.stalls = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._step_began = self._clock()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._step_began is None:
            return
        held = self._clock() - self._step_began
        if held <= self.longest and held < self._threshold:
            return
        if held > self.longest:
            self.longest, self.longest_task = held, task.name
        if held >= self._threshold:
            self.stalls += 1
            self._report(task.name, held)

    def restart(self) -> None:
        """Forget the longest step so far (the stalls stay counted): a measurement after a
        warm-up starts here."""
        self.longest, self.longest_task = 0.0, None

    def summary(self) -> dict[str, Any]:
        """What the status file says of the loop."""
        return {
            "longest_step_ms": round(self.longest * 1000, 1),
            "longest_step_task": self.longest_task,
            "stalls": self.stalls,
        }
