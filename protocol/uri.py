"""RFC-004 ``mcpl://`` endpoint URIs: string-level refusals, resolve first, then canonicalize.

An ``mcpl://`` URI is a locator and nothing more: resolving one grants no capability, accepts
no ontology, registers no channel and proves nothing about MCPL support (only ``initialize``
does). What this module gives is the three values RFC-004 §5 asks a host to keep apart:

- ``configured_uri``: exactly what the operator or agent wrote (provenance);
- ``canonical_uri``: the normalized ``mcpl://`` form (identity, dedup, "already connected");
- ``resolved_transport``: the ``wss://`` URL that is dialled.

The algorithm (RFC-004 §3):

1. refuse the §2.1 forms on the raw string, before any parsing: a fragment, an empty
   authority, userinfo, and ``.``/``..`` path segments (percent-encoded ones too);
2. substitute ``wss:`` for ``mcpl:``;
3. parse with a WHATWG URL parser (``ada-url``); a parse failure is a refusal;
4. the parsed href is the transport; the canonical form is that href with ``mcpl:`` back.

``mcpl:`` itself is a non-special scheme, so it is never normalized directly (§3.1).

Hardening beyond the RFC, failing closed: a backslash and every C0 control character or
space are refused anywhere in the input. The WHATWG parser treats ``\\`` as ``/`` in a
special scheme (``mcpl://h/a\\..\\b`` would dial ``wss://h/b``), drops tab, CR and LF from
the middle of the input, and strips C0 controls and spaces from its ends
(``mcpl://h/a/.. `` would dial ``wss://h/``), each of which slips a dot segment past a
string-level check.
"""

from __future__ import annotations

from typing import Final

import ada_url
import attrs

MCPL_PREFIX: Final = "mcpl://"
WSS_PREFIX: Final = "wss://"

# Refusal reasons (``McplUriError.reason``).
NOT_A_STRING: Final = "not_a_string"
NOT_MCPL: Final = "not_mcpl"
UNSUPPORTED_SCHEME: Final = "unsupported_scheme"
FORBIDDEN_CHARACTER: Final = "forbidden_character"
FRAGMENT: Final = "fragment"
EMPTY_AUTHORITY: Final = "empty_authority"
USERINFO: Final = "userinfo"
DOT_SEGMENT: Final = "dot_segment"
UNPARSEABLE: Final = "unparseable"
#: The parser changed the URI in a way the string checks should have ruled out.
PARSE_MISMATCH: Final = "parse_mismatch"

REASONS: Final = frozenset(
    {
        NOT_A_STRING,
        NOT_MCPL,
        UNSUPPORTED_SCHEME,
        FORBIDDEN_CHARACTER,
        FRAGMENT,
        EMPTY_AUTHORITY,
        USERINFO,
        DOT_SEGMENT,
        UNPARSEABLE,
        PARSE_MISMATCH,
    }
)


class McplUriError(ValueError):
    """An endpoint URI that is refused; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, uri: object, detail: str = "") -> None:
        self.reason = reason
        self.uri = uri
        self.detail = detail
        text = f"{reason}: {uri!r}"
        super().__init__(f"{text} ({detail})" if detail else text)


@attrs.frozen(kw_only=True)
class EndpointUri:
    """The three stored values of one endpoint (RFC-004 §5); never derive one from another."""

    configured_uri: str
    canonical_uri: str
    resolved_transport: str

    def to_json(self) -> dict[str, str]:
        return {
            "configuredUri": self.configured_uri,
            "canonicalUri": self.canonical_uri,
            "resolvedTransport": self.resolved_transport,
        }


def _forbidden(text: str) -> str | None:
    for ch in text:
        if ch == "\\" or ord(ch) <= 0x20:
            return ch
    return None


def _has_prefix(text: str, prefix: str) -> bool:
    """Case-insensitive ASCII prefix match (``str.lower`` alone folds some non-ASCII letters)."""
    head = text[: len(prefix)]
    return head.isascii() and head.lower() == prefix


def _split_rest(rest: str) -> tuple[str, str]:
    """Split what follows ``//`` into the authority and the path (up to any ``?``)."""
    end = len(rest)
    for sep in ("/", "?"):
        at = rest.find(sep)
        if at != -1:
            end = min(end, at)
    authority = rest[:end]
    after = rest[end:]
    query_at = after.find("?")
    path = after if query_at == -1 else after[:query_at]
    return authority, path


def _is_dot_segment(segment: str) -> bool:
    unescaped = segment.replace("%2e", ".").replace("%2E", ".")
    return unescaped in (".", "..")


def _common_checks(text: object, rest_at: int) -> tuple[str, str, str]:
    """Refusals shared by every scheme; returns (text, authority, path)."""
    if not isinstance(text, str):
        raise McplUriError(NOT_A_STRING, text)
    bad = _forbidden(text)
    if bad is not None:
        raise McplUriError(FORBIDDEN_CHARACTER, text, f"contains {bad!r}")
    if "#" in text:
        raise McplUriError(FRAGMENT, text)
    authority, path = _split_rest(text[rest_at:])
    if not authority:
        raise McplUriError(EMPTY_AUTHORITY, text)
    return text, authority, path


def _parse(text: str, candidate: str, scheme: str) -> ada_url.URL:
    try:
        url = ada_url.URL(candidate)
    except ValueError as exc:  # includes UnicodeEncodeError for lone surrogates
        raise McplUriError(UNPARSEABLE, text, str(exc)) from None
    if url.protocol != scheme:
        raise McplUriError(PARSE_MISMATCH, text, f"parsed as {url.protocol!r}")
    if not url.hostname:
        raise McplUriError(PARSE_MISMATCH, text, "no host")
    if url.hash:
        raise McplUriError(PARSE_MISMATCH, text, "a fragment appeared")
    return url


def parse_mcpl_uri(text: object) -> EndpointUri:
    """Resolve and canonicalize an ``mcpl://`` URI, or raise :class:`McplUriError`."""
    if isinstance(text, str) and not _has_prefix(text, MCPL_PREFIX):
        raise McplUriError(NOT_MCPL, text)
    uri, authority, path = _common_checks(text, len(MCPL_PREFIX))
    if "@" in authority:
        raise McplUriError(USERINFO, uri)
    if any(_is_dot_segment(seg) for seg in path.split("/")):
        raise McplUriError(DOT_SEGMENT, uri)
    url = _parse(uri, WSS_PREFIX + uri[len(MCPL_PREFIX) :], "wss:")
    if url.username or url.password:
        raise McplUriError(PARSE_MISMATCH, uri, "userinfo appeared")
    # The parser may not add or remove path segments once dot segments and backslashes are
    # gone; if it did, a string check missed something and the URI is refused.
    if (path or "/").count("/") != url.pathname.count("/"):
        raise McplUriError(PARSE_MISMATCH, uri, f"path {path!r} became {url.pathname!r}")
    resolved = url.href
    if not resolved.startswith(WSS_PREFIX):
        raise McplUriError(PARSE_MISMATCH, uri, f"resolved to {resolved!r}")
    return EndpointUri(
        configured_uri=uri,
        canonical_uri=MCPL_PREFIX + resolved[len(WSS_PREFIX) :],
        resolved_transport=resolved,
    )


def canonical_mcpl_uri(text: object) -> str:
    """The canonical ``mcpl://`` form of ``text`` (raises :class:`McplUriError`)."""
    return parse_mcpl_uri(text).canonical_uri


def is_mcpl_uri(text: object) -> bool:
    """Whether ``text`` is spelled as an ``mcpl://`` URI (valid or not)."""
    return isinstance(text, str) and _has_prefix(text, MCPL_PREFIX)


def parse_endpoint(text: object) -> EndpointUri:
    """Any of the three accepted spellings: ``mcpl://``, ``wss://`` or ``ws://`` (RFC-004 §2.2).

    ``mcpl://`` goes through :func:`parse_mcpl_uri`. A ``ws://``/``wss://`` URL is dialled as
    the WHATWG parser reads it, and its canonical value is that same href (RFC-004 defines a
    canonical ``mcpl://`` form only for ``mcpl://`` input). It is refused, failing closed,
    for the forbidden characters above, a fragment (the WebSocket API refuses one too) and
    an empty authority (``wss:///x`` would dial host ``x``); dot segments and userinfo stay
    accepted there, as the RFC keeps those spellings unchanged.
    """
    if isinstance(text, str) and _has_prefix(text, MCPL_PREFIX):
        return parse_mcpl_uri(text)
    for prefix in (WSS_PREFIX, "ws://"):
        if isinstance(text, str) and _has_prefix(text, prefix):
            uri, _, _ = _common_checks(text, len(prefix))
            url = _parse(uri, uri, prefix[:-2])
            return EndpointUri(
                configured_uri=uri, canonical_uri=url.href, resolved_transport=url.href
            )
    if not isinstance(text, str):
        raise McplUriError(NOT_A_STRING, text)
    raise McplUriError(UNSUPPORTED_SCHEME, text)
