"""Content blocks (MCPL App. B.1) and the one conversion every lane uses.

``convert_block(block, server_id, provenance)`` validates a block a server sent and returns the
block as the host stores it. The server is a required parameter: whatever a block refers to is
bound to the server that delivered it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

MAX_TEXT_CHARS = 1_000_000
MEDIA = ("image", "audio")
_REF_FIELDS = ("mimeType", "sizeBytes", "digest", "expiresAt", "name", "disposition")


class ContentError(ValueError):
    """A block is not a valid content block; the message names what is wrong."""


def _check_base64(data: Any) -> str:
    if not isinstance(data, str):
        raise ContentError("data must be a base64 string")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ContentError("data is not valid base64") from exc
    return data


def convert_block(block: Any, server_id: str, provenance: str) -> dict[str, Any]:
    """Validate one block from ``server_id`` and return the stored form.

    ``provenance`` names the lane (``push``, ``incoming``, ``tool_result``, ``injection``…).
    """
    if not server_id:
        raise ContentError("content must name the server that sent it")
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if type(block) is not dict and not isinstance(block, Mapping):
        raise ContentError(f"a content block must be an object, not {type(block).__name__}")
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise ContentError("text block without a string 'text'")
        if len(text) > MAX_TEXT_CHARS:
            raise ContentError(f"text block over {MAX_TEXT_CHARS} characters")
        return {"type": "text", "text": text}
    if kind in MEDIA:
        if "data" in block:
            mime = block.get("mimeType")
            if not isinstance(mime, str) or not mime:
                raise ContentError(f"{kind} block with data needs a mimeType")
            return {"type": kind, "data": _check_base64(block["data"]), "mimeType": mime}
        return _uri_block(kind, block)
    if kind == "resource":
        inner = block.get("resource")
        if isinstance(inner, Mapping) and "uri" not in block:
            # MCP's embedded resource: keep its text, name where it came from.
            uri = inner.get("uri")
            text = inner.get("text")
            if isinstance(text, str):
                label = f"[resource {uri}]\n" if isinstance(uri, str) else ""
                return {"type": "text", "text": label + text}
            return _uri_block("resource", inner)
        return _uri_block("resource", block)
    if kind == "resource_link":  # the pre-0.3 name of ``resource``
        return _uri_block("resource", block)
    raise ContentError(f"unsupported content block type {kind!r} from {server_id} ({provenance})")


def _uri_block(kind: str, block: Mapping[str, Any]) -> dict[str, Any]:
    uri = block.get("uri")
    if not isinstance(uri, str) or not uri:
        raise ContentError(f"{kind} block needs a uri or data")
    out: dict[str, Any] = {"type": kind, "uri": uri}
    for key in _REF_FIELDS:
        value = block.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool):
            out[key] = value
    return out


def convert_blocks(blocks: Any, server_id: str, provenance: str) -> list[dict[str, Any]]:
    """Convert a content list (or an injection's plain string)."""
    if isinstance(blocks, str):
        return [convert_block(blocks, server_id, provenance)]
    if type(blocks) is not list and not isinstance(blocks, Sequence):
        raise ContentError("content must be a list of blocks")
    return [convert_block(b, server_id, provenance) for b in blocks]


def text_of(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The text of the text blocks, joined by newlines."""
    return "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
