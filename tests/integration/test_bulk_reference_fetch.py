"""RFC-005 conformance: every ``fetch`` vector of ``bulk-reference-vectors.json`` against a real
loopback origin.

Each case's blocks are read as testimony and registered in a ``RegistryState`` with one server,
``fixture-server``, whose address is the origin's websocket form and whose token is the vectors'
``fixture-secret``; ``choose`` picks the server to dial and ``fetch`` runs with the plan the
registry would make for an on-demand ``fetch_reference`` (ceiling ``min(maxBytes, 256 MiB)``, the
default budget, the 60 s timeout). What a model would be shown -- the stub before the fetch, the
stub after it and the tool's answer -- is checked against ``hidden``, ``stub`` and the
``before``/``after`` overrides; the origin's request log, the saved file and the record are
checked against the rest of ``expect``.
"""

from __future__ import annotations

import base64
import random
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import trio

from actors.references.fetcher import Fetched, FetchPlan, FetchRefused, fetch, make_client
from protocol.references import (
    Chosen,
    RegistryState,
    choose,
    fetch_result_text,
    read_testimony,
    stub_text,
)
from tests.conformance import load_vectors
from tests.origin import Origin, Route, serve_origin

pytestmark = pytest.mark.slow

VECTORS: dict[str, Any] = load_vectors("bulk-reference-vectors.json")
FETCH_CASES = [c for c in VECTORS["cases"] if c["operation"] == "fetch"]
TOKEN: str = VECTORS["fixtures"]["token"]

SERVER = "fixture-server"
PROVENANCE = "from tool result"
HARD_CEILING = 268435456
DEFAULT_BUDGET = 1073741824
ON_DEMAND_TIMEOUT = 60.0

#: Every key of ``expect`` this runner checks; a vector with another key fails loudly.
HANDLED = {
    "stub", "hidden", "ok", "requests", "decodedBase64", "digestVerified", "savedMime",
    "storageFromId", "cleanLabel", "abortStream", "redirectSafe", "unchanged", "before", "after",
}  # fmt: skip
#: What a stub's label may not carry (A.3's sanitizer) -- controls, C1 and bidi controls.
UNCLEAN = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_the_vectors_hold_the_fetch_cases() -> None:
    assert VECTORS["format"] == "mcpl-bulk-references-1"
    assert len(FETCH_CASES) == 14
    assert TOKEN == "fixture-secret"


def expand(value: Any, origin: str, case_id: str) -> Any:
    """The vectors' placeholders: ``$ORIGIN``, ``$CASE`` (URL-encoded id) and ``$repeat``."""
    if isinstance(value, str):
        return value.replace("$ORIGIN", origin).replace("$CASE", quote(case_id, safe=""))
    if isinstance(value, list):
        return [expand(v, origin, case_id) for v in value]
    if isinstance(value, dict):
        if set(value) == {"$repeat", "count"}:
            return expand(value["$repeat"], origin, case_id) * value["count"]
        return {k: expand(v, origin, case_id) for k, v in value.items()}
    return value


def route_for(response: dict[str, Any], elsewhere: Origin) -> Route:
    """How the fixture origin answers (README: ``bodyBase64`` decoded before optional gzip,
    ``redirect`` to a second, cross-origin server, ``stream`` of paced chunks)."""
    if response.get("redirect"):
        return Route(status=302, redirect=elsewhere.url("/landing"))
    headers = {"Content-Type": response["contentType"]} if "contentType" in response else {}
    if "stream" in response:
        s = response["stream"]
        return Route(
            body=b"s" * (s["chunks"] * s["chunkBytes"]),
            chunk=s["chunkBytes"],
            interval=s["intervalMs"] / 1000,
            chunked=True,
            headers=headers,
        )
    body = base64.b64decode(response["bodyBase64"])
    return Route(body=body, gzip=bool(response.get("gzip")), headers=headers)


def answer(result: Fetched | str, digest_claimed: bool) -> str:
    """The ``fetch_reference`` tool's answer as the model reads it (B.4)."""
    if isinstance(result, str):
        return result
    return fetch_result_text(
        result.path, result.bytes, result.mime_type, result.digest_verified, digest_claimed
    )


def saved_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("case", FETCH_CASES, ids=[c["id"] for c in FETCH_CASES])
async def test_fetch_vector(case: dict[str, Any], tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with serve_origin() as origin, serve_origin() as elsewhere:
            await run_case(case, origin, elsewhere, tmp_path)


async def run_case(raw: dict[str, Any], origin: Origin, elsewhere: Origin, tmp: Path) -> None:
    case = expand(raw, origin.origin, raw["id"])
    expect: dict[str, Any] = case["expect"]
    assert set(expect) <= HANDLED, f"unhandled expectations: {set(expect) - HANDLED}"
    assert len(case["blocks"]) == 1
    block = case["blocks"][0]
    path = "/case/" + quote(raw["id"], safe="") + "/payload"
    if "response" in case:
        origin.route(path, route_for(case["response"], elsewhere))
    elsewhere.route("/landing", Route(body=b"RIFF0000WAVElanded"))
    workspace = tmp / "data" / "workspace"
    data = b""

    # Registered from the one server, as a tool result's reference is.
    state = RegistryState(random.Random(0))
    record = state.register(read_testimony(block), SERVER, time.time())
    ref_id = record.ref_id
    before = stub_text(ref_id, record.testimony, PROVENANCE, saved_path=None, bound=True)

    # fetch_reference, on demand.
    chosen = choose(record.server_ids, {SERVER: origin.ws_url()}, record.testimony.uri)
    result: Fetched | str
    if isinstance(chosen, Chosen):
        assert chosen.server_id == SERVER
        plan = FetchPlan(
            ref_id=ref_id,
            testimony=record.testimony,
            token=TOKEN,
            ceiling=min(case.get("maxBytes", HARD_CEILING), HARD_CEILING),
            budget=DEFAULT_BUDGET,
            used=0,
            timeout=ON_DEMAND_TIMEOUT,
            workspace=workspace,
            now=time.time(),
        )
        async with make_client() as client:
            try:
                result = await fetch(plan, client)
            except FetchRefused as exc:
                result = str(exc)
    else:
        result = chosen.message
    if isinstance(result, Fetched):
        state.mark_fetched(
            ref_id,
            path=result.path,
            n=result.bytes,
            mime=result.mime_type,
            digest_verified=result.digest_verified,
        )
    after_record = state.get(ref_id)
    assert after_record is not None
    after = stub_text(
        ref_id,
        after_record.testimony,
        PROVENANCE,
        saved_path=after_record.fetched_path,
        bound=bool(after_record.server_ids),
    )
    views = {
        "stub before": before,
        "stub after": after,
        "tool answer": answer(result, "digest" in block),
    }

    # What a model is shown.
    hidden = [*expect["hidden"], origin.origin.removeprefix("http://")]
    for name, text in views.items():
        for secret in hidden:
            assert secret not in text, f"{name} shows {secret!r}: {text!r}"
    stage_before = {**expect, **expect.get("before", {})}
    if stage_before.get("stub"):
        assert before.startswith(f"[{ref_id}] "), before
    for secret in expect.get("before", {}).get("hidden", []):
        assert secret not in before

    # The outcome.
    if "ok" in expect:
        assert isinstance(result, Fetched) is expect["ok"], result
    if "requests" in expect:
        assert origin.count() == expect["requests"]
    assert elsewhere.count() == 0
    if isinstance(result, Fetched):
        assert after == before.replace("fetch with fetch_reference", f"saved: {result.path}")
        assert saved_files(tmp) == ["data/workspace/" + result.path]
        data = (workspace / result.path).read_bytes()
        assert result.bytes == len(data)
    else:
        assert after == before
        assert saved_files(tmp) == []
    if "decodedBase64" in expect:
        assert isinstance(result, Fetched)
        assert data == base64.b64decode(expect["decodedBase64"])
    if "digestVerified" in expect:
        assert isinstance(result, Fetched)
        assert result.digest_verified is expect["digestVerified"]
    if "savedMime" in expect:
        assert isinstance(result, Fetched)
        assert result.mime_type == expect["savedMime"]
    if expect.get("storageFromId"):
        assert isinstance(result, Fetched)
        assert re.fullmatch(rf"refs/{re.escape(ref_id)}\.[a-z0-9]+", result.path), result.path
        assert SERVER not in result.path and block["name"] not in result.path
    if expect.get("cleanLabel"):
        for text in (before, after):
            assert not UNCLEAN.search(text), text
        assert UNCLEAN.sub("", block["name"]) in before
    if expect.get("abortStream"):
        assert isinstance(result, str)
        assert result.startswith("aborted: actual bytes exceeded ceiling at "), result
        request = origin.requests[0]
        await request.done.wait()  # the origin noticed the fetcher hang up
        assert not request.completed
        assert request.sent < len(route_for(case["response"], elsewhere).body)
    if expect.get("redirectSafe"):
        assert result == "redirect refused (HTTP 302) — no redirect traversal"
        assert [r.authorization for r in origin.requests] == [f"Bearer {TOKEN}"]
        assert elsewhere.requests == []  # neither followed nor the token forwarded
    if expect.get("unchanged"):
        assert not after_record.fetched
        assert after_record.testimony == record.testimony
    if "stubOrInlineBase64" in expect.get("after", {}):
        assert isinstance(result, Fetched)
        assert after.startswith(f"[{ref_id}] ") and after.endswith(f"saved: {result.path}")
        assert data == base64.b64decode(expect["after"]["stubOrInlineBase64"])
    # A token goes only with a request on the dialed server's own origin.
    assert all(r.authorization == f"Bearer {TOKEN}" for r in origin.requests)
