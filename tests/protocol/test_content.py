"""Content blocks: validation and the stored form every lane shares."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.content import (
    MAX_TEXT_CHARS,
    ContentError,
    convert_block,
    convert_blocks,
    text_of,
)

SID = "srv"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n\x00\x00").decode()


def conv(block: Any) -> dict[str, Any]:
    return convert_block(block, SID, "push")


def test_text_block() -> None:
    assert conv({"type": "text", "text": "hi", "annotations": {"x": 1}}) == {
        "type": "text",
        "text": "hi",
    }
    assert conv({"type": "text", "text": ""}) == {"type": "text", "text": ""}
    assert conv("plain") == {"type": "text", "text": "plain"}


def test_text_at_and_past_the_limit() -> None:
    assert conv({"type": "text", "text": "x" * MAX_TEXT_CHARS})["text"] == "x" * MAX_TEXT_CHARS
    with pytest.raises(ContentError, match="over"):
        conv({"type": "text", "text": "x" * (MAX_TEXT_CHARS + 1)})


@pytest.mark.parametrize("text", [None, 5, ["a"], {"t": "a"}])
def test_text_block_needs_a_string(text: Any) -> None:
    with pytest.raises(ContentError, match="text"):
        conv({"type": "text", "text": text})
    with pytest.raises(ContentError, match="text"):
        conv({"type": "text"})


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_base64_media(kind: str) -> None:
    block = {"type": kind, "data": PNG, "mimeType": "image/png", "extra": True}
    assert conv(block) == {"type": kind, "data": PNG, "mimeType": "image/png"}


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_uri_media_keeps_only_reference_fields(kind: str) -> None:
    block = {
        "type": kind,
        "uri": "https://example.org/a.png",
        "mimeType": "image/png",
        "sizeBytes": 10,
        "digest": "sha256:abc",
        "expiresAt": "2030-01-01T00:00:00Z",
        "name": "a.png",
        "disposition": "inline",
        "secret": "dropped",
        "annotations": {"x": 1},
    }
    out = conv(block)
    assert out == {k: v for k, v in block.items() if k not in ("secret", "annotations")}


def test_reference_fields_of_the_wrong_type_are_dropped() -> None:
    out = conv({"type": "image", "uri": "u:1", "sizeBytes": True, "name": ["x"], "digest": None})
    assert out == {"type": "image", "uri": "u:1"}


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


@pytest.mark.parametrize("uri", [None, "", 5])
def test_media_without_data_needs_a_uri(uri: Any) -> None:
    block: dict[str, Any] = {"type": "image"}
    if uri is not None:
        block["uri"] = uri
    with pytest.raises(ContentError, match="uri"):
        conv(block)


def test_mcpl_resource() -> None:
    block = {"type": "resource", "uri": "mcpl://x/y", "mimeType": "text/plain", "name": "y"}
    assert conv(block) == block


def test_resource_link_is_the_old_name_of_resource() -> None:
    assert conv({"type": "resource_link", "uri": "file:///a", "name": "a"}) == {
        "type": "resource",
        "uri": "file:///a",
        "name": "a",
    }
    with pytest.raises(ContentError, match="uri"):
        conv({"type": "resource_link"})


def test_mcp_embedded_text_resource_becomes_labelled_text() -> None:
    block = {"type": "resource", "resource": {"uri": "file:///n.txt", "text": "body"}}
    assert conv(block) == {"type": "text", "text": "[resource file:///n.txt]\nbody"}
    unlabelled = {"type": "resource", "resource": {"text": "body"}}
    assert conv(unlabelled) == {"type": "text", "text": "body"}


def test_mcp_embedded_blob_resource_becomes_a_reference() -> None:
    block = {
        "type": "resource",
        "resource": {"uri": "file:///a.bin", "blob": "AAAA", "mimeType": "application/x"},
    }
    assert conv(block) == {"type": "resource", "uri": "file:///a.bin", "mimeType": "application/x"}
    with pytest.raises(ContentError, match="uri"):
        conv({"type": "resource", "resource": {"blob": "AAAA"}})


def test_mcpl_resource_with_an_extra_resource_member_uses_its_own_uri() -> None:
    block = {"type": "resource", "uri": "mcpl://top", "resource": {"uri": "x", "text": "t"}}
    assert conv(block) == {"type": "resource", "uri": "mcpl://top"}


@pytest.mark.parametrize("block", [None, 5, 1.5, True, ["text"], b"x"])
def test_non_object_block_is_refused(block: Any) -> None:
    with pytest.raises(ContentError, match="object"):
        conv(block)


@pytest.mark.parametrize("kind", ["video", None, 5, "", "Text", ["text"]])
def test_unknown_type_is_refused_naming_it_and_the_server(kind: Any) -> None:
    with pytest.raises(ContentError) as info:
        convert_block({"type": kind, "text": "x"}, "weather", "incoming")
    message = str(info.value)
    assert repr(kind) in message
    assert "weather" in message
    assert "incoming" in message


def test_missing_type_is_refused() -> None:
    with pytest.raises(ContentError, match="None"):
        conv({"text": "x"})


@pytest.mark.parametrize("server", ["", None])
def test_the_server_is_required(server: Any) -> None:
    with pytest.raises(ContentError, match="server"):
        convert_block({"type": "text", "text": "x"}, server, "push")
    with pytest.raises(ContentError, match="server"):
        convert_blocks([{"type": "text", "text": "x"}], server, "push")
    with pytest.raises(ContentError, match="server"):
        convert_blocks("x", server, "push")


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
        convert_blocks([{"type": "text", "text": "a"}, {"type": "nope"}], SID, "push")


def test_text_of() -> None:
    blocks = [
        {"type": "text", "text": "a"},
        {"type": "image", "uri": "u:1"},
        {"type": "text", "text": "b"},
    ]
    assert text_of(blocks) == "a\nb"
    assert text_of([]) == ""


@given(st.text(max_size=200))
def test_text_blocks_round_trip_exactly(text: str) -> None:
    block = {"type": "text", "text": text}
    assert conv(block) == block
    assert conv(text) == block
    assert text_of([conv(block)]) == text


@given(st.binary(max_size=64), st.sampled_from(["image", "audio"]))
def test_valid_base64_round_trips(raw: bytes, kind: str) -> None:
    data = base64.b64encode(raw).decode()
    out = conv({"type": kind, "data": data, "mimeType": "application/octet-stream"})
    assert base64.b64decode(out["data"]) == raw


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.text(max_size=8),
        st.dictionaries(
            st.sampled_from(["type", "text", "data", "uri", "mimeType", "resource", "name"]),
            st.one_of(
                st.sampled_from(["text", "image", "audio", "resource", "resource_link", PNG]),
                st.text(max_size=8),
                st.integers(),
                st.none(),
                st.dictionaries(st.sampled_from(["uri", "text", "blob"]), st.text(max_size=5)),
            ),
            max_size=5,
        ),
    )
)
def test_any_value_converts_or_raises_content_error(block: Any) -> None:
    try:
        out = conv(block)
    except ContentError as exc:
        assert str(exc)
        return
    assert out["type"] in ("text", "image", "audio", "resource")
    if out["type"] == "text":
        assert isinstance(out["text"], str)
    elif "data" not in out:
        assert isinstance(out["uri"], str) and out["uri"]
