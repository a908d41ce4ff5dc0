"""The HTTP fetcher for bulk content references (RFC-005; refs-and-headers.md B.3 steps 4-9).

The caller (the reference registry) has already answered from the cache, joined a fetch in
flight and chosen the dialed server (steps 1-3), and hands over a ``FetchPlan`` built from that
server. ``fetch`` then, in order:

4. refuses an expired reference, or one whose expiry does not parse;
5. refuses a claimed size over the ceiling, then a server whose budget is spent -- nothing has
   been dialed up to here;
6. GETs the uri: the dialed server's bearer token only when it has one, no other credential,
   no redirect followed, the body streamed, decoded, counted and hashed as it arrives and
   abandoned as soon as it passes the ceiling or what is left of the budget;
7. checks the claimed digest against the payload octets (after any content-coding is undone);
8. sniffs the type and picks the extension;
9. saves the bytes as ``<workspace>/refs/<ref_id>.<ext>`` and reports ``refs/<ref_id>.<ext>``.

Every refusal is a ``FetchRefused`` whose text is the specification's message byte for byte.
Charging the budget and marking the record fetched are the caller's (step 10).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import ssl
import zlib
from http.cookiejar import CookieJar, DefaultCookiePolicy
from pathlib import Path
from typing import TYPE_CHECKING

import ada_url
import attrs
import trio

from protocol.references import (
    EXPIRED,
    Testimony,
    budget_refusal,
    ceiling_refusal,
    digest_mismatch,
    extension_for,
    is_expired,
    sniff_mime,
)

if TYPE_CHECKING:  # imported where a fetch needs it: most runs never fetch, and it is slow to load
    import httpx

__all__ = ["FetchPlan", "FetchRefused", "Fetched", "fetch", "make_client"]

TIMED_OUT = "fetch timed out or aborted"
NO_BODY = "no response body"
NO_WORKSPACE = "no writable workspace to store the payload"
BAD_URI = "reference uri does not parse"
UNSUPPORTED_CODING = "unsupported content-encoding"
DECODING_FAILED = "content decoding failed"

#: How many leading bytes the type sniffer sees.
_SNIFF_BYTES = 512
#: Host-generated file names only: a reference id and a short extension.
_SAFE_REF_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SAFE_EXT = re.compile(r"[a-z0-9]{1,16}")
#: A transport error's text is shown to the model: bounded, one line.
_MAX_ERROR = 200
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class FetchRefused(Exception):
    """A refusal or failure; ``str(exc)`` is exactly the message the caller shows."""


@attrs.frozen(kw_only=True)
class FetchPlan:
    ref_id: str
    testimony: Testimony
    token: (
        str | None
    )  # the dialed server's bearer token; sent only because the uri is on its origin
    ceiling: int  # min(requested max_bytes, 268435456), or the server's eager limit when eager
    budget: int  # the dialed server's fetch_budget_bytes
    used: int  # bytes already charged to the dialed server
    timeout: float  # 60.0 on demand, 10.0 eager
    workspace: Path  # <data_dir>/workspace; files go to workspace / "refs" / f"{ref_id}.{ext}"
    now: float  # POSIX time for the expiry check


@attrs.frozen(kw_only=True)
class Fetched:
    path: str  # workspace-relative: "refs/<ref_id>.<ext>"
    bytes: int
    mime_type: str
    digest_verified: bool


def make_client(verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """A client for reference fetches: no redirects, no proxies or netrc from the environment,
    no cookie kept from one response for the next, no timeouts of its own (each fetch has one
    deadline for the whole exchange). The host passes its shared TLS context as ``verify``
    (``actors.models.tls``): building one per fetch would hold the loop."""
    import httpx

    return httpx.AsyncClient(
        verify=verify,
        follow_redirects=False,
        trust_env=False,
        cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),  # keeps none
        timeout=httpx.Timeout(None, connect=30.0),
        headers={"User-Agent": "mcplive-fetcher"},
    )


async def fetch(plan: FetchPlan, client: httpx.AsyncClient) -> Fetched:
    """B.3 steps 4-9 for one planned fetch; raises ``FetchRefused`` with the exact message."""
    testimony = plan.testimony
    if not _SAFE_REF_ID.fullmatch(plan.ref_id):
        raise ValueError(f"not a host reference id: {plan.ref_id!r}")
    # 4. Expiry (an unparseable expiry counts as expired).
    if testimony.expires_at is not None and is_expired(testimony.expires_at, plan.now):
        raise FetchRefused(EXPIRED)
    # 5. The claimed size against the ceiling, then the server's budget. Nothing dialed yet.
    if testimony.size_bytes is not None:
        refusal = ceiling_refusal(testimony.size_bytes, plan.ceiling)
        if refusal is not None:
            raise FetchRefused(refusal)
    refusal = budget_refusal(plan.used, plan.budget)
    if refusal is not None:
        raise FetchRefused(refusal)
    # 6. The GET.
    url = _request_url(testimony.uri)
    body = await _get(plan, client, url)
    # 7. Digest of the payload octets.
    if testimony.digest is not None and testimony.digest != body.digest:
        raise FetchRefused(digest_mismatch(testimony.digest, body.digest))
    # 8. Type and extension.
    data = body.data  # not copied: it may be as large as the ceiling
    mime = sniff_mime(bytes(data[:_SNIFF_BYTES]), body.content_type, testimony.mime_type)
    ext = extension_for(mime).lstrip(".").lower()
    if not _SAFE_EXT.fullmatch(ext):
        ext = "bin"
    # 9. Save under a host-generated name.
    name = f"{plan.ref_id}.{ext}"
    try:
        await trio.to_thread.run_sync(_write, plan.workspace / "refs", name, data)
    except OSError:
        raise FetchRefused(NO_WORKSPACE) from None
    return Fetched(
        path=f"refs/{name}",
        bytes=len(data),
        mime_type=mime,
        digest_verified=testimony.digest is not None,
    )


# -- step 6 --------------------------------------------------------------------------------


@attrs.define
class _Body:
    data: bytearray
    digest: str
    content_type: str | None


def _request_url(uri: str) -> httpx.URL:
    """The URL to dial: the WHATWG reading of the uri (the one its origin was checked on),
    without user-info (no credential but the server's token goes out) or fragment; refused
    unless httpx reads the same scheme, host and port from it."""
    import httpx

    try:
        parsed = ada_url.URL(uri)
    except ValueError:
        raise FetchRefused(BAD_URI) from None
    scheme = parsed.protocol.rstrip(":")
    if scheme not in ("http", "https"):
        raise FetchRefused(f"scheme not allowed: {scheme}:")
    parsed.username = ""
    parsed.password = ""
    parsed.hash = ""
    default_port = 443 if scheme == "https" else 80
    port = int(parsed.port) if parsed.port else default_port
    try:
        url = httpx.URL(parsed.href)
    except (httpx.InvalidURL, ValueError):
        raise FetchRefused(BAD_URI) from None
    # Both in their encoded forms (punycode); httpx keeps IPv6 hosts without brackets.
    host = parsed.hostname[1:-1] if parsed.hostname.startswith("[") else parsed.hostname
    dialed = url.raw_host.decode("ascii", "replace")
    if (url.scheme, dialed, url.port or default_port) != (scheme, host, port):
        raise FetchRefused(BAD_URI)
    return url


async def _get(plan: FetchPlan, client: httpx.AsyncClient, url: httpx.URL) -> _Body:
    import httpx

    headers = {"Accept-Encoding": "gzip, deflate"}
    if plan.token is not None:
        headers["Authorization"] = f"Bearer {plan.token}"
    counter = _Counter(ceiling=plan.ceiling, room=plan.budget - plan.used)
    content_type: str | None = None
    with trio.move_on_after(plan.timeout) as deadline:
        try:
            async with client.stream(
                "GET", url, headers=headers, follow_redirects=False, auth=_no_auth()
            ) as response:
                status = response.status_code
                if 300 <= status < 400:
                    raise FetchRefused(f"redirect refused (HTTP {status}) — no redirect traversal")
                if not 200 <= status < 300:
                    raise FetchRefused(f"HTTP {status}")
                if status in (204, 205):  # statuses that carry no body at all
                    raise FetchRefused(NO_BODY)
                content_type = response.headers.get("content-type")
                decoder = _decoder(response.headers.get_list("content-encoding", split_commas=True))
                async for raw in response.aiter_raw():
                    decoder.feed(raw, counter)
                decoder.finish()
        except httpx.TimeoutException:
            raise FetchRefused(TIMED_OUT) from None
        except httpx.HTTPError as exc:
            raise FetchRefused(_transport_message(exc, plan)) from None
    if deadline.cancelled_caught:
        raise FetchRefused(TIMED_OUT)
    return _Body(data=counter.data, digest=counter.digest(), content_type=content_type)


def _no_auth() -> httpx.Auth:
    """No credential from the client's defaults or from the URL (an ``httpx.Auth`` that adds
    nothing)."""
    import httpx

    return httpx.Auth()


@attrs.define
class _Counter:
    """Counts and hashes the payload octets, and aborts past the ceiling or the budget left."""

    ceiling: int
    room: int  # budget - used when the fetch started
    received: int = 0
    raw: int = 0
    data: bytearray = attrs.field(factory=bytearray)
    hasher: hashlib._Hash = attrs.field(factory=hashlib.sha256)

    @property
    def allowance(self) -> int:
        """How many more payload octets may arrive before the fetch is over a limit."""
        return max(0, min(self.ceiling, self.room) - self.received)

    def add(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self.ceiling:
            raise FetchRefused(f"aborted: actual bytes exceeded ceiling at {self.received}")
        if self.received > self.room:
            raise FetchRefused(
                f"aborted: actual bytes exceeded per-server budget at {self.received}"
            )
        self.hasher.update(chunk)
        self.data += chunk

    def add_raw(self, n: int) -> None:
        """Bound the octets on the wire too, so a content-coding that decodes to little or
        nothing cannot stream forever: the ceiling plus deflate's worst-case overhead."""
        self.raw += n
        if self.raw > self.ceiling + self.ceiling // 1024 + 1024:
            raise FetchRefused(f"aborted: actual bytes exceeded ceiling at {self.raw}")

    def digest(self) -> str:
        return "sha256:" + base64.urlsafe_b64encode(self.hasher.digest()).rstrip(b"=").decode()


class _Identity:
    def feed(self, raw: bytes, counter: _Counter) -> None:
        if raw:
            counter.add(raw)

    def finish(self) -> None:
        return None


class _Inflate:
    """gzip or deflate, decoded incrementally and never more than one octet past the
    allowance, so a small compressed body cannot be expanded past the ceiling (gzip bomb)."""

    def __init__(self, gzip: bool) -> None:
        self.gzip = gzip
        self.wbits = zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS
        self.inflater = zlib.decompressobj(self.wbits)
        self.started = False

    def feed(self, raw: bytes, counter: _Counter) -> None:
        self._inflate(raw, counter)
        counter.add_raw(len(raw))

    def _inflate(self, raw: bytes, counter: _Counter) -> None:
        data = raw
        while data:
            try:
                out = self.inflater.decompress(data, counter.allowance + 1)
            except zlib.error:
                if self.gzip or self.started:
                    raise FetchRefused(DECODING_FAILED) from None
                # "deflate" sent as a raw deflate stream (no zlib wrapper), as some servers do.
                self.wbits = -zlib.MAX_WBITS
                self.inflater = zlib.decompressobj(self.wbits)
                self.started = True
                continue
            self.started = True
            if out:
                counter.add(out)
            if self.inflater.eof:
                data = self.inflater.unused_data
                if not data.strip(b"\x00"):
                    return  # trailing padding after the last member
                if not self.gzip:
                    raise FetchRefused(DECODING_FAILED)
                self.inflater = zlib.decompressobj(self.wbits)  # the next gzip member
            else:
                data = self.inflater.unconsumed_tail

    def finish(self) -> None:
        if not self.inflater.eof:
            raise FetchRefused(DECODING_FAILED)  # truncated: the payload is not what was sent


def _decoder(codings: list[str]) -> _Identity | _Inflate:
    applied = [c.strip().lower() for c in codings if c.strip().lower() not in ("", "identity")]
    if not applied:
        return _Identity()
    if len(applied) == 1 and applied[0] in ("gzip", "x-gzip"):
        return _Inflate(gzip=True)
    if len(applied) == 1 and applied[0] == "deflate":
        return _Inflate(gzip=False)
    raise FetchRefused(UNSUPPORTED_CODING)


def _transport_message(exc: Exception, plan: FetchPlan) -> str:
    """A transport error's own message, made fit to show a model: one bounded line that names
    neither the uri, its host nor the token."""
    text = str(exc) or type(exc).__name__
    secrets_to_hide = [plan.testimony.uri]
    try:
        parsed = ada_url.URL(plan.testimony.uri)
        secrets_to_hide += [parsed.origin, parsed.host, parsed.hostname]
    except ValueError:
        pass
    if plan.token:
        secrets_to_hide.append(plan.token)
    for secret in sorted(filter(None, secrets_to_hide), key=len, reverse=True):
        text = text.replace(secret, "<reference>")
    text = _CONTROLS.sub(" ", text).strip()
    if len(text) > _MAX_ERROR:
        text = text[: _MAX_ERROR - 1] + "…"
    return text or type(exc).__name__


# -- step 9 --------------------------------------------------------------------------------


def _write(refs: Path, name: str, data: bytes | bytearray) -> None:
    """Write ``refs/name`` whole or not at all (a temporary file renamed into place)."""
    refs.mkdir(parents=True, exist_ok=True)
    temporary = refs / f".{name}.{secrets.token_hex(6)}.part"
    try:
        with open(temporary, "xb") as f:
            f.write(data)
        os.replace(temporary, refs / name)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
