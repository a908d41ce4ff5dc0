"""The ReferenceRegistry actor over a real loopback HTTP origin: one request per reference however
many ask at once, budgets held while fetches run, the cap on fetches in flight, and ids that never
name a file an earlier run saved. Real clock, generous deadlines, order-only assertions."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.config import AgentConfig, HostConfig, ServerConfig
from actors.kernel import ActorRef, Work
from actors.references import registry as references
from actors.references.registry import (
    FetchError,
    FetchRef,
    LookupRefs,
    ReferenceRegistry,
    RegisterRefs,
    SavedRef,
    highest_saved_counter,
)
from protocol import references as refs_protocol
from tests.origin import Origin, Route, serve_origin

PNG = b"\x89PNG\r\n\x1a\n" + b"x" * 200


def digest(data: bytes) -> str:
    return "sha256:" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def host_config(tmp_path: Path, origin: Origin, **server: Any) -> HostConfig:
    url = origin.ws_url()
    return HostConfig(
        data_dir=tmp_path / "data",
        servers=(ServerConfig(id="gallery", url=url, endpoint=url, token="t0k", **server),),
        agents=(AgentConfig(name="Ada", model="scripted:unused"),),
        base_dir=tmp_path,
    )


@asynccontextmanager
async def registry(cfg: HostConfig) -> AsyncIterator[ActorRef[Any]]:
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(ReferenceRegistry(cfg, Work()).run)
        yield ref
        nursery.cancel_scope.cancel()


async def register(ref: ActorRef[Any], origin: Origin, path: str, **claims: Any) -> str:
    testimony = refs_protocol.Testimony(uri=origin.url(path), **claims)
    (view,) = await ref.ask(RegisterRefs(items=((testimony, "gallery"),)), timeout=10)
    return str(view.ref_id)


async def test_concurrent_fetches_of_one_reference_share_one_request(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with serve_origin() as origin:
            # paced, so the second ask arrives while the first fetch is still reading
            origin.route("/p.png", Route(body=PNG, chunk=50, interval=0.05))
            async with registry(host_config(tmp_path, origin)) as ref:
                ref_id = await register(ref, origin, "/p.png", digest=digest(PNG))
                results: list[SavedRef] = []

                async def ask() -> None:
                    results.append(await ref.ask(FetchRef(ref_id=ref_id), timeout=20))

                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(ask)
                assert origin.count("/p.png") == 1
                assert {r.path for r in results} == {f"refs/{ref_id}.png"}
                assert all(r.digest_verified for r in results)
                # fetched: later asks are answered from the record, without a request
                again = await ref.ask(FetchRef(ref_id=ref_id), timeout=10)
                assert again.path == results[0].path and origin.count("/p.png") == 1
                (view,) = await ref.ask(LookupRefs(ref_ids=(ref_id,)), timeout=10)
                assert view.fetched_path == results[0].path
                assert "saved: refs/" in view.stub("from tool result")


async def test_fetches_side_by_side_never_charge_past_the_budget(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with serve_origin() as origin:
            for name in ("/a.png", "/b.png"):
                origin.route(name, Route(body=PNG, chunk=50, interval=0.05))
            cfg = host_config(tmp_path, origin, fetch_budget_bytes=len(PNG) + 10)
            async with registry(cfg) as ref:
                a = await register(ref, origin, "/a.png")
                b = await register(ref, origin, "/b.png")
                outcomes: dict[str, Any] = {}

                async def fetch(ref_id: str) -> None:
                    try:
                        outcomes[ref_id] = await ref.ask(FetchRef(ref_id=ref_id), timeout=20)
                    except FetchError as exc:
                        outcomes[ref_id] = str(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(fetch, a)
                    nursery.start_soon(fetch, b)
                saved = [o for o in outcomes.values() if isinstance(o, SavedRef)]
                refused = [o for o in outcomes.values() if isinstance(o, str)]
                # the first fetch holds the whole budget while it runs: the second cannot
                # start, and nothing was charged past the budget
                assert len(saved) == 1 and len(refused) == 1
                assert "per-server" in refused[0] and "budget" in refused[0]
                assert origin.count() == 1


async def test_at_the_cap_of_fetches_in_flight_a_fetch_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(references, "MAX_FETCHES", 2)
    with trio.fail_after(30):
        async with serve_origin() as origin:
            for name in ("/1", "/2", "/3"):
                origin.route(name, Route(hang=True))
            async with registry(host_config(tmp_path, origin)) as ref:
                ids = [await register(ref, origin, n) for n in ("/1", "/2", "/3")]
                async with trio.open_nursery() as nursery:
                    for ref_id in ids[:2]:
                        nursery.start_soon(partial(ref.ask, FetchRef(ref_id=ref_id), timeout=20))
                    await origin.wait_for_requests(2)  # both fetches are in flight
                    with pytest.raises(FetchError, match="too many fetches in flight"):
                        await ref.ask(FetchRef(ref_id=ids[2]), timeout=10)
                    assert origin.count("/3") == 0
                    nursery.cancel_scope.cancel()


async def test_at_the_cap_of_askers_sharing_one_fetch_the_next_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(references, "MAX_WAITERS", 2)
    with trio.fail_after(30):
        async with serve_origin() as origin:
            origin.route("/slow", Route(hang=True))
            async with registry(host_config(tmp_path, origin)) as ref:
                ref_id = await register(ref, origin, "/slow")
                refused: list[str] = []
                one_refused = trio.Event()

                async def ask() -> None:
                    try:
                        await ref.ask(FetchRef(ref_id=ref_id), timeout=20)
                    except FetchError as exc:
                        refused.append(str(exc))
                        one_refused.set()

                async with trio.open_nursery() as nursery:
                    for _ in range(3):  # the fetch hangs: two share it, the third is refused
                        nursery.start_soon(ask)
                    await one_refused.wait()
                    assert len(refused) == 1 and "2 askers already wait" in refused[0]
                    assert origin.count() <= 1
                    nursery.cancel_scope.cancel()


async def test_unknown_and_missing_ids_are_refused_by_the_tool_text(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with serve_origin() as origin:
            async with registry(host_config(tmp_path, origin)) as ref:
                with pytest.raises(FetchError, match="unknown reference: ref_9_zzzz"):
                    await ref.ask(FetchRef(ref_id="ref_9_zzzz"), timeout=10)
                with pytest.raises(FetchError, match=r"unknown reference: \(missing ref_id\)"):
                    await ref.ask(FetchRef(ref_id=None), timeout=10)
                assert origin.count() == 0


async def test_new_ids_never_name_a_file_an_earlier_run_saved(tmp_path: Path) -> None:
    refs = tmp_path / "data" / "workspace" / "refs"
    refs.mkdir(parents=True)
    (refs / "ref_z_abcd.png").write_bytes(PNG)  # counter 35 in base 36
    (refs / "notes.txt").write_text("not a saved reference")
    assert highest_saved_counter(tmp_path / "data" / "workspace") == 35
    with trio.fail_after(30):
        async with serve_origin() as origin:
            async with registry(host_config(tmp_path, origin)) as ref:
                ref_id = await register(ref, origin, "/x")
    assert ref_id.startswith("ref_10_")  # 36: past every saved counter
    assert highest_saved_counter(tmp_path / "missing") == 0
