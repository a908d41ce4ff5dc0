"""Body digests: the version stamps of an inbound item (refs-and-headers F.2–F.3).

    body_digest(bs) = hex(SHA-256(UTF-8(canonical_json([[normalize_block(b) for b in bs]]))))

Note the **one-element outer array** around the block list: it keeps the framing an older,
undecorated copy already hashes to, so ``body_digest(blocks)`` is *not* the hash of
``canonical_json(blocks)``. Ingestion stamps ``source_body_digest`` (the body as delivered, before
header and marking) and ``stored_body_digest`` (exactly the blocks handed to the store) with this
one function; a reader checks a stored copy with it too, never with a copy of it.

Canonical JSON is the TypeScript host's, byte for byte (decision 11):

* objects: keys sorted by UTF-16 code units (JavaScript's ``<``); an entry whose key is not a
  well-formed string is dropped (a key that is not a ``str`` at all counts as not well-formed);
* arrays (``list``/``tuple``) in order; no whitespace;
* strings made well-formed, then written as ``JSON.stringify`` writes them (non-ASCII raw,
  ``\\" \\\\ \\b \\f \\n \\r \\t`` and ``\\u00XX`` for the other C0 controls). A ``str`` is read as
  JavaScript would read the same UTF-16 units: two surrogate code points that form a pair are that
  pair's character, and each lone surrogate becomes U+FFFD;
* numbers as JavaScript prints the double: ``1`` not ``1.0``, ``-0`` as ``0``, ``1e+21``,
  ``1e-7``, and an ``int`` beyond 2**53 rounded to the nearest double first (as a JavaScript peer
  parses it); a non-finite number is ``null`` (``JSON.stringify(Infinity)``);
* ``True``/``False``/``None`` as ``true``/``false``/``null``. Python has no ``undefined``:
  ``None`` is JSON ``null``, a value, and is kept (``{"a": None}`` is ``{"a":null}``). Any other
  Python type (``bytes``, ``set``, objects) is not a JSON value and raises :class:`TypeError`.

The serialization itself is RFC 8785 (JCS) by the ``rfc8785`` package, the one
:mod:`protocol.manifest` uses. For the values this module hands it, JCS *is* F.3's form: the same
UTF-16 key order, the same string escapes as ``JSON.stringify``, and ECMAScript ``Number::toString``
for doubles (compared with Node 20 on 600,000 random doubles, on every code point and on key sets
mixing BMP and astral keys; the tests keep a smaller differential run against Node). ``rfc8785``
refuses what F.3 instead rewrites (lone surrogates, keys that are not well-formed, integers beyond
2**53, non-finite floats), so :func:`_plain` does those rewrites first and JCS never sees them.

``normalize_block`` reduces a media block the TypeScript host's store keeps as a blob to
``{type, source: {type: "base64", data, mediaType}}``: the data re-encoded as canonical padded
base64 (what Node's ``Buffer.from(data, "base64").toString("base64")`` gives), an image's media
type re-sniffed from its bytes (PNG/JPEG/GIF/WEBP; else the declared one). mcplive stores inline
media in MCPL's own shape, ``{"type": "image" | "audio", "data", "mimeType"}``; such a block is read
as the same blob (``mimeType`` is its ``mediaType``), so a body with inline media hashes as the
TypeScript host hashes the same delivered body (it converts MCPL media to exactly that ``source``
shape). A block that already has a ``source`` is treated as F.3 says. Every other block (text, a
URL image ``{"type": "image", "uri"}``, reference stubs, tool blocks) is hashed as it is.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeAlias

import rfc8785

__all__ = [
    "body_digest",
    "body_digests",
    "canonical_base64",
    "canonical_json",
    "normalize_block",
    "sniff_image_type",
]

Json: TypeAlias = bool | int | float | str | list["Json"] | dict[str, "Json"] | None

#: Integers JavaScript holds exactly; beyond them a JSON number is the nearest double.
_MAX_SAFE_INTEGER = 2**53 - 1
#: Block types the TypeScript host's store always keeps as blobs (and ``image``, unless a URL).
_BLOB_TYPES = frozenset({"document", "audio", "video"})
_ABSENT: Any = object()
_CANONICAL_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_NOT_BASE64 = re.compile(r"[^A-Za-z0-9+/]+")
_URL_SAFE = str.maketrans("-_", "+/")


def body_digest(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The F.3 digest of ``blocks``: lowercase hex SHA-256 of the framed canonical JSON."""
    framed = _framed(_plain_text_parts(blocks))
    if framed is not None:
        return hashlib.sha256(framed).hexdigest()
    framed_value = [[normalize_block(block) for block in blocks]]
    return hashlib.sha256(_canonical_bytes(framed_value)).hexdigest()


def body_digests(
    delivered: Sequence[Mapping[str, Any]], stored: Sequence[Mapping[str, Any]]
) -> tuple[str, str]:
    """``(body_digest(delivered), body_digest(stored))``, for a stored copy that is blocks put
    before the delivered ones. When the stored copy ends with the very block objects delivered
    (marking changed nothing), their canonical text is written once for both digests; that of a
    single header block is remembered from item to item."""
    parts = _plain_text_parts(delivered)
    framed = _framed(parts)
    if parts is None or framed is None:
        return body_digest(delivered), body_digest(stored)
    both = None
    cut = len(stored) - len(delivered)
    head = None if cut < 0 else _head_parts(stored[:cut])
    if head is not None:
        for i, block in enumerate(delivered, cut):
            if stored[i] is not block:  # marked: the stored body is written on its own
                tail = _plain_text_parts(stored[cut:])
                break
        else:
            tail = parts
        both = None if tail is None else _framed(head + tail)
    stored_digest = body_digest(stored) if both is None else hashlib.sha256(both).hexdigest()
    return hashlib.sha256(framed).hexdigest(), stored_digest


def _head_parts(head: Sequence[Mapping[str, Any]]) -> list[str] | None:
    if len(head) == 1:
        first = head[0]
        if (
            type(first) is dict
            and len(first) == 2
            and first.get("type") == "text"
            and type(text := first.get("text")) is str
        ):
            # a single header block: the same text on every item of a channel
            part = _text_part(text)
            return None if part is None else [part]
    return _plain_text_parts(head)


def _framed(parts: list[str] | None) -> bytes | None:
    """The framed canonical JSON of plain-text parts, as UTF-8; ``None`` when there are no parts,
    or when a text holds a surrogate code point (the general path reads those as JavaScript
    does). Encoding is what finds a surrogate, so a text is not searched for one beforehand."""
    if parts is None:
        return None
    try:
        return ("[[" + ",".join(parts) + "]]").encode("utf-8")
    except UnicodeEncodeError:
        return None


# JSON.stringify and this encoder agree on every well-formed string: the same short escapes, the
# same lowercase \u00XX for the other controls, everything else (U+2028 too) raw.
_ENCODE_STRING = json.JSONEncoder(ensure_ascii=False).encode


def _plain_text_parts(blocks: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The canonical JSON of each block of a body made only of plain text blocks (the common
    case), written directly; None for anything else, which takes the general path. A text with
    a surrogate code point is written too: :func:`_framed` refuses it."""
    parts = []
    for block in blocks:
        if type(block) is not dict or len(block) != 2 or block.get("type") != "text":
            return None
        text = block.get("text")
        if type(text) is not str:
            return None
        parts.append('{"text":' + _ENCODE_STRING(text) + ',"type":"text"}')
    return parts


@lru_cache(maxsize=256)
def _text_part(text: str) -> str | None:
    """What :func:`_plain_text_parts` writes for ``{"type": "text", "text": text}``."""
    parts = _plain_text_parts([{"type": "text", "text": text}])
    return None if parts is None else parts[0]


def _plain_text_json(blocks: Sequence[Mapping[str, Any]]) -> str | None:
    """The framed canonical JSON of a plain-text body (see :func:`_plain_text_parts`); ``None``
    for a body the general path hashes."""
    framed = _framed(_plain_text_parts(blocks))
    return None if framed is None else framed.decode("utf-8")


def canonical_json(value: Any) -> str:
    """``value`` in F.3's canonical JSON. Serialization only: :func:`body_digest` adds the framing
    and the block normalization, so hash through it rather than through this."""
    return _canonical_bytes(value).decode("utf-8")


def _canonical_bytes(value: Any) -> bytes:
    return rfc8785.dumps(_plain(value))


def _plain(value: Any) -> Json:
    """``value`` rewritten into what JCS prints exactly as F.3 wants (see the module notes)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER:
            return int(value)
        try:
            return float(value)  # correctly rounded, as a JavaScript peer parses the literal
        except OverflowError:
            return None  # JavaScript parses it as Infinity, which JSON.stringify writes as null
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return _well_formed(value)
    if isinstance(value, Mapping):
        out: dict[str, Json] = {}
        for key, item in value.items():
            name = _well_formed_key(key)
            if name is not None:
                out[name] = _plain(item)
        return out
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _has_surrogates(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _well_formed(text: str) -> str:
    """``text`` as JavaScript's ``toWellFormed()`` gives the same UTF-16 units back."""
    if not _has_surrogates(text):
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _well_formed_key(key: object) -> str | None:
    """The key as a well-formed string, or ``None`` when JavaScript would find it ill-formed.

    (Two Python keys can name one JavaScript key, e.g. a character and its surrogate pair spelled
    as two code points; the later one wins, as it would in a JavaScript object.)
    """
    if not isinstance(key, str):
        return None
    if not _has_surrogates(key):
        return key
    try:
        return key.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        return None


def normalize_block(block: Any) -> Any:
    """``block`` as F.3 hashes it: a blob-kept media block reduced, anything else unchanged."""
    if not isinstance(block, Mapping):
        return block
    kind = block.get("type")
    if not isinstance(kind, str):
        return block
    if "source" in block:  # F.3's own shape
        source = block["source"]
        if not isinstance(source, Mapping) or not isinstance(source.get("data"), str):
            return block
        if kind in _BLOB_TYPES or (kind == "image" and source.get("type") != "url"):
            return _reduced(kind, source["data"], source.get("mediaType", _ABSENT))
        return block
    data = block.get("data")  # mcplive's stored shape: MCPL's inline media
    if (kind == "image" or kind in _BLOB_TYPES) and isinstance(data, str):
        return _reduced(kind, data, block.get("mimeType", _ABSENT))
    return block


def _reduced(kind: str, data: str, media_type: Any) -> dict[str, Any]:
    canonical = canonical_base64(data)
    if kind == "image":
        sniffed = sniff_image_type(base64.b64decode(canonical[:32]))
        if sniffed is not None:
            media_type = sniffed
    source: dict[str, Any] = {"type": "base64", "data": canonical}
    if media_type is not _ABSENT:
        source["mediaType"] = media_type
    return {"type": kind, "source": source}


def canonical_base64(data: str) -> str:
    """``data`` as Node's ``Buffer.from(data, "base64").toString("base64")`` writes it back:
    padded, standard alphabet, no whitespace, zero unused bits.

    Decoding is Node's lenient one: it reads up to the first ``=``, takes ``-``/``_`` for
    ``+``/``/``, skips any other character outside the alphabet, and drops a lone last character.
    Data already in canonical form (as every valid stored copy's is) comes back unchanged.
    """
    if len(data) % 4 == 0 and _CANONICAL_BASE64.fullmatch(data) is not None:
        last = data[-4:]
        if not last or base64.b64encode(base64.b64decode(last)).decode("ascii") == last:
            return data
    chars = _NOT_BASE64.sub("", data.split("=", 1)[0].translate(_URL_SAFE))
    if len(chars) % 4 == 1:
        chars = chars[:-1]
    try:
        raw = base64.b64decode(chars + "=" * (-len(chars) % 4))
    except (binascii.Error, ValueError):  # pragma: no cover - the input is clean by now
        raw = b""
    return base64.b64encode(raw).decode("ascii")


def sniff_image_type(head: bytes) -> str | None:
    """The raster image type whose signature ``head`` (the data's first bytes) starts with."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if len(head) >= 12 and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None
