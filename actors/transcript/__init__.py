"""What the host did, as lines for a person: the transcript of trace events and the printing of
it (level filter, redaction, repeat collapsing, plain, styled or JSON), and a stored message as
one line. The terminal (:mod:`actors.cli`) and the console (:mod:`actors.web`) both show it.

May import: :mod:`actors.models` (usage figures), the root of :mod:`actors` below Host,
:mod:`protocol`.
Never imported by: the root modules, :mod:`actors.models` or :mod:`actors.serverkit`.
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
