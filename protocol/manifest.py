"""The manifest revision: the canonical digest of an MCPL manifest (SPEC §17.2, RFC-003 §3.1).

    revision = "sha256:" + base64url_nopad(SHA-256(UTF-8(JCS(normalize(strip(manifest))))))

Theory of operation. ``manifest`` is the value ``json.loads`` returns for the
``experimental.mcpl`` object as received. One walk over it does three things at once:

* **strip** the root ``revision`` member and nothing else (a nested ``revision``, ``version``,
  ``false`` and ``null`` are content; absent is not the same as empty);
* **check identifiers** at the positions the conformance vectors list: a string there must be a
  non-empty run of ``[A-Za-z0-9._:*-]``, otherwise no digest exists (``identifier_charset``);
* **normalize sets**: the three set-valued arrays (``featureSets.<fs>.uses``,
  ``featureSets.<fs>.tagOntology.coreTags`` and ``featureSets.<fs>.tagOntology.tags.<t>.implies``)
  are deduplicated and sorted by UTF-8 bytes. Every other array is a list and keeps its order.

The walk descends by *role*: each function below knows which kind of node it is looking at, so
the positions are the call structure instead of a table of patterns. Set and identifier rules
apply only where every container on the path is an object and the array holds only strings;
anything else of the wrong shape (``"uses": "tools"``, ``"uses": ["tools", 1]``, an array-form
``featureSets``, boolean shorthand) is hashed verbatim. The digest is total over JSON: a wrong
shape is for validation (SPEC §6.4) to reject, not for the digest.

The normalized tree is then serialized with RFC 8785 (JCS) by the ``rfc8785`` package. Numbers
reach it as IEEE doubles (a JSON number *is* a double; ``2**53`` and beyond are rounded exactly as
a JavaScript peer would parse them), so it prints them as ECMAScript ``Number::toString`` does.

Two readings where the vector file and the libraries leave a choice, both fail-closed (they only
refuse more, never hash differently):

* capability member names are checked at any depth, including inside arrays;
* ``suggestedTreatment[*].tagsAny|tagsAll|tagsNone`` elements are checked (the vector file lists
  them in ``identifierPositions``); they stay lists, never sorted.

The revision is untrusted and compared for equality only; a refused manifest has no revision, and
that is never by itself a reason to reject the manifest (RFC-003 §6.6).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

import rfc8785

#: A string in an identifier position is empty or holds a character outside ``[A-Za-z0-9._:*-]``.
IDENTIFIER_CHARSET = "identifier_charset"
#: The manifest is not a JSON object.
MANIFEST_NOT_OBJECT = "manifest_not_object"
#: NaN, an infinity, or an integer too large for a double: JCS has no text for these.
NON_FINITE_NUMBER = "non_finite_number"
#: A string or member name holds an unpaired surrogate, so it has no UTF-8 encoding.
UNPAIRED_SURROGATE = "unpaired_surrogate"
#: A Python value outside the JSON data model (a non-string member name, a tuple, bytes…).
NOT_JSON = "not_json"
#: Nested deeper than the interpreter can walk.
NESTING_TOO_DEEP = "nesting_too_deep"

_TAG_MATCHERS = frozenset({"tagsAny", "tagsAll", "tagsNone"})
# ``fullmatch``, not ``match`` with ``$``: ``$`` also matches before a trailing newline.
_IDENTIFIER = re.compile(r"[A-Za-z0-9._:*-]+")

Json: TypeAlias = "bool | float | str | list[Json] | dict[str, Json] | None"
_Path: TypeAlias = tuple[str | int, ...]
_Walk: TypeAlias = Callable[[Any, _Path], Json]


class ManifestError(ValueError):
    """The manifest has no revision. ``code`` names why; ``detail`` names where."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


def manifest_digest(manifest: Any) -> str:
    """Return ``"sha256:<43 base64url characters>"`` for a manifest as received.

    Raises:
        ManifestError: the manifest is not an object, breaks the identifier rule, or holds a
            value JSON cannot carry (see the module's error codes).
    """
    digest = hashlib.sha256(_canonical_bytes(manifest)).digest()
    return "sha256:" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def canonical_json(manifest: Any) -> str:
    """Return the exact text whose UTF-8 bytes are hashed (the vectors' ``canonicalJson``)."""
    return _canonical_bytes(manifest).decode("utf-8")


def sort_identifiers(values: Iterable[str]) -> list[str]:
    """Deduplicate and sort ascending by UTF-8 byte sequence: the order of a set-valued array.

    UTF-8 preserves code-point order, so Python's ``str`` ordering is that order; comparing
    code points also needs no encoding step that could fail. UTF-16 (JavaScript's default sort)
    differs above U+FFFF.
    """
    return sorted(set(values))


def _canonical_bytes(manifest: Any) -> bytes:
    if not isinstance(manifest, dict):
        raise ManifestError(MANIFEST_NOT_OBJECT, f"got {type(manifest).__name__}")
    try:
        return rfc8785.dumps(_root(manifest))
    except RecursionError:
        raise ManifestError(NESTING_TOO_DEEP, "the manifest is nested too deeply") from None
    except rfc8785.CanonicalizationError as exc:  # the walk admits only what JCS can print
        raise ManifestError(NOT_JSON, str(exc)) from exc


# --------------------------------------------------------------------------------------------
# The walk. Every function returns a fresh normalized copy and never mutates its input.


def _root(manifest: dict[Any, Any]) -> dict[str, Json]:
    out: dict[str, Json] = {}
    for key, value in manifest.items():
        name = _member_name(key, ())
        if name == "revision":
            continue
        if name == "featureSets":
            out[name] = _feature_sets(value, (name,))
        elif name == "version":
            out[name] = _plain(value, (name,))
        else:
            _identifier(name, (name,))
            out[name] = _capability(value, (name,))
    return out


def _feature_sets(value: Any, path: _Path) -> Json:
    return _keyed_object(value, path, _feature_set)


def _feature_set(value: Any, path: _Path) -> Json:
    return _object_with(value, path, {"uses": _set, "tagOntology": _ontology})


def _ontology(value: Any, path: _Path) -> Json:
    return _object_with(
        value,
        path,
        {"coreTags": _set, "tags": _tags, "keyed": _keyed, "suggestedTreatment": _treatments},
    )


def _tags(value: Any, path: _Path) -> Json:
    return _keyed_object(value, path, _tag)


def _tag(value: Any, path: _Path) -> Json:
    return _object_with(value, path, {"implies": _set, "facet": _facet})


def _facet(value: Any, path: _Path) -> Json:
    if isinstance(value, str):
        return _identifier(value, path)
    return _plain(value, path)


def _keyed(value: Any, path: _Path) -> Json:
    return _keyed_object(value, path, _keyed_entry)


def _keyed_entry(value: Any, path: _Path) -> Json:
    return _object_with(value, path, {"values": _identifier_list})


def _treatments(value: Any, path: _Path) -> Json:
    if not isinstance(value, list):
        return _plain(value, path)
    return [_treatment(rule, (*path, index)) for index, rule in enumerate(value)]


def _treatment(value: Any, path: _Path) -> Json:
    return _object_with(value, path, dict.fromkeys(_TAG_MATCHERS, _identifier_list))


def _set(value: Any, path: _Path) -> Json:
    """A set-valued array: checked, deduplicated and sorted, when it is all strings."""
    if not _all_strings(value):
        return _plain(value, path)
    checked = [_identifier(item, (*path, index)) for index, item in enumerate(value)]
    return [*sort_identifiers(checked)]


def _identifier_list(value: Any, path: _Path) -> Json:
    """A list of identifiers: checked when it is all strings, and its order kept."""
    if not _all_strings(value):
        return _plain(value, path)
    return [_identifier(item, (*path, index)) for index, item in enumerate(value)]


def _capability(value: Any, path: _Path) -> Json:
    """A capability subtree: every member name at any depth is a capability path segment."""
    if isinstance(value, dict):
        out: dict[str, Json] = {}
        for key, child in value.items():
            name = _identifier(_member_name(key, path), (*path, key))
            out[name] = _capability(child, (*path, name))
        return out
    if isinstance(value, list):
        return [_capability(item, (*path, index)) for index, item in enumerate(value)]
    return _scalar(value, path)


def _plain(value: Any, path: _Path) -> Json:
    """Content hashed verbatim: only checked to be JSON that JCS can print."""
    if isinstance(value, dict):
        out: dict[str, Json] = {}
        for key, child in value.items():
            name = _text(_member_name(key, path), (*path, key))
            out[name] = _plain(child, (*path, name))
        return out
    if isinstance(value, list):
        return [_plain(item, (*path, index)) for index, item in enumerate(value)]
    return _scalar(value, path)


# --------------------------------------------------------------------------------------------
# Shapes and leaves.


def _keyed_object(value: Any, path: _Path, walk: _Walk) -> Json:
    """An object whose member names are identifiers and whose values ``walk`` handles."""
    if not isinstance(value, dict):
        return _plain(value, path)
    out: dict[str, Json] = {}
    for key, child in value.items():
        name = _identifier(_member_name(key, path), (*path, key))
        out[name] = walk(child, (*path, name))
    return out


def _object_with(value: Any, path: _Path, walks: dict[str, _Walk]) -> Json:
    """An object in which the members named in ``walks`` have a role and the rest are plain."""
    if not isinstance(value, dict):
        return _plain(value, path)
    out: dict[str, Json] = {}
    for key, child in value.items():
        name = _text(_member_name(key, path), (*path, key))
        out[name] = walks.get(name, _plain)(child, (*path, name))
    return out


def _all_strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _scalar(value: Any, path: _Path) -> Json:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        # A JSON number is an IEEE double; a large integer rounds as a JavaScript peer's would.
        try:
            return float(value)
        except OverflowError:
            raise ManifestError(NON_FINITE_NUMBER, f"{_where(path)} is beyond a double") from None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ManifestError(NON_FINITE_NUMBER, f"{_where(path)} = {value!r}")
        return float(value)
    if isinstance(value, str):
        return _text(value, path)
    raise ManifestError(NOT_JSON, f"{_where(path)} is a {type(value).__name__}")


def _member_name(key: Any, path: _Path) -> str:
    if not isinstance(key, str):
        raise ManifestError(NOT_JSON, f"{_where(path)} has a {type(key).__name__} member name")
    return key


def _text(value: str, path: _Path) -> str:
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ManifestError(UNPAIRED_SURROGATE, f"{_where(path)} = {value!r}") from None
    return value


def _identifier(value: str, path: _Path) -> str:
    if _IDENTIFIER.fullmatch(value) is None:
        raise ManifestError(IDENTIFIER_CHARSET, f"{_where(path)} = {value!r}")
    return value


def _where(path: _Path) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else f".{step}" if out else str(step)
    return out or "(root)"
