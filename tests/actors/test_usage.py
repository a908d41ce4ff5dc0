"""Token usage, retry notices and the merge of two drains: pure pieces, property-tested."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.agent.wakes import merge_drained
from actors.messages import Wake
from actors.models.base import USAGE_KEYS, ModelRetry, Usage
from protocol.gate import MAX_CONVERSATIONS, Drained

counts = st.integers(0, 10**9)
usages = st.builds(
    Usage,
    input_tokens=counts,
    output_tokens=counts,
    cache_read_input_tokens=counts,
    cache_creation_input_tokens=counts,
)


@given(usages)
def test_usage_reads_back_what_it_writes(u: Usage) -> None:
    assert Usage.of(u.as_dict()) == u
    assert list(u.as_dict()) == list(USAGE_KEYS)


@given(usages, usages, usages)
def test_usage_adds_per_key_and_in_any_order(a: Usage, b: Usage, c: Usage) -> None:
    total = a + b + c
    for key in USAGE_KEYS:
        assert total.as_dict()[key] == a.as_dict()[key] + b.as_dict()[key] + c.as_dict()[key]
    assert (a + b) + c == a + (b + c) == c + b + a
    assert a + Usage() == a


@given(
    st.dictionaries(
        st.sampled_from([*USAGE_KEYS, "server_tool_use", "other"]),
        st.one_of(st.integers(-5, 50), st.booleans(), st.none(), st.text(max_size=3)),
    )
)
def test_usage_counts_only_what_is_a_count(reported: dict[str, Any]) -> None:
    u = Usage.of(reported)
    for key in USAGE_KEYS:
        value = reported.get(key)
        good = isinstance(value, int) and not isinstance(value, bool) and value > 0
        assert u.as_dict()[key] == (value if good else 0)


def test_usage_describes_the_cache_only_when_used() -> None:
    assert Usage(input_tokens=1204, output_tokens=87).describe() == "1,204 in, 87 out"
    assert (
        Usage(input_tokens=3, output_tokens=4, cache_read_input_tokens=1000).describe()
        == "3 in, 4 out, cache 1,000 read, 0 written"
    )


def test_retry_line() -> None:
    def line(wait_s: float) -> str:
        failure = "overloaded (529)"
        return ModelRetry(
            provider="anthropic", failure=failure, attempt=2, retries=4, wait_s=wait_s
        ).line

    assert line(1.234) == "anthropic: overloaded (529), retry 2/4 in 1.2s"
    assert line(12.4) == "anthropic: overloaded (529), retry 2/4 in 12s"


conversations = st.tuples(st.sampled_from("ab"), st.text("xyz", min_size=1, max_size=3), st.none())
drains = st.builds(
    Drained,
    items=st.lists(st.builds(Wake, lane=st.just("local"), count=st.integers(1, 3)), max_size=5).map(
        tuple
    ),
    dropped=st.integers(0, 50),
    evicted=st.frozensets(conversations, max_size=MAX_CONVERSATIONS),
    overflow=st.booleans(),
)


@given(drains, drains)
def test_merged_drain_keeps_both_in_order(older: Drained[Wake], newer: Drained[Wake]) -> None:
    merged = merge_drained(older, newer)
    assert merged.items == older.items + newer.items
    assert merged.dropped == older.dropped + newer.dropped
    joined = older.evicted | newer.evicted
    if older.overflow or newer.overflow or len(joined) > MAX_CONVERSATIONS:
        assert merged.overflow and merged.evicted == frozenset()
    else:
        assert not merged.overflow and merged.evicted == joined
