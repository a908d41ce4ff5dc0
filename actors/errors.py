"""Errors of the actor runtime."""

from __future__ import annotations


class ActorDied(Exception):
    """The actor stopped before it answered."""


class MailboxFull(Exception):
    """``tell_nowait`` found the mailbox at its cap."""


class AskTimeout(TimeoutError):
    """An ``ask`` got no answer before its deadline."""


class ConfigError(ValueError):
    """A configuration problem; the message is one line naming the key and the fix."""


class NotConnected(Exception):
    """The server is not connected (or not ready) right now."""
