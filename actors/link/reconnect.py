"""Reconnecting a server when the operator asks (the console's *reconnect* action).

A connection waits out its backoff between links in :meth:`ReconnectSwitch.wait`; a request
(:meth:`ReconnectSwitch.request`) closes the link in force, if there is one, and cuts the next
wait short, so a new link is dialled at once. Requests while one is already pending count once.

The connection asks :meth:`ReconnectSwitch.ended_by_request` when a link has ended: a link a
request closed is reported as the operator's doing (``disconnected`` with ``requested``: no
failure, no stderr lines, not counted as a failed attempt), and while a request is
:attr:`~ReconnectSwitch.pending` the wait reported is none, as it is.
"""

from __future__ import annotations

from typing import Any

import trio

#: Why the link ended, as the ``disconnected`` event reports it.
REASON = "the operator asked for a reconnect"


class ReconnectSwitch:
    def __init__(self) -> None:
        self._now = trio.Event()
        self._closed_one = False  # a request closed the link in force

    def request(self, link: Any) -> str:
        """Ask for a new link now; ``link`` is the one in force (None between links). The
        answer: ``"closing"`` (a link was ended) or ``"dialling"`` (the backoff is cut short)."""
        self._now.set()
        if link is not None and not link.closed.is_set():
            link.close(REASON)
            self._closed_one = True
            return "closing"
        return "dialling"

    @property
    def pending(self) -> bool:
        """Whether a request waits: the next :meth:`wait` returns at once."""
        return self._now.is_set()

    def ended_by_request(self) -> bool:
        """Whether the link that just ended was closed by a request (told once per link)."""
        closed, self._closed_one = self._closed_one, False
        return closed

    async def wait(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or less if a reconnect was asked for meanwhile (or before)."""
        with trio.move_on_after(delay):
            await self._now.wait()
        self._now = trio.Event()
