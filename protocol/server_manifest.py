"""What an MCPL server declares about itself: its manifest, feature sets and revision.

Pure values for the server side of the handshake. A server names the capability paths it
implements (leaves of the closed vocabulary, :data:`protocol.mcpl.VOCABULARY`) and the feature
sets that group them; :func:`build_manifest` turns that into the 0.5 ``experimental.mcpl``
object (feature sets keyed by name, every capability written as an explicit leaf, ``revision``
the RFC-003 canonical digest from :func:`protocol.manifest.manifest_digest`), and
:func:`changed_domains` tells which §17 domains differ between two manifests, for
``mcpl/manifestChanged``.

``tools`` is not a member of the manifest: it comes from MCP's outer ``capabilities.tools``,
which :func:`initialize_result` writes when the server has tools.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from protocol.manifest import manifest_digest
from protocol.mcpl import MCPL_VERSION, PROTOCOL_VERSION, VOCABULARY

__all__ = [
    "FeatureSetDecl",
    "advertisement",
    "build_manifest",
    "changed_domains",
    "initialize_result",
]

#: Paths a feature set may name in ``uses``: the vocabulary (``tools`` included).
USABLE: frozenset[str] = VOCABULARY


def _uses(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        raise TypeError("uses must be a sequence of capability paths, not a string")
    out = tuple(dict.fromkeys(value))
    unknown = [u for u in out if u not in USABLE]
    if unknown:
        raise ValueError(f"not capability paths of MCPL 0.5: {', '.join(sorted(unknown))}")
    if not out:
        raise ValueError("a feature set must use at least one capability")
    return out


@attrs.frozen(kw_only=True)
class FeatureSetDecl:
    """One declared feature set (SPEC §6.1): a name, a description and the paths it uses."""

    name: str
    description: str
    uses: tuple[str, ...] = attrs.field(converter=_uses)
    rollback: bool = False
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if not self.name or any(not part for part in self.name.split(".")):
            raise ValueError(f"feature set name {self.name!r} is not a dotted name")

    def to_wire(self) -> dict[str, Any]:
        """The declaration as the manifest carries it."""
        out: dict[str, Any] = dict(self.extra)
        out["description"] = self.description
        out["uses"] = sorted(self.uses)
        if self.rollback:
            out["rollback"] = True
        return out


def advertisement(paths: Iterable[str]) -> dict[str, Any]:
    """The nested advertisement of ``paths`` (every one an explicit ``true`` leaf).

    A path with paths beneath it (``inferenceRequest``) is written as an object, which the
    host's walk reads as advertising the node alone. ``tools`` is left out (MCP carries it).
    """
    root: dict[str, Any] = {}
    for path in sorted(set(paths)):
        if path not in VOCABULARY:
            raise ValueError(f"{path!r} is not a capability path of MCPL 0.5")
        if path == "tools":
            continue
        node = root
        parts = path.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        if isinstance(node.get(parts[-1]), dict):
            continue
        # ``true`` would also advertise every path beneath (the host's walk reads it so): a
        # path with paths beneath it is advertised as an object, which names the node alone.
        below = any(p.startswith(path + ".") for p in VOCABULARY)
        node[parts[-1]] = {} if below else True
    return root


def build_manifest(
    capabilities: Iterable[str],
    feature_sets: Sequence[FeatureSetDecl],
    *,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The server's ``experimental.mcpl`` object, its ``revision`` included.

    Every path a feature set uses must be among ``capabilities`` (``tools`` excepted: MCP
    advertises it), so a declaration can never ask for something the server did not advertise.
    """
    caps = frozenset(capabilities)
    names = [fs.name for fs in feature_sets]
    if len(set(names)) != len(names):
        raise ValueError("feature set names must be unique")
    for fs in feature_sets:
        missing = sorted(set(fs.uses) - caps - {"tools"})
        if missing:
            raise ValueError(
                f"feature set {fs.name!r} uses {', '.join(missing)}, which the server does not "
                "advertise"
            )
    manifest: dict[str, Any] = {"version": MCPL_VERSION}
    manifest.update(advertisement(caps))
    if extra:
        manifest.update(extra)
    manifest["featureSets"] = {fs.name: fs.to_wire() for fs in feature_sets}
    manifest["revision"] = manifest_digest(manifest)
    return manifest


def initialize_result(
    manifest: Mapping[str, Any] | None,
    *,
    name: str,
    version: str,
    tools: bool,
    requested_version: object = None,
) -> dict[str, Any]:
    """The ``initialize`` result: MCP's shape with the manifest under ``experimental.mcpl``.

    The protocol version echoes the host's when it sent a string (MCPL does not negotiate
    one), else the version every MCPL peer uses.
    """
    capabilities: dict[str, Any] = {}
    if tools:
        capabilities["tools"] = {"listChanged": True}
    if manifest is not None:
        capabilities["experimental"] = {"mcpl": dict(manifest)}
    proto = requested_version if isinstance(requested_version, str) else PROTOCOL_VERSION
    return {
        "protocolVersion": proto,
        "capabilities": capabilities,
        "serverInfo": {"name": name, "version": version},
    }


def _domains_of(manifest: Mapping[str, Any]) -> dict[str, Any]:
    caps = {k: v for k, v in manifest.items() if k not in ("version", "revision", "featureSets")}
    sets = manifest.get("featureSets")
    plain: Any = sets
    ontology: dict[str, Any] = {}
    if isinstance(sets, Mapping):
        plain = {}
        for name, body in sets.items():
            if isinstance(body, Mapping):
                plain[name] = {k: v for k, v in body.items() if k != "tagOntology"}
                if "tagOntology" in body:
                    ontology[name] = body["tagOntology"]
            else:
                plain[name] = body
    return {"capabilities": caps, "featureSets": plain, "tagOntology": ontology}


def changed_domains(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The §17 domains (``capabilities``, ``featureSets``, ``tagOntology``) that differ."""
    before, after = _domains_of(old), _domains_of(new)
    return [d for d in ("capabilities", "featureSets", "tagOntology") if before[d] != after[d]]
