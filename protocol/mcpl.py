"""MCPL handshake pieces: manifests, the advertisement walk, the default grant, feature sets.

Pure functions over the JSON values ``json.loads`` returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from protocol.coalesce import Advertisement

PROTOCOL_VERSION = "2024-11-05"
MCPL_VERSION = "0.5"

#: The closed capability vocabulary (SPEC §6.2).
VOCABULARY: frozenset[str] = frozenset(
    {
        "pushEvents",
        "tools",
        "modelInfo",
        "inferenceRequest",
        "inferenceRequest.streaming",
        "inferenceLifecycle",
        "contextHooks.beforeInference.observe",
        "contextHooks.beforeInference.inject.system",
        "contextHooks.beforeInference.inject.beforeUser",
        "contextHooks.beforeInference.inject.afterUser",
        "channels.register",
        "channels.lifecycle",
        "channels.publish",
        "channels.incoming",
        "channels.streaming",
        "channels.acknowledge",
        "channels.typing",
    }
)

#: Denied unless the operator grants it: the most consequential capability (SPEC §13.4).
DENIED_BY_DEFAULT: frozenset[str] = frozenset({"contextHooks.beforeInference.inject.system"})


#: The RFC-006 coalescing this host implements: plain replacement and retraction on both lanes
#: and channel-scoped pushes, and deferred batches rendered through ``push/render``.
HOST_COALESCING = Advertisement()


def host_manifest() -> dict[str, Any]:
    """What this host implements, advertised under ``capabilities.experimental.mcpl``."""
    return {
        "version": MCPL_VERSION,
        "pushEvents": True,
        "channels": {
            "register": True,
            "publish": True,
            "incoming": True,
            "lifecycle": True,
            "streaming": True,
            "typing": True,
        },
        "featureSets": True,
        "eventCoalescing": HOST_COALESCING.to_wire(),
    }


def initialize_params(client_version: str) -> dict[str, Any]:
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "capabilities": {"experimental": {"mcpl": host_manifest()}},
        "clientInfo": {"name": "mcplive", "version": client_version},
    }


def _covered(prefix: str) -> set[str]:
    dotted = prefix + "."
    return {p for p in VOCABULARY if p == prefix or p.startswith(dotted)}


#: The 0.4 name (``channels: {observe: true}``, ``uses: ["channels.observe"]``) of the server's
#: channel messages to the host, which 0.5 calls ``channels.incoming`` (RFC-002 renamed it:
#: ``channels/incoming`` is content injection, not observation). A 0.4 server such as
#: mcpl-editor still sends it; it is read as the 0.5 path, with a diagnostic for the uses.
OBSERVE_04 = "observe"
INCOMING = "channels.incoming"
OBSERVE_PATH_04 = "channels.observe"


def advertised_paths(manifest: Any, mcp_capabilities: Any = None) -> frozenset[str]:
    """The recursive advertisement walk (SPEC §5.1).

    ``true`` covers every vocabulary leaf beneath its node; an object is descended into and also
    advertises its own node when that node is a path; anything else covers nothing. ``tools``
    comes only from MCP's outer ``capabilities.tools``. A 0.4 ``channels.observe: true``
    advertises ``channels.incoming`` (:data:`OBSERVE_04`).
    """
    found: set[str] = set()

    def walk(prefix: str, value: Any, depth: int) -> None:
        if depth > 8:
            return
        if value is True:
            found.update(_covered(prefix))
        elif isinstance(value, Mapping):
            if prefix in VOCABULARY:
                found.add(prefix)
            for key, child in value.items():
                if isinstance(key, str) and key:
                    walk(f"{prefix}.{key}" if prefix else key, child, depth + 1)

    if isinstance(manifest, Mapping):
        for key, child in manifest.items():
            if isinstance(key, str) and key and key not in ("featureSets", "tools"):
                walk(key, child, 1)
    found.discard("tools")
    channels = manifest.get("channels") if isinstance(manifest, Mapping) else None
    if isinstance(channels, Mapping) and channels.get(OBSERVE_04) is True:
        found.add(INCOMING)  # the 0.4 name of what 0.5 calls channels.incoming
    if isinstance(mcp_capabilities, Mapping) and mcp_capabilities.get("tools") not in (
        None,
        False,
    ):
        found.add("tools")
    return frozenset(found & VOCABULARY)


def default_grant(advertised: Iterable[str]) -> frozenset[str]:
    return frozenset(advertised) - DENIED_BY_DEFAULT


@attrs.frozen(kw_only=True)
class FeatureSet:
    name: str
    description: str
    uses: tuple[str, ...]
    raw: Mapping[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.frozen(kw_only=True)
class DeclaredSets:
    sets: Mapping[str, FeatureSet]
    diagnostics: tuple[str, ...] = ()


MAX_FEATURE_SETS = 256


def declared_feature_sets(manifest: Any) -> DeclaredSets:
    """Normalize ``featureSets`` (object keyed by name, or the 0.4 array of ``{name, …}``)."""
    raw = manifest.get("featureSets") if isinstance(manifest, Mapping) else None
    notes: list[str] = []
    items: list[tuple[Any, Any]] = []
    if isinstance(raw, Mapping):
        items = list(raw.items())
    elif isinstance(raw, list):
        notes.append("featureSets sent in the 0.4 array form; normalized")
        items = [(e.get("name") if isinstance(e, Mapping) else None, e) for e in raw]
    elif raw is not None:
        notes.append(f"featureSets of type {type(raw).__name__} ignored")
    out: dict[str, FeatureSet] = {}
    for name, body in items:
        if len(out) >= MAX_FEATURE_SETS:
            notes.append(f"more than {MAX_FEATURE_SETS} feature sets; the rest ignored")
            break
        if not isinstance(name, str) or not name or not isinstance(body, Mapping):
            notes.append(f"feature set {name!r} malformed; ignored")
            continue
        uses_raw = body.get("uses")
        uses: tuple[str, ...] = ()
        if isinstance(uses_raw, list):
            if all(isinstance(u, str) for u in uses_raw):
                uses = tuple(INCOMING if u == OBSERVE_PATH_04 else u for u in uses_raw)
                if OBSERVE_PATH_04 in uses_raw:
                    notes.append(
                        f"feature set {name!r} uses {OBSERVE_PATH_04!r}, the 0.4 name of "
                        f"{INCOMING!r}; read as {INCOMING}"
                    )
            else:
                # An entry that is not a path is an unknown value: the set fails closed (§6.4).
                notes.append(f"feature set {name!r}: uses holds a non-string; the set is unusable")
        desc = body.get("description")
        out[name] = FeatureSet(
            name=name, description=desc if isinstance(desc, str) else "", uses=uses, raw=body
        )
    return DeclaredSets(sets=out, diagnostics=tuple(notes))


@attrs.frozen(kw_only=True)
class Receipt:
    """What a ``featureSets/update`` answer means for the connection."""

    ready: bool
    mcp_only: bool = False
    close: bool = False
    note: str = ""


def read_receipt(result: Any) -> Receipt:
    if not isinstance(result, Mapping):
        return Receipt(ready=True, mcp_only=True, note="malformed featureSets/update receipt")
    if result.get("accepted") is True:
        mode = result.get("mode")
        return Receipt(ready=True, note="degraded" if mode == "degraded" else "")
    fallback = result.get("fallback")
    reason = result.get("reason")
    why = f": {reason}" if isinstance(reason, str) else ""
    if fallback == "close":
        return Receipt(ready=False, close=True, note=f"server refused the policy{why}")
    return Receipt(ready=True, mcp_only=True, note=f"server refused the policy{why}; MCP-only")
