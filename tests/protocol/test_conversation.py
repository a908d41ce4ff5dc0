"""The one ``conversationId`` of an agent's conversation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocol.conversation import conversation_id

names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}", fullmatch=True)


@given(names, names)
def test_one_value_per_agent_and_distinct_agents_differ(a: str, b: str) -> None:
    assert conversation_id(a) == conversation_id(a) == f"agent:{a}"
    assert (conversation_id(a) == conversation_id(b)) is (a == b)
