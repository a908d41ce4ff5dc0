"""The MCPL handshake pieces: the advertisement walk, the default grant, feature sets, receipts."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.mcpl import (
    DENIED_BY_DEFAULT,
    MAX_FEATURE_SETS,
    MCPL_VERSION,
    PROTOCOL_VERSION,
    VOCABULARY,
    FeatureSet,
    Receipt,
    advertised_paths,
    declared_feature_sets,
    default_grant,
    host_manifest,
    initialize_params,
    read_receipt,
)

HOOKS = {
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.system",
    "contextHooks.beforeInference.inject.beforeUser",
    "contextHooks.beforeInference.inject.afterUser",
}
CHANNELS = {
    f"channels.{leaf}"
    for leaf in (
        "register",
        "lifecycle",
        "publish",
        "incoming",
        "streaming",
        "acknowledge",
        "typing",
    )
}
SYSTEM = "contextHooks.beforeInference.inject.system"


def test_vocabulary_is_the_closed_seventeen_paths() -> None:
    assert len(VOCABULARY) == 17
    assert HOOKS | CHANNELS <= VOCABULARY
    for legacy in ("contextHooks.beforeInference", "contextHooks.afterInference", "channels"):
        assert legacy not in VOCABULARY


# --- advertisement walk ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        ({"pushEvents": True}, {"pushEvents"}),
        ({"contextHooks": {"beforeInference": True}}, HOOKS),
        ({"contextHooks": True}, HOOKS),
        (
            {"contextHooks": {"beforeInference": {"observe": True, "inject": True}}},
            HOOKS,
        ),
        (
            {
                "contextHooks": {
                    "beforeInference": {"inject": {"beforeUser": True, "system": False}}
                }
            },
            {"contextHooks.beforeInference.inject.beforeUser"},
        ),
        ({"channels": True}, CHANNELS),
        (
            {"channels": {"register": True, "publish": True}},
            {"channels.register", "channels.publish"},
        ),
        ({"inferenceRequest": True}, {"inferenceRequest", "inferenceRequest.streaming"}),
        (
            {"inferenceRequest": {"streaming": True}},
            {"inferenceRequest", "inferenceRequest.streaming"},
        ),
        ({"inferenceRequest": {"streaming": False}}, {"inferenceRequest"}),
        ({"inferenceRequest": {}}, {"inferenceRequest"}),
        ({"modelInfo": True, "inferenceLifecycle": True}, {"modelInfo", "inferenceLifecycle"}),
    ],
)
def test_advertisement_walk(manifest: dict[str, Any], expected: set[str]) -> None:
    assert advertised_paths({"version": "0.5", **manifest}) == expected


@pytest.mark.parametrize("value", [False, None, 0, 1, "true", [], ["register"]])
def test_anything_but_true_or_an_object_covers_nothing(value: Any) -> None:
    manifest = {"pushEvents": value, "channels": value, "contextHooks": {"beforeInference": value}}
    assert advertised_paths(manifest) == frozenset()


def test_the_04_name_of_channels_incoming_advertises_it_and_nothing_more() -> None:
    # mcpl-editor (which says "0.5") still advertises and uses the 0.4 name ``observe``
    assert advertised_paths({"channels": {"observe": True}}) == {"channels.incoming"}
    assert advertised_paths({"channels": {"observe": 1}}) == frozenset()
    declared = declared_feature_sets(
        {"featureSets": {"e.chat": {"uses": ["channels.publish", "channels.observe"]}}}
    )
    assert declared.sets["e.chat"].uses == ("channels.publish", "channels.incoming")
    assert declared.diagnostics == (
        "feature set 'e.chat' uses 'channels.observe', the 0.4 name of 'channels.incoming'; "
        "read as channels.incoming",
    )


@pytest.mark.parametrize(
    "manifest",
    [
        {"contextHooks": {"afterInference": True}},
        {"memory": True},
        {"memory": {"pushEvents": True}},
        {"featureSets": {"pushEvents": True}},
        {"version": "0.5", "revision": "sha256:x", "hostState": True},
        {"": {"pushEvents": True}},
        {"contextHooks": {"": {"beforeInference": True}}},
        {"pushEvents": {"": True}},
    ],
)
def test_names_outside_the_vocabulary_mint_nothing(manifest: dict[str, Any]) -> None:
    assert advertised_paths(manifest) - {"pushEvents"} == frozenset()
    if "pushEvents" not in manifest:
        assert advertised_paths(manifest) == frozenset()


def test_an_object_at_a_path_advertises_that_path() -> None:
    assert advertised_paths({"pushEvents": {"": True}}) == {"pushEvents"}
    assert advertised_paths({"channels": {"register": {}}}) == {"channels.register"}


def test_dotted_keys_flatten_like_nested_objects() -> None:
    assert advertised_paths({"contextHooks.beforeInference": True}) == HOOKS
    assert advertised_paths({"channels": {"register.x": True}}) == frozenset()


def test_tools_comes_only_from_mcp_capabilities() -> None:
    assert advertised_paths({"tools": True}) == frozenset()
    assert advertised_paths({"tools": {"x": True}}, {}) == frozenset()
    assert advertised_paths({}, {"tools": {}}) == {"tools"}
    assert advertised_paths({}, {"tools": {"listChanged": True}}) == {"tools"}
    assert advertised_paths({"pushEvents": True}, {"tools": True}) == {"tools", "pushEvents"}
    assert advertised_paths(None, {"tools": {}}) == {"tools"}
    for absent in ({}, {"tools": None}, {"tools": False}, None, ["tools"], "tools"):
        assert advertised_paths({"tools": True}, absent) == frozenset()


@pytest.mark.parametrize("manifest", [None, True, "pushEvents", ["pushEvents"], 3])
def test_a_manifest_that_is_not_an_object_advertises_nothing(manifest: Any) -> None:
    assert advertised_paths(manifest) == frozenset()


def test_deep_manifest_does_not_raise() -> None:
    deep: Any = True
    for _ in range(5000):
        deep = {"channels": deep}
    assert advertised_paths({"channels": deep}) <= VOCABULARY


json_keys = st.one_of(
    st.sampled_from(
        [
            "pushEvents",
            "tools",
            "channels",
            "register",
            "publish",
            "contextHooks",
            "beforeInference",
            "inject",
            "system",
            "observe",
            "inferenceRequest",
            "streaming",
            "featureSets",
            "",
            "x",
        ]
    ),
    st.text(max_size=12),
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(json_keys, inner, max_size=5)
    ),
    max_leaves=25,
)


@given(json_values, json_values)
def test_advertised_paths_are_always_vocabulary(manifest: Any, caps: Any) -> None:
    found = advertised_paths(manifest, caps)
    assert found <= VOCABULARY
    tools = caps.get("tools") if isinstance(caps, dict) else None
    if isinstance(tools, dict):
        assert "tools" in found
    elif tools is None or tools is False:
        assert "tools" not in found


@given(st.dictionaries(json_keys, json_values, max_size=6))
def test_adding_false_members_changes_nothing(manifest: dict[str, Any]) -> None:
    before = advertised_paths(manifest)
    extra = {
        k: False for k in ("pushEvents", "modelInfo", "inferenceLifecycle") if k not in manifest
    }
    assert advertised_paths({**manifest, **extra}) == before


# --- grant ------------------------------------------------------------------------------------


def test_default_grant_withholds_inject_system() -> None:
    everything = advertised_paths({"pushEvents": True, "contextHooks": True, "channels": True})
    assert SYSTEM in everything
    grant = default_grant(everything)
    assert SYSTEM not in grant
    assert grant == everything - {SYSTEM}
    assert DENIED_BY_DEFAULT == {SYSTEM}


@given(st.sets(st.sampled_from(sorted(VOCABULARY))))
def test_default_grant_never_contains_inject_system(advertised: set[str]) -> None:
    grant = default_grant(advertised)
    assert SYSTEM not in grant
    assert grant == advertised - {SYSTEM}


# --- feature sets -----------------------------------------------------------------------------


def test_object_and_array_forms_normalize_to_the_same_sets() -> None:
    keyed = {
        "featureSets": {
            "chat.inbox": {"description": "messages", "uses": ["channels.register"]},
            "memory": {"description": "recall", "uses": ["pushEvents"], "rollback": True},
        }
    }
    array = {
        "featureSets": [
            {"name": "chat.inbox", "description": "messages", "uses": ["channels.register"]},
            {"name": "memory", "description": "recall", "uses": ["pushEvents"], "rollback": True},
        ]
    }
    a = declared_feature_sets(keyed)
    b = declared_feature_sets(array)
    assert a.sets == b.sets
    assert a.sets["memory"] == FeatureSet(name="memory", description="recall", uses=("pushEvents",))
    assert a.sets["memory"].raw["rollback"] is True
    assert a.diagnostics == ()
    assert len(b.diagnostics) == 1
    assert "array" in b.diagnostics[0]


def test_keyed_form_may_repeat_the_name_inside() -> None:
    got = declared_feature_sets(
        {"featureSets": {"a": {"name": "a", "description": "", "uses": ["tools"]}}}
    )
    assert got.sets == {"a": FeatureSet(name="a", description="", uses=("tools",))}


@pytest.mark.parametrize(
    "raw",
    [
        [1, "x", None, {"description": "no name"}, {"name": ""}, {"name": 5}],
        {"": {"uses": ["tools"]}, "b": "not an object", "c": None, "d": ["tools"]},
    ],
)
def test_malformed_entries_are_ignored_with_a_note(raw: Any) -> None:
    good = {"name": "ok", "description": "d", "uses": ["tools"]}
    if isinstance(raw, list):
        raw = [*raw, good]
    else:
        raw = {**raw, "ok": {"description": "d", "uses": ["tools"]}}
    got = declared_feature_sets({"featureSets": raw})
    assert list(got.sets) == ["ok"]
    assert sum("malformed" in n for n in got.diagnostics) == (6 if isinstance(raw, list) else 4)


@pytest.mark.parametrize("raw", [True, "sets", 3])
def test_feature_sets_of_another_type_are_ignored_with_a_note(raw: Any) -> None:
    got = declared_feature_sets({"featureSets": raw})
    assert got.sets == {}
    assert len(got.diagnostics) == 1


@pytest.mark.parametrize("manifest", [{}, None, [], {"featureSets": None}])
def test_no_feature_sets(manifest: Any) -> None:
    got = declared_feature_sets(manifest)
    assert (dict(got.sets), got.diagnostics) == ({}, ())


def test_odd_description_and_uses_are_normalized() -> None:
    got = declared_feature_sets(
        {"featureSets": {"a": {"description": 5, "uses": "tools"}, "b": {}}}
    ).sets
    assert got["a"] == FeatureSet(name="a", description="", uses=())
    assert got["b"] == FeatureSet(name="b", description="", uses=())


def _many(n: int) -> dict[str, Any]:
    return {f"s{i:04d}": {"description": "", "uses": ["tools"]} for i in range(n)}


def test_feature_set_cap() -> None:
    at_cap = declared_feature_sets({"featureSets": _many(MAX_FEATURE_SETS)})
    assert len(at_cap.sets) == MAX_FEATURE_SETS
    assert at_cap.diagnostics == ()
    past = declared_feature_sets({"featureSets": _many(MAX_FEATURE_SETS + 1)})
    assert len(past.sets) == MAX_FEATURE_SETS
    assert f"s{MAX_FEATURE_SETS:04d}" not in past.sets
    assert len(past.diagnostics) == 1
    as_array = [{"name": k, **v} for k, v in _many(MAX_FEATURE_SETS + 1).items()]
    assert declared_feature_sets({"featureSets": as_array}).sets == past.sets


def test_accepted_receipt_makes_the_connection_ready() -> None:
    assert read_receipt({"accepted": True}) == Receipt(ready=True)
    degraded = read_receipt(
        {
            "accepted": True,
            "mode": "degraded",
            "unavailableFeatures": [{"featureSet": "x", "missingCapabilities": [], "effect": "d"}],
        }
    )
    assert degraded == Receipt(ready=True, note="degraded")
    assert not degraded.mcp_only and not degraded.close


def test_refusal_with_mcp_only_fallback() -> None:
    got = read_receipt({"accepted": False, "fallback": "mcp-only", "reason": "no hooks"})
    assert (got.ready, got.mcp_only, got.close) == (True, True, False)
    assert "no hooks" in got.note


def test_refusal_with_close_fallback() -> None:
    got = read_receipt({"accepted": False, "fallback": "close", "reason": "policy"})
    assert (got.ready, got.mcp_only, got.close) == (False, False, True)
    assert "policy" in got.note


@pytest.mark.parametrize(
    "result",
    [
        {"accepted": False},
        {"accepted": False, "fallback": "sideways"},
        {"accepted": False, "fallback": None, "reason": 5},
        {},
        {"accepted": "true"},
        {"accepted": 1},
    ],
)
def test_refusal_without_a_known_fallback_is_mcp_only(result: Any) -> None:
    got = read_receipt(result)
    assert (got.ready, got.mcp_only, got.close) == (True, True, False)


@pytest.mark.parametrize("result", [None, [], "ok", True, 1])
def test_receipt_that_is_not_an_object_is_mcp_only(result: Any) -> None:
    got = read_receipt(result)
    assert (got.ready, got.mcp_only, got.close) == (True, True, False)
    assert "malformed" in got.note


# --- handshake --------------------------------------------------------------------------------


def test_initialize_params_shape() -> None:
    params = initialize_params("1.2.3")
    assert set(params) == {"protocolVersion", "capabilities", "clientInfo"}
    assert params["protocolVersion"] == PROTOCOL_VERSION == "2024-11-05"
    assert params["clientInfo"] == {"name": "mcplive", "version": "1.2.3"}
    mcpl = params["capabilities"]["experimental"]["mcpl"]
    assert mcpl == host_manifest()
    assert mcpl["version"] == MCPL_VERSION == "0.5"
    assert mcpl["featureSets"] is True


def test_host_manifest_advertises_only_vocabulary_it_walks_to() -> None:
    manifest = host_manifest()
    found = advertised_paths(manifest)
    assert found == {
        "pushEvents",
        "channels.register",
        "channels.publish",
        "channels.incoming",
        "channels.lifecycle",
        "channels.streaming",
        "channels.typing",
    }


def test_host_manifest_advertises_coalescing_with_every_leaf() -> None:
    advertised = host_manifest()["eventCoalescing"]
    assert advertised["pushEvents"] is advertised["channelsIncoming"] is True
    assert advertised["channelScopedPush"] is True
    assert advertised["deferred"] is True
    assert advertised["retryWindowMs"] >= 3_600_000
