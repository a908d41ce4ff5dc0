"""Context hooks and inference lifecycle (SPEC §10, §14.4; RFC-010).

``context/beforeInference`` goes to every server granted ``…observe`` or any ``…inject.*``
path; only observers see the user's message. Each returned injection is authorized on its
own, by its own ``position``, against the grant passed in (the one in force when the answer
arrived); the answer's ``featureSet`` and each ``namespace`` never authorize anything.
Injection is deprecated (RFC-010) but authorized injections are still applied in 0.5.

``inference/lifecycle`` carries ids, phase, and optionally model and usage: never content.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from protocol.content import ContentError, convert_blocks

OBSERVE: Final = "contextHooks.beforeInference.observe"
POSITIONS: Final = ("system", "beforeUser", "afterUser")
_INJECT_PREFIX: Final = "contextHooks.beforeInference.inject."

#: At most this many ``contextInjections`` entries of one answer are read.
MAX_INJECTIONS: Final = 64


def inject_path(position: str) -> str:
    """The capability path that authorizes an injection at ``position``."""
    return _INJECT_PREFIX + position


_INJECT_PATHS: Final = tuple(inject_path(p) for p in POSITIONS)


def hook_role(grant: Collection[str]) -> str | None:
    """``"observe"``, ``"inject-only"``, or None when the server gets no hook call."""
    if OBSERVE in grant:
        return "observe"
    if any(p in grant for p in _INJECT_PATHS):
        return "inject-only"
    return None


@attrs.frozen
class ModelInfo:
    """The model an inference runs on (SPEC §12)."""

    id: str
    vendor: str
    context_window: int
    capabilities: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "vendor": self.vendor,
            "contextWindow": self.context_window,
            "capabilities": list(self.capabilities),
        }


def channel_context(
    *,
    incoming: tuple[str, str | None, str | None] | None,
    default_outgoing: str | None,
    candidates: Sequence[str],
) -> dict[str, Any] | None:
    """The ``channels`` member of ``context/beforeInference`` (SPEC §14.4).

    ``incoming`` is ``(channel_id, message_id, thread_id)``. Absent members and None
    sub-members are omitted; None when nothing is left.
    """
    out: dict[str, Any] = {}
    if incoming is not None:
        channel_id, message_id, thread_id = incoming
        edge: dict[str, Any] = {"channelId": channel_id}
        if message_id is not None:
            edge["messageId"] = message_id
        if thread_id is not None:
            edge["threadId"] = thread_id
        out["incoming"] = edge
    if default_outgoing is not None:
        out["defaultOutgoing"] = {"channelId": default_outgoing}
    if candidates:
        out["candidates"] = list(candidates)
    return out or None


def before_inference_params(
    *,
    inference_id: str,
    conversation_id: str,
    turn_index: int,
    user_message: str | None,
    observe: bool,
    model: ModelInfo,
    channels: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """``context/beforeInference`` params; ``userMessage`` is null unless ``observe``."""
    params: dict[str, Any] = {
        "inferenceId": inference_id,
        "conversationId": conversation_id,
        "turnIndex": turn_index,
        "userMessage": user_message if observe else None,
        "model": model.to_wire(),
    }
    if channels is not None:
        params["channels"] = dict(channels)
    return params


@attrs.frozen
class Injection:
    """One authorized injection, its content converted to stored blocks."""

    server_id: str
    namespace: str
    position: str
    blocks: tuple[dict[str, Any], ...]
    metadata: Mapping[str, Any] | None


@attrs.frozen
class Dropped:
    """An injection left out and why; ``index`` is -1 for a problem with the whole answer."""

    index: int
    position: Any
    reason: str


@attrs.frozen
class HookAnswer:
    injections: tuple[Injection, ...]
    dropped: tuple[Dropped, ...]


_EMPTY: Final = HookAnswer(injections=(), dropped=())


def _whole(reason: str) -> HookAnswer:
    return HookAnswer(injections=(), dropped=(Dropped(-1, None, reason),))


def _read_entry(entry: Any, server_id: str, grant: Collection[str]) -> Injection | str:
    """The injection, or why it is dropped."""
    if not isinstance(entry, Mapping):
        return "injection is not an object"
    namespace = entry.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        return "namespace must be a non-empty string"
    position = entry.get("position")
    if not isinstance(position, str) or position not in POSITIONS:
        return f"position must be one of {', '.join(POSITIONS)}"
    if inject_path(position) not in grant:
        return f"capability denied: {inject_path(position)}"
    if "content" not in entry:
        return "content is required"
    content = entry["content"]
    if isinstance(content, str):
        # Wrapped so the text-length limit applies to the string form too.
        content = [{"type": "text", "text": content}]
    elif not isinstance(content, list):
        return "content must be a string or an array of content blocks"
    if not content:
        return "content is empty"
    try:
        blocks = convert_blocks(content, server_id, "injection")
    except ContentError as exc:
        return str(exc)
    metadata = entry.get("metadata")
    return Injection(
        server_id=server_id,
        namespace=namespace,
        position=position,
        blocks=tuple(blocks),
        metadata=dict(metadata) if isinstance(metadata, Mapping) else None,
    )


def read_hook_result(result: Any, server_id: str, grant: Collection[str]) -> HookAnswer:
    """Read a ``context/beforeInference`` result; never raises for bad input.

    Each entry of ``contextInjections`` is kept or dropped on its own. Authorization is by
    the entry's ``position`` against ``grant`` only. Entries past :data:`MAX_INJECTIONS`
    are dropped.
    """
    if not isinstance(result, Mapping):
        return _whole("result is not an object")
    entries = result.get("contextInjections")
    if entries is None:
        return _EMPTY
    if not isinstance(entries, list):
        return _whole("contextInjections is not an array")
    kept: list[Injection] = []
    dropped: list[Dropped] = []
    for index, entry in enumerate(entries):
        position = entry.get("position") if isinstance(entry, Mapping) else None
        if index >= MAX_INJECTIONS:
            dropped.append(Dropped(index, position, f"over the cap of {MAX_INJECTIONS} injections"))
            continue
        read = _read_entry(entry, server_id, grant)
        if isinstance(read, str):
            dropped.append(Dropped(index, position, read))
        else:
            kept.append(read)
    return HookAnswer(injections=tuple(kept), dropped=tuple(dropped))


def group_by_position(injections: Iterable[Injection]) -> dict[str, tuple[Injection, ...]]:
    """Injections by position, every position a key, the given order kept within each.

    An injection whose position is not one of :data:`POSITIONS` is left out.
    """
    groups: dict[str, list[Injection]] = {p: [] for p in POSITIONS}
    for injection in injections:
        groups.setdefault(injection.position, []).append(injection)
    return {p: tuple(groups[p]) for p in POSITIONS}


# -- inference/lifecycle ------------------------------------------------------------------

PHASES: Final = ("started", "completed", "aborted", "failed")
TERMINALS: Final = frozenset(PHASES[1:])


def lifecycle_params(
    *,
    phase: str,
    inference_id: str,
    conversation_id: str,
    turn_index: int,
    model: ModelInfo | None,
    model_granted: bool,
    usage: tuple[int, int] | None,
) -> dict[str, Any]:
    """``inference/lifecycle`` params (SPEC §10.5).

    ``model`` only when ``modelInfo`` is granted; ``usage`` (input, output tokens) only on
    ``completed``. Never any content.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown lifecycle phase {phase!r}")
    params: dict[str, Any] = {
        "inferenceId": inference_id,
        "conversationId": conversation_id,
        "turnIndex": turn_index,
        "phase": phase,
    }
    if model_granted and model is not None:
        params["model"] = model.to_wire()
    if phase == "completed" and usage is not None:
        input_tokens, output_tokens = usage
        params["usage"] = {"inputTokens": input_tokens, "outputTokens": output_tokens}
    return params
