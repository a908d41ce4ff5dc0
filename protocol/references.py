"""Bulk content references (RFC-005): testimony, stubs, the server choice and the registry.

A reference block is *testimony*: a server's claims about a payload it names by URI. Three
things are kept apart here:

- :class:`Testimony`, the claims as received, each optional field checked by one rule (a value
  that breaks its constraint is dropped and named in ``rejected_fields``);
- :class:`Record`, the host's private entry for one URI in :class:`RegistryState`: its id, every
  server that delivered it, and what a fetch verified;
- the stub (:func:`stub_text`), the one line the model sees: the id and host-bounded labels,
  never the URI.

The fetch itself is I/O and lives elsewhere; this module gives it the decisions that need no
network: which server to dial (:func:`choose`), expiry, the ceiling and budget refusals, the
digest, the sniffed type and the texts of every outcome. Nothing here reads a clock or draws
randomness on its own: ``now`` is a parameter and the registry is handed a ``random.Random``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import ada_url
import attrs

MAX_URI_CHARS: Final = 4096
MAX_RECORDS: Final = 2000
MAX_SIZE_BYTES: Final = 2**53 - 1
MAX_LABEL_CHARS: Final = 255  # mimeType and name, in code points
MAX_EXPIRES_CHARS: Final = 64
LABEL_BOUND: Final = 120  # stub name, mimeType and provenance, in UTF-16 units
PATH_BOUND: Final = 256  # stub saved path, in UTF-16 units

UNBOUND: Final = "reference unbound: no server is recorded to fetch it from"
EXPIRED: Final = "reference expired (or unparseable expiry — fail closed)"
STUB_SEPARATOR: Final = " — "
STUB_FETCH: Final = "fetch with fetch_reference"
STUB_UNBOUND: Final = "unbound: no server is recorded to fetch it from"

#: The lanes that bring a server's content in, and the provenance line each gives a stub.
LANES: Final = ("push", "render", "incoming", "injection", "tool_result")
DISPOSITIONS: Final = ("never", "ref")

#: Wire name -> attribute name of every optional claim, in the order ``rejectedFields`` uses.
FIELDS: Final = {
    "mimeType": "mime_type",
    "name": "name",
    "expiresAt": "expires_at",
    "sizeBytes": "size_bytes",
    "digest": "digest",
    "disposition": "disposition",
}

_DIGEST = re.compile(r"sha256:[A-Za-z0-9_-]{43}", re.ASCII)
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


class ContentError(ValueError):
    """A block is not a valid content block; the message names what is wrong."""


# -- testimony (A.1) --------------------------------------------------------------------------


def _field_ok(wire: str, value: object) -> bool:
    """Whether ``value`` meets the constraint of optional field ``wire`` (A.1)."""
    if wire in ("mimeType", "name"):
        return isinstance(value, str) and len(value) <= MAX_LABEL_CHARS
    if wire == "expiresAt":
        return isinstance(value, str) and len(value) <= MAX_EXPIRES_CHARS
    if wire == "sizeBytes":
        return type(value) is int and 0 <= value <= MAX_SIZE_BYTES
    if wire == "digest":
        return isinstance(value, str) and _DIGEST.fullmatch(value) is not None
    if wire == "disposition":
        return isinstance(value, str) and value in DISPOSITIONS
    raise AssertionError(wire)


def _uri_problem(uri: object) -> str | None:
    if not isinstance(uri, str) or not uri:
        return "reference without string uri"
    if len(uri) > MAX_URI_CHARS:
        return "uri exceeds schema maximum"
    return None


@attrs.frozen(kw_only=True)
class Testimony:
    """A reference's claims. Every field is the server's word, never a fact.

    The constructor refuses values that break A.1 (``ValueError``): a Testimony always holds
    only accepted claims. :func:`read_testimony` is how a wire block becomes one.
    """

    uri: str
    mime_type: str | None = None
    size_bytes: int | None = None
    digest: str | None = None
    expires_at: str | None = None
    name: str | None = None
    disposition: str | None = None
    rejected_fields: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        problem = _uri_problem(self.uri)
        if problem is not None:
            raise ValueError(problem)
        for wire, attr in FIELDS.items():
            value = getattr(self, attr)
            if value is not None and not _field_ok(wire, value):
                raise ValueError(f"{wire} does not meet its constraint")
        if type(self.rejected_fields) is not tuple or not all(
            f in FIELDS for f in self.rejected_fields
        ):
            raise ValueError("rejected_fields must be a tuple of optional field names")

    def to_wire(self) -> dict[str, Any]:
        """camelCase keys; absent claims omitted; ``rejectedFields`` always present."""
        out: dict[str, Any] = {"uri": self.uri}
        for wire, attr in FIELDS.items():
            value = getattr(self, attr)
            if value is not None:
                out[wire] = value
        out["rejectedFields"] = list(self.rejected_fields)
        return out

    @classmethod
    def from_wire(cls, value: Mapping[str, Any]) -> Testimony:
        """Read back what :meth:`to_wire` wrote; anything else is refused (``ValueError``)."""
        if not isinstance(value, Mapping):
            raise ValueError("testimony must be an object")
        unknown = set(value) - {"uri", "rejectedFields", *FIELDS}
        if unknown:
            raise ValueError(f"unknown testimony keys: {sorted(unknown)}")
        rejected = value.get("rejectedFields", [])
        if not isinstance(rejected, list | tuple) or not all(isinstance(f, str) for f in rejected):
            raise ValueError("rejectedFields must be a list of strings")
        uri = value.get("uri")
        if not isinstance(uri, str):
            raise ValueError("reference without string uri")
        kwargs = {attr: value[wire] for wire, attr in FIELDS.items() if wire in value}
        return cls(uri=uri, rejected_fields=tuple(rejected), **kwargs)


def read_testimony(block: Mapping[str, Any]) -> Testimony:
    """The testimony of a reference block (``resource``, or uri-form ``image``/``audio``).

    Raises :class:`ContentError` when the ``uri`` is missing, not a non-empty string, or longer
    than :data:`MAX_URI_CHARS` code points. An optional field that breaks its constraint is
    dropped and named in ``rejected_fields``; unknown keys are ignored.
    """
    problem = _uri_problem(block.get("uri"))
    if problem is not None:
        raise ContentError(problem)
    kept: dict[str, Any] = {}
    rejected: list[str] = []
    for wire, attr in FIELDS.items():
        if wire not in block:
            continue
        value = block[wire]
        if wire == "sizeBytes" and type(value) is float and value.is_integer():
            value = int(value)  # JSON's 12.0 is the integer 12 (as JSON Schema reads it)
        if _field_ok(wire, value):
            kept[attr] = value
        else:
            rejected.append(wire)
    return Testimony(uri=block["uri"], rejected_fields=tuple(rejected), **kept)


# -- the stub (A.3) ---------------------------------------------------------------------------


def stub_provenance(lane: str, server_id: str) -> str:
    """The provenance line of a stub made on ``lane`` (Decision 4); ``ValueError`` if unknown."""
    if lane in ("push", "render"):
        return "attachment on push event"
    if lane == "incoming":
        return "attachment on channel message"
    if lane == "injection":
        return f"injected by {server_id} before inference"
    if lane == "tool_result":
        return "from tool result"
    raise ValueError(f"unknown lane {lane!r}; expected one of {', '.join(LANES)}")


def format_size(n: int) -> str:
    """A claimed size as the stub shows it, rounding half up as JavaScript does.

    Integer arithmetic throughout: ``n / 1024`` and ``n / 2**20`` are exact binary fractions,
    so rounding the exact rational matches ``Math.round`` and ``toFixed(1)`` on the double.
    """
    if n < 0:
        raise ValueError("a size is never negative")
    if n < 1024:
        return f"{n}B"
    if n < 2**20:
        return f"~{(2 * n + 1024) // 2048}KB"
    unit, suffix = (2**20, "MB") if n < 2**30 else (2**30, "GB")
    tenths = (20 * n + unit) // (2 * unit)  # floor(10 n / unit + 1/2)
    return f"~{tenths // 10}.{tenths % 10}{suffix}"


def _removed(ch: str) -> bool:
    c = ord(ch)
    return (
        c <= 0x1F
        or 0x7F <= c <= 0x9F
        or c in (0x200E, 0x200F)
        or 0x202A <= c <= 0x202E
        or 0x2066 <= c <= 0x2069
    )


def utf16_len(text: str) -> int:
    """Length in UTF-16 units (a JavaScript string's ``length``)."""
    return sum(2 if ord(ch) > 0xFFFF else 1 for ch in text)


def sanitize(text: str, bound: int) -> str:
    """Remove control and bidi characters, then bound to ``bound`` UTF-16 units.

    Removed: U+0000–U+001F, U+007F–U+009F, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069. A
    longer result keeps its first ``bound - 1`` units, never half of a surrogate pair, and gets
    ``…`` appended.
    """
    if bound < 1:
        raise ValueError("bound must be at least 1")
    clean = "".join(ch for ch in text if not _removed(ch))
    if utf16_len(clean) <= bound:
        return clean
    kept: list[str] = []
    units = 0
    for ch in clean:
        width = 2 if ord(ch) > 0xFFFF else 1
        if units + width > bound - 1:
            break
        kept.append(ch)
        units += width
    if kept and 0xD800 <= ord(kept[-1]) <= 0xDBFF:
        kept.pop()  # a lone high surrogate would pair with nothing
    return "".join(kept) + "…"


def stub_text(
    ref_id: str,
    testimony: Testimony,
    provenance: str,
    *,
    saved_path: str | None,
    bound: bool,
) -> str:
    """The single line the model sees in place of a reference (A.3).

    ``[<ref_id>] <name> — <mimeType>, <size> claimed — <provenance> — <last part>``; the name
    and the meta part appear only when there is something to show. The URI never appears.
    """
    parts: list[str] = []
    name = sanitize(testimony.name, LABEL_BOUND) if testimony.name is not None else ""
    if name:
        parts.append(name)
    meta: list[str] = []
    mime = sanitize(testimony.mime_type, LABEL_BOUND) if testimony.mime_type is not None else ""
    if mime:
        meta.append(mime)
    if testimony.size_bytes is not None:
        meta.append(f"{format_size(testimony.size_bytes)} claimed")
    if meta:
        parts.append(", ".join(meta))
    parts.append(sanitize(provenance, LABEL_BOUND))
    if saved_path is not None:
        parts.append(f"saved: {sanitize(saved_path, PATH_BOUND)}")
    elif bound:
        parts.append(STUB_FETCH)
    else:
        parts.append(STUB_UNBOUND)
    return f"[{ref_id}] " + STUB_SEPARATOR.join(parts)


# -- origins and the server choice (B.2) ------------------------------------------------------


def _parsed(url: str) -> tuple[str, str] | None:
    """``(scheme, origin)`` of ``url`` as a WHATWG parser reads it, or None."""
    try:
        parsed = ada_url.URL(url)
    except ValueError:  # includes UnicodeEncodeError (lone surrogates)
        return None
    scheme = parsed.protocol.removesuffix(":")
    mapped = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    port = parsed.port  # "" when absent or the default of the parsed scheme
    default = "443" if mapped == "https" else "80"
    host = parsed.hostname + (f":{port}" if port and port != default else "")
    return scheme, f"{mapped}://{host}"


def origin(url: str) -> str | None:
    """The origin the host compares (B.2): ``ws``/``wss`` read as ``http``/``https``,
    lower-case punycode host, no user-info, path, query or fragment, no default port."""
    parsed = _parsed(url)
    return parsed[1] if parsed is not None else None


def origin_check(uri: str, address: str | None) -> str | None:
    """None when a server dialled at ``address`` may fetch ``uri``; else the refusal.

    An ``address`` of None (a server the host holds no address for) reads as a server url that
    does not parse; :func:`choose` never asks about one.
    """
    target = _parsed(uri)
    if target is None:
        return "reference uri does not parse"
    dialed = origin(address) if address is not None else None
    if dialed is None:
        return "server url does not parse"
    scheme, uri_origin = target
    if scheme not in ("http", "https"):
        return f"scheme not allowed: {scheme}:"
    if uri_origin != dialed:
        return f"third-party origin ({uri_origin} != dialed {dialed}); not fetched by this host"
    # B.2 rule 5 (an http uri from an https server) cannot fire here: the schemes are part of
    # the origins, which are equal by now.
    return None


@attrs.frozen
class Chosen:
    """The server a fetch dials (and whose limits, token and budget apply)."""

    server_id: str


@attrs.frozen
class Refused:
    message: str


def choose(
    server_ids: Sequence[str], addresses: Mapping[str, str | None], uri: str
) -> Chosen | Refused:
    """The first listed server with an address on the uri's origin; else the first listed
    server's refusal (``unknown server: <id>`` when it has no address)."""
    if not server_ids:
        return Refused(UNBOUND)
    for server_id in server_ids:
        address = addresses.get(server_id)
        if address is not None and origin_check(uri, address) is None:
            return Chosen(server_id)
    first = server_ids[0]
    address = addresses.get(first)
    if address is None:
        return Refused(f"unknown server: {first}")
    message = origin_check(uri, address)
    assert message is not None
    return Refused(message)


# -- fetch decisions and texts (B.3-B.5) ------------------------------------------------------

_ISO = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:[.,]([0-9]{1,9}))?)?"
    r"(?:([Zz])|([+-])([0-9]{2}):?([0-9]{2}))?)?",
    re.ASCII,
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def parse_expiry(text: str) -> float | None:
    """POSIX seconds of an ISO 8601 date or date-time, or None when it does not parse.

    A date-time without an offset is read as UTC (the host has no local zone to consult).
    """
    m = _ISO.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, _z, sign, off_h, off_m = m.groups()
    try:
        offset = dt.timedelta(0)
        if sign is not None:
            offset = dt.timedelta(hours=int(off_h), minutes=int(off_m))
            offset = -offset if sign == "-" else offset
        when = dt.datetime(
            int(year),
            int(month),
            int(day),
            int(hour or 0),
            int(minute or 0),
            int(second or 0),
            int((frac or "0").ljust(6, "0")[:6]),
            tzinfo=dt.timezone(offset),
        )
    except (ValueError, OverflowError):
        return None
    return (when - _EPOCH).total_seconds()


def is_expired(expires_at: str | None, now: float) -> bool:
    """No claim: not expired. Unparseable: expired (fail closed). Else ``expiry <= now``."""
    if expires_at is None:
        return False
    when = parse_expiry(expires_at)
    return when is None or when <= now


def ceiling_refusal(size_bytes: int | None, ceiling: int) -> str | None:
    if size_bytes is not None and size_bytes > ceiling:
        return f"claimed {size_bytes} bytes exceeds fetch ceiling {ceiling}"
    return None


def budget_refusal(used: int, budget: int) -> str | None:
    if used >= budget:
        return f"per-server fetch budget exhausted ({used}/{budget} bytes)"
    return None


def digest_of(data: bytes) -> str:
    """``sha256:`` + unpadded base64url of the SHA-256 of exactly these octets."""
    raw = hashlib.sha256(data).digest()
    return "sha256:" + base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def digest_mismatch(claimed: str, got: str) -> str:
    return f"digest mismatch (claimed {claimed[:20]}…, got {got[:20]}…)"


def _mpeg_sync(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0


_MAGIC: Final = (
    (b"RIFF", "audio/wav"),
    (b"fLaC", "audio/flac"),
    (b"OggS", "audio/ogg"),
    (b"MThd", "audio/midi"),
    (b"ID3", "audio/mpeg"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK", "application/zip"),
)


def _media_type(value: str | None) -> str:
    return (value or "").split(";", 1)[0].strip().lower()


def sniff_mime(head: bytes, content_type: str | None, claimed: str | None) -> str:
    """The observed type: magic bytes, else the response's Content-Type (before ``;``), else
    the claimed type, else ``application/octet-stream``."""
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[4:8] == b"ftyp":
        return "video/mp4"
    if _mpeg_sync(head):
        return "audio/mpeg"
    header = _media_type(content_type)
    if header:
        return header
    if claimed:
        return claimed
    return "application/octet-stream"


_EXTENSIONS: Final = {
    "audio/wav": "wav",
    "audio/wave": "wav",
    "audio/x-wav": "wav",
    "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
    "audio/mp4": "m4a",
    "audio/m4a": "m4a",
    "audio/x-m4a": "m4a",
    "audio/flac": "flac",
    "audio/x-flac": "flac",
    "audio/midi": "mid",
    "audio/x-midi": "mid",
    "audio/ogg": "ogg",
    "application/ogg": "ogg",
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/jpg": "jpg",
    "image/gif": "gif",
    "image/webp": "webp",
    "video/mp4": "mp4",
    "application/json": "json",
    "text/plain": "txt",
    "application/pdf": "pdf",
    "application/zip": "zip",
}


def extension_for(mime: str) -> str:
    """The saved file's extension (no dot) for a type; ``bin`` for any other type."""
    return _EXTENSIONS.get(_media_type(mime), "bin")


def eager_eligible(
    *, fetched: bool, chosen: Chosen | Refused, size_bytes: int | None, eager_limit: int
) -> bool:
    """B.5: unfetched, a server to dial, and a size claim within that server's eager limit."""
    return (
        not fetched
        and isinstance(chosen, Chosen)
        and size_bytes is not None
        and size_bytes <= eager_limit
    )


def unknown_reference(ref_id: str | None) -> str:
    shown = sanitize(ref_id, LABEL_BOUND) if ref_id else "(missing ref_id)"
    return f"unknown reference: {shown} — it may have been evicted; ids are never reused"


def fetch_result_text(
    path: str, n: int, mime: str, digest_verified: bool, digest_claimed: bool
) -> str:
    """The JSON text a successful ``fetch_reference`` returns (compact, as ``JSON.stringify``)."""
    verified: bool | str = bool(digest_verified) if digest_claimed else "no digest claimed"
    body = {"path": path, "bytes": n, "mime_type": mime, "digest_verified": verified}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


# -- the registry (A.4) -----------------------------------------------------------------------


@attrs.define
class Record:
    """The host's private entry for one URI. ``server_ids`` empty means unbound."""

    ref_id: str
    testimony: Testimony
    server_ids: list[str]
    received_at: float
    fetched_path: str | None = None
    verified_bytes: int | None = None
    verified_mime: str | None = None
    digest_verified: bool = False

    @property
    def fetched(self) -> bool:
        return self.fetched_path is not None


class Rng(Protocol):
    """What the registry needs of a ``random.Random``: it is passed in, never made here."""

    def choice(self, seq: Sequence[str], /) -> str: ...


def base36(n: int) -> str:
    if n < 0:
        raise ValueError("negative")
    digits = ""
    while True:
        n, r = divmod(n, 36)
        digits = _BASE36[r] + digits
        if n == 0:
            return digits


class RegistryState:
    """Every reference the host holds, keyed by the exact ``uri`` string.

    Ids are ``ref_<counter in base 36>_<4 random base-36 chars>``; the counter starts at 1 and
    only grows, so an id is never reused. Past ``max_records`` the oldest record (by first
    registration) is evicted; its id becomes a defined miss, and its uri, delivered again, gets
    a new id.
    """

    def __init__(self, rng: Rng, max_records: int = MAX_RECORDS, *, counter_after: int = 0) -> None:
        """``counter_after``: the highest counter already used (by an earlier process whose
        files remain), so no new id can name an existing file."""
        if max_records < 1:
            raise ValueError("max_records must be at least 1")
        if counter_after < 0:
            raise ValueError("counter_after must be >= 0")
        self._rng = rng
        self._max = max_records
        self._counter = counter_after
        self._by_uri: OrderedDict[str, Record] = OrderedDict()  # first registration first
        self._by_id: dict[str, Record] = {}

    def _new_id(self) -> str:
        self._counter += 1
        tail = "".join(self._rng.choice(_BASE36) for _ in range(4))
        return f"ref_{base36(self._counter)}_{tail}"

    def register(self, testimony: Testimony, server_id: str | None, now: float) -> Record:
        """Record ``testimony`` as delivered by ``server_id`` (None: no server) at ``now``.

        A known uri keeps its record: a new server is appended once; while unfetched the
        testimony is replaced wholesale by this one (latest wins, whoever gave it); once
        fetched it stays as it is.
        """
        if server_id is not None and not server_id:
            raise ValueError("a server id is non-empty (or None for no server)")
        record = self._by_uri.get(testimony.uri)
        if record is None:
            record = Record(
                ref_id=self._new_id(),
                testimony=testimony,
                server_ids=[server_id] if server_id is not None else [],
                received_at=now,
            )
            self._by_uri[testimony.uri] = record
            self._by_id[record.ref_id] = record
            while len(self._by_uri) > self._max:
                _, oldest = self._by_uri.popitem(last=False)
                del self._by_id[oldest.ref_id]
            return record
        if server_id is not None and server_id not in record.server_ids:
            record.server_ids.append(server_id)
        if not record.fetched:
            record.testimony = testimony
        return record

    def get(self, ref_id: str) -> Record | None:
        return self._by_id.get(ref_id)

    def mark_fetched(
        self,
        ref_id: str,
        *,
        path: str,
        n: int,
        mime: str,
        digest_verified: bool,
        testimony: Testimony | None = None,
    ) -> None:
        """Store a fetch's verified outcome. ``testimony``: the claims the fetch checked, when
        a newer registration replaced them while it ran (they become the frozen ones).

        A record already fetched keeps its first outcome; an evicted id is ignored.
        """
        record = self._by_id.get(ref_id)
        if record is None or record.fetched:
            return
        if testimony is not None:
            if testimony.uri != record.testimony.uri:
                raise ValueError("the fetched testimony names another uri")
            record.testimony = testimony
        record.fetched_path = path
        record.verified_bytes = n
        record.verified_mime = mime
        record.digest_verified = digest_verified and record.testimony.digest is not None

    def __len__(self) -> int:
        return len(self._by_uri)
