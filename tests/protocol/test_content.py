"""Content blocks: validation, the lane rule for references, and the form every lane shares."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.content import (
    MAX_TEXT_CHARS,
    WITHHELD,
    ContentError,
    convert_block,
    convert_blocks,
    text_of,
)
from protocol.references import LANES, MAX_URI_CHARS, stub_provenance
from protocol.references import Testimony as Claims

SID = "srv"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00").decode()
URI = "https://files.example/a.png?token=s3cret"
OTHER_LANES = [lane for lane in LANES if lane != "tool_result"]


def conv(block: Any, lane: str = "push") -> dict[str, Any]:
    return convert_block(block, SID, lane)


def pending(block: dict[str, Any], lane: str, server: str = SID) -> dict[str, Any]:
    fields = {k: v for k, v in block.items() if k != "type"}
    return {
        "type": "reference",
        "server_id": server,
        "provenance": stub_provenance(lane, server),
        "testimony": {**fields, "rejectedFields": []},
    }


def test_text_block() -> None:
    assert conv({"type": "text", "text": "hi", "annotations": {"x": 1}}) == {
        "type": "text",
        "text": "hi",
    }
    assert conv({"type": "text", "text": ""}) == {"type": "text", "text": ""}


def test_text_at_and_past_the_limit() -> None:
    assert conv({"type": "text", "text": "x" * MAX_TEXT_CHARS})["text"] == "x" * MAX_TEXT_CHARS
    with pytest.raises(ContentError, match="over"):
        conv({"type": "text", "text": "x" * (MAX_TEXT_CHARS + 1)})


@pytest.mark.parametrize("text", [None, 5, ["a"], {"t": "a"}])
def test_text_block_needs_a_string(text: Any) -> None:
    with pytest.raises(ContentError, match=r"^text block without string text$"):
        conv({"type": "text", "text": text})
    with pytest.raises(ContentError, match=r"^text block without string text$"):
        conv({"type": "text"})


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("kind", ["image", "audio"])
def test_base64_media(kind: str, lane: str) -> None:
    block = {"type": kind, "data": PNG, "mimeType": "image/png", "extra": True}
    assert conv(block, lane) == {"type": kind, "data": PNG, "mimeType": "image/png"}


@pytest.mark.parametrize(
    "data", ["not base64!", "abc", "YWJj\n", "YW Jj", "ü", 123, None, ["YWJj"]]
)
def test_bad_base64_is_refused(data: Any) -> None:
    with pytest.raises(ContentError, match="base64"):
        conv({"type": "image", "data": data, "mimeType": "image/png"})


@pytest.mark.parametrize("mime", [None, "", 5])
def test_media_data_needs_a_mime_type(mime: Any) -> None:
    block: dict[str, Any] = {"type": "audio", "data": PNG}
    if mime is not None:
        block["mimeType"] = mime
    with pytest.raises(ContentError, match="mimeType"):
        conv(block)


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("kind", ["image", "audio"])
@pytest.mark.parametrize(
    "extra",
    [
        {"disposition": "never"},
        {"disposition": "ref"},
        {"disposition": None},
        {"disposition": "bogus"},
        {"uri": URI},
        {"uri": ""},
        {"uri": URI, "disposition": "never"},
    ],
)
def test_inline_data_that_also_disowns_itself_is_withheld(
    kind: str, lane: str, extra: dict[str, Any]
) -> None:
    # The data is withheld before it is even checked: bad base64 and no mimeType change nothing.
    for data in (PNG, "not base64!"):
        out = conv({"type": kind, "data": data, **extra}, lane)
        assert out == {"type": "text", "text": WITHHELD}
        assert data not in json.dumps(out)
    assert WITHHELD == ("[inline content withheld: nonconformant bulk disposition on inline data]")


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("uri", [None, 5, ["u"]])
def test_media_with_neither_data_nor_uri(lane: str, uri: Any) -> None:
    for kind, text in (("image", "[Image: no data]"), ("audio", "[Audio: no data]")):
        block: dict[str, Any] = {"type": kind, "mimeType": "image/png", "disposition": "never"}
        if uri is not None:
            block["uri"] = uri
        assert conv(block, lane) == {"type": "text", "text": text}


REF_FIELDS = {
    "mimeType": "image/png",
    "sizeBytes": 10,
    "digest": "sha256:uM7OLD5sO8G3SeWw3LirIreZM71523d9_qXxkn8ewpM",
    "expiresAt": "2030-01-01T00:00:00Z",
    "name": "a.png",
}


@pytest.mark.parametrize("kind", ["image", "audio"])
@pytest.mark.parametrize("disposition", [None, "never", "ref"])
def test_a_tool_result_stubs_every_uri_form_media_block(kind: str, disposition: str | None) -> None:
    block: dict[str, Any] = {"type": kind, "uri": URI, **REF_FIELDS}
    if disposition is not None:
        block["disposition"] = disposition
    out = conv({**block, "secret": "dropped", "annotations": {"x": 1}}, "tool_result")
    assert out == pending(block, "tool_result")
    assert Claims.from_wire(out["testimony"]).uri == URI


@pytest.mark.parametrize("lane", OTHER_LANES)
@pytest.mark.parametrize("kind", ["image", "audio"])
@pytest.mark.parametrize("disposition", ["never", "ref"])
def test_other_lanes_stub_uri_form_media_that_carries_a_disposition(
    kind: str, lane: str, disposition: str
) -> None:
    block = {"type": kind, "uri": URI, **REF_FIELDS, "disposition": disposition}
    assert conv(block, lane) == pending(block, lane)


@pytest.mark.parametrize("lane", OTHER_LANES)
@pytest.mark.parametrize("disposition", ["inline", "", None, 5])
def test_an_invalid_disposition_still_stubs(lane: str, disposition: Any) -> None:
    out = conv({"type": "audio", "uri": URI, "disposition": disposition}, lane)
    assert out["type"] == "reference"
    assert out["testimony"] == {"uri": URI, "rejectedFields": ["disposition"]}


@pytest.mark.parametrize("lane", OTHER_LANES)
def test_other_lanes_pass_a_uri_image_without_disposition_as_a_url(lane: str) -> None:
    block = {"type": "image", "uri": URI, **REF_FIELDS, "secret": 1}
    assert conv(block, lane) == {"type": "image", "uri": URI}
    with pytest.raises(ContentError, match=r"^uri exceeds schema maximum$"):
        conv({"type": "image", "uri": "a" * (MAX_URI_CHARS + 1)}, lane)
    with pytest.raises(ContentError, match=r"^reference without string uri$"):
        conv({"type": "image", "uri": ""}, lane)


@pytest.mark.parametrize("lane", OTHER_LANES)
def test_other_lanes_turn_uri_audio_without_disposition_into_a_notice(lane: str) -> None:
    for uri in (URI, "", "a" * (MAX_URI_CHARS + 1)):
        out = conv({"type": "audio", "uri": uri, **REF_FIELDS}, lane)
        assert out == {"type": "text", "text": "[Audio: no data]"}


@pytest.mark.parametrize("lane", LANES)
def test_an_mcpl_resource_is_always_a_reference(lane: str) -> None:
    block = {"type": "resource", "uri": "mcpl://x/y", "mimeType": "text/plain", "name": "y"}
    assert conv(block, lane) == pending(block, lane)
    bare = {"type": "resource", "uri": "u:1"}
    assert conv(bare, lane) == pending(bare, lane)


@pytest.mark.parametrize("lane", LANES)
def test_reference_fields_that_break_their_rule_are_named(lane: str) -> None:
    out = conv(
        {"type": "resource", "uri": "u:1", "sizeBytes": True, "name": ["x"], "digest": None},
        lane,
    )
    assert out["testimony"] == {"uri": "u:1", "rejectedFields": ["name", "sizeBytes", "digest"]}


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("uri", [None, 5, "", ["u"]])
def test_a_reference_needs_a_string_uri(lane: str, uri: Any) -> None:
    block: dict[str, Any] = {"type": "resource", "name": "n"}
    if uri is not None:
        block["uri"] = uri
    with pytest.raises(ContentError, match=r"^reference without string uri$"):
        conv(block, lane)
    with pytest.raises(ContentError, match=r"^reference without string uri$"):
        conv({"type": "image", "uri": "", "disposition": "never"}, lane)


@pytest.mark.parametrize("lane", LANES)
def test_the_uri_cap(lane: str) -> None:
    at_cap = {"type": "resource", "uri": "a" * MAX_URI_CHARS}
    assert conv(at_cap, lane)["testimony"]["uri"] == "a" * MAX_URI_CHARS
    with pytest.raises(ContentError, match=r"^uri exceeds schema maximum$"):
        conv({"type": "resource", "uri": "a" * (MAX_URI_CHARS + 1)}, lane)
    with pytest.raises(ContentError, match=r"^uri exceeds schema maximum$"):
        conv({"type": "audio", "uri": "a" * (MAX_URI_CHARS + 1), "disposition": "ref"}, lane)


@pytest.mark.parametrize("lane", LANES)
def test_the_injection_provenance_names_the_server(lane: str) -> None:
    out = convert_block({"type": "resource", "uri": "u:1"}, "weather", lane)
    assert out["server_id"] == "weather"
    if lane == "injection":
        assert out["provenance"] == "injected by weather before inference"


def test_resource_link_in_a_tool_result_is_shown_not_fetched() -> None:
    link = {
        "type": "resource_link",
        "uri": "file:///a.txt",
        "name": "a",
        "mimeType": "text/plain",
        "size": 5,
    }
    assert conv(link, "tool_result") == {
        "type": "text",
        "text": '[resource link "a": file:///a.txt, text/plain; not fetched]',
    }
    cases = [
        ({"uri": "file:///a"}, "[resource link: file:///a; not fetched]"),
        ({"name": "a\n\u202eb"}, '[resource link "ab"; not fetched]'),
        ({}, "[resource link; not fetched]"),
        ({"uri": "u:1", "disposition": "never", "name": "n"}, '[resource link "n"; not fetched]'),
        (
            {"uri": "a" * (MAX_URI_CHARS + 1), "mimeType": "m/t"},
            "[resource link: m/t; not fetched]",
        ),
        ({"uri": "u:\n1", "name": "n" * 300}, f'[resource link "{"n" * 119}…": u:1; not fetched]'),
    ]
    for fields, text in cases:
        assert conv({"type": "resource_link", **fields}, "tool_result") == {
            "type": "text",
            "text": text,
        }


@pytest.mark.parametrize("lane", OTHER_LANES)
def test_resource_link_elsewhere_is_unrecognized(lane: str) -> None:
    out = conv({"type": "resource_link", "uri": "file:///a", "name": "a"}, lane)
    assert out == {"type": "text", "text": "[unrecognized content block: resource_link]"}


def test_mcp_embedded_text_resource_in_a_tool_result_becomes_labelled_text() -> None:
    block = {"type": "resource", "resource": {"uri": "file:///n.txt", "text": "body"}}
    assert conv(block, "tool_result") == {"type": "text", "text": "[resource file:///n.txt]\nbody"}
    unlabelled = {"type": "resource", "resource": {"text": "body"}}
    assert conv(unlabelled, "tool_result") == {"type": "text", "text": "body"}


def test_an_embedded_resource_never_shows_a_uri_its_server_asked_to_keep_out_of_sight() -> None:
    hidden = [
        {"type": "resource", "resource": {"uri": URI, "text": "b", "disposition": "never"}},
        {"type": "resource", "disposition": "never", "resource": {"uri": URI, "text": "b"}},
        {"type": "resource", "resource": {"uri": URI, "text": "b", "disposition": "bogus"}},
    ]
    for block in hidden:
        assert conv(block, "tool_result") == {"type": "text", "text": "b"}
    too_long = {"type": "resource", "resource": {"uri": "a" * (MAX_URI_CHARS + 1), "text": "b"}}
    assert conv(too_long, "tool_result") == {"type": "text", "text": "b"}
    controls = {"type": "resource", "resource": {"uri": "u:\n[x]\u202e", "text": "b"}}
    assert conv(controls, "tool_result") == {"type": "text", "text": "[resource u:[x]]\nb"}
    with pytest.raises(ContentError, match="over"):
        conv({"type": "resource", "resource": {"text": "x" * (MAX_TEXT_CHARS + 1)}}, "tool_result")


def test_mcp_embedded_blob_resource_in_a_tool_result_is_described_not_shown() -> None:
    block = {
        "type": "resource",
        "resource": {"uri": "file:///a.bin", "blob": "AAAA", "mimeType": "application/x"},
    }
    out = conv(block, "tool_result")
    assert out == {
        "type": "text",
        "text": "[resource file:///a.bin, application/x; content not shown]",
    }
    assert conv({"type": "resource", "resource": {"blob": "AAAA"}}, "tool_result") == {
        "type": "text",
        "text": "[resource; content not shown]",
    }
    secret = {"type": "resource", "resource": {"uri": URI, "blob": "AAAA", "disposition": "ref"}}
    assert URI not in conv(secret, "tool_result")["text"]


@pytest.mark.parametrize("lane", OTHER_LANES)
def test_mcp_embedded_resource_elsewhere_is_invalid(lane: str) -> None:
    for inner in ({"uri": "file:///n.txt", "text": "body"}, {"blob": "AAAA"}):
        with pytest.raises(ContentError, match=r"^reference without string uri$"):
            conv({"type": "resource", "resource": inner}, lane)


@pytest.mark.parametrize("lane", LANES)
def test_mcpl_resource_with_an_extra_resource_member_uses_its_own_uri(lane: str) -> None:
    block = {"type": "resource", "uri": "mcpl://top", "resource": {"uri": "x", "text": "t"}}
    assert conv(block, lane) == pending({"type": "resource", "uri": "mcpl://top"}, lane)


@pytest.mark.parametrize("block", [None, 5, 1.5, True, ["text"], b"x", "plain"])
def test_non_object_block_is_refused(block: Any) -> None:
    with pytest.raises(ContentError, match=r"^not a content block$"):
        conv(block)


@pytest.mark.parametrize("kind", [None, 5, ["text"], {"t": 1}])
def test_a_block_without_a_string_type_is_refused(kind: Any) -> None:
    with pytest.raises(ContentError, match=r"^not a content block$"):
        conv({"type": kind, "text": "x"})
    with pytest.raises(ContentError, match=r"^not a content block$"):
        conv({"text": "x"})


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize(
    ("kind", "shown"),
    [
        ("video", "video"),
        ("", ""),
        ("Text", "Text"),
        ("tool_use", "tool_use"),
        ("re\nsource\u202e", "resource"),
        ("x" * 500, "x" * 119 + "…"),
    ],
)
def test_an_unknown_type_becomes_a_notice(lane: str, kind: str, shown: str) -> None:
    out = conv({"type": kind, "uri": URI, "data": PNG}, lane)
    assert out == {"type": "text", "text": f"[unrecognized content block: {shown}]"}


@pytest.mark.parametrize("server", ["", None, 5])
def test_the_server_is_required(server: Any) -> None:
    with pytest.raises(ContentError, match="server"):
        convert_block({"type": "text", "text": "x"}, server, "push")
    with pytest.raises(ContentError, match="server"):
        convert_blocks([{"type": "text", "text": "x"}], server, "push")
    with pytest.raises(ContentError, match="server"):
        convert_blocks("x", server, "push")


@pytest.mark.parametrize("lane", ["", "Push", "channel", "tool-result", "incoming "])
def test_an_unknown_lane_is_the_callers_mistake(lane: str) -> None:
    with pytest.raises(ValueError, match="lane") as info:
        convert_block({"type": "text", "text": "x"}, SID, lane)
    assert not isinstance(info.value, ContentError)


def test_convert_blocks() -> None:
    assert convert_blocks("hello", SID, "injection") == [{"type": "text", "text": "hello"}]
    assert convert_blocks([], SID, "push") == []
    blocks = convert_blocks(
        ({"type": "text", "text": "a"}, {"type": "image", "uri": "u:1"}), SID, "push"
    )
    assert blocks == [{"type": "text", "text": "a"}, {"type": "image", "uri": "u:1"}]
    for bad in (None, 5, {"type": "text", "text": "a"}):
        with pytest.raises(ContentError, match="list"):
            convert_blocks(bad, SID, "push")
    with pytest.raises(ContentError):
        convert_blocks([{"type": "text", "text": "a"}, {"type": "text"}], SID, "push")
    with pytest.raises(ContentError, match="over"):
        convert_blocks("x" * (MAX_TEXT_CHARS + 1), SID, "injection")


def test_text_of() -> None:
    blocks = [
        {"type": "text", "text": "a"},
        {"type": "image", "uri": "u:1"},
        {"type": "text", "text": "b"},
    ]
    assert text_of(blocks) == "a\nb"
    assert text_of([]) == ""


@given(st.text(max_size=200), st.sampled_from(LANES))
def test_text_blocks_round_trip_exactly(text: str, lane: str) -> None:
    block = {"type": "text", "text": text}
    assert conv(block, lane) == block
    assert convert_blocks(text, SID, lane) == [block]
    assert text_of([conv(block, lane)]) == text


@given(st.binary(max_size=64), st.sampled_from(["image", "audio"]), st.sampled_from(LANES))
def test_valid_base64_round_trips(raw: bytes, kind: str, lane: str) -> None:
    data = base64.b64encode(raw).decode()
    out = conv({"type": kind, "data": data, "mimeType": "application/octet-stream"}, lane)
    assert base64.b64decode(out["data"]) == raw


SECRET = "Zq7secretZq7"


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.text(max_size=8),
        st.dictionaries(
            st.sampled_from(
                ["type", "text", "data", "uri", "mimeType", "resource", "name", "disposition"]
            ),
            st.one_of(
                st.sampled_from(
                    ["text", "image", "audio", "resource", "resource_link", PNG, "never", "ref"]
                ),
                st.just(f"https://h.example/{SECRET}"),
                st.text(max_size=8),
                st.integers(),
                st.none(),
                st.dictionaries(
                    st.sampled_from(["uri", "text", "blob", "disposition"]),
                    st.sampled_from(["never", f"u:{SECRET}", "t", "AAAA"]),
                ),
            ),
            max_size=6,
        ),
    ),
    st.sampled_from(LANES),
)
def test_any_value_converts_or_raises_content_error(block: Any, lane: str) -> None:
    try:
        out = conv(block, lane)
    except ContentError as exc:
        assert str(exc)
        return
    assert out["type"] in ("text", "image", "audio", "reference")
    if out["type"] == "text":
        assert isinstance(out["text"], str)
    elif out["type"] == "reference":
        assert out["server_id"] == SID
        assert out["provenance"] == stub_provenance(lane, SID)
        assert Claims.from_wire(out["testimony"]).uri == block["uri"]
        assert block["type"] == "resource" or lane == "tool_result" or "disposition" in block
    elif "data" in out:
        assert "disposition" not in block and not isinstance(block.get("uri"), str)
    else:
        assert out == {"type": "image", "uri": block["uri"]}
        assert lane != "tool_result" and "disposition" not in block
    # A uri under a disposition never reaches anything but the (host-private) testimony.
    others = json.dumps({k: v for k, v in block.items() if k != "uri"})
    if "disposition" in block and out["type"] != "reference" and SECRET not in others:
        assert SECRET not in json.dumps(out)
