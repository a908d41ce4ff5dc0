"""Content blocks (MCPL App. B.1, RFC-005) and the one conversion every lane uses.

``convert_block(block, server_id, lane)`` validates a block a server sent and returns the block
as the host keeps it. The server is a required parameter: every reference a block carries is
bound to the server that delivered it.

A reference comes back *pending*: ``{"type": "reference", "server_id", "provenance",
"testimony"}``. The host registers its testimony with that server and replaces it with a stub
before anything is stored or shown; nothing else in a pending reference reaches the model.

Which blocks are references depends on the lane (RFC-005 as this host applies it):

- ``tool_result``: every ``resource`` and every uri-form ``image``/``audio``;
- ``push``, ``render``, ``incoming``, ``injection``: every ``resource``, and uri-form
  ``image``/``audio`` only when they carry a ``disposition`` key. Without one, a uri-form image
  stays a URL image (not registered) and a uri-form audio becomes ``[Audio: no data]``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from protocol.references import (
    LABEL_BOUND,
    MAX_URI_CHARS,
    PATH_BOUND,
    ContentError,
    read_testimony,
    sanitize,
    stub_provenance,
)

__all__ = [
    "MAX_TEXT_CHARS",
    "MEDIA",
    "WITHHELD",
    "ContentError",
    "convert_block",
    "convert_blocks",
    "text_of",
]

MAX_TEXT_CHARS = 1_000_000
MEDIA = ("image", "audio")
WITHHELD = "[inline content withheld: nonconformant bulk disposition on inline data]"


def _text(text: str) -> dict[str, Any]:
    if len(text) > MAX_TEXT_CHARS:
        raise ContentError(f"text block over {MAX_TEXT_CHARS} characters")
    return {"type": "text", "text": text}


def _check_base64(data: str) -> str:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ContentError("data is not valid base64") from exc
    return data


def _pending(block: Mapping[str, Any], server_id: str, lane: str) -> dict[str, Any]:
    return {
        "type": "reference",
        "server_id": server_id,
        "provenance": stub_provenance(lane, server_id),
        "testimony": read_testimony(block).to_wire(),
    }


def _shown_uri(uri: object, *blocks: Mapping[str, Any]) -> str:
    """A uri fit for a text label: a valid one, on no block that carries a ``disposition``
    (a server that asks for one is asking to keep its uri out of sight); else ``""``."""
    if not isinstance(uri, str) or not uri or len(uri) > MAX_URI_CHARS:
        return ""
    if any("disposition" in b for b in blocks):
        return ""
    return sanitize(uri, PATH_BOUND)


def _label(value: object) -> str:
    return sanitize(value, LABEL_BOUND) if isinstance(value, str) else ""


def _media(kind: str, block: Mapping[str, Any], server_id: str, lane: str) -> dict[str, Any]:
    data = block.get("data")
    uri = block.get("uri")
    if isinstance(data, str):
        if "disposition" in block or isinstance(uri, str):
            return _text(WITHHELD)  # never pass on data its sender also disowned
        mime = block.get("mimeType")
        if not isinstance(mime, str) or not mime:
            raise ContentError(f"{kind} block with data needs a mimeType")
        return {"type": kind, "data": _check_base64(data), "mimeType": mime}
    if "data" in block:
        raise ContentError("data must be a base64 string")
    if not isinstance(uri, str):
        return _text(f"[{kind.capitalize()}: no data]")
    if lane == "tool_result" or "disposition" in block:
        return _pending(block, server_id, lane)
    if kind == "audio":
        return _text("[Audio: no data]")
    read_testimony(block)  # the same uri rule as a reference's
    return {"type": "image", "uri": uri}


def _embedded(outer: Mapping[str, Any], inner: Mapping[str, Any]) -> dict[str, Any]:
    """MCP's embedded resource in a tool result: its text, labelled with its uri."""
    uri = _shown_uri(inner.get("uri"), outer, inner)
    text = inner.get("text")
    if isinstance(text, str):
        if len(text) > MAX_TEXT_CHARS:
            raise ContentError(f"text block over {MAX_TEXT_CHARS} characters")
        return _text((f"[resource {uri}]\n" if uri else "") + text)
    described = ", ".join(p for p in (uri, _label(inner.get("mimeType"))) if p)
    return _text(f"[resource{' ' + described if described else ''}; content not shown]")


def _resource_link(block: Mapping[str, Any]) -> dict[str, Any]:
    name = _label(block.get("name"))
    described = ", ".join(
        p for p in (_shown_uri(block.get("uri"), block), _label(block.get("mimeType"))) if p
    )
    head = f'[resource link "{name}"' if name else "[resource link"
    return _text(head + (f": {described}" if described else "") + "; not fetched]")


def convert_block(block: Any, server_id: str, provenance: str) -> dict[str, Any]:
    """Validate one block from ``server_id`` and return the form the host keeps.

    ``provenance`` is the lane's name: ``push``, ``render``, ``incoming``, ``injection`` or
    ``tool_result`` (another is a ``ValueError``: a caller's mistake, not the server's).
    Raises :class:`ContentError` for what no lane accepts: a non-object or untyped block, text
    without a string, inline media without a mimeType or with bad base64, and a reference whose
    uri is missing or too long. Unknown block types become a text notice.
    """
    if not isinstance(server_id, str) or not server_id:
        raise ContentError("content must name the server that sent it")
    lane = provenance
    stub_provenance(lane, server_id)  # refuses an unknown lane up front
    if not isinstance(block, Mapping):
        raise ContentError("not a content block")
    kind = block.get("type")
    if not isinstance(kind, str):
        raise ContentError("not a content block")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise ContentError("text block without string text")
        return _text(text)
    if kind in MEDIA:
        return _media(kind, block, server_id, lane)
    if kind == "resource":
        inner = block.get("resource")
        if "uri" not in block and isinstance(inner, Mapping) and lane == "tool_result":
            return _embedded(block, inner)
        return _pending(block, server_id, lane)
    if kind == "resource_link" and lane == "tool_result":
        return _resource_link(block)
    return _text(f"[unrecognized content block: {sanitize(kind, LABEL_BOUND)}]")


def convert_blocks(blocks: Any, server_id: str, provenance: str) -> list[dict[str, Any]]:
    """Convert a content list (or an injection's plain string, as one text block)."""
    if isinstance(blocks, str):
        return [convert_block({"type": "text", "text": blocks}, server_id, provenance)]
    if type(blocks) is not list and not isinstance(blocks, Sequence):
        raise ContentError("content must be a list of blocks")
    if not blocks:
        return []
    if not isinstance(server_id, str) or not server_id:
        raise ContentError("content must name the server that sent it")
    stub_provenance(provenance, server_id)  # refuses an unknown lane up front
    # a plain text block (the common case) is converted here, as convert_block would
    return [
        _text(text)
        if type(b) is dict and b.get("type") == "text" and type(text := b.get("text")) is str
        else convert_block(b, server_id, provenance)
        for b in blocks
    ]


def text_of(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The text of the text blocks, joined by newlines."""
    return "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
