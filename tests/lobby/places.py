"""Where a publish into the lobby lands (RFC-011), and how its result says so.

A ``channels/publish`` request's ``threadId`` is honoured exactly or refused: absent is legacy
(the root, no ``threadId`` in the result); ``null`` is the root of a channel that declares a
publish target; a string is a thread of an ``exact`` channel that exists (seen on one of the
lobby's incoming messages, or declared by the ``threads`` control command). Nothing is ever
redirected. A publish *notification* carrying ``threadId`` is refused (a targeted publish must be
a request) and reported as a problem.

``channels/open`` names a channel by ``channelId`` or by ``address`` (``#general``,
``lobby:#general`` or ``general``); an address naming no lobby channel fails with -32024.

The ``publish_echo_thread`` control command makes results ``echo`` the ``threadId`` (the
default), ``omit`` it, or falsify it (``wrong``), so that a host's tests can watch it notice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.serverkit import HostRequest, MCPLServer, Publish
from protocol.errors import RpcError

ECHO_THREAD_MODES = ("echo", "omit", "wrong")
CHANNEL_OPEN_FAILED = -32024
#: threads remembered per channel, and channels with threads (past either cap: oldest dropped)
MAX_THREADS = 10_000


class Places:
    """The threads the lobby knows, and how publish results echo the place."""

    def __init__(self) -> None:
        self.threads: dict[str, dict[str, None]] = {}  # channelId: threads, oldest first
        self.echo_mode = "echo"
        self.problem: Callable[[str], None] = lambda text: None

    def note_thread(self, channel_id: Any, thread: Any) -> None:
        """A thread of a channel exists from now on (a publish may target it)."""
        if not (isinstance(channel_id, str) and isinstance(thread, str) and thread):
            return
        known = self.threads.setdefault(channel_id, {})
        known[thread] = None
        while len(known) > MAX_THREADS:
            del known[next(iter(known))]
        while len(self.threads) > MAX_THREADS:
            del self.threads[next(iter(self.threads))]

    def refusal(self, target: str | None, publish: Publish) -> str | None:
        """Why ``publish`` cannot land where it asks (None: it can)."""
        if publish.notification and publish.targeted:
            thread = publish.params.get("threadId")
            self.problem(
                f"channels/publish notification carries threadId {thread!r} (a targeted "
                "publish must be a request); refused, nothing posted"
            )
            return "a targeted publish must be a request"
        if not publish.targeted:
            return None
        if target is None:
            return "the channel declares no publish target"
        thread = publish.thread_id
        if thread is None:
            return None
        if target == "root":
            return "the channel has no threads (target root)"
        if thread not in self.threads.get(publish.channel_id, {}):
            return f"unknown thread {thread!r}"
        return None

    def echoed(self, result: dict[str, Any]) -> dict[str, Any]:
        """A delivered result as the echo mode shows it."""
        if "threadId" not in result or self.echo_mode == "echo":
            return result
        out = {k: v for k, v in result.items() if k != "threadId"}
        if self.echo_mode == "wrong":
            place = result["threadId"]
            out["threadId"] = f"{place}-wrong" if isinstance(place, str) else "wrong"
        return out

    def set_echo_mode(self, mode: Any) -> None:
        if mode not in ECHO_THREAD_MODES:
            raise ValueError(f"publish_echo_thread mode must be one of {ECHO_THREAD_MODES}")
        self.echo_mode = mode


async def open_by_address(server: MCPLServer, request: HostRequest) -> Any:
    """Answer ``channels/open``, finding the channel by its ``address`` when the request
    names no known ``channelId``."""
    params = dict(request.params)
    channel_id = params.get("channelId")
    if not (isinstance(channel_id, str) and channel_id in server.channels):
        wanted = params.get("address")
        name = wanted.removeprefix("lobby:").removeprefix("#") if isinstance(wanted, str) else None
        found = f"lobby:#{name}" if name else None
        if found not in server.channels:
            data = {"channelId": channel_id, "address": wanted, "reason": "no such lobby channel"}
            raise RpcError(code=CHANNEL_OPEN_FAILED, message="Channel open failed", data=data)
        params["channelId"] = found
    link = server.link
    if link is None:
        raise RpcError(code=CHANNEL_OPEN_FAILED, message="Channel open failed")
    return await server.host_call(link, "channels/open", params)
