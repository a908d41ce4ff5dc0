"""The operator console: its HTTP server, JSON API, authentication, live feed and static page.

May import: :mod:`actors.host`, every wing below it (the transcript, the agent's drafts),
:mod:`protocol`, :mod:`store`.
Never imported by: anything but :mod:`actors.cli` (``mcplive run --web`` starts it).
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
