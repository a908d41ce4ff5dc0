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


class StaleFence(StoreError):
    """An op's fence was stale: ``holder`` no longer holds ``resource`` under ``epoch`` (another
    host took it under a later epoch, it was released, or it expired). Nothing of the op was
    stored; the other ops of its batch were applied as usual. The holder should stop acting for
    ``resource`` (its next lease step says what it holds)."""

    def __init__(self, resource: str, holder: str, epoch: int) -> None:
        super().__init__(
            f"write for {resource} refused: epoch {epoch} of {holder} is stale (not the"
            " current lease); nothing of it was stored"
        )
        self.resource = resource
        self.holder = holder
        self.epoch = epoch

    def __reduce__(self) -> tuple[object, ...]:
        return StaleFence, (self.resource, self.holder, self.epoch)
