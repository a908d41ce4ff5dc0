"""The manifest revision digest (SPEC §17.2, RFC-003 §3.1).

The conformance file is the normative artifact: it is read from ``tests/conformance`` and
iterated, never transcribed. Every positive vector is asserted in the order that localizes a bug:
canonical text (JCS), then the SHA-256 of its UTF-8 bytes, then the base64url digest.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import math
import pickle
import random
import re
import string
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.manifest import ManifestError, canonical_json, manifest_digest, sort_identifiers
from tests.conformance import load_vectors

# Parse as UTF-8 with a real JSON parser; never compare raw file bytes (the file is ASCII with
# ``\u`` escapes, and holds both NFC and NFD text that must stay distinct).
VECTORS: dict[str, Any] = load_vectors("manifest-digest-vectors.json")
BY_NAME: dict[str, dict[str, Any]] = {v["name"]: v for v in VECTORS["vectors"]}
POSITIVE = [v for v in VECTORS["vectors"] if "expectError" not in v]
NEGATIVE = [v for v in VECTORS["vectors"] if "expectError" in v]
SAME = [v for v in VECTORS["vectors"] if "sameDigestAs" in v]
DIFFERENT = [v for v in VECTORS["vectors"] if "differentDigestFrom" in v]

DIGEST = re.compile(r"sha256:[A-Za-z0-9_-]{43}")
IDENTIFIER_CHARS = string.ascii_letters + string.digits + "._:*-"
# The vector file's codes, plus this module's refusals for values JSON text cannot carry.
CODES = {
    *VECTORS["errorCodes"],
    "non_finite_number",
    "unpaired_surrogate",
    "not_json",
    "nesting_too_deep",
}


def _name(vector: dict[str, Any]) -> str:
    return str(vector["name"])


def _code(thunk: Callable[[], object]) -> str:
    with pytest.raises(ManifestError) as info:
        thunk()
    return info.value.code


# --------------------------------------------------------------------------------------------
# The conformance vectors


def test_the_vector_file_is_the_one_this_suite_was_written_against() -> None:
    assert len(VECTORS["vectors"]) == 25
    assert (len(POSITIVE), len(NEGATIVE)) == (20, 5)
    assert len(VECTORS["sortVectors"]) == 4
    assert len(BY_NAME) == len(VECTORS["vectors"]), "vector names are unique"
    for vector in VECTORS["vectors"]:
        has_digest = {"canonicalJson", "sha256Hex", "digest"} <= vector.keys()
        assert has_digest != ("expectError" in vector), vector["name"]
    assert {v["expectError"] for v in NEGATIVE} <= VECTORS["errorCodes"].keys()


@pytest.mark.parametrize("vector", POSITIVE, ids=_name)
def test_positive_vector(vector: dict[str, Any]) -> None:
    before = copy.deepcopy(vector["input"])
    text = canonical_json(vector["input"])
    assert text == vector["canonicalJson"]
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() == vector["sha256Hex"]
    digest = manifest_digest(vector["input"])
    assert digest == vector["digest"]
    assert DIGEST.fullmatch(digest)
    assert vector["input"] == before, "the input is never modified"


@pytest.mark.parametrize("vector", NEGATIVE, ids=_name)
def test_negative_vector(vector: dict[str, Any]) -> None:
    assert _code(lambda: manifest_digest(vector["input"])) == vector["expectError"]
    assert _code(lambda: canonical_json(vector["input"])) == vector["expectError"]


@pytest.mark.parametrize("vector", SAME, ids=_name)
def test_same_digest_as(vector: dict[str, Any]) -> None:
    other = BY_NAME[vector["sameDigestAs"]]
    assert manifest_digest(vector["input"]) == manifest_digest(other["input"])


@pytest.mark.parametrize("vector", DIFFERENT, ids=_name)
def test_different_digest_from(vector: dict[str, Any]) -> None:
    other = BY_NAME[vector["differentDigestFrom"]]
    assert manifest_digest(vector["input"]) != manifest_digest(other["input"])


def test_every_cross_vector_assertion_is_exercised() -> None:
    assert len(SAME) + len(DIFFERENT) == 5


@pytest.mark.parametrize("vector", VECTORS["sortVectors"], ids=_name)
def test_sort_vector(vector: dict[str, Any]) -> None:
    assert sort_identifiers(vector["input"]) == vector["sorted"]
    assert sort_identifiers(reversed(vector["input"])) == vector["sorted"]


# --------------------------------------------------------------------------------------------
# Refusals and the readings the vectors leave open


@pytest.mark.parametrize("manifest", [[], "{}", None, 0, 1.5, True, [{"version": "0.5"}]])
def test_a_non_object_has_no_digest(manifest: Any) -> None:
    assert _code(lambda: manifest_digest(manifest)) == "manifest_not_object"


def test_the_error_is_a_value_error_that_names_code_and_place() -> None:
    manifest = {"featureSets": {"f": {"uses": ["pushEvents", "bad one"]}}}
    with pytest.raises(ValueError, match="identifier_charset") as info:
        manifest_digest(manifest)
    error = info.value
    assert isinstance(error, ManifestError)
    assert "featureSets.f.uses[1]" in str(error)
    assert "'bad one'" in error.detail
    copied = pickle.loads(pickle.dumps(error))
    assert (copied.code, copied.detail) == (error.code, error.detail)


@pytest.mark.parametrize(
    "manifest",
    [
        {"featureSets": {"f\n": {}}},
        {"featureSets": {"f": {"uses": ["tools\n"]}}},
        {"pushEvents\n": True},
    ],
)
def test_a_trailing_newline_is_not_an_identifier(manifest: Any) -> None:
    assert _code(lambda: manifest_digest(manifest)) == "identifier_charset"


@pytest.mark.parametrize(
    "manifest",
    [
        {"featureSets": {"f": {"tagOntology": {"tags": {"t:a": {"facet": "bad facet"}}}}}},
        {"featureSets": {"f": {"tagOntology": {"keyed": {"bad key": {"values": []}}}}}},
        {"featureSets": {"f": {"tagOntology": {"keyed": {"k": {"values": ["ok", "n o"]}}}}}},
        {"featureSets": {"f": {"tagOntology": {"coreTags": ["chat:é"]}}}},
        {"featureSets": {"f": {"tagOntology": {"tags": {"t:a": {"implies": ["x", ""]}}}}}},
        # Fail-closed readings (see the module docstring):
        {"featureSets": {"f": {"tagOntology": {"suggestedTreatment": [{"tagsAll": ["a b"]}]}}}},
        {"channels": {"list": [{"display name": True}]}},
    ],
)
def test_identifier_positions_refuse(manifest: Any) -> None:
    assert _code(lambda: manifest_digest(manifest)) == "identifier_charset"


@pytest.mark.parametrize(
    "manifest",
    [
        {"version": "not an identifier, and not one"},
        {"version": {"any key": "any value"}},
        {"featureSets": {"f": {"description": "free text", "other key": ["a b"]}}},
        {"featureSets": {"f": {"tagOntology": {"tags": {"t:a": {"desc": "x y", "facet": 3}}}}}},
        {"featureSets": {"f": {"uses": ["a b", 1]}}},
        {"featureSets": {"f": {"tagOntology": {"keyed": {"k": {"values": ["a b", None]}}}}}},
        {"featureSets": [{"name": "not checked in the array shape", "uses": ["a b"]}]},
        {"channels": {"list": ["values are not member names"]}},
    ],
)
def test_content_outside_identifier_positions_is_hashed(manifest: Any) -> None:
    assert DIGEST.fullmatch(manifest_digest(manifest))


def test_list_valued_arrays_keep_their_order() -> None:
    def manifest(values: list[str], matcher: list[str]) -> dict[str, Any]:
        ontology = {
            "keyed": {"urgency": {"values": values}},
            "suggestedTreatment": [{"tagsAny": matcher, "behavior": "mute"}],
        }
        return {"featureSets": {"f": {"tagOntology": ontology}}}

    base = manifest(["low", "high"], ["chat:a", "chat:b"])
    assert '"values":["low","high"]' in canonical_json(base)
    assert '"tagsAny":["chat:a","chat:b"]' in canonical_json(base)
    assert manifest_digest(base) != manifest_digest(manifest(["high", "low"], ["chat:a", "chat:b"]))
    assert manifest_digest(base) != manifest_digest(manifest(["low", "high"], ["chat:b", "chat:a"]))


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (math.nan, "non_finite_number"),
        (math.inf, "non_finite_number"),
        (-math.inf, "non_finite_number"),
        (10**400, "non_finite_number"),
        ("lone \ud800 surrogate", "unpaired_surrogate"),
        ({"\udfff": 1}, "unpaired_surrogate"),
        ((1, 2), "not_json"),
        (b"bytes", "not_json"),
        ({1: "non-string member name"}, "not_json"),
        ({1, 2}, "not_json"),
    ],
)
def test_values_json_text_cannot_carry_are_refused(value: Any, code: str) -> None:
    described = {"featureSets": {"f": {"description": value}}}
    assert _code(lambda: manifest_digest(described)) == code
    assert _code(lambda: manifest_digest({"version": value})) == code


def test_a_surrogate_in_an_identifier_position_breaks_the_identifier_rule() -> None:
    manifest = {"featureSets": {"f": {"uses": ["tools\ud800"]}}}
    assert _code(lambda: manifest_digest(manifest)) == "identifier_charset"


def test_nesting_deeper_than_the_interpreter_can_walk_is_refused() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    assert _code(lambda: manifest_digest({"version": deep})) == "nesting_too_deep"


def test_integers_are_doubles() -> None:
    def digest(n: int | float) -> str:
        return manifest_digest({"limits": {"n": n}})

    assert canonical_json({"limits": {"n": 2**53 + 1}}) == '{"limits":{"n":9007199254740992}}'
    assert digest(2**53 + 1) == digest(2**53) == digest(float(2**53))
    assert digest(10**21) == digest(1e21)
    assert canonical_json({"limits": {"n": -(10**21)}}) == '{"limits":{"n":-1e+21}}'
    assert canonical_json({"limits": {"t": True, "f": False}}) == '{"limits":{"f":false,"t":true}}'


def test_the_root_revision_is_dropped_unread() -> None:
    plain = manifest_digest({"version": "0.5"})
    assert manifest_digest({"revision": math.nan, "version": "0.5"}) == plain
    assert manifest_digest({"version": "0.5", "revision": {"bad key": "\ud800"}}) == plain


def test_member_names_sort_by_utf16_code_units() -> None:
    # U+FF61 sorts before U+1F642 in UTF-8 but after it in UTF-16 (the emoji is D83D DE42).
    text = canonical_json({"version": {"\uff61": 2, "\U0001f642": 1}})
    assert text == '{"version":{"\U0001f642":1,"\uff61":2}}'


# --------------------------------------------------------------------------------------------
# Properties

identifiers = st.text(IDENTIFIER_CHARS, min_size=1, max_size=8)
names = st.one_of(
    identifiers,
    st.sampled_from(["featureSets", "uses", "tagOntology", "coreTags", "tags", "implies"]),
    st.sampled_from(["keyed", "values", "facet", "suggestedTreatment", "tagsAny", "revision"]),
    st.text(max_size=4),
    st.text(st.sampled_from(["\ud800", "\udfff", "a", " "]), max_size=3),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**1023, max_value=2**1100),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["\ud800", "x\udc00", "é", "e\u0301", "\u2028"]),
)
anything = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
    max_leaves=16,
)
json_text = st.text(max_size=8)
clean_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    json_text,
)


def _shape(well_formed: bool) -> st.SearchStrategy[dict[str, Any]]:
    """A manifest of the 0.5 shape; when not ``well_formed`` any slot may hold anything."""

    def slot(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return strategy if well_formed else st.one_of(strategy, anything)

    def ids(max_size: int = 5) -> st.SearchStrategy[Any]:
        return slot(st.lists(slot(identifiers), max_size=max_size))

    tag = st.fixed_dictionaries(
        {}, optional={"desc": slot(json_text), "facet": slot(identifiers), "implies": ids()}
    )
    keyed = st.fixed_dictionaries({"values": ids()}, optional={"desc": slot(json_text)})
    rule = st.fixed_dictionaries(
        {"behavior": slot(st.sampled_from(["immediate", "mute"]))},
        optional={"tagsAny": ids(3), "tagsAll": ids(3), "tagsNone": ids(3)},
    )
    ontology = st.fixed_dictionaries(
        {},
        optional={
            "coreTags": ids(),
            "tags": slot(st.dictionaries(identifiers, slot(tag), max_size=3)),
            "keyed": slot(st.dictionaries(identifiers, slot(keyed), max_size=2)),
            "suggestedTreatment": slot(st.lists(slot(rule), max_size=3)),
            "open": slot(st.booleans()),
        },
    )
    feature_set = st.fixed_dictionaries(
        {"description": slot(json_text)},
        optional={"uses": ids(), "tagOntology": slot(ontology), "revision": slot(json_text)},
    )
    capability = st.recursive(
        clean_scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(identifiers, inner, max_size=3),
        max_leaves=8,
    )
    capabilities = st.dictionaries(
        identifiers.filter(lambda name: name not in ("version", "revision", "featureSets")),
        slot(capability),
        max_size=4,
    )
    rest = st.fixed_dictionaries(
        {"version": slot(st.just("0.5"))},
        optional={"featureSets": slot(st.dictionaries(identifiers, slot(feature_set), max_size=3))},
    )
    return st.builds(lambda caps, more: {**caps, **more}, capabilities, rest)


manifests = _shape(well_formed=True)
mangled_manifests = _shape(well_formed=False)

SET_PATHS = (
    ("featureSets", "*", "uses"),
    ("featureSets", "*", "tagOntology", "coreTags"),
    ("featureSets", "*", "tagOntology", "tags", "*", "implies"),
)


def _is_set(path: tuple[str, ...]) -> bool:
    """Whether ``path`` is a set position; a ``*`` matches a member name, never an index."""
    return any(
        len(path) == len(pattern)
        and all(
            want == got or (want == "*" and got != "[]")
            for got, want in zip(path, pattern, strict=True)
        )
        for pattern in SET_PATHS
    )


def _reordered(value: Any, rnd: random.Random, path: tuple[str, ...] = ()) -> Any:
    """The same manifest with every object's members and every set's elements reshuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {key: _reordered(child, rnd, (*path, key)) for key, child in items}
    if isinstance(value, list):
        if path and _is_set(path) and all(isinstance(item, str) for item in value):
            shuffled = value + [rnd.choice(value) for _ in value[:2]]
            rnd.shuffle(shuffled)
            return shuffled
        return [_reordered(item, rnd, (*path, "[]")) for item in value]
    return value


def _es_number(x: float) -> str:
    """ECMA-262 Number::toString(x), from the shortest round-tripping digits of ``repr``."""
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    mantissa, _, exponent = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    raw = whole + fraction
    digits = raw.lstrip("0").rstrip("0")
    k = len(digits)
    # abs(x) == 0.<digits> * 10**n
    n = len(whole) + int(exponent or "0") - (len(raw) - len(raw.lstrip("0")))
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + digits
    e = n - 1
    head = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{head}e{'+' if e >= 0 else '-'}{abs(e)}"


@given(manifests)
def test_well_formed_manifests_digest(manifest: dict[str, Any]) -> None:
    digest = manifest_digest(manifest)
    assert DIGEST.fullmatch(digest)
    raw = hashlib.sha256(canonical_json(manifest).encode("utf-8")).digest()
    assert digest == "sha256:" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


@given(manifests, anything)
def test_the_root_revision_is_ignored(manifest: dict[str, Any], revision: Any) -> None:
    expected = manifest_digest(manifest)
    assert manifest_digest({**manifest, "revision": revision}) == expected
    assert manifest_digest({"revision": revision, **manifest}) == expected


@given(manifests, st.randoms(use_true_random=False))
def test_member_order_and_set_order_do_not_matter(
    manifest: dict[str, Any], rnd: random.Random
) -> None:
    assert manifest_digest(_reordered(manifest, rnd)) == manifest_digest(manifest)


@given(manifests)
def test_the_canonical_text_is_json_and_a_fixed_point(manifest: dict[str, Any]) -> None:
    text = canonical_json(manifest)
    assert canonical_json(json.loads(text)) == text


@given(st.one_of(anything, mangled_manifests, manifests))
def test_any_json_like_input_digests_or_raises_manifest_error(value: Any) -> None:
    try:
        digest = manifest_digest(value)
    except ManifestError as error:
        assert error.code in CODES
        assert error.code in str(error)
        assert _code(lambda: canonical_json(value)) == error.code
    else:
        assert DIGEST.fullmatch(digest)
        raw = hashlib.sha256(canonical_json(value).encode("utf-8")).digest()
        assert digest.endswith(base64.urlsafe_b64encode(raw).decode("ascii").rstrip("="))


@given(st.text(st.one_of(st.sampled_from(IDENTIFIER_CHARS), st.characters()), max_size=6))
def test_the_identifier_rule(name: str) -> None:
    legal = name != "" and all(char in IDENTIFIER_CHARS for char in name)
    placed: list[dict[str, Any]] = [
        {"featureSets": {name: {}}},
        {"featureSets": {"f": {"uses": ["tools", name]}}},
        {"cap": {"nested": {name: True}}},
    ]
    for manifest in placed:
        try:
            manifest_digest(manifest)
        except ManifestError as error:
            assert not legal and error.code == "identifier_charset"
        else:
            assert legal


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_numbers_print_as_ecmascript_does(x: float) -> None:
    text = canonical_json({"version": x})
    assert text == '{"version":' + _es_number(x) + "}"
    assert float(json.loads(text)["version"]) == x


@given(st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1))
def test_safe_integers_print_exactly(n: int) -> None:
    assert canonical_json({"version": n}) == '{"version":' + str(n) + "}"


@given(st.lists(st.text()))
def test_sort_identifiers_is_utf8_byte_order(values: list[str]) -> None:
    expected = sorted(set(values), key=lambda value: value.encode("utf-8"))
    assert sort_identifiers(values) == expected
