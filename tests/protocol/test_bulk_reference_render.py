"""RFC-005 conformance vectors, the receive/display half, at the protocol level.

Every ``render`` case of ``bulk-reference-vectors.json`` (and the ``registry`` case) is read from
``tests/conformance`` and run as the host runs a delivery: each block goes through
``convert_block`` on a lane, each pending reference is registered in a ``RegistryState`` with
the delivering server, and the model's view is the converted blocks with every reference
replaced by its ``stub_text``. The ``fetch`` cases need a network fixture and are run with the
fetcher, not here.

Each case runs on every lane: a ``resource`` block is a reference on all of them, and the
cases' image blocks carry inline data, which no lane passes on when it is contradicted.
"""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.content import ContentError, convert_block
from protocol.references import (
    FIELDS,
    LABEL_BOUND,
    LANES,
    MAX_RECORDS,
    Chosen,
    RegistryState,
    choose,
    read_testimony,
    sanitize,
    stub_text,
    unknown_reference,
    utf16_len,
)
from protocol.references import Testimony as Claims
from tests.conformance import load_vectors

try:
    import jsonschema
except ImportError:  # pragma: no cover - the schema half is skipped without it
    jsonschema = None

VECTORS: dict[str, Any] = load_vectors("bulk-reference-vectors.json")
LEGACY: dict[str, Any] = load_vectors("bulk-reference-legacy-schema.json")
CASES: list[dict[str, Any]] = VECTORS["cases"]
RENDER = [c for c in CASES if c["operation"] == "render"]
REGISTRY = [c for c in CASES if c["operation"] == "registry"]

ORIGIN = "http://127.0.0.1:47613"  # the loopback fixture's origin
SERVER = "fixture"
ADDRESSES: dict[str, str | None] = {SERVER: "ws://127.0.0.1:47613/mcpl"}
TOKEN = VECTORS["fixtures"]["token"]
STUB_MAX = 900  # id, three labels at 120 units, a size and a 256-unit path, with separators


def _id(case: dict[str, Any]) -> str:
    return str(case["id"])


def expand(value: Any, case_id: str) -> Any:
    """The fixtures' placeholders: ``$ORIGIN``, ``$CASE`` and ``{"$repeat": s, "count": n}``."""
    if isinstance(value, dict):
        if set(value) == {"$repeat", "count"}:
            return value["$repeat"] * value["count"]
        return {k: expand(v, case_id) for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, case_id) for v in value]
    if isinstance(value, str):
        return value.replace("$ORIGIN", ORIGIN).replace("$CASE", quote(case_id, safe=""))
    return value


def render(
    blocks: list[Any], lane: str, state: RegistryState, server: str = SERVER
) -> list[dict[str, Any]]:
    """What the model is shown of one delivery."""
    shown = []
    for block in blocks:
        out = convert_block(block, server, lane)
        if out["type"] == "reference":
            claims = Claims.from_wire(out["testimony"])
            record = state.register(claims, out["server_id"], 0.0)
            text = stub_text(
                record.ref_id,
                record.testimony,
                out["provenance"],
                saved_path=record.fetched_path,
                bound=bool(record.server_ids),
            )
            out = {"type": "text", "text": text, "ref_id": record.ref_id}
        shown.append(out)
    return shown


def stubs_of(shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in shown if "ref_id" in b]


# -- the host half -----------------------------------------------------------------------------


def test_the_vector_file_is_the_one_described() -> None:
    assert VECTORS["format"] == "mcpl-bulk-references-1"
    assert len(CASES) == 43
    assert (len(RENDER), len(REGISTRY)) == (28, 1)
    assert {c["rfc"] for c in CASES} == set(range(1, 21))


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("case", RENDER, ids=_id)
def test_render_vector(case: dict[str, Any], lane: str) -> None:
    cid = _id(case)
    blocks = expand(case["blocks"], cid)
    expect = expand(case["expect"], cid)
    state = RegistryState(random.Random(0))

    if expect.get("kind") == "invalid":
        with pytest.raises(ContentError):
            render(blocks, lane, state)
        assert len(state) == 0
        assert expect["stub"] is False
        return

    shown = render(blocks, lane, state)
    view = json.dumps(shown, ensure_ascii=False)
    for secret in expect["hidden"]:
        assert secret not in view
    if "knownEmbeddedCredential" in case:
        assert case["emitterConformant"] is False
        assert case["knownEmbeddedCredential"] not in view
    assert TOKEN not in view
    for needle in expect.get("includes", []):
        assert needle in view

    stubs = stubs_of(shown)
    if not expect["stub"]:
        assert stubs == [] and len(state) == 0
        return
    assert stubs
    for stub in stubs:
        record = state.get(stub["ref_id"])
        assert record is not None
        assert stub["text"].startswith(f"[{record.ref_id}] ")
        assert stub["text"].endswith(" — fetch with fetch_reference")
        assert record.server_ids == [SERVER]
        assert record.testimony.uri not in stub["text"]
        if record.testimony.uri.startswith(ORIGIN):
            assert choose(record.server_ids, ADDRESSES, record.testimony.uri) == Chosen(SERVER)

    (reference,) = [b for b in blocks if b.get("type") == "resource"]
    (stub,) = stubs
    record = state.get(stub["ref_id"])
    assert record is not None

    missing = expect.get("missingFields", [])
    if "missingFields" in expect:
        assert list(record.testimony.rejected_fields) == missing
    # Only a claim the schema refuses is dropped, and a block the schema refuses (with a valid
    # uri) always loses one.
    (schema_valid,) = [
        v for b, v in zip(blocks, case["schemaValid"], strict=True) if b is reference
    ]
    assert (record.testimony.rejected_fields == ()) == schema_valid
    for field in missing:
        assert getattr(record.testimony, FIELDS[field]) is None
        if field == "sizeBytes":
            assert "claimed" not in stub["text"]
        if field in ("name", "mimeType"):
            assert str(reference[field])[:LABEL_BOUND] not in stub["text"]
    # A rejected optional field leaves a valid disposition in force.
    assert record.testimony.disposition == reference.get("disposition")

    if expect.get("bounded"):
        assert utf16_len(stub["text"]) <= STUB_MAX
        oversized = [f for f in FIELDS if len(str(reference.get(f, ""))) > STUB_MAX]
        assert oversized
        trimmed = {k: v for k, v in reference.items() if k not in oversized}
        (same,) = stubs_of(render([trimmed], lane, RegistryState(random.Random(0))))
        assert same["text"] == stub["text"]

    if "displayField" in expect:
        field = expect["displayField"]
        value = reference[field]
        assert getattr(record.testimony, FIELDS[field]) == value
        assert sanitize(value, LABEL_BOUND) in stub["text"]
        assert value not in stub["text"]  # 255 code points are over the display bound


@pytest.mark.parametrize("case", REGISTRY, ids=_id)
def test_registry_vector(case: dict[str, Any]) -> None:
    cid = _id(case)
    (block,) = expand(case["blocks"], cid)
    expect = expand(case["expect"], cid)
    count = case["registrations"]
    assert count > MAX_RECORDS
    state = RegistryState(random.Random(20))
    ids = []
    for i in range(count):
        (stub,) = render([{**block, "uri": f"{block['uri']}/{i}"}], "push", state)
        ids.append(stub["ref_id"])
    assert len(state) == MAX_RECORDS
    assert len(set(ids)) == count
    evicted, kept = ids[: count - MAX_RECORDS], ids[count - MAX_RECORDS :]
    for ref_id in evicted:
        assert state.get(ref_id) is None
        miss = unknown_reference(ref_id)
        assert miss == (
            f"unknown reference: {ref_id} — it may have been evicted; ids are never reused"
        )
        assert not any(secret in miss for secret in expect["hidden"])
    assert all(state.get(ref_id) is not None for ref_id in kept)
    (again,) = render([{**block, "uri": f"{block['uri']}/0"}], "push", state)
    assert again["ref_id"] not in ids  # the uri comes back under a new id
    assert expect["stub"] is False  # the case observes the miss, not a stub


# -- the schema half ---------------------------------------------------------------------------

# SPEC Appendix B.1 as RFC-005 §8 amends it, restated: optional claims on ``resource`` and on
# the uri branch of ``image``/``audio``; inline ``data`` with a ``uri`` or a ``disposition`` is
# invalid; unknown members are ignored. The digest's fixed length stands in for an anchored
# pattern, since a Python ``$`` also matches before a final newline.
_CLAIMS: dict[str, Any] = {
    "mimeType": {"type": "string", "maxLength": 255},
    "sizeBytes": {"type": "integer", "minimum": 0, "maximum": 9007199254740991},
    "digest": {
        "type": "string",
        "pattern": "^sha256:[A-Za-z0-9_-]{43}$",
        "minLength": 50,
        "maxLength": 50,
    },
    "expiresAt": {"type": "string", "maxLength": 64},
    "name": {"type": "string", "maxLength": 255},
    "disposition": {"enum": ["never", "ref"]},
}
_URI = {"type": "string", "minLength": 1, "maxLength": 4096}


def _media(kind: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"const": kind}},
        "oneOf": [
            {
                "required": ["data", "mimeType"],
                "properties": {"data": {"type": "string"}, "mimeType": {"type": "string"}},
                "not": {"anyOf": [{"required": ["uri"]}, {"required": ["disposition"]}]},
            },
            {
                "required": ["uri"],
                "properties": {"uri": _URI, **_CLAIMS},
                "not": {"required": ["data"]},
            },
        ],
    }


B1_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "oneOf": [
        {
            "type": "object",
            "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        },
        _media("image"),
        _media("audio"),
        {
            "type": "object",
            "required": ["type", "uri"],
            "properties": {"type": {"const": "resource"}, "uri": _URI, **_CLAIMS},
        },
    ],
}

needs_jsonschema = pytest.mark.skipif(jsonschema is None, reason="jsonschema is not installed")


@needs_jsonschema
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_schema_validity(case: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(B1_SCHEMA)
    blocks = expand(case["blocks"], _id(case))
    assert [validator.is_valid(b) for b in blocks] == case["schemaValid"]


@needs_jsonschema
@pytest.mark.parametrize("case", [c for c in CASES if "legacySchemaValid" in c], ids=_id)
def test_legacy_schema_validity(case: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(LEGACY["schema"])
    blocks = expand(case["blocks"], _id(case))
    assert all(validator.is_valid(b) == case["legacySchemaValid"] for b in blocks)


claim_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-2, max_value=2**53 + 1),
    st.floats(allow_nan=True),
    st.text(max_size=66),
    st.sampled_from(
        [
            "never",
            "ref",
            "sha256:" + "A" * 43,
            "sha256:" + "A" * 43 + "\n",
            "sha256:" + "A" * 42,
            "m" * 255,
            "m" * 256,
            float(2**53 - 1),
        ]
    ),
)


@needs_jsonschema
@given(st.dictionaries(st.sampled_from(list(FIELDS)), claim_values))
def test_a_resource_is_schema_valid_exactly_when_no_claim_is_rejected(
    claims: dict[str, Any],
) -> None:
    block = {"type": "resource", "uri": f"{ORIGIN}/x", **claims}
    valid = jsonschema.Draft202012Validator(B1_SCHEMA).is_valid(block)
    assert valid == (read_testimony(block).rejected_fields == ())
