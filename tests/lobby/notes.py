"""``lobby.notes`` (``--notes``): a shared notebook whose every note is a checkpoint to roll back
to, declared on the lobby (:mod:`tests.lobby.server`).

The ``note`` tool adds a note and returns the notebook, with the new checkpoint in the result's
``state``; ``state/rollback`` goes back to a checkpoint. How (the ``rollback_mode`` control
command): ``exact`` (the default) makes that checkpoint current; ``forward`` makes a new
checkpoint, a child of it holding its notes, and answers with the new name. Each change is
reported as a ``notes`` event {current, parent, notes, cause} where a control link listens.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Mapping
from typing import Any

from actors.serverkit import CheckpointNotFound, MCPLServer, Rollback, ToolError, ToolResult

ROLLBACK_MODES = ("exact", "forward")


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


class Notebook:
    """The checkpoint tree: each checkpoint's parent and notes, and the current one."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, tuple[str | None, tuple[str, ...]]] = {}
        self.current: str | None = None
        self.mode = "exact"
        self.emit: Callable[[dict[str, Any]], None] = lambda event: None
        self._numbers = itertools.count(1)

    def notes_at(self, name: str | None) -> tuple[str, ...]:
        return self.checkpoints[name][1] if name is not None else ()

    def _new(self, parent: str | None, notes: tuple[str, ...], cause: str) -> str:
        name = f"cp-{next(self._numbers)}"
        self.checkpoints[name] = (parent, notes)
        self.current = name
        self._changed(cause)
        return name

    def _changed(self, cause: str) -> None:
        current = self.current
        parent = self.checkpoints[current][0] if current is not None else None
        notes = list(self.notes_at(current))
        _log(f"notebook at {current} (parent {parent}, {cause}): {notes}")
        self.emit(
            {"event": "notes", "current": current, "parent": parent, "notes": notes, "cause": cause}
        )

    def set_mode(self, mode: Any) -> None:
        if mode not in ROLLBACK_MODES:
            raise ValueError(f"rollback_mode must be one of {ROLLBACK_MODES}")
        self.mode = mode
        _log(f"state/rollback mode: {mode}")
        self.emit({"event": "rollback_mode", "mode": mode})

    def add_to(self, server: MCPLServer) -> None:
        """Declare ``lobby.notes``, the ``note`` tool and the rollback handler on ``server``."""
        server.feature_set(
            "lobby.notes",
            description="A shared lobby notebook; every note is a checkpoint to roll back to.",
            uses=["tools"],
            rollback=True,
        )

        @server.tool()
        async def note(text: str) -> ToolResult:  # async: in trio, not a worker thread
            """Add a note to the lobby notebook; returns the notebook"""
            if not text.strip():
                raise ToolError("note needs a text")
            parent = self.current
            notes = (*self.notes_at(parent), text)
            name = self._new(parent, notes, "note")
            state: Mapping[str, Any] = {
                "checkpoint": name,
                "parent": parent,
                "data": {"notes": list(notes)},
            }
            return ToolResult(
                content=[{"type": "text", "text": "notes: " + "; ".join(notes)}], state=state
            )

        @server.on_rollback
        def rollback(request: Rollback) -> str:
            target = self.checkpoints.get(request.checkpoint)
            if target is None:
                _log(f"state/rollback to unknown checkpoint {request.checkpoint!r}")
                raise CheckpointNotFound(request.checkpoint)
            if self.mode == "forward":
                name = self._new(request.checkpoint, target[1], "rollback")
                _log(f"state/rollback to {request.checkpoint}: forward, as {name}")
                return name
            self.current = request.checkpoint
            _log(f"state/rollback to {request.checkpoint}: exact")
            self._changed("rollback")
            return request.checkpoint
