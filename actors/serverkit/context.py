"""Context hooks, inference and state of the server toolkit: the values authors see.

- :class:`BeforeInference` is one ``context/beforeInference`` call (SPEC §10.1); a hook returns
  nothing (observe only), a string (one ``beforeUser`` injection) or a list of
  :class:`Injection`. Injections are deprecated by RFC-010 but still applied by 0.5 hosts.
- :class:`Lifecycle` is one ``inference/lifecycle`` notice (started, completed, aborted,
  failed); it replaces 0.4's ``context/afterInference``, which 0.5 removed.
- :class:`InferenceResult` is the host's answer to ``inference/request`` (SPEC §11).
- :class:`Render` is a ``push/render`` request for a batch of deferred notices (RFC-006).
- :class:`Rollback` is a ``state/rollback`` request (SPEC §8.5); a handler returns True (rolled
  back to it), a checkpoint id (rolled forward to a new one), or raises
  :class:`CheckpointNotFound`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from protocol.errors import CHECKPOINT_NOT_FOUND, INVALID_PARAMS, RpcError

__all__ = [
    "BeforeInference",
    "CheckpointNotFound",
    "InferenceResult",
    "Injection",
    "Lifecycle",
    "Render",
    "Rollback",
    "injections_of",
]

POSITIONS: Final = ("system", "beforeUser", "afterUser")
PHASES: Final = ("started", "completed", "aborted", "failed")


@attrs.frozen(kw_only=True)
class BeforeInference:
    """The host is about to run an inference for one agent's conversation."""

    inference_id: str
    conversation_id: str | None
    turn_index: int | None
    user_message: str | None
    model: Mapping[str, Any] | None
    channels: Mapping[str, Any] | None
    params: Mapping[str, Any] = attrs.field(factory=dict, repr=False)

    @property
    def agent(self) -> str | None:
        """The agent's name, from a ``conversationId`` of ``"agent:<name>"``."""
        cid = self.conversation_id
        return cid.removeprefix("agent:") if cid and cid.startswith("agent:") else None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> BeforeInference:
        """Read ``context/beforeInference`` params; ``-32602`` without an ``inferenceId``."""
        iid = params.get("inferenceId")
        if not isinstance(iid, str) or not iid:
            raise RpcError(code=INVALID_PARAMS, message="inferenceId must be a non-empty string")
        conv, turn, user = (params.get(k) for k in ("conversationId", "turnIndex", "userMessage"))
        model, chans = params.get("model"), params.get("channels")
        return cls(
            inference_id=iid,
            conversation_id=conv if isinstance(conv, str) else None,
            turn_index=turn if type(turn) is int else None,
            user_message=user if isinstance(user, str) else None,
            model=model if isinstance(model, Mapping) else None,
            channels=chans if isinstance(chans, Mapping) else None,
            params=params,
        )


@attrs.frozen(kw_only=True)
class Injection:
    """One context injection: where it goes and what it says.

    ``position`` is ``"system"`` (appended to the system prompt), ``"beforeUser"`` (a message
    just before the newest user message) or ``"afterUser"`` (just after it). Each is fresh for one
    inference and never stored. ``namespace`` labels it: the agent sees ``[context from
    <server> · <namespace>]`` above it (a label only: it authorizes nothing)."""

    content: str | Sequence[Mapping[str, Any]]
    position: str = "beforeUser"
    namespace: str = "main"

    def __attrs_post_init__(self) -> None:
        if self.position not in POSITIONS:
            raise ValueError(
                f"position must be one of {', '.join(POSITIONS)}, not {self.position!r}"
            )

    def to_wire(self) -> dict[str, Any]:
        """The ``contextInjections`` entry."""
        content: Any = (
            self.content if isinstance(self.content, str) else [dict(b) for b in self.content]
        )
        return {"namespace": self.namespace, "position": self.position, "content": content}


def injections_of(value: Any) -> list[dict[str, Any]]:
    """A hook's return value as ``contextInjections`` (an observer's ``None`` is ``[]``)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [Injection(content=value).to_wire()]
    if isinstance(value, Injection):
        return [value.to_wire()]
    if isinstance(value, Sequence) and all(isinstance(v, Injection) for v in value):
        return [v.to_wire() for v in value]
    raise TypeError("a beforeInference hook returns None, a string or a list of Injection")


@attrs.frozen(kw_only=True)
class Lifecycle:
    """One ``inference/lifecycle`` notice (metadata only, never content)."""

    inference_id: str
    conversation_id: str | None
    phase: str
    turn_index: int | None = None
    usage: Mapping[str, Any] | None = None
    params: Mapping[str, Any] = attrs.field(factory=dict, repr=False)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Lifecycle | None:
        """Read the notice; None when it is malformed."""
        iid, phase = params.get("inferenceId"), params.get("phase")
        if not isinstance(iid, str) or phase not in PHASES:
            return None
        conv, turn, usage = (params.get(k) for k in ("conversationId", "turnIndex", "usage"))
        return cls(
            inference_id=iid,
            conversation_id=conv if isinstance(conv, str) else None,
            phase=phase,
            turn_index=turn if type(turn) is int else None,
            usage=usage if isinstance(usage, Mapping) else None,
            params=params,
        )


@attrs.frozen(kw_only=True)
class InferenceResult:
    """The host's answer to ``inference/request``; ``chunks`` holds streamed deltas in order."""

    content: str
    model: str | None
    finish_reason: str | None
    usage: Mapping[str, Any] | None
    chunks: tuple[str, ...] = ()

    @classmethod
    def from_result(cls, result: Any, chunks: Sequence[str]) -> InferenceResult:
        """Read the result (a malformed one reads as empty content)."""
        r = result if isinstance(result, Mapping) else {}
        content, model, finish, usage = (
            r.get(k) for k in ("content", "model", "finishReason", "usage")
        )
        return cls(
            content=content if isinstance(content, str) else "",
            model=model if isinstance(model, str) else None,
            finish_reason=finish if isinstance(finish, str) else None,
            usage=usage if isinstance(usage, Mapping) else None,
            chunks=tuple(chunks),
        )


@attrs.frozen(kw_only=True)
class Render:
    """The host asks for the content of a batch of deferred notices (RFC-006 ``push/render``):
    the notices pushed with ``coalesce={"key": ..., "deferred": True}`` under one key, oldest
    first, each ``{"eventId", "timestamp", "data"?}``; ``dropped`` counts older ones left out."""

    feature_set: str
    key: str
    event_id: str
    notices: tuple[Mapping[str, Any], ...]
    dropped: int = 0
    channel_id: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Render:
        """Read ``push/render`` params; ``-32602`` when malformed."""
        fs, key, eid = params.get("featureSet"), params.get("key"), params.get("eventId")
        notices, dropped, cid = (
            params.get("notices"),
            params.get("dropped"),
            params.get("channelId"),
        )
        if not (isinstance(fs, str) and isinstance(key, str) and isinstance(eid, str)):
            raise RpcError(
                code=INVALID_PARAMS, message="featureSet, key and eventId must be strings"
            )
        if not isinstance(notices, list) or not all(isinstance(n, Mapping) for n in notices):
            raise RpcError(code=INVALID_PARAMS, message="notices must be an array of objects")
        return cls(
            feature_set=fs,
            key=key,
            event_id=eid,
            notices=tuple(notices),
            dropped=dropped if type(dropped) is int else 0,
            channel_id=cid if isinstance(cid, str) else None,
        )


class CheckpointNotFound(Exception):
    """Raised by a rollback handler: the host gets ``-32005`` naming the checkpoint."""


@attrs.frozen(kw_only=True)
class Rollback:
    """The host asks to return a feature set's state to a checkpoint."""

    feature_set: str
    checkpoint: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Rollback:
        """Read ``state/rollback`` params; ``-32602`` when malformed."""
        fs, cp = params.get("featureSet"), params.get("checkpoint")
        if not isinstance(fs, str) or not isinstance(cp, str) or not cp:
            raise RpcError(code=INVALID_PARAMS, message="featureSet and checkpoint must be strings")
        return cls(feature_set=fs, checkpoint=cp)


def checkpoint_not_found(checkpoint: str) -> RpcError:
    """The ``-32005`` refusal of an unknown or pruned checkpoint."""
    return RpcError(code=CHECKPOINT_NOT_FOUND, data={"checkpoint": checkpoint})
