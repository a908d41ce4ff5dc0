"""Bulk content references (RFC-005): the registry actor and the HTTP fetcher.

Owns every reference the host has seen, bound to the servers that delivered it, their claims,
the per-server fetch budgets, and fetching the bytes (with the right server's credentials only).

May import: the root of :mod:`actors` below Host, :mod:`protocol`, :mod:`store`.
Never imported by: the root modules, :mod:`actors.models`, :mod:`actors.transcript` or
:mod:`actors.serverkit`.
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
