"""The MCPL conformance vectors that apply to a server, through the server toolkit's API: the
manifest revision (RFC-003, the vendored digest vectors) and the address a host dials (RFC-004
§8, the tables kept in ``tests/protocol/test_uri.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.serverkit import MCPLServer, manifest_revision, parse_address
from protocol.manifest import ManifestError
from protocol.mcpl import VOCABULARY
from protocol.uri import McplUriError
from tests.conformance import load_vectors
from tests.protocol.test_uri import REJECTION, RESOLUTION

VECTORS: dict[str, Any] = load_vectors("manifest-digest-vectors.json")
POSITIVE = [v for v in VECTORS["vectors"] if "expectError" not in v]
NEGATIVE = [v for v in VECTORS["vectors"] if "expectError" in v]


@pytest.mark.parametrize("vector", POSITIVE, ids=lambda v: v["name"])
def test_the_revision_of_every_positive_vector(vector: dict[str, Any]) -> None:
    assert manifest_revision(vector["input"]) == vector["digest"]


@pytest.mark.parametrize("vector", NEGATIVE, ids=lambda v: v["name"])
def test_every_negative_vector_is_refused(vector: dict[str, Any]) -> None:
    with pytest.raises(ManifestError) as info:
        manifest_revision(vector["input"])
    assert info.value.code == vector["expectError"]


def test_the_vector_file_is_complete() -> None:
    assert (len(POSITIVE), len(NEGATIVE)) == (20, 5)


@pytest.mark.parametrize(("n", "text", "canonical", "resolved"), RESOLUTION)
def test_every_resolvable_address(n: int, text: str, canonical: str, resolved: str) -> None:
    got = parse_address(text)
    assert (got.canonical_uri, got.resolved_transport) == (canonical, resolved)


@pytest.mark.parametrize(("n", "text", "because", "reason"), REJECTION)
def test_every_refused_address(n: int, text: str, because: str, reason: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_address(text)
    assert info.value.reason == reason


_NAMES = st.from_regex(r"[a-z][a-z0-9]{0,8}(\.[a-z][a-z0-9]{0,8}){0,2}", fullmatch=True)


@given(
    name=_NAMES,
    sets=st.dictionaries(
        _NAMES, st.sets(st.sampled_from(sorted(VOCABULARY - {"tools"})), min_size=1), max_size=4
    ),
    push=st.booleans(),
    channels=st.booleans(),
)
def test_a_servers_own_manifest_carries_its_canonical_revision(
    name: str, sets: dict[str, set[str]], push: bool, channels: bool
) -> None:
    server = MCPLServer(name, push_events=push)
    if channels:
        server.channel(f"{name}:room")
    for set_name, uses in sets.items():
        if set_name != name:
            server.feature_set(set_name, description="d", uses=sorted(uses))
    manifest = server.manifest()
    assert manifest["revision"] == manifest_revision(manifest)
    assert manifest_revision(dict(reversed(list(manifest.items())))) == manifest["revision"]
