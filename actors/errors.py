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


class DataDirBusy(Exception):
    """Another running host holds the data directory's lock; ``pid`` is its process id (None
    when the lock file does not say)."""

    def __init__(self, data_dir: object, pid: int | None) -> None:
        who = f"pid {pid}" if pid is not None else "another process"
        super().__init__(
            f"data_dir {data_dir} is in use by {who} (a running mcplive host); stop it, or give "
            "this host another data_dir"
        )
        self.pid = pid
