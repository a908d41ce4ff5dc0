"""Declaration mismatches between a manifest's feature sets and what it advertises."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.declarations import (
    DECLARATION,
    DECLARED_TWICE,
    MAX_MISMATCHES,
    NO_USES,
    NOT_ADVERTISED,
    UNKNOWN_CAPABILITY,
    declaration_mismatches,
)
from protocol.mcpl import VOCABULARY, advertised_paths


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
