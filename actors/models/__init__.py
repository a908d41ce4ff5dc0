"""Model providers and what they share: the provider interface, scripted, Anthropic,
OpenAI-compatible (chat and stream), retries and the prompt cache.

May import: the root of :mod:`actors` below Host, :mod:`protocol`.
Never imported by: the root modules or :mod:`actors.serverkit`. Every other wing may use a model.
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
