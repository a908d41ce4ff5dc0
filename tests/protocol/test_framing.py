"""``LineBuffer``: newline framing with a per-line cap, chunking invariance, EOF handling."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.framing import LineBuffer, Oversize, Undecodable, encode_line

CAP = 16


def feed(chunks: list[bytes], cap: int = CAP, eof: bool = True) -> list[object]:
    buf = LineBuffer(cap)
    out: list[object] = []
    for chunk in chunks:
        assert chunk, "an empty chunk means EOF"
        out.extend(buf.receive_data(chunk))
        assert buf.buffered <= cap
    if eof:
        out.extend(buf.receive_data(b""))
        assert buf.buffered == 0
    return out


def reference(stream: bytes, cap: int) -> list[object]:
    """What the framing promises, written the slow way: split on LF, then judge each line."""
    out: list[object] = []
    for raw in stream.split(b"\n"):
        if len(raw) > cap:
            out.append(Oversize(len(raw)))
            continue
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not raw.strip():
            continue
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(Undecodable(len(raw)))
    return out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


# Bytes that make every interesting case likely: newlines, CR, blanks, invalid UTF-8, multibyte.
_byte_soup = st.lists(
    st.sampled_from([b"\n", b"\r", b" ", b"a", b"{", b"\xff", b"\xc3", b"\xa9", b"\xe2\x82\xac"]),
    max_size=80,
).map(b"".join)
streams = st.one_of(_byte_soup, st.binary(max_size=200))


@given(streams, st.lists(st.integers(min_value=0, max_value=200), max_size=20))
def test_any_chunking_gives_the_same_lines_as_feeding_whole(data: bytes, cuts: list[int]) -> None:
    whole = feed([data] if data else [])
    assert feed(split_at(data, cuts)) == whole


@given(streams)
def test_lines_match_the_reference_framing(data: bytes) -> None:
    assert feed([data] if data else []) == reference(data, CAP)


@given(streams)
def test_byte_at_a_time_matches_the_reference(data: bytes) -> None:
    assert feed([data[i : i + 1] for i in range(len(data))]) == reference(data, CAP)


@given(st.lists(st.binary(min_size=1, max_size=64), max_size=30), st.integers(1, 40))
def test_arbitrary_bytes_never_raise_and_yield_only_framed_items(
    chunks: list[bytes], cap: int
) -> None:
    for item in feed(chunks, cap=cap):
        if isinstance(item, str):
            assert "\n" not in item
            assert len(item.encode("utf-8")) <= cap
        elif isinstance(item, Oversize):
            assert item.size > cap
        else:
            assert isinstance(item, Undecodable)
            assert 0 < item.size <= cap


def test_blank_lines_are_skipped_and_crlf_is_stripped() -> None:
    data = b'{"a":1}\r\n\r\n\n \t \n  x  \r\nlast\n'
    assert feed([data]) == ['{"a":1}', "  x  ", "last"]


def test_only_one_trailing_cr_is_stripped() -> None:
    assert feed([b"a\r\r\n", b"b\rc\n"]) == ["a\r", "b\rc"]


def test_crlf_split_between_chunks() -> None:
    assert feed([b"abc\r", b"\n", b"def\r"], eof=True) == ["abc", "def"]


def test_line_exactly_at_the_cap_is_kept_and_one_past_is_oversize() -> None:
    assert feed([b"x" * CAP + b"\n"]) == ["x" * CAP]
    assert feed([b"x" * (CAP + 1) + b"\n"]) == [Oversize(CAP + 1)]


def test_oversize_line_is_one_marker_and_following_lines_still_arrive() -> None:
    big = b"y" * (CAP * 10)
    data = b"before\n" + big + b"\nafter\n"
    expected = ["before", Oversize(len(big)), "after"]
    assert feed([data]) == expected
    # streamed a byte at a time, the buffer never holds more than the cap
    assert feed([data[i : i + 1] for i in range(len(data))]) == expected


def test_oversize_memory_stays_bounded_while_the_line_streams() -> None:
    buf = LineBuffer(CAP)
    for _ in range(1000):
        assert buf.receive_data(b"z" * 7) == []
        assert buf.buffered <= CAP
    assert buf.receive_data(b"\nok\n") == [Oversize(7000), "ok"]
    assert buf.buffered == 0


def test_eof_mid_line_returns_the_partial_line() -> None:
    buf = LineBuffer(CAP)
    assert buf.receive_data(b"one\ntw") == ["one"]
    assert buf.buffered == 2
    assert buf.receive_data(b"o") == []
    assert buf.receive_data(b"") == ["two"]
    assert buf.buffered == 0


def test_eof_mid_oversize_line_returns_one_oversize() -> None:
    buf = LineBuffer(CAP)
    assert buf.receive_data(b"q" * (CAP + 5)) == []
    assert buf.receive_data(b"") == [Oversize(CAP + 5)]


def test_eof_with_a_blank_partial_line_returns_nothing() -> None:
    assert feed([b"a\n  \r"]) == ["a"]


def test_invalid_utf8_is_undecodable_and_the_next_line_arrives() -> None:
    assert feed([b"\xff\xfeab\n", b"ok\n"]) == [Undecodable(4), "ok"]


def test_multibyte_character_split_across_chunks_decodes() -> None:
    data = "é€😀\n".encode()
    assert feed([data[i : i + 1] for i in range(len(data))]) == ["é€😀"]


def test_truncated_multibyte_character_at_eof_is_undecodable() -> None:
    assert feed([b"ok\n\xe2\x82"]) == ["ok", Undecodable(2)]


@pytest.mark.parametrize("cap", [0, -1])
def test_cap_must_be_positive(cap: int) -> None:
    with pytest.raises(ValueError):
        LineBuffer(cap)


_line_text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\n\r"), min_size=1
).filter(lambda t: t.encode("utf-8").strip() != b"")


@given(st.lists(_line_text, max_size=10))
def test_encode_line_round_trips_through_the_buffer(texts: list[str]) -> None:
    data = b"".join(encode_line(t) for t in texts)
    assert all(encode_line(t).count(b"\n") == 1 for t in texts)
    assert feed([data] if data else [], cap=10_000) == texts
