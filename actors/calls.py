"""Asking a server something under a deadline, from a task that may be cancelled."""

from __future__ import annotations

import contextlib
from typing import Any

import trio

from .errors import ActorDied, MailboxFull
from .messages import Call, CancelCall


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
