"""The agent actor and its turn: wakes, the gate, history, speech, tools, hooks, folding, recall.

Owns everything one agent does: which wakes start a turn, the context it sends the model (within
its token budget, older spans folded into summaries), the model call, the tools it runs, where
its speech goes, its drafts, rollback, and server-initiated inference routing.

May import: :mod:`actors.channel`, :mod:`actors.link`, :mod:`actors.references`,
:mod:`actors.models`, the root of :mod:`actors` below Host, :mod:`protocol`, :mod:`store`.
Never imported by: any other wing but :mod:`actors.leasing`, :mod:`actors.cli` and
:mod:`actors.web`; only :mod:`actors.host` and the lease keeper above it build agents.
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
