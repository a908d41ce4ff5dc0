"""Talking to a server through its ConnectionActor: a request under a deadline, from a task
that may be cancelled, and a best-effort notification that never waits."""

from __future__ import annotations

import contextlib
from typing import Any

import trio

from actors.context import HostContext
from actors.errors import ActorDied, MailboxFull
from actors.messages import Call, CancelCall, Notify


class NoAnswer(TimeoutError):
    """The server did not answer within the deadline."""


async def call_within(ref: Any, call: Call, deadline: float) -> Any:
    """Ask a ConnectionActor (``ref``) for ``call`` and wait at most ``deadline`` seconds.

    If the wait ends early (the asker is cancelled, or the deadline passes) and the call has a
    ``key``, the connection is told to stop waiting, so the server hears
    ``notifications/cancelled``. Raises :class:`NoAnswer` at the deadline; any other failure as
    the ask raised it.
    """
    with trio.move_on_after(deadline):
        try:
            return await ref.ask(call, timeout=deadline)
        except trio.Cancelled:
            if call.key is not None:
                with contextlib.suppress(MailboxFull, ActorDied):
                    ref.tell_nowait(CancelCall(key=call.key))
            raise
    raise NoAnswer(f"no answer in {deadline:g}s")


def notify(ctx: HostContext, server_id: str, method: str, params: Any) -> bool | None:
    """Hand a notification to the server's connection without waiting (it is sent if the server
    is ready). True when queued; False when the connection refused it (its mailbox is full or
    it stopped); None when the host has no connection to that server."""
    ref = ctx.connections.get(server_id)
    if ref is None:
        return None
    try:
        ref.tell_nowait(Notify(method=method, params=params))
    except (MailboxFull, ActorDied):
        return False
    return True
