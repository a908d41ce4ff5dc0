"""Declaration mismatches: what a server's manifest says of its feature sets that cannot hold.

A feature set whose ``uses`` names a capability the server did not advertise can never be
enabled (SPEC §6.4 fails it closed), and the server usually does not know: its author wrote the
set and forgot the capability, or dropped the capability and kept the set. The host reports each
such mismatch once per handshake and per manifest change, one line each, naming the set and the
capability, instead of a later, puzzling refusal.

Pure: a function of the manifest (as ``json.loads`` returns it) and the advertised paths.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Final

import attrs

from protocol.mcpl import VOCABULARY, declared_feature_sets

NOT_ADVERTISED: Final = "not-advertised"
UNKNOWN_CAPABILITY: Final = "unknown-capability"
NO_USES: Final = "no-uses"
DECLARED_TWICE: Final = "declared-twice"
DECLARATION: Final = "declaration"  # a note of the declaration walk itself (form, types)

#: At most this many mismatches are listed for one manifest; one more line says how many more.
MAX_MISMATCHES = 64


@attrs.frozen(kw_only=True)
class Mismatch:
    """One problem of a feature-set declaration: ``problem`` is one of the constants above;
    ``text`` is the line an operator reads."""

    problem: str
    text: str
    feature_set: str | None = None
    capability: str | None = None


def declaration_mismatches(manifest: Any, advertised: Collection[str]) -> tuple[Mismatch, ...]:
    """Every mismatch between a manifest's feature sets and what it advertises, in declaration
    order, at most :data:`MAX_MISMATCHES` of them (then one line counting the rest)."""
    declared = declared_feature_sets(manifest)
    out = [Mismatch(problem=DECLARATION, text=note) for note in declared.diagnostics]
    raw = manifest.get("featureSets") if isinstance(manifest, Mapping) else None
    if isinstance(raw, list):  # the 0.4 array form can name a set twice; the last one is kept
        seen: set[str] = set()
        for entry in raw:
            name = entry.get("name") if isinstance(entry, Mapping) else None
            if not isinstance(name, str) or not name:
                continue
            if name in seen:
                out.append(
                    Mismatch(
                        problem=DECLARED_TWICE,
                        text=f"feature set {name!r} declared twice; the last declaration is used",
                        feature_set=name,
                    )
                )
            seen.add(name)
    pool = frozenset(advertised)
    for name, fs in declared.sets.items():
        uses_raw = fs.raw.get("uses")
        if not fs.uses and not (isinstance(uses_raw, list) and uses_raw):
            out.append(
                Mismatch(
                    problem=NO_USES,
                    text=f"feature set {name!r} declares no uses; it cannot be enabled",
                    feature_set=name,
                )
            )
        for cap in dict.fromkeys(fs.uses):  # each capability once, in declaration order
            if cap not in VOCABULARY:
                out.append(
                    Mismatch(
                        problem=UNKNOWN_CAPABILITY,
                        text=f"feature set {name!r} uses {cap!r}, which is not an MCPL "
                        "capability; the set cannot be enabled",
                        feature_set=name,
                        capability=cap,
                    )
                )
            elif cap not in pool:
                out.append(
                    Mismatch(
                        problem=NOT_ADVERTISED,
                        text=f"feature set {name!r} uses {cap}, which the server did not "
                        "advertise; the set cannot be enabled",
                        feature_set=name,
                        capability=cap,
                    )
                )
    if len(out) > MAX_MISMATCHES:
        rest = len(out) - MAX_MISMATCHES + 1
        out = out[: MAX_MISMATCHES - 1]
        out.append(Mismatch(problem=DECLARATION, text=f"{rest} more declaration problems"))
    return tuple(out)
