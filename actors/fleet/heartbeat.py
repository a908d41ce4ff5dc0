"""A host's heartbeat into the ``hosts`` table of a PostgreSQL store (:mod:`store.leases`).

One thread of its own, with a connection of its own, beats every :data:`HEARTBEAT_S` seconds:
the database is never waited for on the host's loop. A failed beat is one transcript line
(``heartbeat-failed``) per streak of failures, and the next beat tries again on a new connection.
On a clean stop the thread marks the host leaving (:meth:`~store.leases.LeaseTable.leaving`);
the stop waits for that at most :data:`LEAVE_S` seconds. It lets go of no lease: the lease
keeper does, once the agents it ran have stopped (a lease let go before then could be taken
while one of its turns still runs here).
"""

from __future__ import annotations

import threading

import trio

from store.dbapi import describe
from store.leases import LeaseTable

from ..context import HostContext

#: Seconds between two heartbeats.
HEARTBEAT_S = 5.0
#: Seconds a clean stop waits for the heartbeat thread to mark the host leaving.
LEAVE_S = 5.0


class Heartbeat:
    """The heartbeat of the host of ``ctx`` into the store at ``dsn``, every ``every`` seconds;
    :meth:`run` runs it until cancelled."""

    def __init__(self, ctx: HostContext, dsn: str, *, every: float | None = None) -> None:
        self.ctx = ctx
        self.dsn = dsn
        self.every = HEARTBEAT_S if every is None else every
        self.beats = 0  # heartbeats recorded (read on the loop; written by the thread)
        self.failures = 0  # heartbeats that failed
        self._failing = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        token = trio.lowlevel.current_trio_token()
        stop = threading.Event()
        thread = threading.Thread(
            target=self._loop, args=(token, stop), name="mcplive-heartbeat", daemon=True
        )
        thread.start()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            stop.set()
            # bounded by the join's own timeout (a trio deadline would fire at once on an
            # autojumping test clock); a thread still stuck is a daemon, left behind
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(thread.join, LEAVE_S)

    def _loop(self, token: trio.lowlevel.TrioToken, stop: threading.Event) -> None:
        host_id = self.ctx.host_id
        table: LeaseTable | None = None
        try:
            while not stop.is_set():
                try:
                    if table is None:
                        table = LeaseTable(self.dsn)
                    table.heartbeat(host_id)
                except Exception as exc:  # one line, and the next beat tries again
                    if table is not None:
                        table.close()
                        table = None
                    self.failures += 1
                    self._tell(token, str(exc) or type(exc).__name__)
                else:
                    self.beats += 1
                    self._tell(token, None)
                stop.wait(self.every)
            if table is None and self.beats:
                table = LeaseTable(self.dsn)  # the last beat failed: one try to say goodbye
            if table is not None:
                table.leaving(host_id)
        except Exception as exc:
            self._tell(token, f"could not mark the host leaving: {exc}")
        finally:
            if table is not None:
                table.close()

    def _tell(self, token: trio.lowlevel.TrioToken, error: str | None) -> None:
        try:
            trio.from_thread.run_sync(self._told, error, trio_token=token)
        except (trio.RunFinishedError, trio.Cancelled):
            pass

    def _told(self, error: str | None) -> None:
        """On the host's loop, after each beat: a failure is one line per streak of failures."""
        if error is not None and not self._failing:
            self.ctx.trace.emit(
                "heartbeat-failed", data={"store": describe(self.dsn), "error": error}
            )
        self._failing = error is not None
