"""Bulk content references (RFC-005): testimony, stubs, origins, the server choice, fetch
decisions and the registry."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import random
import re
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

import ada_url
import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from protocol.references import (
    EXPIRED,
    FIELDS,
    LANES,
    MAX_RECORDS,
    MAX_URI_CHARS,
    UNBOUND,
    Chosen,
    ContentError,
    Refused,
    RegistryState,
    base36,
    budget_refusal,
    ceiling_refusal,
    choose,
    digest_mismatch,
    digest_of,
    eager_eligible,
    extension_for,
    fetch_result_text,
    format_size,
    is_expired,
    origin,
    origin_check,
    read_testimony,
    sanitize,
    sniff_mime,
    stub_provenance,
    stub_text,
    unknown_reference,
    utf16_len,
)
from protocol.references import Testimony as Claims  # (a Test* name would be collected)

URI = "https://files.example/a/b.wav?sig=s3cret"
DIGEST = "sha256:uM7OLD5sO8G3SeWw3LirIreZM71523d9_qXxkn8ewpM"  # of b"RIFF0000WAVEpayload"
REMOVED = (
    [chr(c) for c in range(0x20)]
    + [chr(c) for c in range(0x7F, 0xA0)]
    + ["\u200e", "\u200f"]
    + [chr(c) for c in range(0x202A, 0x202F)]
    + [chr(c) for c in range(0x2066, 0x206A)]
)
REF_ID = re.compile(r"ref_[0-9a-z]+_[0-9a-z]{4}")


def full_block(**over: Any) -> dict[str, Any]:
    block: dict[str, Any] = {
        "type": "resource",
        "uri": URI,
        "mimeType": "audio/wav",
        "sizeBytes": 19,
        "digest": DIGEST,
        "expiresAt": "2030-01-01T00:00:00Z",
        "name": "chord.wav",
        "disposition": "never",
    }
    block.update(over)
    return block


# -- testimony ---------------------------------------------------------------------------------


def test_every_claim_is_read() -> None:
    t = read_testimony(full_block(extra={"ignored": True}))
    assert t == Claims(
        uri=URI,
        mime_type="audio/wav",
        size_bytes=19,
        digest=DIGEST,
        expires_at="2030-01-01T00:00:00Z",
        name="chord.wav",
        disposition="never",
    )
    assert t.to_wire() == {k: v for k, v in full_block().items() if k != "type"} | {
        "rejectedFields": []
    }


def test_only_the_uri_is_required() -> None:
    t = read_testimony({"uri": "u:1"})
    assert t == Claims(uri="u:1")
    assert t.to_wire() == {"uri": "u:1", "rejectedFields": []}


@pytest.mark.parametrize("uri", [None, 5, "", ["u"], {"u": 1}, True])
def test_a_reference_needs_a_string_uri(uri: Any) -> None:
    with pytest.raises(ContentError, match=r"^reference without string uri$"):
        read_testimony(full_block(uri=uri))
    with pytest.raises(ContentError, match=r"^reference without string uri$"):
        read_testimony({"type": "resource"})


def test_the_uri_cap_counts_code_points() -> None:
    assert read_testimony({"uri": "a" * MAX_URI_CHARS}).uri == "a" * MAX_URI_CHARS
    assert read_testimony({"uri": "😀" * MAX_URI_CHARS}).uri == "😀" * MAX_URI_CHARS
    for uri in ("a" * (MAX_URI_CHARS + 1), "😀" * (MAX_URI_CHARS + 1)):
        with pytest.raises(ContentError, match=r"^uri exceeds schema maximum$"):
            read_testimony({"uri": uri})


ACCEPTED = [
    ("mimeType", "m" * 255),
    ("mimeType", ""),
    ("mimeType", "😀" * 255),
    ("name", "n" * 255),
    ("name", "../../etc/passwd"),
    ("expiresAt", "e" * 64),
    ("sizeBytes", 0),
    ("sizeBytes", 2**53 - 1),
    ("digest", "sha256:" + "A" * 43),
    ("digest", "sha256:" + "-_09azAZ" * 5 + "abc"),
    ("disposition", "never"),
    ("disposition", "ref"),
]
REJECTED = [
    ("mimeType", "m" * 256),
    ("mimeType", 5),
    ("mimeType", None),
    ("name", "n" * 256),
    ("name", ["n"]),
    ("expiresAt", "e" * 65),
    ("expiresAt", 1700000000),
    ("sizeBytes", -1),
    ("sizeBytes", 3.5),
    ("sizeBytes", 2**53),
    ("sizeBytes", True),
    ("sizeBytes", "12"),
    ("sizeBytes", float("inf")),
    ("sizeBytes", float("nan")),
    ("digest", "sha256:" + "A" * 42),
    ("digest", "sha256:" + "A" * 44),
    ("digest", "sha256:" + "A" * 42 + "="),
    ("digest", "sha256:" + "A" * 42 + "+"),
    ("digest", "sha256:" + "A" * 43 + "\n"),
    ("digest", "SHA256:" + "A" * 43),
    ("digest", "sha512:" + "A" * 43),
    ("digest", "sha256:" + "Ａ" * 43),
    ("disposition", "inline"),
    ("disposition", "NEVER"),
    ("disposition", ""),
    ("disposition", None),
    ("disposition", ["never"]),
]


@pytest.mark.parametrize(("field", "value"), ACCEPTED)
def test_a_valid_claim_is_kept(field: str, value: Any) -> None:
    t = read_testimony({"uri": "u:1", field: value})
    assert getattr(t, FIELDS[field]) == value
    assert t.rejected_fields == ()


@pytest.mark.parametrize(("field", "value"), REJECTED)
def test_an_invalid_claim_is_dropped_and_named(field: str, value: Any) -> None:
    t = read_testimony(full_block(**{field: value}))
    assert getattr(t, FIELDS[field]) is None
    assert t.rejected_fields == (field,)
    assert field not in t.to_wire()
    assert t.to_wire()["rejectedFields"] == [field]
    if field != "disposition":
        assert t.disposition == "never"  # the veto stays in force


def test_an_integral_float_size_is_the_integer() -> None:
    t = read_testimony({"uri": "u:1", "sizeBytes": 12.0})
    assert t.size_bytes == 12 and type(t.size_bytes) is int


def test_rejected_fields_come_in_one_fixed_order() -> None:
    block = {
        "disposition": "x",
        "digest": "x",
        "sizeBytes": -1,
        "expiresAt": 1,
        "name": 1,
        "mimeType": 1,
        "uri": "u:1",
    }
    assert read_testimony(block).rejected_fields == (
        "mimeType",
        "name",
        "expiresAt",
        "sizeBytes",
        "digest",
        "disposition",
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"uri": ""},
        {"uri": "a" * (MAX_URI_CHARS + 1)},
        {"uri": "u", "size_bytes": -1},
        {"uri": "u", "size_bytes": True},
        {"uri": "u", "name": "n" * 256},
        {"uri": "u", "digest": "sha256:x"},
        {"uri": "u", "disposition": "inline"},
        {"uri": "u", "rejected_fields": ("bogus",)},
        {"uri": "u", "rejected_fields": ["name"]},
    ],
)
def test_testimony_never_holds_an_unaccepted_claim(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Claims(**kwargs)


@pytest.mark.parametrize(
    "wire",
    [
        {},
        {"uri": 5},
        {"uri": "u", "extra": 1},
        {"uri": "u", "rejectedFields": "name"},
        {"uri": "u", "rejectedFields": [1]},
        {"uri": "u", "rejectedFields": ["uri"]},
        {"uri": "u", "sizeBytes": "12"},
        {"uri": "u", "mime_type": "x"},
    ],
)
def test_from_wire_is_strict(wire: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Claims.from_wire(wire)


claim_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2**54),
    st.floats(allow_nan=True),
    st.text(max_size=70),
    st.sampled_from(["never", "ref", DIGEST, "sha256:" + "_" * 43, "m" * 255, "m" * 256]),
    st.lists(st.integers(), max_size=2),
)
blocks = st.dictionaries(st.sampled_from(list(FIELDS)), claim_values).map(
    lambda d: {"type": "resource", "uri": "https://h/x", **d}
)


@given(blocks)
def test_each_claim_is_kept_unchanged_or_named_as_rejected(block: dict[str, Any]) -> None:
    t = read_testimony(block)
    for wire, attr in FIELDS.items():
        kept = getattr(t, attr)
        if wire not in block:
            assert kept is None and wire not in t.rejected_fields
        elif wire in t.rejected_fields:
            assert kept is None
        else:
            assert kept == block[wire]
    assert len(set(t.rejected_fields)) == len(t.rejected_fields)
    assert Claims.from_wire(t.to_wire()) == t
    assert Claims.from_wire(json.loads(json.dumps(t.to_wire()))) == t


# -- the stub ------------------------------------------------------------------------------------


def test_provenance_per_lane() -> None:
    assert stub_provenance("push", "vst") == "attachment on push event"
    assert stub_provenance("render", "vst") == "attachment on push event"
    assert stub_provenance("incoming", "vst") == "attachment on channel message"
    assert stub_provenance("injection", "vst") == "injected by vst before inference"
    assert stub_provenance("tool_result", "vst") == "from tool result"
    assert set(LANES) == {"push", "render", "incoming", "injection", "tool_result"}
    for lane in ("", "Push", "channel", "tool-result"):
        with pytest.raises(ValueError, match="lane"):
            stub_provenance(lane, "vst")


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0B"),
        (1, "1B"),
        (1023, "1023B"),
        (1024, "~1KB"),
        (1535, "~1KB"),
        (1536, "~2KB"),
        (2560, "~3KB"),
        (3584, "~4KB"),
        (1048575, "~1024KB"),
        (1048576, "~1.0MB"),
        (1310720, "~1.3MB"),
        (1153433, "~1.1MB"),
        (1153434, "~1.1MB"),
        (4 * 2**20, "~4.0MB"),
        (2**30 - 1, "~1024.0MB"),
        (1073741824, "~1.0GB"),
        (1610612736, "~1.5GB"),
        (2**53 - 1, "~8388608.0GB"),
    ],
)
def test_format_size(n: int, text: str) -> None:
    assert format_size(n) == text


def _size_oracle(n: int) -> str:
    with localcontext() as ctx:
        ctx.prec = 100
        if n < 1024:
            return f"{n}B"
        if n < 2**20:
            return f"~{(Decimal(n) / 1024).quantize(Decimal(1), ROUND_HALF_UP)}KB"
        unit, suffix = (2**20, "MB") if n < 2**30 else (2**30, "GB")
        return f"~{(Decimal(n) / unit).quantize(Decimal('0.1'), ROUND_HALF_UP)}{suffix}"


sizes = st.one_of(
    st.integers(min_value=0, max_value=2**53 - 1),
    st.integers(min_value=0, max_value=2**31),
    st.sampled_from([2**k + d for k in (10, 20, 30) for d in (-1, 0, 1)]),
    st.integers(min_value=0, max_value=2**20).map(lambda k: k * 2**20 // 20 + 2**19 // 10),
)


@given(sizes)
def test_format_size_rounds_half_up(n: int) -> None:
    assert format_size(n) == _size_oracle(n)


def test_format_size_refuses_a_negative() -> None:
    with pytest.raises(ValueError):
        format_size(-1)


@pytest.mark.parametrize("ch", REMOVED)
def test_sanitize_removes_each_control_and_bidi_character(ch: str) -> None:
    assert sanitize(f"a{ch}b{ch}", 120) == "ab"


def test_sanitize_keeps_other_invisibles_and_text() -> None:
    for text in ("\u200b", "\u00ad", "\ufeff", "\u2060", "é", "e\u0301", "😀", "a b"):
        assert sanitize(text, 120) == text


def test_sanitize_bounds_in_utf16_units() -> None:
    assert sanitize("x" * 120, 120) == "x" * 120
    assert sanitize("x" * 121, 120) == "x" * 119 + "…"
    assert sanitize("😀" * 60, 120) == "😀" * 60
    # 59 pairs = 118 units; the 60th would make 120 > 119, so it is dropped whole.
    assert sanitize("😀" * 61, 120) == "😀" * 59 + "…"
    assert sanitize("x" + "😀" * 60, 120) == "x" + "😀" * 59 + "…"
    assert utf16_len(sanitize("x" + "😀" * 60, 120)) == 120
    assert sanitize("x" * 118 + "\ud800" + "yy", 120) == "x" * 118 + "…"
    assert sanitize("\u0000" * 500 + "x", 1) == "x"
    assert sanitize("xy", 1) == "…"
    assert sanitize("x" * 256, 256) == "x" * 256
    assert sanitize("x" * 257, 256) == "x" * 255 + "…"
    with pytest.raises(ValueError):
        sanitize("x", 0)


label_text = st.text(
    alphabet=st.one_of(
        st.sampled_from(REMOVED),
        st.sampled_from(["a", "é", "😀", "\U0001f3fb", "\u200b", "…", " "]),
        st.characters(codec="utf-8"),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    ),
    max_size=300,
)


@given(label_text, st.integers(min_value=1, max_value=300))
def test_sanitize_properties(text: str, bound: int) -> None:
    out = sanitize(text, bound)
    clean = "".join(ch for ch in text if ch not in REMOVED)
    assert utf16_len(out) <= bound
    assert not any(ch in REMOVED for ch in out)
    if utf16_len(clean) <= bound:
        assert out == clean
    else:
        assert out.endswith("…")
        assert clean.startswith(out[:-1])
        assert utf16_len(out) >= bound - 2
        assert not (out[:-1] and 0xD800 <= ord(out[-2]) <= 0xDBFF)
    assert sanitize(out, bound) == out


def test_the_stub_of_the_spec_example() -> None:
    t = Claims(uri=URI, name="chord.wav", mime_type="audio/wav", size_bytes=4 * 2**20)
    stub = stub_text("ref_1_k3x9", t, stub_provenance("push", "vst"), saved_path=None, bound=True)
    assert stub == (
        "[ref_1_k3x9] chord.wav — audio/wav, ~4.0MB claimed — attachment on push event"
        " — fetch with fetch_reference"
    )


@pytest.mark.parametrize(
    ("kwargs", "middle"),
    [
        ({}, ""),
        ({"name": "n"}, "n — "),
        ({"mime_type": "m/t"}, "m/t — "),
        ({"size_bytes": 0}, "0B claimed — "),
        ({"mime_type": "m/t", "size_bytes": 2560}, "m/t, ~3KB claimed — "),
        ({"name": "n", "size_bytes": 5}, "n — 5B claimed — "),
        ({"name": "\u202e\u0000", "mime_type": "\n"}, ""),
        ({"digest": DIGEST, "expires_at": "2030", "disposition": "ref"}, ""),
    ],
)
def test_stub_parts(kwargs: dict[str, Any], middle: str) -> None:
    t = Claims(uri=URI, **kwargs)
    prov = "from tool result"
    assert stub_text("ref_a_0000", t, prov, saved_path=None, bound=True) == (
        f"[ref_a_0000] {middle}from tool result — fetch with fetch_reference"
    )
    assert stub_text("ref_a_0000", t, prov, saved_path=None, bound=False) == (
        f"[ref_a_0000] {middle}from tool result — unbound: no server is recorded to fetch it from"
    )
    for bound in (True, False):
        assert stub_text("ref_a_0000", t, prov, saved_path="refs/ref_a_0000.wav", bound=bound) == (
            f"[ref_a_0000] {middle}from tool result — saved: refs/ref_a_0000.wav"
        )


def test_stub_bounds_at_each_cap() -> None:
    def stub(**kwargs: Any) -> str:
        provenance = kwargs.pop("provenance", "p")
        saved = kwargs.pop("saved_path", None)
        return stub_text(
            "ref_1_aaaa", Claims(uri=URI, **kwargs), provenance, saved_path=saved, bound=True
        )

    assert stub(name="n" * 120).startswith("[ref_1_aaaa] " + "n" * 120 + " — p")
    assert stub(name="n" * 121).startswith("[ref_1_aaaa] " + "n" * 119 + "… — p")
    assert stub(name="n" * 255).startswith("[ref_1_aaaa] " + "n" * 119 + "… — p")
    assert stub(mime_type="m" * 120).startswith("[ref_1_aaaa] " + "m" * 120 + " — p")
    assert stub(mime_type="m" * 121).startswith("[ref_1_aaaa] " + "m" * 119 + "… — p")
    assert stub(provenance="p" * 120).endswith("p" * 120 + " — fetch with fetch_reference")
    assert stub(provenance="p" * 121).endswith("p" * 119 + "… — fetch with fetch_reference")
    assert stub(saved_path="s" * 256).endswith(" — saved: " + "s" * 256)
    assert stub(saved_path="s" * 257).endswith(" — saved: " + "s" * 255 + "…")


# The longest stub: id + name + meta + provenance + the saved path, each at its bound.
STUB_MAX = (
    (len("[ref_zzzzzzzz_zzzz] ") + 120 + 3 + 120 + 2 + len("~8388608.0GB claimed") + 3 + 120)
    + 3
    + len("saved: ")
    + 256
)


@given(
    name=st.none() | st.text(max_size=255),
    mime=st.none() | st.text(max_size=255),
    size=st.none() | st.integers(min_value=0, max_value=2**53 - 1),
    provenance=st.text(max_size=2000),
    saved=st.none() | st.text(max_size=2000),
    bound=st.booleans(),
    secret=st.text(alphabet="qwxz", min_size=12, max_size=40),
)
def test_a_stub_is_one_bounded_line_without_the_uri(
    name: str | None,
    mime: str | None,
    size: int | None,
    provenance: str,
    saved: str | None,
    bound: bool,
    secret: str,
) -> None:
    uri = f"https://h.example/{secret}?token={secret}"
    t = Claims(uri=uri, name=name, mime_type=mime, size_bytes=size)
    stub = stub_text("ref_zzzzzzzz_zzzz", t, provenance, saved_path=saved, bound=bound)
    assert utf16_len(stub) <= STUB_MAX
    assert "\n" not in stub and "\r" not in stub
    assert "\u202e" not in stub and "\u2066" not in stub
    if secret not in (name or "") + (mime or "") + provenance + (saved or ""):
        assert secret not in stub
    assert stub.startswith("[ref_zzzzzzzz_zzzz] ")
    last = stub.rsplit(" — ", 1)[1]
    if saved is not None:
        assert " — saved: " in stub
    else:
        assert last == (
            "fetch with fetch_reference"
            if bound
            else "unbound: no server is recorded to fetch it from"
        )


# -- origins -----------------------------------------------------------------------------------

ORIGINS = [
    ("ws://Host.Example:80/x", "http://host.example"),
    ("wss://host.example/x", "https://host.example"),
    ("https://host.example:8443", "https://host.example:8443"),
    ("ws://127.0.0.1:8080/mcpl", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/files?x=1", "http://127.0.0.1:8080"),
    ("https://user:pw@h/x", "https://h"),
    ("https://bücher.example/x", "https://xn--bcher-kva.example"),
    ("http://[::1]:80/", "http://[::1]"),
    ("ws://h:443", "http://h:443"),
    ("wss://h:443/x", "https://h"),
    ("file:///etc/passwd", "file://"),
    ("not a url", None),
    ("", None),
    ("http://", None),
    ("http://h:65536/", None),
    ("https://\ud800/", None),
    ("wss://h:80/", "https://h:80"),
    ("HTTPS://H.EXAMPLE:443/#frag", "https://h.example"),
    ("http://h.example:0080", "http://h.example"),
]


@pytest.mark.parametrize(("url", "expected"), ORIGINS)
def test_origin_table(url: str, expected: str | None) -> None:
    assert origin(url) == expected


hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9]{0,8}(\.[a-z][a-z0-9]{0,8}){0,2}", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
)
ports = st.none() | st.integers(min_value=1, max_value=65535)
paths = st.from_regex(r"(/[a-zA-Z0-9._~-]{0,6}){0,3}(\?[a-z=&0-9]{0,10})?", fullmatch=True)


@given(st.sampled_from(["http", "https", "ws", "wss"]), hosts, ports, paths)
def test_origin_of_any_dialable_url(scheme: str, host: str, port: int | None, path: str) -> None:
    url = f"{scheme}://{host}{'' if port is None else f':{port}'}{path}"
    mapped = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    host_as_parsed = ada_url.URL(f"http://{host}/").hostname
    default = 443 if mapped == "https" else 80
    shown_port = "" if port is None or port == default else f":{port}"
    got = origin(url)
    assert got == f"{mapped}://{host_as_parsed}{shown_port}"
    assert origin(got) == got  # an origin is its own origin
    twin = {"ws": "http", "wss": "https", "http": "ws", "https": "wss"}[scheme]
    assert origin(twin + url[len(scheme) :]) == got


# -- the origin check and the server choice --------------------------------------------------

ADDR = "wss://files.example/mcpl"


@pytest.mark.parametrize(
    ("uri", "address", "message"),
    [
        ("not a uri", ADDR, "reference uri does not parse"),
        ("not a uri", "also bad", "reference uri does not parse"),
        ("https://files.example/x", "not a url", "server url does not parse"),
        ("https://files.example/x", None, "server url does not parse"),
        ("file:///private/fixture", ADDR, "scheme not allowed: file:"),
        ("ftp://files.example/x", ADDR, "scheme not allowed: ftp:"),
        ("wss://files.example/x", ADDR, "scheme not allowed: wss:"),
        (
            "https://other.example/x",
            ADDR,
            "third-party origin (https://other.example != dialed https://files.example);"
            " not fetched by this host",
        ),
        (
            "http://files.example/x",
            ADDR,
            "third-party origin (http://files.example != dialed https://files.example);"
            " not fetched by this host",
        ),
        (
            "https://files.example:8443/x",
            ADDR,
            "third-party origin (https://files.example:8443 != dialed https://files.example);"
            " not fetched by this host",
        ),
        ("https://files.example/x?token=t", ADDR, None),
        ("https://FILES.example:443/x", ADDR, None),
        ("http://127.0.0.1:8080/p", "ws://127.0.0.1:8080/mcpl", None),
    ],
)
def test_origin_check(uri: str, address: str | None, message: str | None) -> None:
    assert origin_check(uri, address) == message


urls = st.one_of(
    st.builds(
        lambda s, h, p: f"{s}://{h}{'' if p is None else f':{p}'}/x",
        st.sampled_from(["http", "https", "ws", "wss", "ftp", "file"]),
        st.sampled_from(["a.example", "b.example", "127.0.0.1"]),
        st.sampled_from([None, 80, 443, 8080]),
    ),
    st.sampled_from(["not a url", "", "mailto:x@y"]),
)


@given(urls, st.none() | urls)
def test_the_check_passes_exactly_on_the_same_http_origin(uri: str, address: str | None) -> None:
    passes = origin_check(uri, address) is None
    same = address is not None and origin(uri) is not None and origin(uri) == origin(address)
    assert passes == (same and uri.split(":", 1)[0] in ("http", "https"))


ADDRESSES: dict[str, str | None] = {
    "on": "wss://files.example/mcpl",
    "on2": "https://files.example:443/other",
    "off": "ws://relay.example/mcpl",
    "stdio": None,
    "bad": "::::",
}
ON_URI = "https://files.example/a.wav"
THIRD = (
    "third-party origin (https://files.example != dialed http://relay.example);"
    " not fetched by this host"
)


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ([], Refused(UNBOUND)),
        (["on"], Chosen("on")),
        (["off", "on"], Chosen("on")),
        (["on", "off"], Chosen("on")),
        (["on", "on2"], Chosen("on")),
        (["on2", "on"], Chosen("on2")),
        (["stdio", "on"], Chosen("on")),
        (["ghost", "on"], Chosen("on")),
        (["stdio"], Refused("unknown server: stdio")),
        (["ghost"], Refused("unknown server: ghost")),
        (["ghost", "off"], Refused("unknown server: ghost")),
        (["off", "ghost"], Refused(THIRD)),
        (["off", "stdio", "bad"], Refused(THIRD)),
        (["bad", "off"], Refused("server url does not parse")),
    ],
)
def test_choose(servers: list[str], expected: Chosen | Refused) -> None:
    assert choose(servers, ADDRESSES, ON_URI) == expected


def test_choose_refuses_a_bad_uri_with_the_first_servers_refusal() -> None:
    assert choose(["on"], ADDRESSES, "file:///etc/passwd") == Refused("scheme not allowed: file:")
    assert choose(["stdio", "on"], ADDRESSES, "nope") == Refused("unknown server: stdio")
    assert choose(["on", "stdio"], ADDRESSES, "nope") == Refused("reference uri does not parse")


@given(
    st.lists(st.sampled_from([*ADDRESSES, "ghost"]), max_size=5, unique=True),
    st.sampled_from([ON_URI, "http://relay.example/x", "file:///x", "junk"]),
)
def test_choose_properties(servers: list[str], uri: str) -> None:
    got = choose(servers, ADDRESSES, uri)

    def fits(s: str) -> bool:
        address = ADDRESSES.get(s)
        return address is not None and origin_check(uri, address) is None

    if isinstance(got, Chosen):
        index = servers.index(got.server_id)
        assert fits(got.server_id) and not any(fits(s) for s in servers[:index])
    elif not servers:
        assert got == Refused(UNBOUND)
    else:
        assert not any(fits(s) for s in servers)
        first = ADDRESSES.get(servers[0])
        assert got.message == (
            f"unknown server: {servers[0]}" if first is None else origin_check(uri, first)
        )
    # Whether some server is dialled does not depend on the order they delivered in.
    shuffled = choose(list(reversed(servers)), ADDRESSES, uri)
    assert isinstance(shuffled, Chosen) == isinstance(got, Chosen)


# -- fetch decisions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "now", "expired"),
    [
        (None, 1e12, False),
        ("not-a-date", 0, True),
        ("", 0, True),
        ("a" * 64, 0, True),
        ("2030-13-01T00:00:00Z", 0, True),
        ("2030-02-30", 0, True),
        ("2030-01-01T24:00:00Z", 0, True),
        ("2030-01-01T23:59:60Z", 0, True),
        ("0000-01-01", 0, True),
        ("２０３０-01-01", 0, True),
        ("2030-01-01T00:00:00+24:00", 0, True),
        ("2030-01-01T00:00:00Z\n", 0, True),
        ("1700000000", 0, True),
        ("2030-01-01T00:00:00Z", 1893456000 - 1, False),
        ("2030-01-01T00:00:00Z", 1893456000, True),
        ("2030-01-01T00:00:00z", 1893456000 - 1, False),
        ("2030-01-01t00:00:00Z", 1893456000 - 1, False),
        ("2030-01-01 00:00:00Z", 1893456000 - 1, False),
        ("2030-01-01T00:00:00.999Z", 1893456000.5, False),
        ("2030-01-01T00:00:00,5Z", 1893456000.5, True),
        ("2030-01-01T00:00Z", 1893456000 - 1, False),
        ("2030-01-01", 1893456000 - 1, False),
        ("2030-01-01T00:00:00", 1893456000 - 1, False),
        ("2030-01-01T00:00:00", 1893456000, True),
        ("2030-01-01T02:00:00+02:00", 1893456000, True),
        ("2030-01-01T02:00:00+0200", 1893456000 - 1, False),
        ("2029-12-31T22:00:00-02:00", 1893456000 - 1, False),
        ("2029-12-31T22:00:00-02:00", 1893456000, True),
        ("9999-12-31T23:59:59Z", 1e11, False),
        ("0001-01-01T00:00:00+01:00", -1e12, False),
        ("0001-01-01T00:00:00+01:00", 0, True),
    ],
)
def test_is_expired(text: str | None, now: float, expired: bool) -> None:
    assert is_expired(text, now) is expired


@given(
    st.datetimes(
        min_value=dt.datetime(1971, 1, 1),
        max_value=dt.datetime(9998, 1, 1),
        timezones=st.sampled_from(
            [
                dt.UTC,
                dt.timezone(dt.timedelta(hours=5, minutes=30)),
                dt.timezone(-dt.timedelta(hours=11)),
            ]
        ),
    ),
    st.floats(min_value=-1e6, max_value=1e6),
    st.sampled_from(["seconds", "milliseconds", "microseconds", "minutes"]),
)
def test_an_iso_expiry_is_read_as_its_instant(when: dt.datetime, delta: float, spec: str) -> None:
    text = when.isoformat(timespec=spec)
    shown = dt.datetime.fromisoformat(text).timestamp()
    now = shown + delta
    assert is_expired(text, now) is (shown <= now)
    assert is_expired(text.replace("+00:00", "Z"), now) is (shown <= now)
    assert is_expired(text, shown) is True
    # Expiry only ever moves one way as time passes.
    assert not (is_expired(text, now) and not is_expired(text, now + 1))


@given(st.text(max_size=64), st.floats(allow_nan=False, allow_infinity=False))
def test_an_expiry_that_does_not_parse_has_passed(text: str, now: float) -> None:
    try:
        parsable = dt.datetime.fromisoformat(text) is not None
    except ValueError:
        parsable = False
    assume(not parsable and not text.endswith("z"))
    assert is_expired(text, now)


def test_expired_text() -> None:
    assert EXPIRED == "reference expired (or unparseable expiry — fail closed)"


def test_ceiling_and_budget() -> None:
    assert ceiling_refusal(None, 0) is None
    assert ceiling_refusal(128, 128) is None
    assert ceiling_refusal(129, 128) == "claimed 129 bytes exceeds fetch ceiling 128"
    assert budget_refusal(0, 1) is None
    assert budget_refusal(1073741823, 1073741824) is None
    assert budget_refusal(1073741824, 1073741824) == (
        "per-server fetch budget exhausted (1073741824/1073741824 bytes)"
    )
    assert budget_refusal(5, 0) == "per-server fetch budget exhausted (5/0 bytes)"


@given(st.none() | st.integers(min_value=0, max_value=2**53), st.integers(0, 2**40))
def test_ceiling_refusal_iff_over(size: int | None, ceiling: int) -> None:
    assert (ceiling_refusal(size, ceiling) is None) == (size is None or size <= ceiling)


@given(st.integers(0, 2**40), st.integers(0, 2**40))
def test_budget_refusal_iff_spent(used: int, budget: int) -> None:
    assert (budget_refusal(used, budget) is None) == (used < budget)


def test_digest_known_answers() -> None:
    assert digest_of(b"RIFF0000WAVEpayload") == DIGEST
    assert digest_of(b"") == "sha256:47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


@given(st.binary(max_size=512))
def test_digest_of_is_unpadded_base64url_sha256(data: bytes) -> None:
    got = digest_of(data)
    assert re.fullmatch(r"sha256:[A-Za-z0-9_-]{43}", got)
    assert base64.urlsafe_b64decode(got[7:] + "=") == hashlib.sha256(data).digest()
    assert read_testimony({"uri": "u", "digest": got}).digest == got


def test_digest_mismatch_text() -> None:
    got = digest_of(b"other")
    assert digest_mismatch(DIGEST, got) == (
        f"digest mismatch (claimed sha256:uM7OLD5sO8G3S…, got {got[:20]}…)"
    )


@pytest.mark.parametrize(
    ("head", "mime"),
    [
        (b"RIFF0000WAVEpayload", "audio/wav"),
        (b"RIFF", "audio/wav"),
        (b"fLaC\x00", "audio/flac"),
        (b"OggS\x00", "audio/ogg"),
        (b"MThd\x00", "audio/midi"),
        (b"ID3\x04", "audio/mpeg"),
        (b"\xff\xfb\x90", "audio/mpeg"),
        (b"\xff\xe0", "audio/mpeg"),
        (b"\x89PNG\r\n\x1a\n\x00", "image/png"),
        (b"\xff\xd8\xff\xe0", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a..", "image/gif"),
        (b"\x00\x00\x00\x18ftypmp42", "video/mp4"),
        (b"%PDF-1.7", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
    ],
)
def test_sniff_magic_beats_header_and_claim(head: bytes, mime: str) -> None:
    assert sniff_mime(head, "image/png", "text/plain") == mime


def test_sniff_falls_back_to_header_then_claim() -> None:
    assert sniff_mime(b"hello", "Text/Plain; charset=utf-8", "x/y") == "text/plain"
    assert sniff_mime(b"hello", " ;x", "x/y") == "x/y"
    assert sniff_mime(b"hello", None, "x/y") == "x/y"
    assert sniff_mime(b"hello", None, None) == "application/octet-stream"
    assert sniff_mime(b"", "", "") == "application/octet-stream"
    assert sniff_mime(b"\xff\xc0", None, None) == "application/octet-stream"
    assert sniff_mime(b"GIF88a", None, None) == "application/octet-stream"
    assert sniff_mime(b"%PDF", None, None) == "application/octet-stream"


@given(st.binary(max_size=16), st.none() | st.text(max_size=20), st.none() | st.text(max_size=20))
def test_sniff_is_total_and_prefers_the_bytes(
    head: bytes, header: str | None, claim: str | None
) -> None:
    got = sniff_mime(head, header, claim)
    assert got
    assert sniff_mime(b"RIFF" + head, header, claim) == "audio/wav"
    assert sniff_mime(b"%PDF-" + head, header, claim) == "application/pdf"


@pytest.mark.parametrize(
    ("mime", "ext"),
    [
        ("audio/wav", "wav"),
        ("audio/x-wav", "wav"),
        ("audio/mpeg", "mp3"),
        ("audio/mp4", "m4a"),
        ("audio/flac", "flac"),
        ("audio/midi", "mid"),
        ("audio/ogg", "ogg"),
        ("image/png", "png"),
        ("image/jpeg", "jpg"),
        ("image/gif", "gif"),
        ("image/webp", "webp"),
        ("video/mp4", "mp4"),
        ("application/json", "json"),
        ("text/plain", "txt"),
        ("Text/Plain; charset=utf-8", "txt"),
        ("application/pdf", "pdf"),
        ("application/zip", "zip"),
        ("application/octet-stream", "bin"),
        ("", "bin"),
        ("../../etc", "bin"),
    ],
)
def test_extension_for(mime: str, ext: str) -> None:
    assert extension_for(mime) == ext


@given(st.text(max_size=40))
def test_an_extension_is_from_a_fixed_set(mime: str) -> None:
    known = {"wav", "mp3", "m4a", "flac", "mid", "ogg", "png", "jpg", "gif", "webp", "mp4"}
    assert extension_for(mime) in known | {"json", "txt", "pdf", "zip", "bin"}


@given(
    st.booleans(),
    st.sampled_from([Chosen("a"), Refused("no")]),
    st.none() | st.integers(0, 2**20),
    st.integers(0, 2**20),
)
def test_eager_eligible(
    fetched: bool, chosen: Chosen | Refused, size: int | None, limit: int
) -> None:
    got = eager_eligible(fetched=fetched, chosen=chosen, size_bytes=size, eager_limit=limit)
    expected = not fetched and chosen == Chosen("a") and size is not None and size <= limit
    assert got is expected


def test_eager_eligible_at_the_limit() -> None:
    on = Chosen("s")
    assert eager_eligible(fetched=False, chosen=on, size_bytes=262144, eager_limit=262144)
    assert not eager_eligible(fetched=False, chosen=on, size_bytes=262145, eager_limit=262144)
    assert not eager_eligible(fetched=False, chosen=on, size_bytes=None, eager_limit=262144)
    assert not eager_eligible(fetched=True, chosen=on, size_bytes=1, eager_limit=262144)
    off = Refused("third-party")
    assert not eager_eligible(fetched=False, chosen=off, size_bytes=0, eager_limit=262144)


def test_unknown_reference() -> None:
    assert unknown_reference("ref_1_abcd") == (
        "unknown reference: ref_1_abcd — it may have been evicted; ids are never reused"
    )
    assert unknown_reference(None) == (
        "unknown reference: (missing ref_id) — it may have been evicted; ids are never reused"
    )
    assert "\n" not in unknown_reference("x\ny" * 1000)
    assert len(unknown_reference("x" * 10_000)) < 200


def test_fetch_result_text() -> None:
    text = fetch_result_text("refs/ref_1_abcd.wav", 19, "audio/wav", True, True)
    assert text == (
        '{"path":"refs/ref_1_abcd.wav","bytes":19,"mime_type":"audio/wav","digest_verified":true}'
    )
    plain = json.loads(fetch_result_text("refs/r.bin", 0, "application/octet-stream", False, False))
    assert plain == {
        "path": "refs/r.bin",
        "bytes": 0,
        "mime_type": "application/octet-stream",
        "digest_verified": "no digest claimed",
    }
    assert json.loads(fetch_result_text("p", 1, "m", False, True))["digest_verified"] is False


# -- the registry ------------------------------------------------------------------------------


def t(uri: str = URI, **kwargs: Any) -> Claims:
    return Claims(uri=uri, **kwargs)


def test_base36() -> None:
    assert [base36(n) for n in (0, 1, 35, 36, 46, 1295, 1296)] == [
        "0", "1", "z", "10", "1a", "zz", "100",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        base36(-1)


@given(st.integers(min_value=0, max_value=2**64))
def test_base36_round_trips(n: int) -> None:
    assert int(base36(n), 36) == n
    assert re.fullmatch(r"0|[1-9a-z][0-9a-z]*", base36(n))


def test_ids_count_up_in_base36_with_a_random_tail() -> None:
    state = RegistryState(random.Random(7))
    ids = [state.register(t(f"u:{i}"), "s", 0.0).ref_id for i in range(40)]
    assert all(REF_ID.fullmatch(i) for i in ids)
    assert [i.split("_")[1] for i in ids[:3]] == ["1", "2", "3"]
    assert ids[35].split("_")[1] == "10"
    assert len(set(ids)) == 40
    again = RegistryState(random.Random(7))
    assert [again.register(t(f"u:{i}"), "s", 0.0).ref_id for i in range(40)] == ids


def test_one_record_per_uri_with_each_server_once_in_order() -> None:
    state = RegistryState(random.Random(0))
    first = state.register(t(size_bytes=1), "relay", 10.0)
    assert first.server_ids == ["relay"] and first.received_at == 10.0
    assert state.register(t(size_bytes=2), "files", 11.0) is first
    assert state.register(t(size_bytes=3), "relay", 12.0) is first
    assert state.register(t(size_bytes=4), None, 13.0) is first
    assert first.server_ids == ["relay", "files"]
    assert first.received_at == 10.0
    assert len(state) == 1
    assert state.get(first.ref_id) is first


def test_a_record_without_a_server_is_unbound_until_one_delivers() -> None:
    state = RegistryState(random.Random(0))
    record = state.register(t(), None, 0.0)
    assert record.server_ids == []
    state.register(t(), None, 0.0)
    assert record.server_ids == []
    state.register(t(), "s", 0.0)
    assert record.server_ids == ["s"]
    with pytest.raises(ValueError):
        state.register(t(), "", 0.0)


def test_latest_claims_win_until_fetched_then_freeze() -> None:
    state = RegistryState(random.Random(0))
    record = state.register(t(size_bytes=1, digest=DIGEST, name="a"), "s1", 0.0)
    state.register(t(size_bytes=2), None, 1.0)
    assert record.testimony == t(size_bytes=2)  # replaced wholesale: digest and name are gone
    state.register(t(name="b", digest=DIGEST), "s2", 2.0)
    assert record.testimony == t(name="b", digest=DIGEST)
    assert not record.fetched
    state.mark_fetched(
        record.ref_id, path="refs/x.wav", n=19, mime="audio/wav", digest_verified=True
    )
    assert record.fetched
    assert (record.fetched_path, record.verified_bytes, record.verified_mime) == (
        "refs/x.wav",
        19,
        "audio/wav",
    )
    assert record.digest_verified
    state.register(t(size_bytes=999), "s3", 3.0)
    assert record.testimony == t(name="b", digest=DIGEST)
    assert record.server_ids == ["s1", "s2", "s3"]
    state.mark_fetched(record.ref_id, path="refs/other", n=1, mime="x/y", digest_verified=False)
    assert record.fetched_path == "refs/x.wav"  # the first verified outcome stands


def test_a_fetch_freezes_the_claims_it_checked() -> None:
    state = RegistryState(random.Random(0))
    checked = t(size_bytes=19)
    record = state.register(checked, "s", 0.0)
    state.register(t(size_bytes=5, digest=DIGEST), "s", 1.0)  # arrives while the fetch runs
    state.mark_fetched(
        record.ref_id, path="p", n=19, mime="audio/wav", digest_verified=False, testimony=checked
    )
    assert record.testimony == checked
    with pytest.raises(ValueError):
        state.mark_fetched(
            state.register(t("u:2"), "s", 0).ref_id,
            path="p",
            n=1,
            mime="m",
            digest_verified=False,
            testimony=t("u:3"),
        )


def test_digest_verified_needs_a_claimed_digest() -> None:
    state = RegistryState(random.Random(0))
    record = state.register(t(), "s", 0.0)
    state.mark_fetched(record.ref_id, path="p", n=1, mime="m", digest_verified=True)
    assert record.digest_verified is False


def test_unknown_ids_are_misses() -> None:
    state = RegistryState(random.Random(0))
    assert state.get("ref_1_aaaa") is None
    state.mark_fetched("ref_1_aaaa", path="p", n=1, mime="m", digest_verified=False)
    assert len(state) == 0


def test_eviction_at_the_record_cap() -> None:
    state = RegistryState(random.Random(3))
    assert MAX_RECORDS == 2000
    records = [state.register(t(f"https://h/{i}"), "s", float(i)) for i in range(MAX_RECORDS)]
    assert len(state) == MAX_RECORDS
    assert all(state.get(r.ref_id) is r for r in records)
    # Re-delivering the oldest uri does not refresh its place in line.
    state.register(t("https://h/0"), "s2", 1e6)
    newest = state.register(t("https://h/new"), "s", 1e6)
    assert len(state) == MAX_RECORDS
    assert state.get(records[0].ref_id) is None
    assert state.get(records[1].ref_id) is records[1]
    assert state.get(newest.ref_id) is newest
    again = state.register(t("https://h/0"), "s", 2e6)
    assert again.ref_id != records[0].ref_id
    assert again.server_ids == ["s"]
    assert state.get(records[1].ref_id) is None
    with pytest.raises(ValueError):
        RegistryState(random.Random(0), max_records=0)


def test_the_registry_vector_shape_2100_registrations() -> None:
    state = RegistryState(random.Random(20))
    ids = [state.register(t(f"https://h/{i}"), "s", 0.0).ref_id for i in range(2100)]
    assert len(state) == 2000 and len(set(ids)) == 2100
    assert all(state.get(i) is None for i in ids[:100])
    assert all(state.get(i) is not None for i in ids[100:])


@attrs.define
class _Model:
    ref_id: str
    servers: list[str]
    testimony: Claims
    received_at: float
    fetched: bool = False


URIS = [f"https://h/{i}" for i in range(7)]
CAP = 4


class RegistryMachine(RuleBasedStateMachine):
    """The registry against a plain model: one record per live uri, FIFO eviction, servers once
    in order, latest-wins claims until fetched, ids never reused."""

    ids = Bundle("ids")

    def __init__(self) -> None:
        super().__init__()
        self.state = RegistryState(random.Random(0), max_records=CAP)
        self.model: dict[str, _Model] = {}
        self.issued: set[str] = set()
        self.evicted: set[str] = set()
        self.clock = 0.0

    @rule(
        target=ids,
        uri=st.sampled_from(URIS),
        server=st.none() | st.sampled_from(["a", "b", "c"]),
        size=st.none() | st.integers(0, 10),
    )
    def register(self, uri: str, server: str | None, size: int | None) -> str:
        self.clock += 1
        claim = Claims(uri=uri, size_bytes=size)
        record = self.state.register(claim, server, self.clock)
        known = self.model.get(uri)
        if known is None:
            assert record.ref_id not in self.issued
            self.issued.add(record.ref_id)
            known = self.model[uri] = _Model(record.ref_id, [], claim, self.clock)
            if len(self.model) > CAP:
                oldest = next(iter(self.model))
                self.evicted.add(self.model.pop(oldest).ref_id)
        else:
            assert record.ref_id == known.ref_id
        if server is not None and server not in known.servers:
            known.servers.append(server)
        if not known.fetched:
            known.testimony = claim
        return record.ref_id

    @rule(ref_id=ids, n=st.integers(0, 10))
    def fetch(self, ref_id: str, n: int) -> None:
        self.state.mark_fetched(
            ref_id, path=f"refs/{ref_id}.bin", n=n, mime="m", digest_verified=False
        )
        for known in self.model.values():
            if known.ref_id == ref_id:
                known.fetched = True

    @rule(ref_id=ids)
    def lookup(self, ref_id: str) -> None:
        record = self.state.get(ref_id)
        if ref_id in self.evicted:
            assert record is None
        else:
            assert record is not None and record.ref_id == ref_id

    @invariant()
    def matches_the_model(self) -> None:
        assert len(self.state) == len(self.model) <= CAP
        for uri, known in self.model.items():
            record = self.state.get(known.ref_id)
            assert record is not None
            assert record.testimony == known.testimony and record.testimony.uri == uri
            assert record.server_ids == known.servers
            assert record.received_at == known.received_at
            assert record.fetched == known.fetched
        for ref_id in self.evicted:
            assert self.state.get(ref_id) is None


TestRegistryMachine = RegistryMachine.TestCase
