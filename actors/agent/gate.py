"""An agent's event gate and its timers: which channel items wake the agent, the debounced
batches the gate policy collects, and the agent's sleep.

The gate file is watched: every ``GATE_RELOAD_S`` of the host's clock its modification time is
checked and, when it changed, the file is read again, in a worker thread with a time limit (a
FIFO or a file on a hung mount holds that thread, never the loop; the running policies stay
until a read succeeds). A file that does not parse leaves the running policies in force too.
Batches that come due and the end of a sleep wake the agent through ``wake`` (the agent buffers
them like any other wake). Everything else runs in the agent's tasks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from actors.config import load_gate
from actors.errors import ConfigError
from actors.messages import Wake
from actors.reload import OffLoop, SlowRead
from protocol.addressing import addresses
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


def _read_if_changed(
    path: Path, seen: float | None
) -> tuple[float | None, GateConfig | ConfigError | None]:
    """The file's modification time and, when it differs from ``seen``, its policies or the
    problem reading them (in a worker thread: both the stat and the read may block)."""
    mtime = _mtime(path)
    if mtime == seen:
        return mtime, None
    try:
        return mtime, load_gate(path)
    except ConfigError as exc:
        return mtime, exc


class WakeGate:
    def __init__(
        self,
        path: Path | None,
        trace: Callable[..., Any],
        wake: Callable[[Wake], None],
        policy: GateConfig | None = None,
        names: tuple[str, ...] = (),
        others: tuple[str, ...] = (),
    ) -> None:
        """``policy`` is the file's content as the config read it (or a built-in preset,
        with no file); without it (an ``AgentConfig`` built by hand) the file is read here.
        ``names``: the agent's name and aliases, which address it in a message; ``others``:
        those of the host's other agents."""
        self.path = path
        self.names = names
        self.others = others
        # not stat'ed here, on the loop: the watch's first read (in its thread) takes it
        self._mtime: float | None = None
        if policy is None and path is not None:
            policy = load_gate(path)
        self.gate = Gate(policy)
        self._trace = trace
        self._wake = wake
        self._reader = OffLoop("the gate file")
        self._slow_said = False  # a read past its limit is told once, until one succeeds
        self._timer_changed = trio.Event()
        self._sleep_until: float | None = None

    def admits(self, wake: Wake) -> bool:
        """Whether a channel item wakes the agent now (it is stored either way)."""
        now = trio.current_time()
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
            metadata={"addressed": self.addresses(wake)},
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

    def addresses(self, wake: Wake) -> bool:
        """Whether a channel item addresses this agent (``protocol.addressing``)."""
        if not self.names:
            return wake.addressed or wake.direct
        agent, *aliases = self.names
        return addresses(
            aliases,
            agent=agent,
            text=wake.text,
            tags=wake.tags,
            replies_to=wake.replies_to,
            direct=wake.direct,
            others=self.others,
        )

    def withdraw(self, occurrence: str) -> bool:
        """Drop a withdrawn occurrence from a debounce batch; whether one held it."""
        if self.gate.withdraw(occurrence):
            self._timer_changed.set()
            return True
        return False

    async def watch(self) -> None:
        """Every ``GATE_RELOAD_S``: the gate file read again when it changed (off the loop)."""
        while True:
            await trio.sleep(GATE_RELOAD_S)
            path = self.path
            if path is None:
                continue
            try:
                mtime, config = await self._reader.read(_read_if_changed, path, self._mtime)
            except SlowRead as exc:
                if not self._slow_said:
                    self._slow_said = True
                    text = f"{path}: {exc}; the old policies stay"
                    self._trace("diagnostic", text=text)
                continue
            self._slow_said = False
            if path != self.path:
                continue  # a config reload named another file meanwhile
            self._mtime = mtime  # a broken file is told once per change
            if isinstance(config, ConfigError):
                text = f"gate file not reloaded, the old policies stay: {config}"
                self._trace("diagnostic", text=text)
            elif config is not None:
                self._apply(config)

    def _apply(self, config: GateConfig) -> bool:
        """Put new policies in force; True when they differ from the running ones."""
        if config == self.gate.config:
            return False
        for batch in self.gate.reload(config, trio.current_time()):
            self._batch(batch)
        self._trace("gate-reloaded", path=str(self.path))
        self._timer_changed.set()
        return True

    def reconfigure(
        self,
        path: Path | None,
        policy: GateConfig | None,
        names: tuple[str, ...] | None = None,
        others: tuple[str, ...] | None = None,
    ) -> bool:
        """A config reload: the policies it read from the gate file (a new one, or the same one
        changed on disk) or the preset it names are put in force; neither drops every policy.
        True when the policies changed."""
        self.path = path
        if names is not None:
            self.names = names
        if others is not None:
            self.others = others
        self._mtime = None  # the watch reads the file again: it may change after the config read
        if path is None:
            return self._apply(policy if policy is not None else GateConfig())
        return self._apply(policy if policy is not None else load_gate(path))

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
