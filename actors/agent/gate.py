"""An agent's event gate and its timers: which channel items wake the agent, the debounced
batches the gate policy collects, and the agent's sleep.

The gate file is re-read when it changes (its modification time is checked at most once per
``GATE_RELOAD_S`` of the host's clock); a file that does not parse leaves the running policies in
force. Batches that come due and the end of a sleep wake the agent through ``wake`` (the agent
buffers them like any other wake). Everything runs in the agent's tasks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from actors.config import load_gate
from actors.messages import Wake
from protocol.gate import Gate, GateConfig, GateEvent

#: How often (in seconds of the host's clock) the gate file's modification time is checked.
GATE_RELOAD_S = 1.0


def _mtime(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return float(os.stat(path).st_mtime_ns)
    except OSError:
        return None


class WakeGate:
    def __init__(
        self,
        path: Path | None,
        trace: Callable[..., Any],
        wake: Callable[[Wake], None],
    ) -> None:
        self.path = path
        self.gate = Gate(load_gate(path) if path is not None else None)
        self._trace = trace
        self._wake = wake
        self._mtime = _mtime(path)
        self._checked = -1e18
        self._timer_changed = trio.Event()
        self._sleep_until: float | None = None

    def admits(self, wake: Wake) -> bool:
        """Whether a channel item wakes the agent now (it is stored either way)."""
        now = trio.current_time()
        self._reload(now)
        if self.gate.wakes_plainly(now):
            return True
        event = GateEvent(
            kind=wake.lane,
            server_id=wake.server_id or "",
            channel_id=wake.channel_id,
            thread_id=wake.thread_id,
            text=wake.text,
            tags=wake.tags,
            author=wake.author,
            metadata={"addressed": wake.addressed},
            item=wake.occurrence,
        )
        decision = self.gate.decide(event, now)
        if decision.wake:
            return True
        self._trace(
            "gate-decision",
            wake if wake.server_id and wake.channel_id else None,
            wake=False,
            policy=decision.policy,
            behavior=decision.behavior,
        )
        if decision.due is not None:
            self._timer_changed.set()
        return False

    def withdraw(self, occurrence: str) -> bool:
        """Drop a withdrawn occurrence from a debounce batch; whether one held it."""
        if self.gate.withdraw(occurrence):
            self._timer_changed.set()
            return True
        return False

    def _reload(self, now: float) -> None:
        if self.path is None or now - self._checked < GATE_RELOAD_S:
            return
        self._checked = now
        mtime = _mtime(self.path)
        if mtime == self._mtime:
            return
        self._mtime = mtime
        try:
            config = load_gate(self.path)
        except Exception as exc:
            self._trace("diagnostic", text=f"gate file not reloaded, the old policies stay: {exc}")
            return
        for batch in self.gate.reload(config, now):
            self._batch(batch)
        self._trace("gate-reloaded", path=str(self.path))
        self._timer_changed.set()

    def reconfigure(self, path: Path | None) -> bool:
        """A config reload: the gate file (a new one, or the same one changed on disk) is
        re-read now, whatever its modification time says; no file drops every policy. True
        when the policies changed."""
        before = self.gate.config
        now = trio.current_time()
        self.path = path
        self._mtime = None
        if path is None:
            for batch in self.gate.reload(GateConfig(), now):
                self._batch(batch)
        else:
            self._checked = -math.inf
            self._reload(now)
        self._timer_changed.set()
        return bool(self.gate.config != before)

    def _batch(self, batch: Any) -> None:
        """A debounced batch came due: one wake carrying its count (never a speech route)."""
        self._trace("gate-batch", policy=batch.policy, count=batch.count)
        self._wake(Wake(lane="gate", count=batch.count))

    async def run_timers(self) -> None:
        """The gate's debounce deadlines and the end of a sleep, on the host's clock."""
        while True:
            due = self.gate.next_due()
            if self._sleep_until is not None:
                due = self._sleep_until if due is None else min(due, self._sleep_until)
            self._timer_changed = trio.Event()
            if due is None:
                await self._timer_changed.wait()
                continue
            with trio.move_on_at(due):
                await self._timer_changed.wait()
                continue
            now = trio.current_time()
            for batch in self.gate.due(now):
                self._batch(batch)
            if self._sleep_until is not None and now >= self._sleep_until:
                self._sleep_until = None
                self._trace("awake", reason="the sleep is over")
                self._wake(Wake(lane="self"))

    def sleep(self, seconds: float) -> float:
        """Sleep: only privileged authors wake the agent until ``seconds`` pass, then it wakes
        by itself. Returns the deadline."""
        until = trio.current_time() + seconds
        self.gate.sleep(until)
        self._sleep_until = until
        self._timer_changed.set()
        self._trace("asleep", seconds=seconds)
        return until

    def wake_up(self) -> bool:
        """End a sleep now; False when the agent was not asleep."""
        was = self._sleep_until is not None
        self.gate.wake_up()
        self._sleep_until = None
        self._timer_changed.set()
        return was
