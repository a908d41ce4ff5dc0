"""The ``conversationId`` the host sends for an agent.

One agent is one conversation that persists across its turns, so every message that names a
conversation (``channels/publish``, ``channels/outgoing/chunk`` and ``complete``, the context
hooks, ``inference/lifecycle``) carries the same value, made here.
"""

from __future__ import annotations

__all__ = ["conversation_id"]


def conversation_id(agent: str) -> str:
    """The ``conversationId`` of ``agent``'s conversation: ``"agent:<name>"``."""
    return f"agent:{agent}"
