"""The turn token: agents' turns take the host's interpreter one after another.

When one message wakes many agents, their turns all want the same interpreter. Interleaved
(each turn a few steps, then the next agent's), every turn ends near the end of the whole
burst; one after another, the first ends after one turn's work, the second after two, and the
average answer comes about twice as soon for the same total work. A turn holds the token while
it works in the host (reading its context, a local model, storing, routing) and lets it go
whenever it waits for something outside the host (a remote model, a server's answer to a
publish, a hook or a render, a tool call), so that wait never holds up another agent. A turn
storing its last reply lets it go for good (:meth:`TurnToken.let_go`): what follows the commit
is queueing that reply for its channel and waiting for the server, nothing worth queueing for.

A turn's work in the host is long when it reads a big batch (an agent hearing a flooding server
reads hundreds of messages in one turn). Such work calls :meth:`TurnToken.share` between its
parts: it lets every other task run (trio runs nothing else until a task yields), and when
another turn waits for the token and this one has held it for ``SHARE_AFTER_S``, it hands the
token over and queues for it again, so a short turn never waits out a long one.

A turn coming back from a wait (:meth:`TurnToken.away`) is served before turns that have not
started: it has already done part of its work, and finishing the turns in hand first brings
every answer sooner than starting them all and ending them together. Among each kind the token
is first come, first served. It is never a stall: a turn that has waited ``MAX_WAIT_S`` for it
goes on without it, so a turn stuck while holding it delays the others by at most that much,
and a host under more load than turns can share still runs every turn (a new turn behind
returning ones waits at most that long too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

#: The longest a turn waits for the token before it goes on without it.
MAX_WAIT_S = 0.25
#: How long a turn reading a big batch holds the token before :meth:`TurnToken.share` between
#: its slices hands it to a waiting turn.
SHARE_AFTER_S = 0.002
#: The same before a local model's call (``share(whole_turn=True)``): longer than a usual turn's
#: work in the host, so turns woken together still run one after another.
TURN_SHARE_AFTER_S = 0.01


class TurnToken:
    def __init__(
        self,
        max_wait: float = MAX_WAIT_S,
        share_after: float = SHARE_AFTER_S,
        turn_share_after: float = TURN_SHARE_AFTER_S,
    ) -> None:
        self.max_wait = max_wait
        self.share_after = share_after
        self.turn_share_after = turn_share_after
        self._owner: trio.lowlevel.Task | None = None
        self._back = trio.lowlevel.ParkingLot()  # turns coming back from a wait: served first
        self._new = trio.lowlevel.ParkingLot()  # turns starting or sharing, first come first
        self._since = 0.0  # when the holder took the token
        self.gave_up = 0  # how many waits ended without the token (went on without it)
        self.shared = 0  # how many times a holder handed the token to a waiting turn

    def held(self) -> bool:
        """Whether the current task holds the token."""
        return self._owner is trio.lowlevel.current_task()

    def waiting(self) -> int:
        """How many turns wait for the token."""
        return len(self._back) + len(self._new)

    async def _take(self, *, back: bool = False) -> bool:
        task = trio.lowlevel.current_task()
        if self._owner is None and not self.waiting():
            self._owner, self._since = task, trio.current_time()
            await trio.lowlevel.cancel_shielded_checkpoint()
            return True
        with trio.move_on_after(self.max_wait):
            await (self._back if back else self._new).park()
            # the releasing turn handed the token to this one
            self._since = trio.current_time()
            return True
        self.gave_up += 1
        return False

    def _release(self) -> None:
        for lot in (self._back, self._new):
            if lot:
                (self._owner,) = lot.unpark()
                return
        self._owner = None

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold the token for a turn's work in the host (taken again after each ``away``)."""
        await self._take()
        try:
            yield
        finally:
            if self.held():
                self._release()

    async def share(self, *, whole_turn: bool = False) -> None:
        """A point between parts of a turn's work: every other task runs before this returns,
        and a turn that waits for the token gets it first when this one has held it for
        ``share_after`` (``turn_share_after`` for a share between whole parts of a turn,
        ``whole_turn``). Never cancelled here (work between two shares stays whole): it returns
        within ``max_wait``."""
        with trio.CancelScope(shield=True):
            after = self.turn_share_after if whole_turn else self.share_after
            if self.held() and self.waiting() and trio.current_time() - self._since >= after:
                self.shared += 1
                self._release()  # the first waiter has it now; this turn queues again
                await self._take()
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()

    def let_go(self) -> None:
        """Let the token go for the rest of this turn: what is left of it waits outside the
        host or is too small to queue for (a ``turn`` or ``away`` after this one does not take
        it back)."""
        if self.held():
            self._release()

    @asynccontextmanager
    async def away(self) -> AsyncIterator[None]:
        """Let the token go while waiting on something outside the host; take it again after
        (if it was held)."""
        if not self.held():
            yield
            return
        self._release()
        yield  # an error or a cancellation leaves without the token
        await self._take(back=True)
