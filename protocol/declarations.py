"""Declaration mismatches: what a server's manifest says of its feature sets that cannot hold.

A feature set whose ``uses`` names a capability the server did not advertise can never be
enabled (SPEC §6.4 fails it closed), and the server usually does not know: its author wrote the
set and forgot the capability, or dropped the capability and kept the set. The host reports each
such mismatch once per handshake and per manifest change, one line each, naming the set and the
capability, instead of a later, puzzling refusal.

The converse mismatch is a server that exercises a capability none of its enabled sets lists in
``uses``: it advertises ``pushEvents``, names its chat set in every push, and forgot
``pushEvents`` in that set's ``uses``. Each such call is refused (-32002, SPEC §6.4 item 4). Given
the policy the host derived (``state``), :func:`declaration_mismatches` also reports it at the
handshake (:data:`UNLISTED_USE`), for the capabilities a server exercises under a feature set's
name (:data:`TAGGED_CAPABILITIES`); :func:`refused_use` and :class:`NotedUses` report the
refusals themselves, once per (set, capability) and connection, within a cap.

Pure: functions of the manifest (as ``json.loads`` returns it), the advertised paths and the
derived feature-set state.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import attrs

from protocol.errors import CAPABILITY_DENIED
from protocol.grants import FEATURE_SET_METHODS, INBOUND_CAPABILITY, FeatureSetState
from protocol.mcpl import VOCABULARY, FeatureSet, declared_feature_sets

NOT_ADVERTISED: Final = "not-advertised"
UNKNOWN_CAPABILITY: Final = "unknown-capability"
NO_USES: Final = "no-uses"
DECLARED_TWICE: Final = "declared-twice"
DECLARATION: Final = "declaration"  # a note of the declaration walk itself (form, types)
#: a capability the server may exercise that no enabled feature set lists in ``uses``
UNLISTED_USE: Final = "unlisted-use"

#: At most this many mismatches are listed for one manifest; one more line says how many more.
MAX_MISMATCHES = 64
#: At most this many feature sets are named in one line; the rest are counted.
MAX_NAMED_SETS = 8
#: Refused uses reported per connection, one line per (set, capability); past the cap, one line
#: says that further ones are not reported (they are still refused, and traced as refusals).
MAX_NOTED_USES = 32

#: The capabilities a server exercises under a feature set's name (``push/event`` and
#: ``inference/request`` carry ``featureSet``), each with the method that exercises it.
TAGGED_CAPABILITIES: Final[Mapping[str, str]] = MappingProxyType(
    {INBOUND_CAPABILITY[method]: method for method in sorted(FEATURE_SET_METHODS)}
)


@attrs.frozen(kw_only=True)
class Mismatch:
    """One problem of a feature-set declaration: ``problem`` is one of the constants above;
    ``text`` is the line an operator reads."""

    problem: str
    text: str
    feature_set: str | None = None
    capability: str | None = None
    #: the sets an :data:`UNLISTED_USE` line names (``feature_set`` is set when it is one)
    feature_sets: tuple[str, ...] = ()


def declaration_mismatches(
    manifest: Any,
    advertised: Collection[str],
    state: FeatureSetState | None = None,
    grant: Collection[str] | None = None,
    allowed: Collection[str] = (),
) -> tuple[Mismatch, ...]:
    """Every mismatch between a manifest's feature sets and what it advertises, in declaration
    order, at most :data:`MAX_MISMATCHES` of them (then one line counting the rest).

    Given ``state`` (the sets the host derived from ``grant``, the advertised paths when None),
    the :data:`UNLISTED_USE` lines come first: see :func:`unlisted_uses` (``allowed``: the
    capabilities the operator lets be used outside the sets that list them).
    """
    declared = declared_feature_sets(manifest)
    out: list[Mismatch] = []
    if state is not None:
        granted = advertised if grant is None else grant
        out += unlisted_uses(state, declared.sets, granted, allowed)
    out += [Mismatch(problem=DECLARATION, text=note) for note in declared.diagnostics]
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


def _named(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:MAX_NAMED_SETS])
    rest = len(names) - MAX_NAMED_SETS
    return shown + (f" and {rest} more" if rest > 0 else "")


def unlisted_uses(
    state: FeatureSetState,
    declared: Mapping[str, FeatureSet],
    grant: Collection[str],
    allowed: Collection[str] = (),
) -> tuple[Mismatch, ...]:
    """The :data:`TAGGED_CAPABILITIES` that are granted but that no enabled set lists in
    ``uses``: every call exercising one names an enabled set (or none) and is refused.

    One line per capability, naming the enabled sets (at most :data:`MAX_NAMED_SETS`, then a
    count). A capability that a set the host deselected or disabled lists is the operator's
    choice, not a mismatch, and is not reported; so is a capability in ``allowed`` (the
    operator lets it be used outside the sets that list it).
    """
    granted = frozenset(grant)
    enabled = sorted(state.enabled)
    out: list[Mismatch] = []
    for cap, method in TAGGED_CAPABILITIES.items():
        if cap not in granted or cap in allowed:
            continue
        listing = [n for n, fs in declared.items() if cap in fs.uses]
        if any(n in state.enabled for n in listing):
            continue
        if any((s := state.status(n)) is not None and not s.selected for n in listing):
            continue
        if enabled:
            them, its = ("it", "its") if len(enabled) == 1 else ("any of them", "their")
            text = (
                f"the server advertises {cap}, but no enabled feature set lists it in its uses "
                f"(enabled: {_named(enabled)}); every {method} naming {them} will be refused "
                f"(-32002) until {its} uses include {cap}"
            )
        else:
            text = (
                f"the server advertises {cap}, but no enabled feature set lists it in its uses; "
                f"every {method} will be refused"
            )
        out.append(
            Mismatch(
                problem=UNLISTED_USE,
                text=text,
                feature_set=enabled[0] if len(enabled) == 1 else None,
                capability=cap,
                feature_sets=tuple(enabled),
            )
        )
    return tuple(out)


def refused_use(method: str, code: int, data: Any) -> Mismatch | None:
    """The declaration mismatch a refusal stands for, or None: ``-32002`` naming both a
    capability and a feature set is a call the set's ``uses`` does not cover (SPEC §6.4)."""
    if code != CAPABILITY_DENIED or not isinstance(data, Mapping):
        return None
    cap, name = data.get("capability"), data.get("featureSet")
    if not isinstance(cap, str) or not isinstance(name, str):
        return None
    return Mismatch(
        problem=UNLISTED_USE,
        text=f"feature set {name!r} does not list {cap} in its uses, but the server sent "
        f"{method} naming it: refused (-32002), and so will be every such call until the "
        f"server adds {cap} to the set's uses",
        feature_set=name,
        capability=cap,
        feature_sets=(name,),
    )


@attrs.frozen
class NotedUses:
    """The refused uses already reported on one connection: each (set, capability) once, at
    most :data:`MAX_NOTED_USES` of them; the first one past the cap is reported as a line
    saying so, and the rest only counted (``dropped``)."""

    keys: frozenset[tuple[str, str]] = frozenset()
    dropped: int = 0

    def note(self, m: Mismatch) -> tuple[NotedUses, Mismatch | None]:
        """This value with ``m`` noted, and the line to report (None: already reported, or
        past the cap)."""
        key = (m.feature_set or "", m.capability or "")
        if key in self.keys:
            return self, None
        if len(self.keys) < MAX_NOTED_USES:
            return attrs.evolve(self, keys=self.keys | {key}), m
        line = None
        if not self.dropped:
            line = Mismatch(
                problem=DECLARATION,
                text=f"more than {MAX_NOTED_USES} feature sets used capabilities outside their "
                "uses; further ones are not reported on this connection (their calls are still "
                "refused)",
            )
        return attrs.evolve(self, dropped=self.dropped + 1), line
