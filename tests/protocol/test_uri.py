"""RFC-004 ``mcpl://`` URIs: the §8 vectors, the three stored values, the hardening."""

from __future__ import annotations

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from protocol import uri as uri_mod
from protocol.uri import (
    DOT_SEGMENT,
    EMPTY_AUTHORITY,
    FORBIDDEN_CHARACTER,
    FRAGMENT,
    NOT_A_STRING,
    NOT_MCPL,
    REASONS,
    UNPARSEABLE,
    UNSUPPORTED_SCHEME,
    USERINFO,
    EndpointUri,
    McplUriError,
    canonical_mcpl_uri,
    is_mcpl_uri,
    parse_endpoint,
    parse_mcpl_uri,
)

# --- RFC-004 §8 ------------------------------------------------------------------------------
# Expected values transcribed from the §8.1 "Resolution" and §8.2 "Rejection" tables of
# RFC-004-mcpl-uri-scheme.md in anima-research/mcpl (read at commit 3344f20f7da0). The RFC says
# every value there was produced by running its §3 algorithm.

RESOLUTION = [
    # (#, input, canonicalUri, resolvedTransport)
    (1, "mcpl://example.com", "mcpl://example.com/", "wss://example.com/"),
    (2, "mcpl://example.com/path", "mcpl://example.com/path", "wss://example.com/path"),
    (3, "mcpl://example.com:8443/x", "mcpl://example.com:8443/x", "wss://example.com:8443/x"),
    (
        4,
        "mcpl://eidoverse.animalabs.ai?world=abc",
        "mcpl://eidoverse.animalabs.ai/?world=abc",
        "wss://eidoverse.animalabs.ai/?world=abc",
    ),
    (5, "MCPL://Example.COM/x", "mcpl://example.com/x", "wss://example.com/x"),
    (
        6,
        "mcpl://EIDOVERSE.Animalabs.AI:443/x",
        "mcpl://eidoverse.animalabs.ai/x",
        "wss://eidoverse.animalabs.ai/x",
    ),
    (
        7,
        "mcpl://ünicode.example/x",
        "mcpl://xn--nicode-2ya.example/x",
        "wss://xn--nicode-2ya.example/x",
    ),
    (
        8,
        "mcpl://[2001:DB8::1]:8443/x",
        "mcpl://[2001:db8::1]:8443/x",
        "wss://[2001:db8::1]:8443/x",
    ),
    (9, "mcpl://localhost/x", "mcpl://localhost/x", "wss://localhost/x"),
    (10, "mcpl://h/p?b=2&a=1", "mcpl://h/p?b=2&a=1", "wss://h/p?b=2&a=1"),
    (11, "mcpl://h/x?a=1&a=2", "mcpl://h/x?a=1&a=2", "wss://h/x?a=1&a=2"),
    (12, "mcpl://h/a%2fb", "mcpl://h/a%2fb", "wss://h/a%2fb"),
    (13, "mcpl://h/%7Euser", "mcpl://h/%7Euser", "wss://h/%7Euser"),
]

REJECTION = [
    # (#, input, the RFC's "rejected because", our reason)
    (14, "mcpl:///x", "empty authority", EMPTY_AUTHORITY),
    (15, "mcpl://u:p@h/x", "userinfo", USERINFO),
    (16, "mcpl://h/x#frag", "fragment", FRAGMENT),
    (17, "mcpl://h/a/../b", "dot segment", DOT_SEGMENT),
    (18, "mcpl://h/a/%2e%2e/b", "dot segment, percent-encoded", DOT_SEGMENT),
    (19, "mcpl://h/a/./b", "dot segment (single)", DOT_SEGMENT),
    (20, "mcpl://h:99999/x", "port out of range", UNPARSEABLE),
]


def test_the_tables_hold_all_twenty_vectors() -> None:
    numbers = [row[0] for row in RESOLUTION] + [row[0] for row in REJECTION]
    assert numbers == list(range(1, 21))


@pytest.mark.parametrize(("n", "text", "canonical", "resolved"), RESOLUTION)
def test_rfc004_resolution_vector(n: int, text: str, canonical: str, resolved: str) -> None:
    got = parse_mcpl_uri(text)
    assert got == EndpointUri(
        configured_uri=text, canonical_uri=canonical, resolved_transport=resolved
    )
    assert canonical_mcpl_uri(text) == canonical
    assert parse_endpoint(text) == got


@pytest.mark.parametrize(("n", "text", "because", "reason"), REJECTION)
def test_rfc004_rejection_vector(n: int, text: str, because: str, reason: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == reason
    assert info.value.uri == text
    with pytest.raises(McplUriError):
        parse_endpoint(text)


def test_the_three_values_of_the_rfc_example() -> None:
    # RFC-004 §5's example record.
    got = parse_mcpl_uri("mcpl://EIDOVERSE.Animalabs.AI?world=abc")
    assert got.to_json() == {
        "configuredUri": "mcpl://EIDOVERSE.Animalabs.AI?world=abc",
        "canonicalUri": "mcpl://eidoverse.animalabs.ai/?world=abc",
        "resolvedTransport": "wss://eidoverse.animalabs.ai/?world=abc",
    }


# --- string-level refusals beyond the vectors -----------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "mcpl://h/..",
        "mcpl://h/.",
        "mcpl://h/a/..?q=1",
        "mcpl://h/%2e",
        "mcpl://h/%2E",
        "mcpl://h/.%2e/b",
        "mcpl://h/%2E./b",
        "mcpl://h/%2e%2E",
        "mcpl://h/a/./",
        "mcpl://h/./",
    ],
)
def test_dot_segments_are_refused_in_every_spelling(text: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == DOT_SEGMENT


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("mcpl://h/...", "/..."),
        ("mcpl://h/.a", "/.a"),
        ("mcpl://h/a..", "/a.."),
        ("mcpl://h/%2e%2e%2e", "/%2e%2e%2e"),
        ("mcpl://h/%252e%252e", "/%252e%252e"),
        ("mcpl://h/a%2f..%2fb", "/a%2f..%2fb"),
    ],
)
def test_things_that_only_look_like_dot_segments_stay(text: str, path: str) -> None:
    assert parse_mcpl_uri(text).resolved_transport == "wss://h" + path


def test_the_query_is_not_a_path() -> None:
    got = parse_mcpl_uri("mcpl://h?x=/../y&x=./")
    assert got.canonical_uri == "mcpl://h/?x=/../y&x=./"


@pytest.mark.parametrize(
    "text",
    [
        "mcpl://h/a\\..\\b",  # the RFC digest's example: would resolve to wss://h/b
        "mcpl://h\\x",
        "mcpl://h/a\tb",
        "mcpl://h/a\rb",
        "mcpl://h/a\nb",
        "mcpl://h/x\n",
        "mcpl://h/a/.. ",  # a parser strips the trailing space and collapses the ..
        "mcpl://h/a/..\x00",
        "mcpl://h/a/..\x1f",
        "mcpl://h/a b",
        "mcpl://h/.\t.",
    ],
)
def test_backslash_controls_and_space_are_refused(text: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == FORBIDDEN_CHARACTER


@pytest.mark.parametrize("text", ["mcpl://@h/x", "mcpl://h@/x", "mcpl://u@h", "mcpl://h:1@g?x"])
def test_any_at_sign_in_the_authority_is_userinfo(text: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == USERINFO


def test_an_at_sign_in_the_path_or_query_is_fine() -> None:
    assert parse_mcpl_uri("mcpl://h/a@b?c@d").canonical_uri == "mcpl://h/a@b?c@d"


@pytest.mark.parametrize("text", ["mcpl://", "mcpl://?x", "mcpl:///", "MCPL:///evil"])
def test_an_empty_authority_is_refused(text: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == EMPTY_AUTHORITY


@pytest.mark.parametrize("text", ["mcpl://h/x#", "mcpl://h#", "mcpl://h?a#b"])
def test_any_fragment_is_refused(text: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == FRAGMENT


@pytest.mark.parametrize(
    "text", ["mcpl://:443/x", "mcpl://h:x/", "mcpl://[::1/x", "mcpl://h/\ud800", "mcpl://a%2fb/"]
)
def test_what_the_parser_refuses_is_refused(text: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == UNPARSEABLE


@pytest.mark.parametrize(
    "text", ["wss://h/x", "mcpl:/h/x", "mcpl:h", "", " mcpl://h", "mcpls://h/x", "mcpl//h"]
)
def test_other_spellings_are_not_mcpl(text: str) -> None:
    assert not is_mcpl_uri(text)
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(text)
    assert info.value.reason == NOT_MCPL


def test_the_scheme_is_matched_without_unicode_case_folding() -> None:
    # U+212A KELVIN SIGN lowercases to "k"; nothing but ASCII may spell the scheme.
    assert is_mcpl_uri("McPl://h")
    assert not is_mcpl_uri("mcpl\u212a//h")


@pytest.mark.parametrize("value", [None, 1, b"mcpl://h/", ["mcpl://h/"]])
def test_a_non_string_is_refused(value: object) -> None:
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(value)
    assert info.value.reason == NOT_A_STRING
    with pytest.raises(McplUriError):
        parse_endpoint(value)


def test_the_error_is_a_value_error_that_names_its_reason() -> None:
    with pytest.raises(ValueError, match="fragment"):
        parse_mcpl_uri("mcpl://h/#x")


def test_percent_encoding_and_query_order_are_kept() -> None:
    got = parse_mcpl_uri("mcpl://H/%7E/%41?z=%7E&a=1&z=2")
    assert got.canonical_uri == "mcpl://h/%7E/%41?z=%7E&a=1&z=2"


def test_the_configured_value_is_verbatim_and_the_others_differ() -> None:
    text = "MCPL://Example.COM:443"
    got = parse_mcpl_uri(text)
    assert got.configured_uri is text
    assert got.canonical_uri == "mcpl://example.com/"
    assert got.resolved_transport == "wss://example.com/"


# --- ws:// and wss:// stay accepted ----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "href"),
    [
        ("ws://localhost:8080", "ws://localhost:8080/"),
        ("WSS://Example.COM:443/x?b=1&a=2", "wss://example.com/x?b=1&a=2"),
        ("wss://h/a/../b", "wss://h/b"),
        ("ws://u:p@h/x", "ws://u:p@h/x"),
    ],
)
def test_websocket_urls_resolve_to_their_own_href(text: str, href: str) -> None:
    got = parse_endpoint(text)
    assert got == EndpointUri(configured_uri=text, canonical_uri=href, resolved_transport=href)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("wss:///x", EMPTY_AUTHORITY),
        ("ws://h/x#f", FRAGMENT),
        ("ws://h/a\\..\\b", FORBIDDEN_CHARACTER),
        ("wss://h:70000/", UNPARSEABLE),
        ("http://h/", UNSUPPORTED_SCHEME),
        ("h:8080", UNSUPPORTED_SCHEME),
    ],
)
def test_websocket_urls_refused(text: str, reason: str) -> None:
    with pytest.raises(McplUriError) as info:
        parse_endpoint(text)
    assert info.value.reason == reason


# --- properties ------------------------------------------------------------------------------

TOKENS = [
    "a",
    "Z",
    "0",
    "9",
    "-",
    "_",
    "~",
    ".",
    "..",
    ":",
    "/",
    "?",
    "&",
    "=",
    "@",
    "#",
    "%",
    "%2e",
    "%2E",
    "%2f",
    "%7E",
    "%zz",
    "[",
    "]",
    "::1",
    ":443",
    ":8443",
    ":99999",
    "ü",
    "xn--",
    "\\",
    "\t",
    "\r",
    "\n",
    " ",
    "\x00",
    "\x7f",
    "\u3002",
    "\uff0e",
    "\ud800",
    "'",
    '"',
    "<",
    "{",
]
tails = st.lists(st.sampled_from(TOKENS), max_size=14).map("".join)
prefixes = st.sampled_from(["mcpl://", "MCPL://", "McPl://", "mcpl:", "mcpl:/", "wss://", ""])
uri_like = st.builds(lambda p, t: p + t, prefixes, tails) | st.text(max_size=40)
hosts = st.sampled_from(["h", "Example.COM", "ünicode.example", "[2001:DB8::1]", "127.0.0.1"])
ports = st.sampled_from(["", ":443", ":8443", ":1"])
segments = (
    st.lists(
        st.sampled_from([*"abcXYZ019-_~.!$'()*+,;=:@", "%41", "%2f", "é"]), min_size=1, max_size=6
    )
    .map("".join)
    .filter(lambda s: s.replace("%2e", ".").replace("%2E", ".") not in (".", ".."))
)
paths = st.lists(segments, max_size=4).map(lambda segs: "".join("/" + s for s in segs))
queries = st.sampled_from(["", "?", "?a=1", "?b=2&a=1&b=3", "?q=%7E/./..", "?x=é"])
valid = st.builds(lambda h, p, pa, q: "mcpl://" + h + p + pa + q, hosts, ports, paths, queries)
FORBIDDEN = ["\\", "\t", "\r", "\n", " ", "\x00", "\x1f"]


@given(uri_like)
@example("mcpl://h/a/.. ")
@example("mcpl://h/\ud800")
def test_parsing_raises_only_the_module_error(text: str) -> None:
    for parse in (parse_mcpl_uri, parse_endpoint):
        try:
            got = parse(text)
        except McplUriError as exc:
            assert exc.reason in REASONS
            assert exc.reason != uri_mod.PARSE_MISMATCH  # the string checks are complete
        else:
            assert got.configured_uri == text


@given(uri_like)
def test_whatever_is_accepted_is_canonical_and_free_of_dot_segments(text: str) -> None:
    try:
        got = parse_mcpl_uri(text)
    except McplUriError:
        return
    assert got.resolved_transport.startswith("wss://")
    assert got.canonical_uri == "mcpl://" + got.resolved_transport[len("wss://") :]
    after_host = got.canonical_uri[len("mcpl://") :].split("?", 1)[0].partition("/")[2]
    assert all(seg not in (".", "..") for seg in after_host.split("/"))
    assert parse_mcpl_uri(got.canonical_uri).canonical_uri == got.canonical_uri


@given(valid)
def test_canonicalization_is_idempotent(text: str) -> None:
    once = parse_mcpl_uri(text)
    twice = parse_mcpl_uri(once.canonical_uri)
    assert twice.canonical_uri == once.canonical_uri
    assert twice.resolved_transport == once.resolved_transport
    assert parse_endpoint(once.resolved_transport).canonical_uri == once.resolved_transport


@given(valid, st.sampled_from(FORBIDDEN), st.integers(min_value=0))
def test_a_forbidden_character_anywhere_is_refused(text: str, bad: str, at: int) -> None:
    at %= len(text) + 1
    spoiled = text[:at] + bad + text[at:]
    assume(spoiled.startswith("mcpl://") or at < len("mcpl://"))
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(spoiled)
    if at >= len("mcpl://"):
        assert info.value.reason == FORBIDDEN_CHARACTER
    else:
        assert info.value.reason in (NOT_MCPL, FORBIDDEN_CHARACTER)
    with pytest.raises(McplUriError):
        parse_endpoint(spoiled)


@given(valid, st.sampled_from(["..", ".", "%2e%2e", "%2E.", ".%2e", "%2e"]), st.data())
def test_an_inserted_dot_segment_is_refused(text: str, dots: str, data: st.DataObject) -> None:
    rest = text[len("mcpl://") :]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i != -1), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    path, sep, query = tail.partition("?")
    segs = path.split("/")[1:] if path else []
    at = data.draw(st.integers(min_value=0, max_value=len(segs)))
    segs.insert(at, dots)
    spoiled = "mcpl://" + authority + "".join("/" + s for s in segs) + sep + query
    with pytest.raises(McplUriError) as info:
        parse_mcpl_uri(spoiled)
    assert info.value.reason == DOT_SEGMENT
