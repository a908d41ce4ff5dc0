"""The channel actors: one per (server, channel id), and the host-wide coalescer (RFC-006).

Owns what a channel freezes of each item (its source envelope, header, marked body, digests),
publishing into a channel and its receipts, and coalesced items on their way to the store.

May import: :mod:`actors.link` (to call a server), :mod:`actors.references`,
:mod:`actors.models`, the root of :mod:`actors` below Host, :mod:`protocol`, :mod:`store`.
Never imported by: :mod:`actors.link` or anything below it, or :mod:`actors.serverkit`.
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
