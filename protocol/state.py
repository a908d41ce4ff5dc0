"""Opaque state checkpoints and ``state/rollback`` (SPEC §8).

A tool result may carry ``state: {checkpoint, parent, data? | patch?}``. The host tracks the
checkpoints as opaque ids per lineage ``(server_id, feature_set)``: which message recorded
which checkpoint, and which checkpoint is current. Moving the conversation back to a message
means asking each affected lineage to roll back to the checkpoint in force at that message.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeGuard

import attrs

from protocol.errors import CHECKPOINT_NOT_FOUND as CHECKPOINT_NOT_FOUND

MAX_CHECKPOINT_CHARS: Final = 256
MAX_LINEAGES: Final = 1024

Lineage = tuple[str, str]
"""``(server_id, feature_set)``."""


class StateError(ValueError):
    """A ``state`` member or a rollback result is malformed; the message says how."""


def _is_checkpoint(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value) <= MAX_CHECKPOINT_CHARS


@attrs.frozen
class ToolState:
    """The ``state`` member of a tool result; the data and patch themselves are not kept."""

    checkpoint: str
    parent: str | None
    has_data: bool
    has_patch: bool


def read_tool_state(result: Any) -> ToolState | None:
    """The ``state`` of a ``tools/call`` result; None when there is none.

    ``state``, ``parent``, ``data`` and ``patch`` sent as JSON null count as absent. A
    malformed ``state`` raises :class:`StateError`.
    """
    if not isinstance(result, Mapping):
        return None
    state = result.get("state")
    if state is None:
        return None
    if not isinstance(state, Mapping):
        raise StateError("state is not an object")
    checkpoint = state.get("checkpoint")
    if not _is_checkpoint(checkpoint):
        raise StateError(
            f"state.checkpoint must be a string of 1 to {MAX_CHECKPOINT_CHARS} characters"
        )
    parent = state.get("parent")
    if parent is not None and not _is_checkpoint(parent):
        raise StateError(
            f"state.parent must be null or a string of 1 to {MAX_CHECKPOINT_CHARS} characters"
        )
    has_data = state.get("data") is not None
    has_patch = state.get("patch") is not None
    if has_data and has_patch:
        raise StateError("state carries both data and patch")
    return ToolState(checkpoint=checkpoint, parent=parent, has_data=has_data, has_patch=has_patch)


@attrs.frozen
class Recorded:
    """A checkpoint a message's tool call produced for one lineage."""

    message_id: str
    lineage: tuple[str, str]
    checkpoint: str
    parent: str | None


def rollback_targets(
    recorded: Sequence[Recorded],
    to_message: str,
    message_order: Sequence[str],
    current: Mapping[tuple[str, str], str],
) -> dict[tuple[str, str], str]:
    """The checkpoint each lineage must roll back to when the agent returns to ``to_message``.

    ``message_order`` lists the agent's message ids, oldest first; ``recorded`` is in the
    order the checkpoints were recorded. Per lineage the target is the last checkpoint
    recorded at or before ``to_message``, else the parent of the first one recorded after
    it (when that parent is a string; otherwise the lineage has nothing to go back to).
    Records of messages not in ``message_order`` are ignored. Only lineages whose target
    differs from ``current`` are returned.
    """
    position: dict[str, int] = {}
    for index, message_id in enumerate(message_order):
        position.setdefault(message_id, index)
    if to_message not in position:
        raise ValueError(f"message {to_message!r} is not in the message order")
    cut = position[to_message]
    at_or_before: dict[Lineage, tuple[tuple[int, int], str]] = {}
    after: dict[Lineage, tuple[tuple[int, int], str | None]] = {}
    for seq, rec in enumerate(recorded):
        pos = position.get(rec.message_id)
        if pos is None:
            continue
        key = (pos, seq)
        if pos <= cut:
            best = at_or_before.get(rec.lineage)
            if best is None or key > best[0]:
                at_or_before[rec.lineage] = (key, rec.checkpoint)
        else:
            first = after.get(rec.lineage)
            if first is None or key < first[0]:
                after[rec.lineage] = (key, rec.parent)
    targets: dict[Lineage, str] = {}
    for lineage in (*at_or_before, *(k for k in after if k not in at_or_before)):
        if lineage in at_or_before:
            target: str | None = at_or_before[lineage][1]
        else:
            target = after[lineage][1]
        if target is not None and target != current.get(lineage):
            targets[lineage] = target
    return targets


def rollback_params(feature_set: str, checkpoint: str) -> dict[str, Any]:
    """``state/rollback`` params."""
    return {"featureSet": feature_set, "checkpoint": checkpoint}


@attrs.frozen
class RollbackOutcome:
    """A ``state/rollback`` result; ``rolled_forward`` when the server named a new checkpoint."""

    requested: str
    checkpoint: str
    success: bool
    rolled_forward: bool
    reason: str | None


def read_rollback_result(result: Any, requested: str) -> RollbackOutcome:
    """Read a ``state/rollback`` result; a malformed one raises :class:`StateError`."""
    if not isinstance(result, Mapping):
        raise StateError("rollback result is not an object")
    checkpoint = result.get("checkpoint")
    if not _is_checkpoint(checkpoint):
        raise StateError(
            f"rollback checkpoint must be a string of 1 to {MAX_CHECKPOINT_CHARS} characters"
        )
    success = result.get("success")
    if not isinstance(success, bool):
        raise StateError("rollback success must be a boolean")
    reason = result.get("reason")
    return RollbackOutcome(
        requested=requested,
        checkpoint=checkpoint,
        success=success,
        rolled_forward=checkpoint != requested,
        reason=reason if isinstance(reason, str) else None,
    )


_SEP: Final = "\x00"


class Lineages:
    """The current checkpoint of each lineage, host-wide, for at most ``MAX_LINEAGES``.

    Recording into a full table evicts the lineage recorded least recently.
    """

    MAX_LINEAGES: Final = MAX_LINEAGES

    __slots__ = ("_current",)

    def __init__(self) -> None:
        self._current: OrderedDict[Lineage, str] = OrderedDict()  # least recently recorded first

    def __len__(self) -> int:
        return len(self._current)

    def record(self, lineage: tuple[str, str], checkpoint: str) -> None:
        """Make ``checkpoint`` current for ``lineage``.

        ValueError for a server id that is empty or holds NUL, or a checkpoint outside
        1..``MAX_CHECKPOINT_CHARS`` characters.
        """
        server_id = lineage[0]
        if not server_id or _SEP in server_id:
            raise ValueError("a server id must be non-empty and free of NUL")
        if not _is_checkpoint(checkpoint):
            raise ValueError(f"a checkpoint has 1 to {MAX_CHECKPOINT_CHARS} characters")
        self._current.pop(lineage, None)
        self._current[lineage] = checkpoint
        while len(self._current) > MAX_LINEAGES:
            self._current.popitem(last=False)

    def current(self, lineage: tuple[str, str]) -> str | None:
        return self._current.get(lineage)

    def forget_server(self, server_id: str) -> None:
        for lineage in [k for k in self._current if k[0] == server_id]:
            del self._current[lineage]

    def to_state(self) -> dict[str, str]:
        """``{"<server>\\u0000<featureSet>": checkpoint}``, least recently recorded first."""
        return {f"{s}{_SEP}{fs}": cp for (s, fs), cp in self._current.items()}

    @classmethod
    def from_state(cls, value: Any) -> Lineages:
        """The table :meth:`to_state` produced; malformed entries are skipped."""
        table = cls()
        if not isinstance(value, Mapping):
            return table
        for key, checkpoint in value.items():
            if not isinstance(key, str) or not _is_checkpoint(checkpoint):
                continue
            server_id, sep, feature_set = key.partition(_SEP)
            if not sep or not server_id:
                continue
            table.record((server_id, feature_set), checkpoint)
        return table
