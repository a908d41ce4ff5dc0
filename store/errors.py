"""Errors raised by the store."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every store failure; also the per-op failure handed to a ``done`` callback."""


class StoreFull(StoreError):
    """The writer queue holds its maximum number of waiting ops; the caller should back off."""


class StoreClosed(StoreError):
    """The writer, database or reader has been closed."""


class CorruptRecord(StoreError):
    """A stored value could not be decoded."""
