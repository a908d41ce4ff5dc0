"""The ``mcplive`` command: ``run``, ``check``, ``history``, ``status``, ``rollback``, and the lines
it prints for failures an operator can act on.

May import: everything of the host side: :mod:`actors.host`, :mod:`actors.web`, every wing below
them, :mod:`protocol`, :mod:`store`.
Never imported by: any other module of :mod:`actors`; it stands at the top.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from typing import Any

from actors.version import moved_attribute

from .systemd import notify

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``mcplive`` command (the console script): ``argv`` as the command line gives it.

    For ``run``, a SIGHUP is dropped from this moment on, before the command's imports and the
    config load, until the host listens for it (a reload): under systemd a ``reload`` right
    after a start must not end the service, which counts a SIGHUP death as a clean exit. A
    handler that does nothing, not SIG_IGN, so that the servers it starts keep the default."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"]:
        signal.signal(signal.SIGHUP, _dropped)
        notify("STATUS=starting")
    from .command import main as command

    return command(args)


def _dropped(signum: int, frame: object) -> None:
    """A SIGHUP before the host listens for one: nothing to reload yet."""


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
