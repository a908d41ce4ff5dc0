"""``Grant.allows`` remembers its answers: the same as matching afresh, every time."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from protocol.grants import matches_any
from protocol.mcpl import VOCABULARY
from protocol.server_session import ALLOWS_MEMO, Grant

paths = st.sampled_from(sorted(VOCABULARY))
patterns = st.one_of(paths, paths.map(lambda p: p.split(".")[0] + ".*"), st.just("*"))


@given(granted=st.frozensets(patterns, max_size=6), asked=st.lists(paths, max_size=30))
def test_allows_answers_as_matching_does_however_often_asked(
    granted: frozenset[str], asked: list[str]
) -> None:
    grant = Grant(capabilities=granted, received=True)
    for path in asked + asked:
        assert grant.allows(path) == matches_any(granted, path)
    narrowed = attrs.evolve(grant, capabilities=frozenset())
    assert not any(narrowed.allows(path) for path in asked)
    assert narrowed == Grant(received=True)  # what it remembers is not part of its value


def test_past_the_memo_cap_it_still_answers() -> None:
    grant = Grant(capabilities=frozenset({"x.*"}), received=True)
    asked = [f"x.{i}" for i in range(ALLOWS_MEMO + 10)] + ["y"]
    assert [grant.allows(p) for p in asked] == [True] * (ALLOWS_MEMO + 10) + [False]
