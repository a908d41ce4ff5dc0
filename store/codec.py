"""CBOR encoding of message bodies and state values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cbor2

from store.errors import CorruptRecord, StoreError


def to_plain(value: Any, *, well_formed: bool = False) -> Any:
    """Copy ``value`` with every mapping turned into a dict and every list or tuple into a list.

    With ``well_formed``, every string (keys too) also loses its lone surrogates: each becomes
    U+FFFD, as a JSON peer reading the same text would have it."""
    if well_formed and isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, Mapping):
        return {
            to_plain(k, well_formed=well_formed): to_plain(v, well_formed=well_formed)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [to_plain(v, well_formed=well_formed) for v in value]
    return value


def encode_value(value: Any) -> bytes:
    """CBOR bytes of ``value``; :class:`StoreError` when it cannot be encoded.

    Text is stored as UTF-8, which cannot hold a lone surrogate (a server may send one as a
    ``\\udXXX`` escape); such text is stored with U+FFFD in its place rather than refused."""
    try:
        # cbor2 takes dicts, lists and tuples as they are; only other mappings need copying.
        return cbor2.dumps(value)
    except UnicodeEncodeError:
        value = to_plain(value, well_formed=True)
    except (cbor2.CBORError, TypeError):
        pass
    try:
        return cbor2.dumps(to_plain(value))
    except (cbor2.CBORError, RecursionError, TypeError, ValueError, OverflowError) as exc:
        raise StoreError(f"value cannot be stored as CBOR: {exc}") from exc


def decode_value(data: bytes) -> Any:
    """The value encoded in ``data``; :class:`CorruptRecord` when it does not decode."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CorruptRecord(f"stored value is {type(data).__name__}, not bytes")
    try:
        return cbor2.loads(data)
    except Exception as exc:
        # A damaged blob can fail inside any of the decoder's semantic-tag handlers, so every
        # decoding failure is reported the same way.
        raise CorruptRecord(f"stored value does not decode: {exc}") from exc


def encode_body(blocks: Sequence[Mapping[str, Any]], metadata: Mapping[str, Any]) -> bytes:
    """CBOR of ``{"blocks": [...], "metadata": {...}}``."""
    return encode_value({"blocks": list(blocks), "metadata": metadata})


def decode_body(data: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(blocks, metadata)`` from :func:`encode_body` output; :class:`CorruptRecord` otherwise."""
    body = decode_value(data)
    if not isinstance(body, dict):
        raise CorruptRecord(f"message body is {type(body).__name__}, not a map")
    blocks = body.get("blocks")
    metadata = body.get("metadata")
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise CorruptRecord("message body has no list of block maps")
    if not isinstance(metadata, dict):
        raise CorruptRecord("message body has no metadata map")
    return blocks, metadata
