"""The life of one link once its transport is open: its tasks, its handshake under a deadline,
and the server's notifications.

``LinkRun.serve`` starts the link's tasks (``actors.link.io``: writer, reader, dispatcher, the
holder of the requests that arrive before the host's policy is decided; ``actors.link.inbound``:
the responder and the skip reporter; a websocket pinger), runs the handshake
(``actors.link.handshake.LinkPolicy``) and returns when the link is closed.

The whole handshake (``initialize``, ``featureSets/update``, ``tools/list``) must finish within
the server's ``request_timeout_s``. Past it the link has failed: the server's requests still
waiting for a policy are refused (-32002) and written out, a diagnostic names the step it
waited for, and the link is closed; the connection reports it and reconnects after its backoff.
A handshake counts as work in flight (``Host.run_until_idle``) only for its first
``HANDSHAKE_WORK_S``: one still waiting on its server after that is stuck on the server, not on
the host.
"""

from __future__ import annotations

import trio

from protocol import jsonrpc as rpc

from .handshake import LinkPolicy
from .inbound import HotLanes
from .io import EARLY_WAIT_S, LinkIO
from .requests import ServerRequests
from .state import Link, LinkOwner, RequestTimeout
from .tally import SkipTally

IGNORED_REPORT_S = 10.0  # at most one line per server this often for unknown notifications
HANDSHAKE_WORK_S = EARLY_WAIT_S  # the longest a handshake counts as work in flight
DRAIN_S = 5.0  # the longest a failed handshake's refusals wait to be written


class LinkRun:
    def __init__(
        self, owner: LinkOwner, policy: LinkPolicy, lanes: HotLanes, requests: ServerRequests
    ) -> None:
        self.owner = owner
        self.policy = policy
        self.lanes = lanes
        self.io = LinkIO(owner, lanes, requests, self.on_notification)
        # notifications of methods the host does not know: the first after a quiet interval is
        # told at once, the rest summed (one line per interval, whatever the rate)
        self.ignored = SkipTally(IGNORED_REPORT_S)
        self.last_ignored = ""

    async def serve(self, link: Link) -> None:
        """Run ``link`` until it is closed (by either side, or by a failed handshake)."""
        io, owner = self.io, self.owner
        async with trio.open_nursery() as nursery:
            link.nursery = nursery
            nursery.start_soon(io.writer, link)
            nursery.start_soon(io.reader, link)
            nursery.start_soon(io.dispatcher, link)
            nursery.start_soon(io.hold_early, link)
            nursery.start_soon(self.lanes.responder, link)
            nursery.start_soon(self.lanes.skip_reporter)
            if owner.cfg.url is not None:
                nursery.start_soon(io.pinger, link)
            settled = trio.CancelScope()
            owner.work.inc()  # connecting or waiting to reconnect is not work; a handshake is
            nursery.start_soon(self._count_handshake, settled)
            try:
                await self._handshake(link)
            finally:
                settled.cancel()
                link.handshake_over.set()  # the calls that waited for it go on (or fail)
            await link.closed.wait()
            nursery.cancel_scope.cancel()

    async def _count_handshake(self, settled: trio.CancelScope) -> None:
        """Hold the handshake's unit of work until it settles, but at most
        ``HANDSHAKE_WORK_S``: past that it waits on the server, not on the host (a server
        that sits on its own request, say), and ``Host.run_until_idle`` does not wait for it."""
        try:
            with settled:
                await trio.sleep(HANDSHAKE_WORK_S)
        finally:
            self.owner.work.dec()

    async def _handshake(self, link: Link) -> None:
        """Negotiate within the deadline, then turn ready; past the deadline the link fails."""
        owner = self.owner
        deadline = owner.cfg.request_timeout_s
        try:
            with trio.fail_after(deadline):
                info = await self.policy.handshake(link)
        except (trio.TooSlowError, RequestTimeout):
            await self._failed(link, f"the handshake timed out after {deadline:g}s")
            return
        # The policy has been in force since its featureSets/update was sent (the server's
        # requests were served meanwhile); now the agents may call the server too.
        link.ready = True
        link.ready_at = trio.current_time()
        owner.link_ready()
        owner.publish_status()
        owner.trace(
            "ready",
            mcp_only=link.mcp_only,
            grant=sorted(link.grant),
            feature_sets=sorted(link.enabled_sets),
            policy=link.policy,
            tools=[t.get("name") for t in link.tools],
            server_info=info,
        )
        if link.refetch and not link.mcp_only:  # announced while the handshake ran
            self.policy.fetch_manifest(link)

    async def _failed(self, link: Link, reason: str) -> None:
        """The link will never be ready: refuse what still waits for a policy (-32002, so the
        server retries on the next link), write it out (at most ``DRAIN_S``), and close the
        link."""
        refused = await self.io.refuse_early(link)
        waiting = f" {refused} waiting request(s) refused (-32002);" if refused else ""
        self.owner.diagnostic(
            f"{reason} waiting for {link.step};{waiting} closing the link to reconnect"
        )
        link.outbox_send.close()  # what is queued is written, then the writer stops
        with trio.move_on_after(DRAIN_S):
            await link.written.wait()
        link.close(reason)

    async def refresh_tools(self, link: Link) -> None:
        """List the server's tools again, and once more if they changed meanwhile: however
        many ``tools/list_changed`` a server sends, one listing runs at a time."""
        try:
            while True:
                link.tools_stale = False
                await self.policy.list_tools(link)
                if not link.tools_stale:
                    return
        finally:
            link.tools_listing = False

    def on_notification(self, link: Link, note: rpc.Notification) -> None:
        """A notification the reader does not queue with the requests."""
        method = note.method
        if method == "notifications/tools/list_changed":
            if link.ready and link.nursery is not None:
                if link.tools_listing:  # changes during a listing make one listing more
                    link.tools_stale = True
                else:
                    link.tools_listing = True
                    link.nursery.start_soon(self.refresh_tools, link)
        elif method == "mcpl/manifestChanged":
            self.policy.on_manifest_changed(link, note.params)
        elif method == "channels/changed":  # once a policy is in force, queued in order
            self.owner.diagnostic("channels/changed dropped: no policy is in force yet")
        elif method.startswith("notifications/"):
            pass  # MCP housekeeping (progress, logging, …) is tolerated and ignored
        else:
            self.note_ignored(method)

    def note_ignored(self, method: str) -> None:
        """A notification of a method the host does not know: told at once after a quiet
        ``IGNORED_REPORT_S``, else summed and told once the interval is over."""
        now = trio.current_time()
        self.last_ignored = method
        if self.ignored.add(1, now):
            self.owner.diagnostic(f"notification {method} ignored")
        else:
            self._tell_ignored(self.ignored.take(now))

    def flush_ignored(self) -> None:
        """Tell what is still summed (the link ended)."""
        self._tell_ignored(self.ignored.flush(trio.current_time()))

    def _tell_ignored(self, n: int) -> None:
        if n:
            last = self.last_ignored
            self.owner.diagnostic(f"{n} more notifications ignored (the last: {last})")
