"""The prose grammar: whole-text splitting, streaming routing, and target resolution."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.prose import (
    MAX_CANDIDATES,
    MODES,
    SKIP,
    ChannelView,
    ProseStreamRouter,
    Segment,
    TargetError,
    resolve_target,
    split_segments,
    target_token,
)

Pairs = list[tuple[str | None, str]]


def merged(pairs: Iterable[tuple[str | None, str]]) -> Pairs:
    out: Pairs = []
    for target, delta in pairs:
        if not delta:
            continue
        if out and out[-1][0] == target:
            out[-1] = (target, out[-1][1] + delta)
        else:
            out.append((target, delta))
    return out


def expected_stream(text: str, mode: str) -> Pairs:
    return merged((s.target, s.body) for s in split_segments(text, mode) if s.body)


def streamed(pieces: Iterable[str], mode: str) -> Pairs:
    router = ProseStreamRouter(mode)
    out: Pairs = []
    for piece in pieces:
        out += router.feed(piece)
    out += router.finish()
    return merged(out)


def seg(target: str | None, body: str, raw: str, continue_turn: bool = False) -> Segment:
    return Segment(target=target, body=body, raw=raw, continue_turn=continue_turn)


# Pieces that make prefixes, modifiers and line starts likely.
GRAMMAR_PIECES = [
    ">",
    ">>",
    ">>>",
    "#",
    "@",
    " ",
    "\t",
    "\n",
    "!",
    " !",
    "a",
    "b",
    "Z",
    "é",
    "\u3000",
    "\r",
    "\x0c",
    "#a",
    "@bob",
    SKIP,
    "lobby:#g",
    "😀",
]
soup = st.lists(st.sampled_from(GRAMMAR_PIECES), max_size=40).map("".join)
# Lines shaped like prefixes, with near misses, so that the grammar is exercised often.
line = st.tuples(
    st.sampled_from([">>", ">>>", ">>", ">>>", "", ">", ">> ", ">>> ", ">>>\t", ">>>>"]),
    st.sampled_from(["", "#a", "@bob", SKIP, "x:#g", "!", ">", "é"]),
    st.sampled_from(["", " ", "\t", " !", " ! ", "\t!\t", " !x", "!", "\r", "\u3000"]),
    st.one_of(st.just(""), soup),
).map("".join)
lines = st.lists(line, max_size=6).map("\n".join)
texts = st.one_of(lines, lines, soup, st.text(max_size=60))
modes = st.sampled_from(MODES)


# --- split_segments: explicit ---------------------------------------------------------------


def test_explicit_prefixes_start_segments() -> None:
    assert split_segments(">>#a hi\n>>@bob there", "explicit") == [
        seg("#a", "hi\n", ">>#a hi\n"),
        seg("@bob", "there", ">>@bob there"),
    ]


def test_text_before_the_first_prefix_is_unprefixed() -> None:
    assert split_segments("hello\nworld\n>>#a x", "explicit") == [
        seg(None, "hello\nworld\n", "hello\nworld\n"),
        seg("#a", "x", ">>#a x"),
    ]


def test_a_space_after_two_brackets_is_body_text() -> None:
    text = ">> quoted\nmore"
    assert split_segments(text, "explicit") == [seg(None, text, text)]


def test_three_brackets_are_not_an_explicit_prefix() -> None:
    text = ">>>#a hi\n>>>b"
    assert split_segments(text, "explicit") == [seg(None, text, text)]


def test_a_prefix_must_start_a_line() -> None:
    text = "say >>#a hi"
    assert split_segments(text, "explicit") == [seg(None, text, text)]


def test_token_is_any_run_of_non_whitespace() -> None:
    assert [s.target for s in split_segments('>>lobby:#general x\n>>"q" y', "explicit")] == [
        "lobby:#general",
        '"q"',
    ]


def test_body_keeps_its_own_spacing() -> None:
    assert split_segments(">>#a \t hi  \n", "explicit") == [seg("#a", "hi  \n", ">>#a \t hi  \n")]


def test_body_starts_on_the_next_line_when_the_prefix_line_is_empty() -> None:
    assert split_segments(">>#a\nhello\n", "explicit") == [seg("#a", "hello\n", ">>#a\nhello\n")]
    # Only one newline belongs to the prefix line.
    assert split_segments(">>#a  \n\nx", "explicit") == [seg("#a", "\nx", ">>#a  \n\nx")]


def test_a_carriage_return_after_the_token_is_body() -> None:
    assert split_segments(">>#a\r\nhi", "explicit") == [seg("#a", "\r\nhi", ">>#a\r\nhi")]


def test_a_prefix_right_after_a_bare_prefix_line() -> None:
    assert split_segments(">>#a\n>>#b hi", "explicit") == [
        seg("#a", "", ">>#a\n"),
        seg("#b", "hi", ">>#b hi"),
    ]


# --- the continue-turn modifier ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "body", "continue_turn"),
    [
        (">>#a ! hi", "hi", True),
        (">>#a\t!\nhi", "hi", True),
        (">>#a !", "", True),
        (">>#a  ! ! x", "! x", True),
        (">>#a !hi", "!hi", False),
        (">>#a hi !", "hi !", False),
        (">>#a", "", False),
    ],
)
def test_modifier(text: str, body: str, continue_turn: bool) -> None:
    [segment] = split_segments(text, "explicit")
    assert (segment.target, segment.body, segment.continue_turn) == ("#a", body, continue_turn)


def test_a_bang_glued_to_the_token_is_part_of_it() -> None:
    [segment] = split_segments(">>#a! hi", "explicit")
    assert (segment.target, segment.body, segment.continue_turn) == ("#a!", "hi", False)


# --- hybrid ------------------------------------------------------------------------------------


def test_hybrid_prefixes() -> None:
    assert split_segments("intro\n>>> #a hi\n>>>@bob ! \nyo", "hybrid") == [
        seg(None, "intro\n", "intro\n"),
        seg("#a", "hi\n", ">>> #a hi\n"),
        seg("@bob", "yo", ">>>@bob ! \nyo", continue_turn=True),
    ]


@pytest.mark.parametrize("text", [">>#a hi", ">>>", ">>>   \nx", ">>> \t", "x >>> #a"])
def test_hybrid_ordinary_text(text: str) -> None:
    assert split_segments(text, "hybrid") == [seg(None, text, text)]


# --- modes without grammar, skip, errors ----------------------------------------------------


@pytest.mark.parametrize("mode", ["locus", "disabled"])
def test_modes_without_grammar_give_one_segment(mode: str) -> None:
    text = ">>#a hi\n>>> #b yo"
    assert split_segments(text, mode) == [seg(None, text, text)]
    assert split_segments("", mode) == []


def test_skip_reply_alone_is_a_segment_with_an_empty_body() -> None:
    assert SKIP == "skip_reply"
    assert split_segments(">>skip_reply", "explicit") == [seg(SKIP, "", ">>skip_reply")]
    assert split_segments(">>> skip_reply\n", "hybrid") == [seg(SKIP, "", ">>> skip_reply\n")]


def test_unknown_mode_is_an_error() -> None:
    with pytest.raises(ValueError, match="bogus"):
        split_segments("hi", "bogus")
    with pytest.raises(ValueError, match="bogus"):
        ProseStreamRouter("bogus")


@given(text=texts, mode=modes)
def test_raw_concatenates_back_to_the_text(text: str, mode: str) -> None:
    segments = split_segments(text, mode)
    assert "".join(s.raw for s in segments) == text
    for index, segment in enumerate(segments):
        assert segment.raw.endswith(segment.body)
        if segment.target is None:
            assert index == 0
            assert segment.body == segment.raw != ""
            assert not segment.continue_turn
        else:
            assert segment.raw.startswith(">>>" if mode == "hybrid" else ">>")
            assert segment.target and not any(c.isspace() for c in segment.target)


# --- the stream router ------------------------------------------------------------------------


def test_router_holds_a_possible_prefix_until_it_is_decided() -> None:
    router = ProseStreamRouter("explicit")
    assert [router.feed(c) for c in ">>#a "] == [[], [], [], [], []]
    assert router.feed("h") == [("#a", "h")]
    assert router.feed("i\n") == [("#a", "i\n")]


def test_router_releases_as_soon_as_a_character_decides() -> None:
    router = ProseStreamRouter("explicit")
    assert router.feed(">") == []
    assert router.feed("x") == [(None, ">x")]
    router = ProseStreamRouter("explicit")
    assert router.feed(">> ") == [(None, ">> ")]
    router = ProseStreamRouter("hybrid")
    assert router.feed(">>#") == [(None, ">>#")]


def test_router_emits_mid_line_text_at_once() -> None:
    router = ProseStreamRouter("explicit")
    assert router.feed("hi >") == [(None, "hi >")]
    assert router.feed(">") == [(None, ">")]


def test_router_finish_decides_what_is_held() -> None:
    router = ProseStreamRouter("explicit")
    assert router.feed("x\n>>") == [(None, "x\n")]
    assert router.finish() == [(None, ">>")]
    router = ProseStreamRouter("explicit")
    assert router.feed(">>skip_reply") == []
    assert router.finish() == []
    assert router.by_target() == {}


def test_router_glued_bang_becomes_body() -> None:
    router = ProseStreamRouter("explicit")
    assert router.feed(">>#a !") == []
    assert router.feed("x") == [("#a", "!x")]


def test_router_without_grammar_passes_text_through() -> None:
    router = ProseStreamRouter("locus")
    assert router.feed(">>#a") == [(None, ">>#a")]
    assert router.finish() == []


def test_router_by_target() -> None:
    router = ProseStreamRouter("explicit")
    router.feed("hi\n>>#a x\n>>#b y\n>>#a z")
    router.finish()
    assert list(router.by_target().items()) == [(None, "hi\n"), ("#a", "x\nz"), ("#b", "y\n")]


TRICKY = [
    ">>#a\n>>#b hi",
    ">>#a !\n>>#b !x\n>>>#c\n>> d\n>>",
    "x\n>>> #a\t!\t\n>>>\n>>>  @b\r\nhi\n>>> >c",
    ">>skip_reply\n\n>>#a  \t\n\nbody\n",
    ">>#a\u3000x\n>>#b\x0c!y",
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("text", TRICKY)
def test_streaming_examples_char_by_char(text: str, mode: str) -> None:
    expected = expected_stream(text, mode)
    assert streamed(list(text), mode) == expected
    assert streamed([text], mode) == expected


def test_router_sees_a_prefix_right_after_a_bare_prefix_line() -> None:
    assert streamed(list(">>#a\n>>#b hi"), "explicit") == [("#b", "hi")]


@settings(max_examples=400)
@given(text=texts, mode=modes, data=st.data())
def test_streaming_in_any_pieces_matches_splitting(
    text: str, mode: str, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    expected = expected_stream(text, mode)
    assert streamed(pieces, mode) == expected
    assert streamed(list(text), mode) == expected


# --- target resolution -----------------------------------------------------------------------

GENERAL_1 = ChannelView(server_id="s1", channel_id="lobby:#general", label="#general", type="chat")
GENERAL_2 = ChannelView(server_id="s2", channel_id="lobby:#general", label="#general", type="chat")
RANDOM = ChannelView(server_id="s1", channel_id="lobby:#random", label="Random", type="chat")
GUILD = ChannelView(server_id="d", channel_id="discord:guild:123", label="builds", type="chat")
ALICE = ChannelView(server_id="d", channel_id="discord:dm:9", label="@Alice", type="dm")
ALICE_ROOM = ChannelView(server_id="d", channel_id="discord:guild:7", label="alice", type="chat")


def test_same_id_on_two_servers_is_ambiguous_until_qualified() -> None:
    channels = [GENERAL_1, GENERAL_2, RANDOM]
    assert resolve_target("lobby:#general", channels) == TargetError(
        token="lobby:#general", reason="ambiguous", candidates=(GENERAL_1, GENERAL_2)
    )
    assert resolve_target("s2/lobby:#general", channels) == GENERAL_2
    assert resolve_target("#general", channels) == TargetError(
        token="#general", reason="ambiguous", candidates=(GENERAL_1, GENERAL_2)
    )


def test_unique_label_case_insensitively() -> None:
    channels = [GENERAL_1, RANDOM, GUILD]
    assert resolve_target("#random", channels) == RANDOM
    assert resolve_target("#RANDOM", channels) == RANDOM
    assert resolve_target("random", channels) == RANDOM
    assert resolve_target("BUILDS", channels) == GUILD


def test_raw_platform_id() -> None:
    channels = [GENERAL_1, GUILD]
    assert resolve_target("123", channels) == GUILD
    assert resolve_target("#general", channels) == GENERAL_1


def test_exact_id_comes_before_labels() -> None:
    by_id = ChannelView(server_id="a", channel_id="general")
    by_label = ChannelView(server_id="b", channel_id="x:1", label="general")
    assert resolve_target("general", [by_label, by_id]) == by_id


def test_raw_id_comes_before_label() -> None:
    by_raw = ChannelView(server_id="a", channel_id="irc:#ops")
    by_label = ChannelView(server_id="b", channel_id="x:1", label="#ops")
    assert resolve_target("#ops", [by_label, by_raw]) == by_raw


def test_dm_by_at_name() -> None:
    channels = [ALICE, ALICE_ROOM, GUILD]
    assert resolve_target("@alice", channels) == ALICE
    assert resolve_target("@ALICE", [ALICE_ROOM, GUILD]) == TargetError(
        token="@ALICE", reason="unknown", candidates=(GUILD, ALICE_ROOM)
    )
    direct = ChannelView(server_id="m", channel_id="m:5", label="bob", type="direct")
    assert resolve_target("@bob", [direct]) == direct


def test_unknown_lists_the_first_channels_in_order() -> None:
    channels = [ChannelView(server_id=f"s{i % 3}", channel_id=f"c{i:02}") for i in range(14)]
    result = resolve_target("nowhere", list(reversed(channels)))
    ordered = sorted(channels, key=lambda v: (v.server_id, v.channel_id))
    assert result == TargetError(
        token="nowhere", reason="unknown", candidates=tuple(ordered[:MAX_CANDIDATES])
    )


@pytest.mark.parametrize("token", ["", "#", "@"])
def test_empty_names_match_no_unlabelled_channel(token: str) -> None:
    bare = ChannelView(server_id="s", channel_id="c")
    result = resolve_target(token, [bare])
    assert isinstance(result, TargetError) and result.reason == "unknown"


def test_target_token_prefers_label_then_id_then_qualified() -> None:
    assert target_token(RANDOM, [GENERAL_1, RANDOM]) == "#Random"
    spaced = ChannelView(server_id="s", channel_id="x:9", label="two words")
    assert target_token(spaced, [spaced, RANDOM]) == "x:9"
    assert target_token(GENERAL_2, [GENERAL_1, GENERAL_2]) == "s2/lobby:#general"


def test_target_token_falls_back_to_the_channel_id() -> None:
    a = ChannelView(server_id="s", channel_id="c")
    b = ChannelView(server_id="t", channel_id="c")
    shadow = ChannelView(server_id="u", channel_id="s/c")
    assert target_token(a, [a, b, shadow]) == "c"


WORD = st.text(alphabet="aAbB#@:/1 ", max_size=6)
SLASHLESS = st.text(alphabet="aAbB#@:1", max_size=5)


def channel_views(ids: st.SearchStrategy[str]) -> st.SearchStrategy[ChannelView]:
    return st.builds(
        ChannelView,
        server_id=ids,
        channel_id=ids,
        label=WORD,
        type=st.sampled_from(["chat", "dm", "direct", ""]),
    )


def unique_channels(ids: st.SearchStrategy[str]) -> st.SearchStrategy[list[ChannelView]]:
    return st.lists(
        channel_views(ids), min_size=1, max_size=12, unique_by=lambda v: (v.server_id, v.channel_id)
    )


@settings(max_examples=200)
@given(channels=unique_channels(SLASHLESS))
def test_target_token_round_trips(channels: list[ChannelView]) -> None:
    for view in channels:
        token = target_token(view, channels)
        if not any(c.isspace() for c in token):
            assert resolve_target(token, channels) == view


def tokens_for(channels: list[ChannelView]) -> st.SearchStrategy[str]:
    derived = [
        s
        for v in channels
        for s in (v.channel_id, v.label, f"#{v.label}", f"@{v.label}", v.channel_id[-2:])
    ]
    return st.one_of(st.sampled_from(derived), WORD)


@settings(max_examples=200)
@given(data=st.data())
def test_resolution_only_returns_matching_listed_channels(data: st.DataObject) -> None:
    channels = data.draw(st.lists(channel_views(WORD), min_size=1, max_size=12))
    token = data.draw(tokens_for(channels))
    result = resolve_target(token, channels)
    assert resolve_target(token, data.draw(st.permutations(channels))) == result
    if isinstance(result, ChannelView):
        assert result in channels
        assert resolve_target(token, [result]) == result
    else:
        assert result.token == token
        assert len(result.candidates) <= MAX_CANDIDATES
        assert set(result.candidates) <= set(channels)
        if result.reason == "ambiguous":
            assert len(set(result.candidates)) >= 2
            for candidate in result.candidates:
                assert resolve_target(token, [candidate]) == candidate
        else:
            assert result.reason == "unknown"
            assert all(isinstance(resolve_target(token, [v]), TargetError) for v in channels)
