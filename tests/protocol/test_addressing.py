"""Whether an item addresses an agent: whole-word, case-insensitive mentions of its names,
replies to its messages, server tags and direct channels; and the community gate preset."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from protocol.addressing import _pattern, addresses, is_direct, mentions
from protocol.gate import COMMUNITY_GATE_TOML, Gate, GateEvent, parse_gate, preset

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-.", min_size=1)
NAME = st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,11}", fullmatch=True)
SEPARATORS = st.sampled_from([" ", ", ", "! ", "? ", "\n", "(", ")", ": ", "'s "])
PROSE = st.text(alphabet="xyz ,.!?\n", max_size=40)


@given(NAME, PROSE, PROSE, SEPARATORS, st.booleans())
def test_a_name_as_a_whole_word_is_a_mention_in_any_case(
    name: str, before: str, after: str, sep: str, at: bool
) -> None:
    cased = "".join(c.upper() if i % 2 else c.lower() for i, c in enumerate(name))
    text = f"{before} {'@' if at else ''}{cased}{sep}{after}"
    assert mentions(text, (name,))


@given(NAME, st.from_regex(r"[A-Za-z0-9_]{1,5}", fullmatch=True), PROSE)
def test_a_name_inside_another_word_is_no_mention(name: str, glue: str, prose: str) -> None:
    text = f"{prose} {glue}{name}{glue} {prose}"
    if not mentions(prose, (name,)):
        assert not mentions(text, (name,))
        assert not mentions(f"{prose} {name}{glue}", (name,))
        assert not mentions(f"{prose} {glue}{name}", (name,))


@given(st.lists(NAME, min_size=1, max_size=4), st.integers(0, 3))
def test_any_alias_is_a_mention(names: list[str], pick: int) -> None:
    alias = names[pick % len(names)]
    assert mentions(f"hey @{alias.upper()}!", names)


def test_examples() -> None:
    assert mentions("@ada are you around?", ("Ada",))
    assert mentions("thanks, ADA.", ("Ada",))
    assert mentions("ask ada-bot", ("ada-bot",))
    assert not mentions("Adam and nevada", ("Ada",))
    assert not mentions("ada_bot", ("Ada",))
    assert not mentions("anything", ())
    assert not mentions("anything", ("  ",))


@given(NAMES)
def test_no_names_never_match_and_blank_names_are_ignored(text: str) -> None:
    assert not mentions(text, ())
    assert not mentions(text, ("", " "))


def test_adversarial_text_is_read_by_a_pattern_without_repetition() -> None:
    # linear by construction: the names are escaped literals between lookarounds, with no
    # repetition a crafted text could make backtrack (speed itself is not asserted here)
    names = ("a" * 60 + "b", "aaaa", "a-a-a", "x+y*", "(?:z)")
    assert not mentions("a" * 200_000, names)
    assert mentions("a" * 100 + " x+y* " + "a" * 100, names)
    pattern = _pattern(tuple(names))
    assert pattern is not None
    body = pattern.pattern.removeprefix(r"(?<!\w)(?:").removesuffix(r")(?!\w)")
    assert all(re.escape(re.sub(r"\\(.)", r"\1", w)) == w for w in body.split("|"))


def test_what_addresses_an_agent() -> None:
    assert addresses((), agent="Ada", text="hi @Ada")
    assert addresses(("Lovelace",), agent="Ada", text="Lovelace, a question")
    assert addresses((), agent="Ada", replies_to=frozenset({"Ada"}))
    assert not addresses((), agent="Ada", replies_to=frozenset({"Grace"}))
    assert addresses((), agent="Ada", tags=("chat:addressed",))
    assert addresses((), agent="Ada", direct=True)
    assert not addresses(("Lovelace",), agent="Ada", text="Grace, a question")
    assert is_direct("dm") and is_direct("Direct") and not is_direct("text") and not is_direct(None)


def _event(kind: str = "incoming", addressed: bool = False) -> GateEvent:
    return GateEvent(kind=kind, server_id="s", channel_id="c", metadata={"addressed": addressed})


def test_the_community_preset_wakes_on_pushes_and_what_addresses_the_agent() -> None:
    config = preset("community")
    assert config is not None and config == parse_gate(COMMUNITY_GATE_TOML, "toml")
    assert preset("nothing such") is None
    gate = Gate(config)
    assert gate.decide(_event("push"), 0.0).wake
    assert gate.decide(_event(addressed=True), 0.0).wake
    chatter = gate.decide(_event(), 0.0)
    assert not chatter.wake and chatter.behavior == "default"


def test_a_server_tag_naming_another_agent_of_the_host_is_theirs() -> None:
    tags = ("chat:addressed", "chat:mention")

    def grace(text: str) -> bool:
        return addresses((), agent="Grace", text=text, tags=tags, others=("Ada",))

    assert not grace("@Ada are you around?")
    assert grace("@Ada and @Grace, hi")
    assert grace("are you around?")
    dm = ("chat:addressed", "chat:dm")
    assert addresses((), agent="Grace", text="tell Ada hi", tags=dm, others=("Ada",))


def test_the_community_preset_lets_ambient_pushes_sleep() -> None:
    config = preset("community")
    assert config is not None
    ambient = GateEvent(kind="push", server_id="s", tags=("chat:ambient",))
    assert not Gate(config).decide(ambient, 0.0).wake
