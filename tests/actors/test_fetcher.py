"""The reference fetcher (refs-and-headers.md B.3 steps 4-9) against a real loopback origin.

Every refusal is pinned byte for byte. Tests that must show nothing was dialed count the
origin's requests; tests of an aborted stream wait until the origin is done with the request and
check it never got to send the whole body. The timeout tests use the real clock and assert only
the outcome, never how long anything took.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.references.fetcher import (
    Fetched,
    FetchPlan,
    FetchRefused,
    _request_url,
    fetch,
    make_client,
)
from protocol.references import digest_of, read_testimony
from tests.origin import Origin, Route, serve_origin

REF = "ref_1_test"
WAV = b"RIFF0000WAVEpayload"
MiB = 1 << 20


def sha(data: bytes) -> str:
    return "sha256:" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_plan(
    uri: str, workspace: Path, *, block: dict[str, Any] | None = None, **kw: Any
) -> FetchPlan:
    fields: dict[str, Any] = {
        "ref_id": REF,
        "testimony": read_testimony({"type": "resource", "uri": uri, **(block or {})}),
        "token": None,
        "ceiling": 1 << 20,
        "budget": 1 << 30,
        "used": 0,
        "timeout": 30.0,
        "workspace": workspace,
        "now": 1_700_000_000.0,
    }
    fields.update(kw)
    return FetchPlan(**fields)


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    async with serve_origin() as o:
        yield o


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with make_client() as c:
        yield c


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


async def refused(plan: FetchPlan, client: httpx.AsyncClient) -> str:
    with trio.fail_after(30):
        with pytest.raises(FetchRefused) as info:
            await fetch(plan, client)
    return str(info.value)


async def fetched(plan: FetchPlan, client: httpx.AsyncClient) -> Fetched:
    with trio.fail_after(30):
        return await fetch(plan, client)


def saved_files(workspace: Path) -> list[str]:
    """Every file under the workspace, relative to it (temporary files included)."""
    if not workspace.exists():
        return []
    return sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*") if p.is_file())


# -- step 4: expiry ------------------------------------------------------------------------

EXPIRED = "reference expired (or unparseable expiry — fail closed)"


@pytest.mark.parametrize(
    "expires_at",
    ["2023-11-14T22:13:20Z", "2020-01-01T00:00:00Z", "not-a-date", ""],
    ids=["at-now", "past", "unparseable", "empty"],
)
async def test_expired_or_unparseable_expiry_is_refused_without_dialing(
    origin: Origin, client: httpx.AsyncClient, workspace: Path, expires_at: str
) -> None:
    origin.route("/p", Route(body=WAV))
    plan = make_plan(origin.url("/p"), workspace, block={"expiresAt": expires_at})
    assert await refused(plan, client) == EXPIRED
    assert origin.count() == 0
    assert saved_files(workspace) == []


async def test_a_future_expiry_is_fetched(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=WAV))
    plan = make_plan(origin.url("/p"), workspace, block={"expiresAt": "2099-01-01T00:00:00Z"})
    assert (await fetched(plan, client)).bytes == len(WAV)


# -- step 5: claimed size, then budget -----------------------------------------------------


async def test_a_claim_over_the_ceiling_is_refused_without_dialing(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=WAV))
    plan = make_plan(origin.url("/p"), workspace, block={"sizeBytes": 129}, ceiling=128)
    assert await refused(plan, client) == "claimed 129 bytes exceeds fetch ceiling 128"
    assert origin.count() == 0


async def test_a_claim_at_the_ceiling_is_fetched(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=WAV))
    plan = make_plan(origin.url("/p"), workspace, block={"sizeBytes": 19}, ceiling=19)
    assert (await fetched(plan, client)).bytes == 19


async def test_an_exhausted_budget_is_refused_without_dialing(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=WAV))
    plan = make_plan(origin.url("/p"), workspace, budget=1000, used=1000)
    assert await refused(plan, client) == "per-server fetch budget exhausted (1000/1000 bytes)"
    assert origin.count() == 0


async def test_the_checks_before_dialing_come_in_order(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    uri = origin.url("/p")
    everything = make_plan(
        uri, workspace, block={"expiresAt": "x", "sizeBytes": 9}, ceiling=8, budget=5, used=5
    )
    assert await refused(everything, client) == EXPIRED
    size_and_budget = make_plan(uri, workspace, block={"sizeBytes": 9}, ceiling=8, budget=5, used=5)
    assert await refused(size_and_budget, client) == "claimed 9 bytes exceeds fetch ceiling 8"
    assert origin.count() == 0


# -- step 6: the GET -----------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_refused_and_not_followed(
    origin: Origin, workspace: Path, status: int
) -> None:
    async with serve_origin() as elsewhere:
        elsewhere.route("/landing", Route(body=WAV))
        origin.route("/p", Route(status=status, redirect=elsewhere.url("/landing")))
        plan = make_plan(origin.url("/p"), workspace, token="tok")
        # Even a client that would follow redirects on its own does not follow this one.
        async with httpx.AsyncClient(follow_redirects=True) as eager_client:
            message = await refused(plan, eager_client)
        assert message == f"redirect refused (HTTP {status}) — no redirect traversal"
        assert origin.count("/p") == 1
        assert elsewhere.count() == 0
        assert saved_files(workspace) == []


@pytest.mark.parametrize(
    ("status", "message"),
    [(404, "HTTP 404"), (500, "HTTP 500"), (403, "HTTP 403"), (204, "no response body")],
)
async def test_a_status_that_is_not_success_is_refused(
    origin: Origin, client: httpx.AsyncClient, workspace: Path, status: int, message: str
) -> None:
    origin.route("/p", Route(status=status, body=b"" if status == 204 else b"nope"))
    assert await refused(make_plan(origin.url("/p"), workspace), client) == message
    assert origin.count() == 1
    assert saved_files(workspace) == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_stream_over_the_ceiling_is_abandoned_early(
    origin: Origin, client: httpx.AsyncClient, workspace: Path, chunked: bool
) -> None:
    body = b"\0" * (64 * MiB)
    origin.route("/big", Route(body=body, chunked=chunked))
    plan = make_plan(origin.url("/big"), workspace, block={"sizeBytes": 1}, ceiling=65536)
    message = await refused(plan, client)
    assert message.startswith("aborted: actual bytes exceeded ceiling at ")
    assert int(message.rsplit(" ", 1)[1]) > 65536
    with trio.fail_after(30):
        await origin.requests[0].done.wait()
    assert not origin.requests[0].completed
    assert origin.requests[0].sent < len(body)
    assert saved_files(workspace) == []


async def test_a_stream_over_the_budget_left_is_abandoned(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=b"x" * 5000))
    plan = make_plan(origin.url("/p"), workspace, ceiling=10_000, budget=1000, used=900)
    message = await refused(plan, client)
    assert message.startswith("aborted: actual bytes exceeded per-server budget at ")
    assert int(message.rsplit(" ", 1)[1]) > 100
    assert saved_files(workspace) == []


async def test_a_stream_just_within_the_budget_left_is_fetched(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=b"x" * 100))
    plan = make_plan(origin.url("/p"), workspace, ceiling=10_000, budget=1000, used=900)
    assert (await fetched(plan, client)).bytes == 100


async def test_a_gzip_bomb_is_not_inflated_past_the_ceiling(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    bomb = Route(body=b"\0" * (16 * MiB), gzip=True)
    assert len(bomb.wire_body()) < 20_000
    origin.route("/bomb", bomb)
    plan = make_plan(origin.url("/bomb"), workspace, ceiling=1000)
    # Inflation stops one octet past the ceiling.
    assert await refused(plan, client) == "aborted: actual bytes exceeded ceiling at 1001"
    plan = make_plan(origin.url("/bomb"), workspace, ceiling=1000, budget=500, used=400)
    assert await refused(plan, client) == "aborted: actual bytes exceeded per-server budget at 101"
    assert saved_files(workspace) == []


async def test_gzip_content_coding_is_undone_before_digest_and_save(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    payload = WAV + b"x" * 493
    origin.route("/p", Route(body=payload, gzip=True, headers={"Content-Type": "audio/wav"}))
    plan = make_plan(
        origin.url("/p"), workspace, block={"sizeBytes": 512, "digest": sha(payload)}, ceiling=512
    )
    result = await fetched(plan, client)
    assert result == Fetched(
        path=f"refs/{REF}.wav", bytes=512, mime_type="audio/wav", digest_verified=True
    )
    assert (workspace / result.path).read_bytes() == payload
    assert origin.requests[0].header("accept-encoding") is not None


async def test_an_unknown_content_coding_is_refused(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=WAV, headers={"Content-Encoding": "br"}))
    assert await refused(make_plan(origin.url("/p"), workspace), client) == (
        "unsupported content-encoding"
    )


async def test_a_truncated_gzip_body_is_refused(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    wire = gzip.compress(WAV * 10)[:-12]
    origin.route("/p", Route(body=wire, headers={"Content-Encoding": "gzip"}))
    assert await refused(make_plan(origin.url("/p"), workspace), client) == (
        "content decoding failed"
    )
    assert saved_files(workspace) == []


@pytest.mark.parametrize("token", ["s3cret", None])
async def test_the_token_is_sent_only_when_the_plan_has_one(
    origin: Origin, client: httpx.AsyncClient, workspace: Path, token: str | None
) -> None:
    origin.route("/p", Route(body=WAV))
    await fetched(make_plan(origin.url("/p"), workspace, token=token), client)
    expected = None if token is None else f"Bearer {token}"
    assert [r.authorization for r in origin.requests] == [expected]


@pytest.mark.parametrize("token", ["s3cret", None])
async def test_no_other_credential_goes_out(
    origin: Origin, workspace: Path, token: str | None
) -> None:
    """Neither user-info in the uri nor a client's own auth or cookies are sent."""
    origin.route("/p", Route(body=WAV, headers={"Set-Cookie": "session=abc; Path=/"}))
    uri = origin.url("/p").replace("http://", "http://user:pw@")
    async with httpx.AsyncClient(auth=("client", "auth"), cookies={"c": "1"}) as other:
        await fetched(make_plan(uri, workspace, token=token), other)
    async with make_client() as own:
        await fetched(make_plan(uri, workspace, token=token), own)
        await fetched(make_plan(uri, workspace, token=token), own)
    expected = None if token is None else f"Bearer {token}"
    assert [r.authorization for r in origin.requests] == [expected] * 3
    assert [r.header("cookie") for r in origin.requests[1:]] == [None, None]


async def test_a_request_that_is_never_answered_times_out(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/hang", Route(hang=True))
    plan = make_plan(origin.url("/hang"), workspace, timeout=0.2)
    assert await refused(plan, client) == "fetch timed out or aborted"
    with trio.fail_after(30):
        await origin.requests[0].done.wait()  # the fetcher hung up
    assert saved_files(workspace) == []


async def test_a_body_that_stalls_times_out(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/stall", Route(body=WAV * 100, stall_after=100))
    plan = make_plan(origin.url("/stall"), workspace, timeout=0.2)
    assert await refused(plan, client) == "fetch timed out or aborted"
    with trio.fail_after(30):
        await origin.requests[0].done.wait()
    assert origin.requests[0].sent == 100
    assert saved_files(workspace) == []


async def test_a_transport_error_gives_its_message_without_the_origin(
    client: httpx.AsyncClient, workspace: Path
) -> None:
    async with serve_origin() as gone:
        uri = gone.url("/p")
    message = await refused(make_plan(uri, workspace, token="s3cret"), client)
    assert message
    assert "127.0.0.1" not in message
    assert "s3cret" not in message
    assert "\n" not in message


async def test_an_outer_cancellation_is_not_swallowed(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/hang", Route(hang=True))
    with trio.move_on_after(0.2) as outer:
        await fetch(make_plan(origin.url("/hang"), workspace, timeout=60.0), client)
    assert outer.cancelled_caught


# -- step 7: digest ------------------------------------------------------------------------


async def test_a_digest_mismatch_is_refused_and_nothing_saved(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    claimed = "sha256:2SmKENGwc1g33EvYXaxkGw887yekfl1TpU8vP1svz_o"
    origin.route("/p", Route(body=WAV))
    plan = make_plan(origin.url("/p"), workspace, block={"digest": claimed})
    got = sha(WAV)
    assert await refused(plan, client) == (
        f"digest mismatch (claimed {claimed[:20]}…, got {got[:20]}…)"
    )
    assert saved_files(workspace) == []


async def test_a_matching_digest_is_verified(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    assert sha(WAV) == digest_of(WAV) == "sha256:uM7OLD5sO8G3SeWw3LirIreZM71523d9_qXxkn8ewpM"
    origin.route("/p", Route(body=WAV, headers={"Content-Type": "audio/wav"}))
    plan = make_plan(origin.url("/p"), workspace, block={"digest": sha(WAV)})
    result = await fetched(plan, client)
    assert result == Fetched(
        path=f"refs/{REF}.wav", bytes=len(WAV), mime_type="audio/wav", digest_verified=True
    )
    assert saved_files(workspace) == [f"refs/{REF}.wav"]
    assert (workspace / result.path).read_bytes() == WAV


async def test_no_digest_claimed_is_not_verified(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=WAV))
    result = await fetched(make_plan(origin.url("/p"), workspace), client)
    assert result.digest_verified is False
    assert (workspace / result.path).read_bytes() == WAV


async def test_an_empty_body_is_a_payload_of_zero_bytes(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=b""))
    plan = make_plan(origin.url("/p"), workspace, block={"digest": sha(b"")})
    result = await fetched(plan, client)
    assert (result.bytes, result.digest_verified, result.mime_type) == (
        0,
        True,
        "application/octet-stream",
    )
    assert (workspace / result.path).read_bytes() == b""


# -- step 8: type and extension ------------------------------------------------------------

MAGIC = [
    (b"RIFF\x10\0\0\0WAVEfmt ", None, None, "audio/wav", "wav"),
    (b"fLaC\0\0\0\x22", None, None, "audio/flac", "flac"),
    (b"OggS\0\x02", None, None, "audio/ogg", "ogg"),
    (b"MThd\0\0\0\x06", None, None, "audio/midi", "mid"),
    (b"ID3\x04\0\0", None, None, "audio/mpeg", "mp3"),
    (b"\xff\xfb\x90\x64\0", None, None, "audio/mpeg", "mp3"),
    (b"\x89PNG\r\n\x1a\n\0\0", "audio/wav", "audio/wav", "image/png", "png"),
    (b"\xff\xd8\xff\xe0\0\x10JFIF", None, None, "image/jpeg", "jpg"),
    (b"GIF89a\x01\0", None, None, "image/gif", "gif"),
    (b"GIF87a\x01\0", None, None, "image/gif", "gif"),
    (b"\0\0\0\x18ftypmp42", None, None, "video/mp4", "mp4"),
    (b"%PDF-1.7\n", None, None, "application/pdf", "pdf"),
    (b"PK\x03\x04\x14\0", None, None, "application/zip", "zip"),
    (b'{"a": 1}', "application/json; charset=utf-8", "text/plain", "application/json", "json"),
    (b"plain words", None, "text/plain", "text/plain", "txt"),
    (b"plain words", None, None, "application/octet-stream", "bin"),
]


@pytest.mark.parametrize(
    ("body", "content_type", "claimed", "mime", "ext"),
    MAGIC,
    ids=[m[3] + "-" + m[4] for m in MAGIC],
)
async def test_the_type_is_sniffed_and_names_the_extension(
    origin: Origin,
    client: httpx.AsyncClient,
    workspace: Path,
    body: bytes,
    content_type: str | None,
    claimed: str | None,
    mime: str,
    ext: str,
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    origin.route("/p", Route(body=body, headers=headers))
    block = {"mimeType": claimed} if claimed else {}
    result = await fetched(make_plan(origin.url("/p"), workspace, block=block), client)
    assert (result.mime_type, result.path) == (mime, f"refs/{REF}.{ext}")
    assert saved_files(workspace) == [f"refs/{REF}.{ext}"]


# -- step 9: save --------------------------------------------------------------------------


async def test_the_file_is_named_from_the_reference_id_only(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    origin.route("/p", Route(body=WAV))
    block = {"name": "../../.ssh/authorized_keys", "mimeType": "audio/wav"}
    result = await fetched(make_plan(origin.url("/p"), workspace, block=block), client)
    assert result.path == f"refs/{REF}.wav"
    assert saved_files(workspace) == [f"refs/{REF}.wav"]
    assert not (workspace.parent / ".ssh").exists()


async def test_an_existing_refs_folder_is_used(
    origin: Origin, client: httpx.AsyncClient, workspace: Path
) -> None:
    (workspace / "refs").mkdir(parents=True)
    (workspace / "refs" / "other.bin").write_bytes(b"keep")
    origin.route("/p", Route(body=WAV))
    await fetched(make_plan(origin.url("/p"), workspace), client)
    assert saved_files(workspace) == ["refs/other.bin", f"refs/{REF}.wav"]


async def test_an_unwritable_workspace_is_refused(
    origin: Origin, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    blocked = tmp_path / "workspace"
    blocked.write_bytes(b"a file where the workspace should be")
    origin.route("/p", Route(body=WAV))
    assert await refused(make_plan(origin.url("/p"), blocked), client) == (
        "no writable workspace to store the payload"
    )
    assert origin.count() == 1


# -- the URL dialed ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "dialed"),
    [
        ("https://bücher.example/x", "https://xn--bcher-kva.example/x"),
        ("http://[::1]:8080/a?b=1#frag", "http://[::1]:8080/a?b=1"),
        ("http://Host.Example:80/x", "http://host.example/x"),
        ("http://user:pw@h/x", "http://h/x"),
        ("http://127.0.0.1:8080\\@evil.example/", "http://127.0.0.1:8080/@evil.example/"),
        ("file:///etc/passwd", "scheme not allowed: file:"),
        ("not a url", "reference uri does not parse"),
        ("http://h:99999/", "reference uri does not parse"),
    ],
)
def test_the_url_dialed_is_the_whatwg_reading_of_the_uri(uri: str, dialed: str) -> None:
    """The uri's origin was checked as a WHATWG parser reads it; httpx must dial that same
    host, never its own reading of an ambiguous uri, and without user-info."""
    try:
        got = str(_request_url(uri))
    except FetchRefused as exc:
        got = str(exc)
    assert got == dialed
