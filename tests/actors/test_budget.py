"""The context budget: oldest whole units go first; a tool call never loses its results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.agent.actor import ContextTail, estimate_tokens, fit_budget


def text(role: str, size: int = 0, tag: str = "") -> dict[str, Any]:
    return {"role": role, "blocks": [{"type": "text", "text": tag + "x" * size}], "tag": tag}


def call(size: int = 0, tag: str = "") -> dict[str, Any]:
    use = {"type": "tool_use", "id": tag or "c", "name": "t", "input": {"q": "x" * size}}
    return {"role": "assistant", "blocks": [use], "tag": tag}


def result(size: int = 0, tag: str = "") -> dict[str, Any]:
    res = {"type": "tool_result", "tool_use_id": "c", "content": "x" * size, "is_error": False}
    return {"role": "tool", "blocks": [res], "tag": tag}


def tags(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [m["tag"] for m in messages]


def cost(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(estimate_tokens(m) for m in messages)


# -- estimate_tokens --------------------------------------------------------------------------


def test_estimate_tokens_rule():
    assert estimate_tokens({"role": "user", "blocks": []}) == 8
    assert estimate_tokens(text("user", 400)) == 8 + 400 // 4 + 1
    assert estimate_tokens({"role": "user", "blocks": [{"type": "image"}]}) == 8 + 400
    assert estimate_tokens(call(4000)) > estimate_tokens(call(0)) + 900


def test_a_rendered_message_carries_its_own_count():
    cached = {**text("user", 4000), "tokens": 3}
    assert estimate_tokens(cached) == 3
    history = [{**text("user", 0, "u1"), "tokens": 50}, {**text("user", 4000, "u2"), "tokens": 5}]
    assert tags(fit_budget(history, 55)) == ["u1", "u2"]
    assert tags(fit_budget(history, 54)) == ["u2"]


@given(st.text(), st.text())
def test_estimate_tokens_grows_with_text(a: str, b: str):
    one = {"role": "user", "blocks": [{"type": "text", "text": a}]}
    both = {"role": "user", "blocks": [{"type": "text", "text": a + b}]}
    assert 8 < estimate_tokens(one) <= estimate_tokens(both)


# -- fit_budget: examples ---------------------------------------------------------------------


def test_everything_within_budget_is_kept():
    history = [
        text("user", tag="u1"),
        call(tag="a1"),
        result(tag="t1"),
        text("assistant", tag="a2"),
    ]
    assert fit_budget(history, cost(history)) == history


def test_the_oldest_units_go_first():
    history = [text("user", 40, "u1"), text("assistant", 40, "a1"), text("user", 40, "u2")]
    kept = fit_budget(history, cost(history[1:]))
    assert tags(kept) == ["a1", "u2"]
    assert tags(fit_budget(history, cost(history[1:]) - 1)) == ["u2"]


def test_a_tool_call_and_its_results_go_together():
    history = [
        text("user", 0, "u1"),
        call(100, "a1"),
        result(0, "t1"),
        result(0, "t2"),
        text("user", 0, "u2"),
    ]
    # Room for the two results and the newest message, not for the call: all three go.
    kept = fit_budget(history, cost(history[2:]))
    assert tags(kept) == ["u2"]
    kept = fit_budget(history, cost(history[1:]))
    assert tags(kept) == ["a1", "t1", "t2", "u2"]


def test_the_newest_unit_is_kept_even_when_it_alone_is_over_budget():
    history = [text("user", 10, "u1"), call(1000, "a1"), result(1000, "t1"), result(0, "t2")]
    assert tags(fit_budget(history, 1)) == ["a1", "t1", "t2"]
    assert tags(fit_budget([text("user", 1000, "u")], 0)) == ["u"]


def test_a_tool_message_without_its_call_is_a_unit_of_its_own():
    history = [text("user", 0, "u1"), result(0, "t1"), result(0, "t2"), text("user", 0, "u2")]
    assert tags(fit_budget(history, cost(history[2:]))) == ["t2", "u2"]


def test_an_empty_history_stays_empty():
    assert fit_budget([], 0) == []
    assert fit_budget([], 100) == []


# -- fit_budget: a property over random role sequences ----------------------------------------

message = st.one_of(
    st.integers(0, 200).map(lambda n: text("user", n)),
    st.integers(0, 200).map(lambda n: text("assistant", n)),
    st.integers(0, 200).map(lambda n: text("system", n)),
    st.integers(0, 200).map(lambda n: call(n)),
    st.integers(0, 200).map(lambda n: result(n)),
)


def attached(messages: Sequence[Mapping[str, Any]], i: int) -> bool:
    """A tool message whose nearest earlier non-tool message is an assistant message."""
    if messages[i]["role"] != "tool":
        return False
    j = i - 1
    while j >= 0 and messages[j]["role"] == "tool":
        j -= 1
    return j >= 0 and messages[j]["role"] == "assistant"


@given(st.lists(message, max_size=25), st.integers(0, 600))
def test_fit_budget_keeps_the_longest_suffix_of_whole_units_that_fits(
    messages: list[dict[str, Any]], budget: int
):
    kept = fit_budget(messages, budget)
    n = len(messages)
    k = n - len(kept)
    # A suffix, in order, of the very same messages.
    assert all(a is b for a, b in zip(kept, messages[k:], strict=True))
    if not messages:
        assert kept == []
        return
    cuts = [i for i in range(n) if not attached(messages, i)]
    assert kept, "the newest unit is always kept"
    assert k in cuts, "a tool result is never separated from its call"
    assert cost(kept) <= budget or k == cuts[-1], "over budget only with the newest unit alone"
    earlier = [i for i in cuts if i < k]
    if earlier:
        assert cost(messages[earlier[-1] :]) > budget, "a unit was dropped that would have fit"


@given(st.lists(message, max_size=20), st.integers(0, 400), st.integers(0, 400))
def test_a_bigger_budget_keeps_at_least_as_much(messages: list[dict[str, Any]], a: int, b: int):
    small, big = sorted((a, b))
    assert len(fit_budget(messages, small)) <= len(fit_budget(messages, big))


@given(st.lists(message, max_size=25), st.integers(0, 600), st.lists(st.integers(1, 6)))
def test_trimming_as_messages_arrive_keeps_what_trimming_at_once_keeps(
    messages: list[dict[str, Any]], budget: int, chunks: list[int]
):
    tail = ContextTail(budget)
    i = 0
    for size in [*chunks, len(messages)]:  # the agent's turns read the store in pieces
        tail.extend(messages[i : i + size])
        i += size
    assert [id(m) for m in tail.messages()] == [id(m) for m in fit_budget(messages, budget)]


# -- trimming in steps: the start stays put until the budget is outgrown ----------------------


@given(
    st.lists(st.lists(message, max_size=6), max_size=12),
    st.integers(50, 600),
    st.floats(0.0, 1.0),
)
def test_trimming_in_steps_moves_the_start_only_when_the_budget_is_outgrown(
    chunks: list[list[dict[str, Any]]], budget: int, share: float
):
    target = int(budget * share)
    tail = ContextTail(budget, target)
    arrived: list[dict[str, Any]] = []
    for chunk in chunks:
        before = tail.messages()
        arrived.extend(chunk)
        tail.extend(chunk)
        kept = tail.messages()
        k = len(arrived) - len(kept)
        # always a suffix, in order, of what arrived, starting at a whole unit
        assert all(a is b for a, b in zip(kept, arrived[k:], strict=True))
        cuts = [i for i in range(len(arrived)) if not attached(arrived, i)]
        if not arrived:
            continue
        assert k in cuts
        if cost(before) + cost(chunk) <= budget:
            # within budget: nothing dropped, the start is the same message
            assert kept == [*before, *chunk]
            assert not before or kept[0] is before[0]
        else:
            # outgrown: trimmed to the target, no further than needed
            assert cost(kept) <= target or k == cuts[-1]
            earlier = [i for i in cuts if i < k]
            if earlier and k > len(arrived) - len(before) - len(chunk):
                assert cost(arrived[earlier[-1] :]) > target


def test_after_a_step_the_next_messages_leave_the_start_alone():
    # budget 100, target 50: the overflow drops to at most 50, leaving 50 tokens of room
    history = [text("user", 4 * (30 - 9), f"u{i}") for i in range(4)]  # 30 tokens each
    assert cost(history[:1]) == 30
    tail = ContextTail(100, 50)
    tail.extend(history[:3])
    assert tags(tail.messages()) == ["u0", "u1", "u2"]
    tail.extend(history[3:])  # 120 > 100: down to 30
    assert tags(tail.messages()) == ["u3"]
    for i in range(4, 6):  # 60, 90: within the budget, the start stays u3
        tail.extend([text("user", 4 * (30 - 9), f"u{i}")])
        assert tags(tail.messages())[0] == "u3"
    tail.extend([text("user", 4 * (30 - 9), "u6")])  # 120 again: down to 30
    assert tags(tail.messages()) == ["u6"]
