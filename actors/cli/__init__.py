"""The ``mcplive`` command: ``run``, ``check``, ``history``, ``status``, ``rollback``, and the lines
it prints for failures an operator can act on.

May import: everything of the host side: :mod:`actors.host`, :mod:`actors.web`, every wing below
them, :mod:`protocol`, :mod:`store`.
Never imported by: any other module of :mod:`actors`; it stands at the top.
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute

from .main import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
