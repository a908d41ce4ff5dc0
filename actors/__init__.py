"""The trio runtime of mcplive."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .version import install_moved_modules

if TYPE_CHECKING:
    from .host import Host

__all__ = ["Host"]

install_moved_modules()  # old module names (``actors.cli_history``) import for one release


def __getattr__(name: str) -> Any:
    # the host loads on first use, so a server built on the toolkit starts without it
    if name == "Host":
        from .host import Host

        return Host
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
