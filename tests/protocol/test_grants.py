"""Grants, feature-set derivation, inbound admission and grant changes (SPEC §5.4, §6)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from protocol.errors import (
    CAPABILITY_DENIED,
    FEATURE_SET_NOT_ENABLED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    UNKNOWN_FEATURE_SET,
    RpcError,
)
from protocol.grants import (
    FEATURE_SET_METHODS,
    INBOUND_CAPABILITY,
    REMOVED_METHODS,
    UNGATED_INBOUND,
    GrantLedger,
    UnavailableFeature,
    admit,
    dead_patterns,
    derive_feature_sets,
    effective_grant,
    matches,
    name_matches,
    read_unavailable_features,
    split_change,
    update_params,
)
from protocol.mcpl import VOCABULARY, FeatureSet, declared_feature_sets

SYSTEM = "contextHooks.beforeInference.inject.system"
BEFORE_USER = "contextHooks.beforeInference.inject.beforeUser"
AFTER_USER = "contextHooks.beforeInference.inject.afterUser"
OBSERVE = "contextHooks.beforeInference.observe"
CHANNELS = {p for p in VOCABULARY if p.startswith("channels.")}
ALL = frozenset(VOCABULARY)


def sets(**uses: Any) -> dict[str, FeatureSet]:
    """Feature sets keyed by name; ``__`` in a keyword stands for ``.``."""
    return {
        name.replace("__", "."): FeatureSet(
            name=name.replace("__", "."), description="", uses=tuple(u)
        )
        for name, u in uses.items()
    }


def code_of(call: Any) -> RpcError:
    with pytest.raises(RpcError) as info:
        call()
    return info.value


# --- matching --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("channels.*", "channels.publish", True),  # SPEC §5.4
        ("channels.*", "channels.publish.x", False),
        ("channels.*", "channels", False),
        ("contextHooks.*", SYSTEM, False),  # no depth-4 inject leaf
        ("contextHooks.*", OBSERVE, False),
        ("contextHooks.beforeInference.*", OBSERVE, True),
        ("contextHooks.beforeInference.*", BEFORE_USER, False),
        ("contextHooks.beforeInference.inject.*", BEFORE_USER, True),
        ("*", "pushEvents", True),  # a bare * only at depth 1
        ("*", "channels.publish", False),
        ("*.*", "channels.publish", True),
        ("*.*.*.*", SYSTEM, True),
        ("*.publish", "channels.publish", True),
        ("channels", "channels.publish", False),  # a bare parent grants nothing below it
        ("channels", "channels", True),
        ("chan*", "channels", False),  # * is a whole segment, never a glob inside one
        ("chan*.publish", "channels.publish", False),
        ("channels.publish", "channels.publish", True),
        ("channels.publish", "channels.incoming", False),
        ("*", "", False),
        ("", "", True),
    ],
)
def test_matches(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected


@pytest.mark.parametrize(
    ("pattern", "name", "expected"),
    [
        ("memory.*", "memory.retrieval", True),  # SPEC §6.3
        ("memory.*", "memory.a.b", True),
        ("memory.*", "memory", False),
        ("memory.*", "memoryx.a", False),
        ("memory.retrieval", "memory.retrieval", True),
        ("memory.retrieval", "memory.extraction", False),
        ("*", "anything", True),
        ("*", "any.thing", True),
        ("*.proactive", "memory.proactive", True),
        ("*.proactive", "a.memory.proactive", False),
        ("mem*", "memory.a", False),
    ],
)
def test_name_matches(pattern: str, name: str, expected: bool) -> None:
    assert name_matches(pattern, name) is expected


def test_dead_patterns_name_nothing_in_the_vocabulary() -> None:
    assert dead_patterns(["channels", "channels.*", "contextHooks.*", "*", "tools"]) == (
        "channels",
        "contextHooks.*",
    )


# --- the effective grant --------------------------------------------------------------------


def test_no_mask_grants_everything_advertised_but_system_injection() -> None:
    assert effective_grant(ALL, None, ()) == ALL - {SYSTEM}


def test_only_advertised_vocabulary_paths_can_be_granted() -> None:
    advertised = frozenset({"pushEvents", "channels.publish", "made.up"})
    assert effective_grant(advertised, None, ()) == {"pushEvents", "channels.publish"}
    assert effective_grant(advertised, ["*", "*.*", "made.up", "tools"], ()) == {
        "pushEvents",
        "channels.publish",
    }


def test_a_mask_keeps_only_what_it_matches() -> None:
    assert effective_grant(ALL, ["channels.*"], ()) == CHANNELS
    assert effective_grant(ALL, ["channels"], ()) == frozenset()
    assert effective_grant(ALL, [], ()) == frozenset()
    assert effective_grant(ALL, ["*"], ()) == {
        "pushEvents",
        "tools",
        "modelInfo",
        "inferenceRequest",
        "inferenceLifecycle",
    }


def test_system_injection_needs_its_literal_name() -> None:
    wildcards = ["*.*.*.*", "contextHooks.beforeInference.inject.*", "contextHooks.*.*.*"]
    assert SYSTEM not in effective_grant(ALL, wildcards, ())
    assert effective_grant(ALL, wildcards, ()) >= {BEFORE_USER, AFTER_USER}
    assert SYSTEM in effective_grant(ALL, [SYSTEM], ())
    assert SYSTEM not in effective_grant(ALL - {SYSTEM}, [SYSTEM], ())  # never advertised


def test_deny_wins() -> None:
    assert effective_grant(ALL, [SYSTEM], [SYSTEM]) == frozenset()
    assert effective_grant(ALL, [SYSTEM], ["*.*.*.*"]) == frozenset()
    assert effective_grant(ALL, ["channels.*"], ["channels.publish"]) == CHANNELS - {
        "channels.publish"
    }
    assert effective_grant(ALL, None, ["channels.*"]) == ALL - CHANNELS - {SYSTEM}


def test_a_string_is_not_a_pattern_list() -> None:
    with pytest.raises(TypeError):
        effective_grant(ALL, "tools", ())
    with pytest.raises(TypeError):
        effective_grant(ALL, None, "tools")


PATTERN_PARTS = st.sampled_from(
    ["*", "channels", "publish", "contextHooks", "beforeInference", "inject", "system", "tools"]
)
patterns = st.lists(PATTERN_PARTS, min_size=1, max_size=4).map(".".join) | st.sampled_from(
    sorted(VOCABULARY)
)
pattern_lists = st.lists(patterns, max_size=6)
paths = st.sampled_from(sorted(VOCABULARY))
advertisements = st.frozensets(paths | st.sampled_from(["channels", "x.y", "*"]))


@given(advertisements, st.none() | pattern_lists, pattern_lists)
def test_the_grant_is_inside_the_advertisement(
    advertised: frozenset[str], enabled: list[str] | None, disabled: list[str]
) -> None:
    grant = effective_grant(advertised, enabled, disabled)
    assert grant <= advertised
    assert grant <= VOCABULARY


@given(advertisements, st.none() | pattern_lists, pattern_lists)
def test_deny_always_wins(
    advertised: frozenset[str], enabled: list[str] | None, disabled: list[str]
) -> None:
    grant = effective_grant(advertised, enabled, disabled)
    assert not any(matches(d, p) for d in disabled for p in grant)


@given(advertisements, st.none() | pattern_lists, pattern_lists, patterns)
def test_adding_a_disabled_pattern_never_widens(
    advertised: frozenset[str], enabled: list[str] | None, disabled: list[str], extra: str
) -> None:
    before = effective_grant(advertised, enabled, disabled)
    after = effective_grant(advertised, enabled, [*disabled, extra])
    assert after <= before


@given(advertisements, st.none() | pattern_lists, pattern_lists)
def test_system_injection_is_granted_only_by_its_literal_name(
    advertised: frozenset[str], enabled: list[str] | None, disabled: list[str]
) -> None:
    if SYSTEM in effective_grant(advertised, enabled, disabled):
        assert enabled is not None and SYSTEM in enabled


@given(patterns, paths)
def test_a_star_never_matches_across_segments(pattern: str, path: str) -> None:
    if matches(pattern, path):
        assert pattern.count(".") == path.count(".")
        for p, s in zip(pattern.split("."), path.split("."), strict=True):
            assert p == s or (p == "*" and "." not in s and s)


# --- feature sets ----------------------------------------------------------------------------


def test_the_spec_61_example_degrades_exactly_as_the_rules_say() -> None:
    # SPEC §6.1's declaration, as a server would send it; its first set still uses the
    # legacy path contextHooks.beforeInference, so it is invalid.
    manifest = {
        "featureSets": {
            "memory.retrieval": {"description": "r", "uses": ["contextHooks.beforeInference"]},
            "memory.extraction": {"description": "e", "uses": ["inferenceLifecycle"]},
            "memory.consolidation": {"description": "c", "uses": ["inferenceRequest"]},
            "memory.proactive": {"description": "p", "uses": ["pushEvents"]},
        }
    }
    declared = declared_feature_sets(manifest).sets
    grant = frozenset({"pushEvents", "inferenceRequest"})
    state = derive_feature_sets(declared, grant, ["memory.*"], ["memory.consolidation"])
    reasons = {n: s.reason for n, s in state.statuses.items()}
    assert reasons == {
        "memory.retrieval": "invalid_uses",
        "memory.extraction": "capability_denied",
        "memory.consolidation": "disabled",
        "memory.proactive": None,
    }
    assert state.enabled == {"memory.proactive"}
    assert state.statuses["memory.retrieval"].invalid == ("contextHooks.beforeInference",)
    assert state.statuses["memory.extraction"].missing == ("inferenceLifecycle",)
    assert state.status("memory.nothing") is None


@pytest.mark.parametrize(
    "uses",
    [
        [],
        ["contextHooks.beforeInference"],
        ["contextHooks.afterInference"],
        ["channels.observe"],
        ["channels"],
        ["tools", "channels.observe"],
        ["channels.*"],
        ["Tools"],
    ],
)
def test_invalid_uses(uses: list[str]) -> None:
    state = derive_feature_sets(sets(s=uses), ALL)
    status = state.statuses["s"]
    assert status.reason == "invalid_uses"
    assert not status.enabled
    assert status.invalid == tuple(sorted(set(uses) - VOCABULARY))


@pytest.mark.parametrize("raw", [None, "tools", ["tools", 3], {"a": 1}])
def test_malformed_uses_from_a_manifest_are_invalid(raw: Any) -> None:
    body: dict[str, Any] = {"description": "d"}
    if raw is not None:
        body["uses"] = raw
    declared = declared_feature_sets({"featureSets": {"s": body}}).sets
    assert derive_feature_sets(declared, ALL).statuses["s"].reason == "invalid_uses"


def test_capability_denied_lists_every_missing_path() -> None:
    state = derive_feature_sets(
        sets(chat=["tools", "channels.publish", "pushEvents", "channels.incoming"]),
        {"tools", "channels.publish"},
    )
    status = state.statuses["chat"]
    assert status.reason == "capability_denied"
    assert status.missing == ("channels.incoming", "pushEvents")


def test_selection_and_disable() -> None:
    declared = sets(memory__a=["tools"], memory__b__c=["tools"], other=["tools"], memory=["tools"])
    state = derive_feature_sets(declared, ALL, ["memory.*"], [])
    assert state.enabled == {"memory.a", "memory.b.c"}
    assert state.statuses["other"].reason == "not_selected"
    assert state.statuses["memory"].reason == "not_selected"
    # disable wins over enable, including over a wildcard and a literal
    state = derive_feature_sets(declared, ALL, ["memory.*", "memory.a"], ["memory.a"])
    assert state.statuses["memory.a"].reason == "disabled"
    assert state.statuses["memory.a"].disabled
    assert not state.statuses["memory.a"].selected
    state = derive_feature_sets(declared, ALL, None, ["memory.*"])
    assert state.enabled == {"other", "memory"}
    assert state.disabled == ("memory.a", "memory.b.c")


def test_reason_order_invalid_then_denied_then_disabled_then_not_selected() -> None:
    declared = sets(bad=["channels.observe"], gap=["pushEvents"], off=["tools"], skip=["tools"])
    state = derive_feature_sets(declared, {"tools"}, ["bad", "gap", "off"], ["bad", "gap", "off"])
    assert {n: s.reason for n, s in state.statuses.items()} == {
        "bad": "invalid_uses",
        "gap": "capability_denied",
        "off": "disabled",
        "skip": "not_selected",
    }


def test_unavailable_features_and_the_receipt() -> None:
    declared = sets(
        ok=["tools"],
        gap=["tools", "pushEvents", "channels.incoming"],
        bad=["contextHooks.beforeInference"],
        off=["pushEvents"],
        skip=["pushEvents"],
    )
    state = derive_feature_sets(declared, {"tools"}, ["ok", "gap", "bad", "off"], ["off"])
    assert state.unavailable_features() == [
        {
            "featureSet": "bad",
            "missingCapabilities": [],
            "effect": "disabled",
            "reason": "invalid_uses",
        },
        {
            "featureSet": "gap",
            "missingCapabilities": ["channels.incoming", "pushEvents"],
            "effect": "disabled",
            "reason": "capability_denied",
        },
    ]
    receipt = state.receipt()
    assert receipt["accepted"] is True and receipt["mode"] == "degraded"
    assert len(receipt["unavailableFeatures"]) == 2
    clean = derive_feature_sets(sets(ok=["tools"]), {"tools"})
    assert clean.receipt() == {"accepted": True}  # mode omitted when nothing degraded


def test_reading_a_receipt_keeps_only_well_formed_entries() -> None:
    receipt = {
        "accepted": True,
        "mode": "degraded",
        "unavailableFeatures": [
            {"featureSet": "a", "missingCapabilities": ["pushEvents"], "effect": "disabled"},
            {"featureSet": "b", "effect": "disabled", "extra": 1},
            {"featureSet": "c", "missingCapabilities": "pushEvents", "effect": "disabled"},
            {"featureSet": "d", "missingCapabilities": []},
            {"missingCapabilities": [], "effect": "disabled"},
            "e",
        ],
    }
    assert read_unavailable_features(receipt) == (
        UnavailableFeature(
            feature_set="a", missing_capabilities=("pushEvents",), effect="disabled"
        ),
        UnavailableFeature(feature_set="b", missing_capabilities=(), effect="disabled"),
    )
    junks: list[Any] = [None, [], {"unavailableFeatures": {}}, {"accepted": True}]
    for junk in junks:
        assert read_unavailable_features(junk) == ()


def test_update_params() -> None:
    declared = sets(b=["tools"], a=["pushEvents"], c=["tools"])
    grant = frozenset({"tools", "pushEvents", "not.a.path"})
    assert update_params(grant, derive_feature_sets(declared, grant)) == {
        "effectiveCapabilities": ["pushEvents", "tools"],
        "enabled": ["a", "b", "c"],
    }
    state = derive_feature_sets(declared, grant, ["a", "b"], ["b"])
    assert update_params(frozenset(), state) == {
        "effectiveCapabilities": [],
        "enabled": ["a"],
        "disabled": ["b"],
    }
    assert update_params(frozenset(), derive_feature_sets({}, frozenset())) == {
        "effectiveCapabilities": [],
        "enabled": [],
    }


set_names = st.sampled_from(["a", "b", "memory.x", "memory.y.z", "other.q"])
uses_lists = st.lists(paths | st.sampled_from(["channels.observe", "bogus"]), max_size=4)
declarations = st.dictionaries(set_names, uses_lists).map(
    lambda d: {n: FeatureSet(name=n, description="", uses=tuple(u)) for n, u in d.items()}
)
name_patterns = st.lists(
    set_names | st.sampled_from(["memory.*", "*", "*.x", "nothing"]), max_size=3
)


@given(declarations, st.frozensets(paths), st.none() | name_patterns, name_patterns, name_patterns)
def test_derivation_fails_closed(
    declared: dict[str, FeatureSet],
    grant: frozenset[str],
    enabled: list[str] | None,
    disabled: list[str],
    extra: list[str],
) -> None:
    state = derive_feature_sets(declared, grant, enabled, disabled)
    assert set(state.statuses) == set(declared)
    for name in state.enabled:
        uses = set(declared[name].uses)
        assert uses and uses <= VOCABULARY and uses <= grant
        assert not any(name_matches(d, name) for d in disabled)
        assert enabled is None or any(name_matches(e, name) for e in enabled)
    # more disabled names, or a narrower grant, never enable more
    assert derive_feature_sets(declared, grant, enabled, [*disabled, *extra]).enabled <= (
        state.enabled
    )
    narrower = frozenset(sorted(grant)[: len(grant) // 2])
    assert derive_feature_sets(declared, narrower, enabled, disabled).enabled <= state.enabled
    for entry in state.unavailable_features():
        assert entry["effect"] == "disabled"
        assert set(entry["missingCapabilities"]).isdisjoint(grant)


@given(declarations, st.frozensets(paths), st.none() | name_patterns, name_patterns)
def test_the_update_names_exactly_the_sets_admission_lets_through(
    declared: dict[str, FeatureSet],
    grant: frozenset[str],
    enabled: list[str] | None,
    disabled: list[str],
) -> None:
    state = derive_feature_sets(declared, grant, enabled, disabled)
    named = update_params(grant, state)["enabled"]
    assert named == sorted(named)
    runnable = {
        n
        for n, fs in declared.items()
        if state.statuses[n].selected and fs.uses and set(fs.uses) <= VOCABULARY & grant
    }
    assert set(named) == runnable <= set(state.selected)
    for name in declared:  # a set it names is never refused as not enabled, and vice versa
        for method in FEATURE_SET_METHODS:
            try:
                admit(method, ALL, name, declared=declared, enabled=state.enabled)
            except RpcError as exc:
                assert (exc.code == FEATURE_SET_NOT_ENABLED) == (name not in named)
            else:
                assert name in named


# --- admission -------------------------------------------------------------------------------

DECLARED = sets(
    memory__proactive=["pushEvents"],
    memory__think=["inferenceRequest"],
    memory__off=["pushEvents"],
    memory__tools=["tools"],
)
ENABLED = frozenset({"memory.proactive", "memory.think", "memory.tools"})


def _admit(method: str, grant: Any = ALL, fs: str | None = None, **kw: Any) -> None:
    kw.setdefault("declared", DECLARED)
    kw.setdefault("enabled", ENABLED)
    admit(method, grant, fs, **kw)


def test_the_inbound_table() -> None:
    assert dict(INBOUND_CAPABILITY) == {
        "push/event": "pushEvents",
        "inference/request": "inferenceRequest",
        "model/info": "modelInfo",
        "channels/register": "channels.register",
        "channels/changed": "channels.register",
        "channels/list": "channels.register",
        "channels/incoming": "channels.incoming",
    }
    assert set(INBOUND_CAPABILITY.values()) <= VOCABULARY
    assert FEATURE_SET_METHODS <= set(INBOUND_CAPABILITY)


def test_admitted_calls() -> None:
    _admit("push/event", fs="memory.proactive")
    _admit("inference/request", fs="memory.think")
    _admit("model/info")
    for method in ("channels/register", "channels/changed", "channels/list"):
        _admit(method, {"channels.register"})
    _admit("channels/incoming", {"channels.incoming"}, fs="ignored: channels carry none")
    _admit("mcpl/manifestChanged", frozenset(), ready=False)  # ungated, deliberately


@pytest.mark.parametrize("method", sorted(REMOVED_METHODS))
def test_removed_methods_are_method_not_found(method: str) -> None:
    err = code_of(lambda: _admit(method))
    assert err.code == METHOD_NOT_FOUND
    assert "removed" in err.message


@pytest.mark.parametrize("method", ["state/update", "branches/list", "ping", "tools/call", ""])
def test_unknown_methods_are_method_not_found(method: str) -> None:
    assert code_of(lambda: _admit(method)).code == METHOD_NOT_FOUND


def test_not_ready_denies_every_gated_method() -> None:
    for method, cap in INBOUND_CAPABILITY.items():
        err = code_of(lambda m=method: _admit(m, fs="memory.proactive", ready=False))
        assert (err.code, err.data) == (CAPABILITY_DENIED, {"capability": cap})


def test_outside_the_grant() -> None:
    err = code_of(lambda: _admit("push/event", ALL - {"pushEvents"}, "memory.proactive"))
    assert (err.code, err.data) == (CAPABILITY_DENIED, {"capability": "pushEvents"})
    err = code_of(lambda: _admit("model/info", frozenset()))
    assert (err.code, err.data) == (CAPABILITY_DENIED, {"capability": "modelInfo"})
    err = code_of(lambda: _admit("channels/changed", {"channels.incoming"}))
    assert err.data == {"capability": "channels.register"}


@pytest.mark.parametrize("fs", [None, ""])
def test_a_feature_set_method_must_name_its_set(fs: str | None) -> None:
    assert code_of(lambda: _admit("push/event", fs=fs)).code == INVALID_PARAMS


def test_undeclared_not_enabled_and_mismatch() -> None:
    err = code_of(lambda: _admit("push/event", fs="memory.ghost"))
    assert (err.code, err.data) == (UNKNOWN_FEATURE_SET, {"featureSet": "memory.ghost"})
    err = code_of(lambda: _admit("push/event", fs="memory.off"))
    assert (err.code, err.data) == (FEATURE_SET_NOT_ENABLED, {"featureSet": "memory.off"})
    assert err.message == "Feature set not enabled"
    err = code_of(lambda: _admit("push/event", fs="memory.think"))
    assert (err.code, err.data) == (
        CAPABILITY_DENIED,
        {"capability": "pushEvents", "featureSet": "memory.think"},
    )
    err = code_of(lambda: _admit("inference/request", fs="memory.tools"))
    assert err.data == {"capability": "inferenceRequest", "featureSet": "memory.tools"}


def test_the_checks_run_in_order() -> None:
    # ready before grant before declared before enabled before uses
    err = code_of(lambda: _admit("push/event", frozenset(), "memory.ghost", ready=False))
    assert (err.code, err.data) == (CAPABILITY_DENIED, {"capability": "pushEvents"})
    err = code_of(lambda: _admit("push/event", frozenset(), "memory.ghost"))
    assert err.code == CAPABILITY_DENIED
    err = code_of(lambda: _admit("push/event", fs="memory.ghost", enabled=frozenset()))
    assert err.code == UNKNOWN_FEATURE_SET
    err = code_of(lambda: _admit("push/event", fs="memory.think", enabled=frozenset()))
    assert err.code == FEATURE_SET_NOT_ENABLED


def test_errors_are_wire_ready() -> None:
    err = code_of(lambda: _admit("push/event", frozenset(), "memory.proactive"))
    wire = err.to_wire()
    assert wire["code"] == -32002 and wire["data"] == {"capability": "pushEvents"}
    assert isinstance(wire["message"], str) and wire["message"]


methods = st.sampled_from(
    sorted(INBOUND_CAPABILITY) + sorted(REMOVED_METHODS) + sorted(UNGATED_INBOUND) + ["x/y"]
)


@given(
    methods,
    st.frozensets(paths),
    st.none() | set_names | st.sampled_from(sorted(DECLARED)),
    st.booleans(),
    declarations,
    st.frozensets(set_names),
)
def test_admission_never_admits_outside_the_grant(
    method: str,
    grant: frozenset[str],
    fs: str | None,
    ready: bool,
    declared: Mapping[str, FeatureSet],
    enabled: frozenset[str],
) -> None:
    try:
        admit(method, grant, fs, declared=declared, enabled=enabled, ready=ready)
    except RpcError as err:
        assert err.code in (
            METHOD_NOT_FOUND,
            CAPABILITY_DENIED,
            UNKNOWN_FEATURE_SET,
            FEATURE_SET_NOT_ENABLED,
            INVALID_PARAMS,
        )
        return
    if method in UNGATED_INBOUND:
        return
    cap = INBOUND_CAPABILITY[method]
    assert ready and cap in grant
    if method in FEATURE_SET_METHODS:
        assert fs in enabled and fs in declared and cap in declared[fs].uses


# --- grant changes ---------------------------------------------------------------------------


def test_split_change() -> None:
    split = split_change({"tools", "pushEvents"}, {"tools", "channels.publish"})
    assert split.revoke_now == {"pushEvents"}
    assert split.await_receipt == {"channels.publish"}
    assert split.in_force_now == {"tools"}


NO_SETS = derive_feature_sets({}, frozenset())


def test_the_ledger_reduces_at_once_and_expands_on_receipt() -> None:
    ledger = GrantLedger()
    assert not ledger.ready and ledger.in_force == frozenset()
    ledger, first = ledger.propose({"tools", "pushEvents"}, NO_SETS)
    assert first.params == {"effectiveCapabilities": ["pushEvents", "tools"], "enabled": []}
    assert ledger.in_force == frozenset() and not ledger.ready  # the initial policy waits
    ledger = ledger.on_receipt(first.seq, accepted=True)
    assert ledger.ready and ledger.in_force == {"tools", "pushEvents"}
    ledger, change = ledger.propose({"tools", "modelInfo"}, NO_SETS)
    assert ledger.in_force == {"tools"}  # pushEvents revoked before the Request goes out
    assert change.split.await_receipt == {"modelInfo"}
    assert ledger.on_receipt(change.seq, accepted=False).in_force == {"tools"}
    assert ledger.on_receipt(change.seq + 7, accepted=True).in_force == {"tools"}
    assert ledger.on_receipt(change.seq, accepted=True).in_force == {"tools", "modelInfo"}


def test_a_superseded_proposal_never_activates() -> None:
    ledger = GrantLedger().propose({"tools"}, NO_SETS)[0]
    ledger = ledger.on_receipt(1, accepted=True)
    ledger, wide = ledger.propose({"tools", "pushEvents"}, NO_SETS)
    ledger, narrow = ledger.propose({"modelInfo"}, NO_SETS)
    assert ledger.in_force == frozenset()
    assert ledger.on_receipt(wide.seq, accepted=True).in_force == frozenset()
    assert ledger.on_receipt(narrow.seq, accepted=True).in_force == {"modelInfo"}


def test_reconnect_resets_until_the_new_receipt() -> None:
    ledger = GrantLedger().propose({"tools"}, NO_SETS)[0].on_receipt(1, accepted=True)
    ledger, pending = ledger.propose({"tools", "pushEvents"}, NO_SETS)
    ledger = ledger.reset()
    assert not ledger.ready and ledger.in_force == frozenset() and ledger.pending is None
    assert ledger.on_receipt(pending.seq, accepted=True) == ledger  # a late, old receipt
    err = code_of(lambda: ledger.admit("channels/list"))
    assert err.code == CAPABILITY_DENIED
    ledger, again = ledger.propose({"tools", "channels.register"}, NO_SETS)
    assert again.seq > pending.seq
    ledger = ledger.on_receipt(again.seq, accepted=True)
    ledger.admit("channels/list")


def test_a_refused_initial_policy_never_becomes_ready() -> None:
    ledger, change = GrantLedger().propose(ALL, NO_SETS)
    ledger = ledger.on_receipt(change.seq, accepted=False)
    assert not ledger.ready and ledger.in_force == frozenset()


class GrantChanges(RuleBasedStateMachine):
    """Random grant changes, receipts (in any order, late or refused) and reconnects.

    The model keeps only what the rules allow: after any change the grant in force is the
    old one minus what the change dropped; a path becomes active only through an accepted
    receipt of the newest outstanding proposal; a reconnect empties everything.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ledger = GrantLedger()
        self.model: frozenset[str] = frozenset()
        self.model_ready = False
        self.newest: tuple[int, frozenset[str]] | None = None
        self.sent: list[int] = []
        self.declared = sets(**{f"s{i}": [m] for i, m in enumerate(sorted(VOCABULARY))})
        self.wanted: frozenset[str] = frozenset()

    @initialize()
    def start(self) -> None:
        self.ledger = self.ledger.reset()

    @rule(grant=st.frozensets(paths))
    def change(self, grant: frozenset[str]) -> None:
        state = derive_feature_sets(self.declared, grant)
        self.ledger, change = self.ledger.propose(grant, state)
        assert change.params["effectiveCapabilities"] == sorted(grant)
        self.model = self.model & grant
        self.newest = (change.seq, grant)
        self.sent.append(change.seq)
        self.wanted = grant

    @precondition(lambda self: self.sent)
    @rule(data=st.data(), accepted=st.booleans())
    def receipt(self, data: st.DataObject, accepted: bool) -> None:
        seq = data.draw(st.sampled_from(self.sent))
        self.ledger = self.ledger.on_receipt(seq, accepted)
        if self.newest is not None and seq == self.newest[0]:
            if accepted:
                self.model = self.newest[1]
                self.model_ready = True
            self.newest = None

    @rule()
    def reconnect(self) -> None:
        self.ledger = self.ledger.reset()
        self.model = frozenset()
        self.model_ready = False
        self.newest = None
        self.wanted = frozenset()

    @invariant()
    def matches_the_model(self) -> None:
        assert self.ledger.in_force == self.model
        assert self.ledger.ready == self.model_ready

    @invariant()
    def never_wider_than_what_the_host_wants(self) -> None:
        assert self.ledger.in_force <= self.wanted

    @invariant()
    def nothing_is_admitted_outside_the_grant_in_force(self) -> None:
        enabled = frozenset(self.declared)
        for method, cap in INBOUND_CAPABILITY.items():
            fs = next(n for n, s in self.declared.items() if s.uses == (cap,))
            try:
                self.ledger.admit(method, fs, declared=self.declared, enabled=enabled)
            except RpcError as err:
                assert err.code == CAPABILITY_DENIED
                assert not (self.model_ready and cap in self.model)
            else:
                assert self.model_ready and cap in self.model


TestGrantChanges = GrantChanges.TestCase


@given(
    st.sampled_from(sorted(FEATURE_SET_METHODS)),
    st.lists(st.sampled_from(sorted(VOCABULARY)), max_size=4),
    st.lists(st.sampled_from(sorted(VOCABULARY)), max_size=3),
)
def test_a_use_outside_the_sets_is_admitted_only_when_the_operator_allows_it(
    method: str, uses: list[str], outside: list[str]
) -> None:
    cap = INBOUND_CAPABILITY[method]
    sets = {"s.chat": FeatureSet(name="s.chat", description="", uses=tuple(uses))}
    kwargs: dict[str, Any] = {"declared": sets, "enabled": {"s.chat"}, "outside_sets": outside}
    if cap in uses or cap in outside:
        admit(method, {cap}, "s.chat", **kwargs)
    else:
        with pytest.raises(RpcError) as refused:
            admit(method, {cap}, "s.chat", **kwargs)
        assert refused.value.data == {"capability": cap, "featureSet": "s.chat"}
    # it never reaches past the grant: a capability not granted is refused all the same
    with pytest.raises(RpcError):
        admit(method, set(), "s.chat", **kwargs)
