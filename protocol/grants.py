"""Capability grants, feature-set derivation and inbound admission (SPEC §5.4, §6; RFC-002).

Pure functions and values over capability paths (the closed vocabulary of
:data:`protocol.mcpl.VOCABULARY`) and feature-set names. The grant is the security boundary;
feature sets are ergonomics derived from it and never widen it. Everything here fails closed:
an unknown method, path, pattern or declaration grants nothing.

Two vocabularies, two wildcard rules:

- **capability patterns** (:func:`matches`): ``*`` matches exactly one segment and the
  segment counts must be equal; there is no subtree wildcard, and a bare parent such as
  ``channels`` names only the literal path ``channels`` (which is not a vocabulary path, so
  it grants nothing);
- **feature-set name patterns** (:func:`name_matches`): the same, except that a *trailing*
  ``*`` matches one or more segments, so ``memory.*`` names every ``memory.``-prefixed set at
  any depth (SPEC §6.3) and never ``memory`` itself.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import attrs

from protocol.errors import (
    CAPABILITY_DENIED,
    FEATURE_SET_NOT_ENABLED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    UNKNOWN_FEATURE_SET,
    RpcError,
)
from protocol.mcpl import DENIED_BY_DEFAULT, VOCABULARY, FeatureSet, default_grant

# -- matching -----------------------------------------------------------------------------


def _segments_match(pattern: Sequence[str], path: Sequence[str]) -> bool:
    return len(pattern) == len(path) and all(
        (p == "*" and bool(s)) or p == s for p, s in zip(pattern, path, strict=True)
    )


def matches(pattern: str, path: str) -> bool:
    """Whether a capability pattern names ``path``.

    ``*`` stands for exactly one non-empty segment and only as a whole segment (``chan*`` is
    a literal); the two must have the same number of segments.
    """
    return _segments_match(pattern.split("."), path.split("."))


def matches_any(patterns: Iterable[str], path: str) -> bool:
    return any(matches(p, path) for p in patterns)


def name_matches(pattern: str, name: str) -> bool:
    """Whether a feature-set name pattern names ``name`` (a trailing ``*`` spans the rest)."""
    pat = pattern.split(".")
    segs = name.split(".")
    if pat[-1] == "*" and len(segs) >= len(pat):
        head = len(pat) - 1
        return _segments_match(pat[:head], segs[:head]) and all(segs[head:])
    return _segments_match(pat, segs)


def _names_any(patterns: Iterable[str], name: str) -> bool:
    return any(name_matches(p, name) for p in patterns)


def _patterns(value: Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    # A bare string would be iterated as characters: refuse it rather than guess.
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError(f"{what} must be a sequence of patterns, not a string")
    return tuple(value)


def dead_patterns(patterns: Iterable[str], paths: Collection[str] = VOCABULARY) -> tuple[str, ...]:
    """The patterns that name none of ``paths`` (e.g. a bare parent): worth a diagnostic."""
    return tuple(p for p in patterns if not any(matches(p, q) for q in paths))


# -- the effective grant ------------------------------------------------------------------


def effective_grant(
    advertised: Collection[str],
    enabled: Sequence[str] | None,
    disabled: Sequence[str] = (),
) -> frozenset[str]:
    """The effective grant: what was advertised, narrowed by host policy (SPEC §5.4).

    - Only vocabulary paths that were advertised can be granted.
    - ``enabled is None`` (no mask): every advertised path except :data:`DENIED_BY_DEFAULT`.
    - With a mask: the advertised paths some enabled pattern matches. A path in
      :data:`DENIED_BY_DEFAULT` (``…inject.system``, SPEC §13.4) is granted only when an
      enabled entry names it *literally*; no wildcard reaches it, so ``*.*.*.*`` or
      ``contextHooks.beforeInference.inject.*`` never grant system injection by accident.
    - Deny wins: a path any disabled pattern matches is never granted, whatever enabled says.
    """
    enabled_p = _patterns(enabled, "enabled")
    disabled_p = _patterns(disabled, "disabled") or ()
    pool = frozenset(advertised) & VOCABULARY
    if enabled_p is None:
        granted = default_grant(pool)
    else:
        granted = frozenset(
            p
            for p in pool
            if (p in enabled_p if p in DENIED_BY_DEFAULT else matches_any(enabled_p, p))
        )
    return frozenset(p for p in granted if not matches_any(disabled_p, p))


# -- feature sets -------------------------------------------------------------------------

INVALID_USES: Final = "invalid_uses"
CAPABILITY_DENIED_REASON: Final = "capability_denied"
DISABLED: Final = "disabled"
NOT_SELECTED: Final = "not_selected"


@attrs.frozen(kw_only=True)
class FeatureSetStatus:
    """One declared set after derivation.

    ``reason`` is the first rule that stops it, in this order: ``invalid_uses`` (``uses``
    absent, empty, or holding anything outside the vocabulary, legacy paths included), then
    ``capability_denied`` (``missing`` lists the ``uses`` paths outside the grant), then
    ``disabled`` (a disabled pattern names it; this beats any enabled pattern), then
    ``not_selected`` (an ``enabled`` list is present and does not name it); ``None`` when the
    set is enabled. ``selected`` is the host's choice alone (named, or no list, and not
    disabled), independent of the grant; ``featureSets/update`` lists as enabled only the sets
    that are selected *and* can run (:attr:`enabled`), the very sets admission lets through.
    """

    name: str
    reason: str | None
    selected: bool
    disabled: bool = False
    missing: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.reason is None


@attrs.frozen(kw_only=True)
class FeatureSetState:
    """Every declared set's status under one grant and one selection."""

    statuses: Mapping[str, FeatureSetStatus]

    @property
    def enabled(self) -> frozenset[str]:
        return frozenset(n for n, s in self.statuses.items() if s.enabled)

    @property
    def selected(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, s in self.statuses.items() if s.selected))

    @property
    def disabled(self) -> tuple[str, ...]:
        return tuple(sorted(n for n, s in self.statuses.items() if s.disabled))

    def status(self, name: str) -> FeatureSetStatus | None:
        return self.statuses.get(name)

    def unavailable_features(self) -> list[dict[str, Any]]:
        """Receipt ``unavailableFeatures`` entries: the sets the host selected but that cannot
        run (``invalid_uses`` or ``capability_denied``), sorted by name.

        Each is ``{featureSet, missingCapabilities, effect: "disabled", reason}``; ``reason``
        is an extra member (receivers tolerate unknown members). Sets the host deselected or
        disabled are its own choice, not a degradation, and are left out.
        """
        out: list[dict[str, Any]] = []
        for name in sorted(self.statuses):
            s = self.statuses[name]
            if s.selected and s.reason in (INVALID_USES, CAPABILITY_DENIED_REASON):
                out.append(
                    {
                        "featureSet": name,
                        "missingCapabilities": list(s.missing),
                        "effect": "disabled",
                        "reason": s.reason,
                    }
                )
        return out

    def receipt(self) -> dict[str, Any]:
        """An accepting degradation receipt; ``mode`` is omitted when nothing degraded."""
        unavailable = self.unavailable_features()
        out: dict[str, Any] = {"accepted": True}
        if unavailable:
            out["mode"] = "degraded"
            out["unavailableFeatures"] = unavailable
        return out


def derive_feature_sets(
    declared: Mapping[str, FeatureSet],
    grant: Collection[str],
    enabled_patterns: Sequence[str] | None = None,
    disabled_patterns: Sequence[str] = (),
) -> FeatureSetState:
    """Derive each declared set's status from the grant and the host's selection (SPEC §6.4).

    ``enabled_patterns``/``disabled_patterns`` are feature-set name patterns (``memory.*``),
    expanded here, host-side. ``None`` for ``enabled_patterns`` selects every set.
    """
    enabled_p = _patterns(enabled_patterns, "enabled_patterns")
    disabled_p = _patterns(disabled_patterns, "disabled_patterns") or ()
    granted = frozenset(grant)
    statuses: dict[str, FeatureSetStatus] = {}
    for name, fs in declared.items():
        uses = tuple(fs.uses)
        off = _names_any(disabled_p, name)
        chosen = not off and (enabled_p is None or _names_any(enabled_p, name))
        invalid = tuple(sorted({u for u in uses if u not in VOCABULARY}))
        missing: tuple[str, ...] = ()
        reason: str | None
        if not uses or invalid:
            reason = INVALID_USES
        else:
            missing = tuple(sorted(set(uses) - granted))
            if missing:
                reason = CAPABILITY_DENIED_REASON
            elif off:
                reason = DISABLED
            elif not chosen:
                reason = NOT_SELECTED
            else:
                reason = None
        statuses[name] = FeatureSetStatus(
            name=name,
            reason=reason,
            selected=chosen,
            disabled=off,
            missing=missing,
            invalid=invalid,
        )
    return FeatureSetState(statuses=MappingProxyType(statuses))


@attrs.frozen(kw_only=True)
class UnavailableFeature:
    """One ``unavailableFeatures`` entry as a server reported it: testimony, never authority."""

    feature_set: str
    missing_capabilities: tuple[str, ...]
    effect: str


def read_unavailable_features(receipt: Any) -> tuple[UnavailableFeature, ...]:
    """The well-formed ``unavailableFeatures`` entries of a receipt; malformed ones dropped.

    For display and diagnostics only: a receipt never widens a grant (SPEC §6.7).
    """
    raw = receipt.get("unavailableFeatures") if isinstance(receipt, Mapping) else None
    out: list[UnavailableFeature] = []
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, Mapping):
            continue
        name, missing, effect = (
            entry.get("featureSet"),
            entry.get("missingCapabilities", []),
            entry.get("effect"),
        )
        if not isinstance(name, str) or not isinstance(effect, str):
            continue
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            continue
        out.append(
            UnavailableFeature(feature_set=name, missing_capabilities=tuple(missing), effect=effect)
        )
    return tuple(out)


def update_params(grant: Collection[str], state: FeatureSetState) -> dict[str, Any]:
    """``featureSets/update`` params for a grant (SPEC §6.7).

    ``effectiveCapabilities`` (sorted) is the sole allowlist and is always present, even
    empty; ``enabled`` lists exactly the sets the host treats as enabled (selected, with valid
    ``uses`` all inside the grant; names expanded, sorted), the sets whose calls admission lets
    through: a set it cannot run is never named, so the server does not start it and then
    meet -32001. It is always present, since some servers start nothing until named (§17.7).
    ``disabled`` appears when the host disables any. ``deniedCapabilities`` is diagnostic only
    and is not sent.
    """
    params: dict[str, Any] = {
        "effectiveCapabilities": sorted(frozenset(grant) & VOCABULARY),
        "enabled": sorted(state.enabled),
    }
    if state.disabled:
        params["disabled"] = list(state.disabled)
    return params


# -- inbound admission --------------------------------------------------------------------

#: Server→host MCPL methods and the capability each needs (SPEC §0, RFC-002 §5).
INBOUND_CAPABILITY: Final[Mapping[str, str]] = MappingProxyType(
    {
        "push/event": "pushEvents",
        "inference/request": "inferenceRequest",
        "model/info": "modelInfo",
        "channels/register": "channels.register",
        "channels/changed": "channels.register",
        "channels/list": "channels.register",
        "channels/incoming": "channels.incoming",
    }
)

#: Methods whose params must name the feature set they act for (SPEC §6.5).
FEATURE_SET_METHODS: Final = frozenset({"push/event", "inference/request"})

#: Deliberately ungated server→host methods (SPEC §17.3): admitted without a capability.
UNGATED_INBOUND: Final = frozenset({"mcpl/manifestChanged"})

#: Removed in 0.5: answered with -32601 and never treated as live.
REMOVED_METHODS: Final = frozenset(
    {"context/afterInference", "featureSets/changed", "scope/elevate", "canEnable", "tags/describe"}
)

_NO_SETS: Final[Mapping[str, FeatureSet]] = MappingProxyType({})


def _denied(cap: str, message: str, **extra: str) -> RpcError:
    return RpcError(code=CAPABILITY_DENIED, message=message, data={"capability": cap, **extra})


def admit(
    method: str,
    grant: Collection[str],
    feature_set: str | None = None,
    *,
    declared: Mapping[str, FeatureSet] = _NO_SETS,
    enabled: Collection[str] = frozenset(),
    ready: bool = True,
    outside_sets: Collection[str] = frozenset(),
) -> None:
    """Admit one inbound MCPL call or raise the :class:`RpcError` to answer it with.

    Covers the MCPL surface only; MCP methods (``ping``, ``notifications/*``, …) are
    dispatched before this. Checks, in order:

    1. a removed 0.5 method, or one not in :data:`INBOUND_CAPABILITY`: -32601;
       :data:`UNGATED_INBOUND` methods are admitted here;
    2. not ready (the initial policy receipt has not arrived): -32002 ``{capability}``;
    3. the method's capability is outside ``grant``: -32002 ``{capability}``;

    and, for :data:`FEATURE_SET_METHODS` only (channel methods never carry a feature set,
    and ``model/info`` carries none, so a ``feature_set`` given with them is ignored):

    4. ``feature_set`` missing or not a non-empty string: -32602;
    5. not declared: -32003 ``{featureSet}``;
    6. not in ``enabled``: -32001 ``{featureSet}``;
    7. the set's ``uses`` lacks the capability (a declaration mismatch):
       -32002 ``{capability, featureSet}``, unless the operator lets the capability be used
       outside the sets that list it (``outside_sets``: a server's ``allow_unlisted_uses``).
    """
    if method in REMOVED_METHODS:
        raise RpcError(code=METHOD_NOT_FOUND, message=f"{method} was removed in MCPL 0.5")
    if method in UNGATED_INBOUND:
        return
    cap = INBOUND_CAPABILITY.get(method)
    if cap is None:
        raise RpcError(code=METHOD_NOT_FOUND, message=f"Method not found: {method}")
    if not ready:
        raise _denied(cap, f"Capability denied: {cap} (no policy in force yet)")
    if cap not in grant:
        raise _denied(cap, f"Capability denied: {cap}")
    if method not in FEATURE_SET_METHODS:
        return
    if not isinstance(feature_set, str) or not feature_set:
        raise RpcError(code=INVALID_PARAMS, message=f"{method} requires a featureSet")
    fs = declared.get(feature_set)
    if fs is None:
        raise RpcError(
            code=UNKNOWN_FEATURE_SET,
            message=f"Unknown feature set: {feature_set}",
            data={"featureSet": feature_set},
        )
    if feature_set not in enabled:
        raise RpcError(code=FEATURE_SET_NOT_ENABLED, data={"featureSet": feature_set})
    if cap not in fs.uses and cap not in outside_sets:
        raise _denied(
            cap,
            f"Capability denied: {cap} is not in the uses of feature set {feature_set}",
            featureSet=feature_set,
        )


# -- grant changes ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class GrantSplit:
    """A grant change split by direction (SPEC §6.7)."""

    revoke_now: frozenset[str]  #: applied host-side at once, before the Request is sent
    await_receipt: frozenset[str]  #: activated only when the receipt arrives
    in_force_now: frozenset[str]  #: the grant while the Request is outstanding


def split_change(old: Collection[str], new: Collection[str]) -> GrantSplit:
    before, after = frozenset(old), frozenset(new)
    return GrantSplit(
        revoke_now=before - after, await_receipt=after - before, in_force_now=before & after
    )


@attrs.frozen(kw_only=True)
class GrantChange:
    """What the caller does for one proposed grant: send ``params`` as a Request tagged
    ``seq``, then report its outcome with :meth:`GrantLedger.on_receipt`."""

    seq: int
    target: frozenset[str]
    split: GrantSplit
    params: dict[str, Any] = attrs.field(eq=False)


@attrs.frozen(kw_only=True)
class GrantLedger:
    """The grant in force on one connection, as an immutable value.

    - A change applies its reductions at once and holds its expansions until the receipt
      for that very Request arrives. A newer proposal supersedes an older one: the older
      one's receipt then activates nothing.
    - A refusal or an unanswered Request never activates anything.
    - A reconnect (:meth:`reset`) empties the grant; nothing is admitted until the receipt
      for the new connection's policy arrives.
    """

    in_force: frozenset[str] = frozenset()
    ready: bool = False
    pending: GrantChange | None = None
    next_seq: int = 1

    def propose(
        self, target: Collection[str], state: FeatureSetState
    ) -> tuple[GrantLedger, GrantChange]:
        wanted = frozenset(target) & VOCABULARY
        split = split_change(self.in_force, wanted)
        change = GrantChange(
            seq=self.next_seq, target=wanted, split=split, params=update_params(wanted, state)
        )
        ledger = attrs.evolve(
            self, in_force=split.in_force_now, pending=change, next_seq=self.next_seq + 1
        )
        return ledger, change

    def on_receipt(self, seq: int, accepted: bool) -> GrantLedger:
        """The answer to Request ``seq``: an accepting receipt activates its grant; a refusal,
        a stale ``seq`` or an error leaves the (already reduced) grant as it is."""
        if self.pending is None or self.pending.seq != seq:
            return self
        if not accepted:
            return attrs.evolve(self, pending=None)
        return attrs.evolve(self, in_force=self.pending.target, ready=True, pending=None)

    def reset(self) -> GrantLedger:
        """A new connection: nothing in force, not ready, no proposal outstanding."""
        return GrantLedger(next_seq=self.next_seq)

    def admit(
        self,
        method: str,
        feature_set: str | None = None,
        *,
        declared: Mapping[str, FeatureSet] = _NO_SETS,
        enabled: Collection[str] = frozenset(),
    ) -> None:
        admit(
            method,
            self.in_force,
            feature_set,
            declared=declared,
            enabled=enabled,
            ready=self.ready,
        )
