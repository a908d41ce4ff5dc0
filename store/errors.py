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


class StoreDamaged(StoreError):
    """The store's file cannot be read as a store: damaged, truncated, or some other file.

    ``path`` is the file and ``detail`` what SQLite (or the schema check) said."""

    def __init__(self, path: object, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail
