"""The trio runtime of mcplive."""

from .host import Host

__all__ = ["Host"]
