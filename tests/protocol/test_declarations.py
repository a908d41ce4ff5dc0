"""Declaration mismatches between a manifest's feature sets and what it advertises."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.declarations import (
    DECLARATION,
    DECLARED_TWICE,
    MAX_MISMATCHES,
    MAX_NAMED_SETS,
    MAX_NOTED_USES,
    NO_USES,
    NOT_ADVERTISED,
    TAGGED_CAPABILITIES,
    UNKNOWN_CAPABILITY,
    UNLISTED_USE,
    Mismatch,
    NotedUses,
    declaration_mismatches,
    refused_use,
)
from protocol.errors import CAPABILITY_DENIED, RpcError
from protocol.grants import admit, derive_feature_sets
from protocol.mcpl import VOCABULARY, advertised_paths, declared_feature_sets


def problems(manifest: Any) -> list[tuple[str, str | None, str | None]]:
    found = declaration_mismatches(manifest, advertised_paths(manifest))
    return [(m.problem, m.feature_set, m.capability) for m in found]


def test_a_set_using_a_capability_the_server_did_not_advertise() -> None:
    manifest = {
        "version": "0.5",
        "pushEvents": True,
        "featureSets": {
            "ok": {"uses": ["pushEvents"]},
            "ghost": {"uses": ["pushEvents", "channels.publish"]},
        },
    }
    [m] = declaration_mismatches(manifest, advertised_paths(manifest))
    assert (m.problem, m.feature_set, m.capability) == (NOT_ADVERTISED, "ghost", "channels.publish")
    assert "'ghost'" in m.text and "channels.publish" in m.text and "did not advertise" in m.text


def test_unknown_capabilities_and_empty_uses() -> None:
    manifest = {
        "pushEvents": True,
        "featureSets": {
            "odd": {"uses": ["channels", "pushEvents"]},
            "bare": {"description": "no uses at all"},
            "empty": {"uses": []},
        },
    }
    assert problems(manifest) == [
        (UNKNOWN_CAPABILITY, "odd", "channels"),
        (NO_USES, "bare", None),
        (NO_USES, "empty", None),
    ]


def test_the_array_form_and_a_set_declared_twice() -> None:
    manifest = {
        "pushEvents": True,
        "featureSets": [
            {"name": "a", "uses": ["pushEvents"]},
            {"name": "a", "uses": ["pushEvents"]},
        ],
    }
    found = declaration_mismatches(manifest, advertised_paths(manifest))
    assert [m.problem for m in found] == [DECLARATION, DECLARED_TWICE]
    assert "0.4 array form" in found[0].text
    assert found[1].feature_set == "a" and "declared twice" in found[1].text


def test_notes_of_the_declaration_walk_are_kept() -> None:
    manifest = {"featureSets": {"x": {"uses": ["pushEvents", 3]}, "y": "not an object"}}
    texts = [m.text for m in declaration_mismatches(manifest, frozenset())]
    assert any("non-string" in t for t in texts)
    assert any("malformed" in t for t in texts)
    # a uses list that held a non-string is reported once, not again as "no uses"
    assert not any("declares no uses" in t for t in texts)


def test_the_list_is_capped() -> None:
    sets = {f"s{i}": {"uses": ["channels.publish"]} for i in range(MAX_MISMATCHES * 2)}
    found = declaration_mismatches({"featureSets": sets}, frozenset())
    assert len(found) == MAX_MISMATCHES
    assert found[-1].text == f"{MAX_MISMATCHES + 1} more declaration problems"


paths = st.sampled_from([*sorted(VOCABULARY), "channels", "nope.x"])


@given(
    st.dictionaries(
        st.text("abc.", min_size=1, max_size=4),
        st.fixed_dictionaries({"uses": st.lists(paths, max_size=4)}),
        max_size=6,
    ),
    st.frozensets(st.sampled_from(sorted(VOCABULARY))),
)
def test_a_set_is_reported_exactly_when_its_uses_cannot_hold(
    sets: dict[str, Any], advertised: frozenset[str]
) -> None:
    found = declaration_mismatches({"featureSets": sets}, advertised)
    reported = {m.feature_set for m in found}
    for name, body in sets.items():
        uses = body["uses"]
        sound = bool(uses) and all(u in VOCABULARY and u in advertised for u in uses)
        assert (name not in reported) == sound
    for m in found:  # every line names the set, and the capability when one is at fault
        assert m.feature_set is not None and repr(m.feature_set) in m.text
        if m.problem in (NOT_ADVERTISED, UNKNOWN_CAPABILITY):
            assert m.capability is not None and m.capability in m.text


# -- a capability the server exercises that no enabled set lists in its uses ---------------------


def test_a_pushing_server_whose_sets_omit_push_events() -> None:
    manifest = {
        "pushEvents": True,
        "channels": {"register": True, "incoming": True},
        "featureSets": {
            "chat": {"uses": ["channels.register", "channels.incoming"]},
            "legacy": {"uses": ["pushEvents", "contextHooks.beforeInference"]},
        },
    }
    advertised = advertised_paths(manifest)
    state = derive_feature_sets(declared_feature_sets(manifest).sets, advertised)
    found = declaration_mismatches(manifest, advertised, state)
    assert [(m.problem, m.feature_set, m.capability) for m in found] == [
        (UNLISTED_USE, "chat", "pushEvents"),
        (UNKNOWN_CAPABILITY, "legacy", "contextHooks.beforeInference"),
    ]
    assert found[0].feature_sets == ("chat",)
    assert "'chat'" in found[0].text and "push/event" in found[0].text
    # without the derived state (a manifest file alone), only the declarations are checked
    assert [m.problem for m in declaration_mismatches(manifest, advertised)] == [UNKNOWN_CAPABILITY]
    # the operator turning off the set that pushes is a choice, not a mismatch
    sound = {**manifest, "featureSets": {**manifest["featureSets"], "ev": {"uses": ["pushEvents"]}}}
    off = derive_feature_sets(declared_feature_sets(sound).sets, advertised, None, ["ev"])
    assert UNLISTED_USE not in [m.problem for m in declaration_mismatches(sound, advertised, off)]


def test_many_enabled_sets_are_counted_past_the_cap() -> None:
    sets = {f"s{i:02}": {"uses": ["channels.register"]} for i in range(MAX_NAMED_SETS + 3)}
    manifest = {"pushEvents": True, "channels": {"register": True}, "featureSets": sets}
    advertised = advertised_paths(manifest)
    state = derive_feature_sets(declared_feature_sets(manifest).sets, advertised)
    [m] = declaration_mismatches(manifest, advertised, state)
    assert m.feature_set is None and len(m.feature_sets) == MAX_NAMED_SETS + 3
    assert "'s07' and 3 more" in m.text and "'s08'" not in m.text


set_names = st.sampled_from(["a", "b", "c.d"])
uses = st.lists(st.sampled_from([*sorted(VOCABULARY), "bogus"]), max_size=3)


@given(
    st.dictionaries(set_names, st.fixed_dictionaries({"uses": uses}), max_size=3),
    st.frozensets(st.sampled_from(sorted(VOCABULARY))),
    st.frozensets(st.sampled_from(sorted(VOCABULARY))),
    st.none() | st.lists(set_names, max_size=2),
    st.lists(set_names, max_size=2),
)
def test_an_unlisted_use_is_reported_exactly_when_every_such_call_is_refused(
    sets: dict[str, Any],
    advertised: frozenset[str],
    grant: frozenset[str],
    enabled: list[str] | None,
    disabled: list[str],
) -> None:
    manifest = {"featureSets": sets}
    declared = declared_feature_sets(manifest).sets
    state = derive_feature_sets(declared, grant, enabled, disabled)
    found = declaration_mismatches(manifest, advertised, state, grant)
    reported = {m.capability: m for m in found if m.problem == UNLISTED_USE}
    assert set(reported) <= grant  # an operator's denial is not the server's mismatch
    for cap, method in TAGGED_CAPABILITIES.items():
        # every call naming an enabled set, or a declared one, is refused
        outcomes = []
        for name in declared:
            try:
                admit(method, grant, name, declared=declared, enabled=state.enabled)
                outcomes.append("admitted")
            except RpcError as exc:
                outcomes.append(exc.code)
        deselected = any(
            cap in declared[n].uses and not state.statuses[n].selected for n in declared
        )
        if cap in reported:
            m = reported[cap]
            assert "admitted" not in outcomes
            assert m.feature_sets == tuple(sorted(state.enabled))
            for name in m.feature_sets:
                with pytest.raises(RpcError) as refusal:
                    admit(method, grant, name, declared=declared, enabled=state.enabled)
                assert refusal.value.code == CAPABILITY_DENIED
                assert refusal.value.data == {"capability": cap, "featureSet": name}
        else:  # not granted, a set can take it, or the operator turned such sets off
            assert cap not in grant or "admitted" in outcomes or deselected
        if "admitted" in outcomes:
            assert cap not in reported


def test_a_refusal_stands_for_an_unlisted_use_only_with_both_names() -> None:
    m = refused_use(
        "push/event", CAPABILITY_DENIED, {"capability": "pushEvents", "featureSet": "x"}
    )
    assert m is not None and (m.problem, m.feature_set, m.capability) == (
        UNLISTED_USE,
        "x",
        "pushEvents",
    )
    assert "'x'" in m.text and "push/event" in m.text and "-32002" in m.text
    assert refused_use("push/event", CAPABILITY_DENIED, {"capability": "pushEvents"}) is None
    assert refused_use("push/event", -32001, {"featureSet": "x"}) is None
    assert refused_use("push/event", CAPABILITY_DENIED, None) is None
    # a name with a line break stays on one line
    odd = refused_use("push/event", CAPABILITY_DENIED, {"capability": "c", "featureSet": "a\nb"})
    assert odd is not None and "\n" not in odd.text


def _use(name: str, cap: str = "pushEvents") -> Mismatch:
    return Mismatch(problem=UNLISTED_USE, text=name, feature_set=name, capability=cap)


@given(st.lists(st.integers(0, MAX_NOTED_USES * 2), max_size=MAX_NOTED_USES * 4))
def test_refused_uses_are_reported_once_each_within_the_cap(keys: list[int]) -> None:
    noted = NotedUses()
    lines: list[Mismatch] = []
    for k in keys:
        noted, line = noted.note(_use(f"s{k}"))
        if line is not None:
            lines.append(line)
    distinct = list(dict.fromkeys(keys))
    kept = distinct[:MAX_NOTED_USES]
    assert [m.text for m in lines if m.problem == UNLISTED_USE] == [f"s{k}" for k in kept]
    overflow = [m for m in lines if m.problem == DECLARATION]
    assert len(overflow) == (1 if len(distinct) > MAX_NOTED_USES else 0)
    assert len(noted.keys) == len(kept) and noted.dropped >= len(distinct) - len(kept)


def test_the_noted_uses_at_the_cap() -> None:
    noted = NotedUses()
    for i in range(MAX_NOTED_USES):
        noted, line = noted.note(_use(f"s{i}"))
        assert line is not None
    noted, line = noted.note(_use("one-more"))
    assert line is not None and line.problem == DECLARATION
    assert f"more than {MAX_NOTED_USES}" in line.text
    noted, line = noted.note(_use("and-another", "inferenceRequest"))
    assert line is None and noted.dropped == 2
    noted, line = noted.note(_use("s0"))  # already reported: nothing, and nothing counted
    assert line is None and noted.dropped == 2
