"""Event tags: validation and the normative ``chat:*`` closure."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.tags import MAX_TAG_LENGTH, MAX_TAGS, expand_tags, is_addressed, valid_tag

AMBIENT = "chat:ambient"
ADDRESSED = "chat:addressed"
PRIVATE = "chat:private"


def expanded(*tags: object) -> tuple[str, ...]:
    return expand_tags(tags)[0]


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        (["chat:mention"], ["chat:addressed", "chat:mention"]),
        (["chat:reply"], ["chat:addressed", "chat:reply"]),
        (["chat:dm"], ["chat:addressed", "chat:dm", "chat:private"]),
        (["chat:ambient"], ["chat:ambient"]),
        (["chat:ambient", "chat:mention"], ["chat:addressed", "chat:mention"]),
        (["chat:ambient", "chat:addressed"], ["chat:addressed"]),
        (
            ["chat:dm", "chat:ambient", "chat:group"],
            ["chat:addressed", "chat:dm", "chat:group", "chat:private"],
        ),
        (["chat:private", "chat:ambient"], ["chat:ambient", "chat:private"]),
        (["chat:broadcast", "chat:from-human"], ["chat:broadcast", "chat:from-human"]),
        ([], []),
    ],
)
def test_core_closure(tags: list[str], expected: list[str]) -> None:
    result, refused = expand_tags(tags)
    assert result == tuple(expected)
    assert refused == ()


def test_producer_tags_imply_nothing() -> None:
    # Only the core closure applies; look-alike tags in other namespaces are left as they are.
    assert expanded("discord:mention", "chatx:dm", "Chat:dm") == (
        "Chat:dm",
        "chatx:dm",
        "discord:mention",
    )


@pytest.mark.parametrize(
    "tag",
    [
        "chat:addressed",
        "discord:role=admin",
        "a:b",
        "x.y-z_1:v:w",
        "0:é",
        "ns:key=",
        "n:" + "v" * (MAX_TAG_LENGTH - 2),
    ],
)
def test_valid_tags(tag: str) -> None:
    assert valid_tag(tag)
    assert expand_tags([tag]) == ((tag,), ())


@pytest.mark.parametrize(
    "tag",
    [
        "addressed",
        ":addressed",
        "chat:",
        "chat: x",
        "chat:a b",
        "chat:a\tb",
        "chat:a\n",
        "ch at:x",
        "-ns:x",
        "_ns:x",
        "ñ:x",
        "",
        "n:" + "v" * (MAX_TAG_LENGTH - 1),
        None,
        5,
        True,
        ["chat:dm"],
        {"chat": "dm"},
    ],
)
def test_invalid_tags_are_refused(tag: Any) -> None:
    assert not valid_tag(tag)
    result, refused = expand_tags([tag, "chat:dm"])
    assert result == ("chat:addressed", "chat:dm", "chat:private")
    assert refused == (str(tag)[:MAX_TAG_LENGTH],)


def test_cap_on_kept_tags() -> None:
    tags = [f"t:{i:03d}" for i in range(MAX_TAGS + 5)]
    result, refused = expand_tags(tags)
    assert result == tuple(tags[:MAX_TAGS])
    assert refused == tuple(tags[MAX_TAGS:])
    at_cap, none_refused = expand_tags(tags[:MAX_TAGS])
    assert len(at_cap) == MAX_TAGS
    assert none_refused == ()


def test_duplicates_do_not_count_against_the_cap() -> None:
    tags = ["t:same"] * (MAX_TAGS * 2) + ["t:other"]
    assert expand_tags(tags) == (("t:other", "t:same"), ())


def test_a_repeat_of_a_kept_tag_after_the_cap_is_not_reported_as_refused() -> None:
    tags = [f"t:{i:03d}" for i in range(MAX_TAGS)]
    result, refused = expand_tags([*tags, tags[0], "t:late"])
    assert result == tuple(tags)
    assert refused == ("t:late",)


def test_is_addressed() -> None:
    assert is_addressed(["chat:addressed"])
    assert is_addressed(["x:y", "chat:mention"])
    assert not is_addressed(["chat:dm"])  # expand first: the closure adds chat:addressed
    assert is_addressed(expanded("chat:dm"))
    assert not is_addressed(["chat:ambient", "chat:private"])
    assert not is_addressed([])


# --- properties -------------------------------------------------------------------------------

_core = st.sampled_from(
    [
        "chat:mention",
        "chat:reply",
        "chat:dm",
        "chat:ambient",
        "chat:addressed",
        "chat:private",
        "chat:group",
        "mcpl:x",
    ]
)
_namespaced = st.builds(
    lambda ns, value: f"{ns}:{value}",
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,6}", fullmatch=True),
    st.text(st.characters(exclude_categories=("Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=8),
)
_anything = st.one_of(st.text(max_size=10), st.integers(), st.none(), st.booleans())
tag_lists = st.lists(st.one_of(_core, _namespaced, _anything), max_size=80)


def _closure(tags: set[str]) -> set[str]:
    out = set(tags)
    if "chat:mention" in out or "chat:reply" in out or "chat:dm" in out:
        out.add(ADDRESSED)
    if "chat:dm" in out:
        out.add(PRIVATE)
    if ADDRESSED in out:
        out.discard(AMBIENT)
    return out


@given(tag_lists)
def test_expansion_is_idempotent(tags: list[object]) -> None:
    once, _ = expand_tags(tags)
    twice, refused = expand_tags(once)
    assert twice == once
    assert refused == ()


@given(tag_lists)
def test_output_is_sorted_unique_valid_and_covers_every_kept_input(tags: list[object]) -> None:
    result, refused = expand_tags(tags)
    assert list(result) == sorted(set(result))
    assert all(valid_tag(t) for t in result)
    kept: list[str] = []
    dropped: list[str] = []
    for tag in tags:
        if valid_tag(tag) and tag not in kept and len(kept) < MAX_TAGS:
            assert isinstance(tag, str)
            kept.append(tag)
        elif not (valid_tag(tag) and tag in kept):
            dropped.append(str(tag)[:MAX_TAG_LENGTH])
    assert list(refused) == dropped
    assert set(result) == _closure(set(kept))
    assert set(kept) - {AMBIENT} <= set(result)
    assert len(set(result) & set(kept)) <= MAX_TAGS
    assert len(result) <= MAX_TAGS + 2  # the closure adds at most addressed and private


@given(tag_lists)
def test_every_invalid_input_is_refused(tags: list[object]) -> None:
    _, refused = expand_tags(tags)
    invalid = [str(t)[:MAX_TAG_LENGTH] for t in tags if not valid_tag(t)]
    assert [r for r in refused if r in invalid] == invalid
    assert len(refused) <= len(tags)


@given(tag_lists)
def test_closure_rules_hold_on_the_output(tags: list[object]) -> None:
    result = set(expand_tags(tags)[0])
    if result & {"chat:mention", "chat:reply", "chat:dm"}:
        assert ADDRESSED in result
    if "chat:dm" in result:
        assert PRIVATE in result
    if ADDRESSED in result:
        assert AMBIENT not in result


@given(st.lists(st.text(max_size=12), max_size=10))
def test_tags_without_a_namespace_are_refused(values: list[str]) -> None:
    plain = [v for v in values if ":" not in v]
    result, refused = expand_tags(plain)
    assert result == ()
    assert list(refused) == plain


@given(st.text(min_size=1, max_size=10), st.text(min_size=1, max_size=10))
def test_whitespace_anywhere_is_refused(head: str, tail: str) -> None:
    for space in (" ", "\t", "\n", "\u00a0", "\u2003"):
        assert not valid_tag(f"ns:{head}{space}{tail}")
