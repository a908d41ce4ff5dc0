"""inference/request params, result and chunk params, and the request budget."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from protocol.errors import INVALID_PARAMS, RpcError
from protocol.inference import (
    FINISH_REASONS,
    MAX_CONTENT_CHARS,
    MAX_MESSAGES,
    MAX_TOKENS_CEILING,
    InferenceRequest,
    RequestBudget,
    chunk_params,
    finish_reason,
    inference_result,
    parse_inference_request,
)


def msg(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


def request(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"featureSet": "memory.extract", "messages": [msg("user", "hi")]}
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def refused(params: Any) -> str:
    with pytest.raises(RpcError) as info:
        parse_inference_request(params)
    assert info.value.code == INVALID_PARAMS
    assert info.value.message.startswith("Invalid params: ")
    return info.value.message


# --- parsing ----------------------------------------------------------------------------------


def test_a_full_request() -> None:
    got = parse_inference_request(
        request(
            conversationId="conv-1",
            stream=True,
            messages=[
                msg("system", "Be brief."),
                msg("user", "Summarize."),
                msg("assistant", "Sure."),
                msg("system", "Use English."),
                msg("user", "Go."),
            ],
            preferences={
                "maxTokens": 500,
                "temperature": 0.5,
                "model": "claude-x",
                "modelTier": "fast",
                "costTier": "low",
            },
            unknownMember={"tolerated": True},
        )
    )
    assert got == InferenceRequest(
        feature_set="memory.extract",
        conversation_id="conv-1",
        stream=True,
        system="Be brief.\n\nUse English.",
        messages=(("user", "Summarize."), ("assistant", "Sure."), ("user", "Go.")),
        max_tokens=500,
        temperature=0.5,
        hints={"model": "claude-x", "modelTier": "fast", "costTier": "low"},
    )


def test_a_minimal_request_has_defaults() -> None:
    got = parse_inference_request(request())
    assert got.conversation_id is None
    assert got.stream is False
    assert got.system == ""
    assert got.messages == (("user", "hi"),)
    assert (got.max_tokens, got.temperature) == (None, None)
    assert dict(got.hints) == {}


def test_null_optional_members_count_as_absent() -> None:
    got = parse_inference_request(
        request(
            conversationId=None,
            stream=None,
            preferences={"maxTokens": None, "temperature": None, "model": None},
        )
    )
    assert (got.conversation_id, got.stream, got.max_tokens, got.temperature) == (
        None,
        False,
        None,
        None,
    )
    assert dict(got.hints) == {"model": None}
    assert parse_inference_request(request(preferences=None)).hints == {}


def test_hints_cannot_be_changed_through_the_request() -> None:
    got = parse_inference_request(request(preferences={"model": "m"}))
    with pytest.raises(TypeError):
        got.hints["model"] = "other"  # type: ignore[index]


def test_empty_system_messages_add_no_blank_lines() -> None:
    got = parse_inference_request(
        request(messages=[msg("system", ""), msg("system", "A"), msg("user", "u")])
    )
    assert got.system == "A"


@pytest.mark.parametrize("params", [None, [], "x", 5, [request()]])
def test_params_must_be_an_object(params: Any) -> None:
    assert "object" in refused(params)


@pytest.mark.parametrize(
    ("over", "member"),
    [
        ({"featureSet": ...}, "featureSet"),
        ({"featureSet": ""}, "featureSet"),
        ({"featureSet": 5}, "featureSet"),
        ({"featureSet": None}, "featureSet"),
        ({"conversationId": 5}, "conversationId"),
        ({"conversationId": ["c"]}, "conversationId"),
        ({"stream": "yes"}, "stream"),
        ({"stream": 1}, "stream"),
        ({"messages": ...}, "messages"),
        ({"messages": None}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": {"role": "user", "content": "hi"}}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [msg("user", "a"), {"content": "b"}]}, "messages[1].role"),
        ({"messages": [msg("tool", "a")]}, "messages[0].role"),
        ({"messages": [msg("User", "a")]}, "messages[0].role"),
        ({"messages": [{"role": ["user"], "content": "a"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
            "messages[0].content",
        ),
        ({"preferences": "fast"}, "preferences"),
        ({"preferences": [1]}, "preferences"),
        ({"preferences": {"maxTokens": 0}}, "maxTokens"),
        ({"preferences": {"maxTokens": -5}}, "maxTokens"),
        ({"preferences": {"maxTokens": MAX_TOKENS_CEILING + 1}}, "maxTokens"),
        ({"preferences": {"maxTokens": True}}, "maxTokens"),
        ({"preferences": {"maxTokens": 100.0}}, "maxTokens"),
        ({"preferences": {"maxTokens": "100"}}, "maxTokens"),
        ({"preferences": {"temperature": -0.01}}, "temperature"),
        ({"preferences": {"temperature": 2.0001}}, "temperature"),
        ({"preferences": {"temperature": math.nan}}, "temperature"),
        ({"preferences": {"temperature": math.inf}}, "temperature"),
        ({"preferences": {"temperature": True}}, "temperature"),
        ({"preferences": {"temperature": "0.5"}}, "temperature"),
    ],
)
def test_bad_members_are_named(over: dict[str, Any], member: str) -> None:
    assert member in refused(request(**over))


def test_messages_must_start_with_user_after_system() -> None:
    assert "user" in refused(request(messages=[msg("assistant", "a"), msg("user", "u")]))
    assert "user" in refused(request(messages=[msg("system", "s"), msg("assistant", "a")]))
    assert "system" in refused(request(messages=[msg("system", "s")]))
    got = parse_inference_request(request(messages=[msg("system", "s"), msg("user", "u")]))
    assert got.messages == (("user", "u"),)


@pytest.mark.parametrize("value", [1, MAX_TOKENS_CEILING])
def test_max_tokens_bounds_are_inclusive(value: int) -> None:
    assert parse_inference_request(request(preferences={"maxTokens": value})).max_tokens == value


@pytest.mark.parametrize("value", [0, 2, 1, 0.0, 1.999])
def test_temperature_bounds_are_inclusive(value: float) -> None:
    got = parse_inference_request(request(preferences={"temperature": value}))
    assert got.temperature == value
    assert isinstance(got.temperature, float)


def test_messages_at_the_cap() -> None:
    turns = [msg("user" if i % 2 == 0 else "assistant", str(i)) for i in range(MAX_MESSAGES)]
    assert len(parse_inference_request(request(messages=turns)).messages) == MAX_MESSAGES
    assert str(MAX_MESSAGES) in refused(request(messages=[*turns, msg("user", "more")]))


def test_content_at_the_cap() -> None:
    text = "x" * MAX_CONTENT_CHARS
    assert parse_inference_request(request(messages=[msg("user", text)])).messages[0][1] == text
    message = refused(request(messages=[msg("user", "ok"), msg("assistant", text + "x")]))
    assert "messages[1].content" in message


def test_a_system_message_over_the_cap_is_refused_too() -> None:
    too_long = "x" * (MAX_CONTENT_CHARS + 1)
    assert "messages[0].content" in refused(
        request(messages=[msg("system", too_long), msg("user", "u")])
    )


roles = st.sampled_from(["user", "assistant", "system"])
texts = st.text(max_size=20)


@given(
    st.lists(st.tuples(roles, texts), min_size=1, max_size=12),
    st.dictionaries(st.sampled_from(["model", "modelTier", "costTier", "x"]), texts, max_size=3),
)
def test_system_messages_are_lifted_and_the_rest_kept_in_order(
    turns: list[tuple[str, str]], hints: dict[str, str]
) -> None:
    params = request(messages=[msg(r, c) for r, c in turns], preferences=hints)
    rest = [(r, c) for r, c in turns if r != "system"]
    if not rest or rest[0][0] != "user":
        refused(params)
        return
    got = parse_inference_request(params)
    assert list(got.messages) == rest
    assert got.system == "\n\n".join(c for r, c in turns if r == "system" and c)
    assert dict(got.hints) == hints


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@given(
    st.one_of(
        json_values,
        st.dictionaries(
            st.sampled_from(["featureSet", "conversationId", "stream", "messages", "preferences"]),
            json_values,
        ),
    )
)
def test_any_params_parse_or_raise_invalid_params(params: Any) -> None:
    try:
        got = parse_inference_request(params)
    except RpcError as err:
        assert err.code == INVALID_PARAMS
        return
    assert got.feature_set
    assert got.messages and got.messages[0][0] == "user"
    assert all(role in ("user", "assistant") for role, _ in got.messages)


# --- result and chunks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stop", "reason"),
    [
        ("end_turn", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "stop_sequence"),
        ("tool_use", "end_turn"),
        ("refusal", "end_turn"),
        ("pause_turn", "end_turn"),
        ("", "end_turn"),
    ],
)
def test_finish_reason(stop: str, reason: str) -> None:
    assert finish_reason(stop) == reason


@given(st.text(max_size=15) | st.sampled_from(FINISH_REASONS))
def test_finish_reason_is_always_a_wire_value(stop: str) -> None:
    reason = finish_reason(stop)
    assert reason in FINISH_REASONS
    assert reason == (stop if stop in FINISH_REASONS else "end_turn")


def test_inference_result() -> None:
    assert inference_result(
        content="done",
        model="claude-x",
        finish_reason="max_tokens",
        input_tokens=12,
        output_tokens=34,
    ) == {
        "content": "done",
        "model": "claude-x",
        "finishReason": "max_tokens",
        "usage": {"inputTokens": 12, "outputTokens": 34},
    }
    with pytest.raises(ValueError, match="tool_use"):
        inference_result(
            content="", model="m", finish_reason="tool_use", input_tokens=0, output_tokens=0
        )


def test_chunk_params() -> None:
    assert chunk_params(7, 0, "He") == {"requestId": 7, "index": 0, "delta": "He"}
    assert chunk_params("r-1", 3, "") == {"requestId": "r-1", "index": 3, "delta": ""}


# --- the budget -------------------------------------------------------------------------------


@pytest.mark.parametrize(("per_hour", "window"), [(-1, 3600.0), (1, 0.0), (1, -1.0), (1, math.nan)])
def test_budget_arguments(per_hour: int, window: float) -> None:
    with pytest.raises(ValueError):
        RequestBudget(per_hour, window)


def test_budget_defaults_to_an_hour() -> None:
    budget = RequestBudget(2)
    assert (budget.per_hour, budget.window) == (2, 3600.0)
    assert budget.take(0.0) is None
    assert budget.take(10.0) is None
    assert budget.take(20.0) == 3580.0
    assert budget.take(3599.0) == 1.0
    assert budget.take(3600.0) is None
    assert budget.take(3600.0) == 10.0
    assert budget.take(3610.0) is None


def test_a_zero_budget_never_grants() -> None:
    budget = RequestBudget(0)
    assert budget.take(0.0) == math.inf
    assert budget.take(1e9) == math.inf
    assert budget.recorded == 0


def test_an_earlier_time_counts_as_the_last_one() -> None:
    budget = RequestBudget(1, window=10.0)
    assert budget.take(100.0) is None
    assert budget.take(50.0) == 10.0  # taken at 100, not at 50
    assert budget.take(109.0) == 1.0
    assert budget.take(0.0) == 1.0
    assert budget.take(110.0) is None


@pytest.mark.parametrize("now", [math.nan, math.inf, -math.inf])
def test_the_time_must_be_finite(now: float) -> None:
    with pytest.raises(ValueError):
        RequestBudget(1).take(now)


def test_the_record_is_bounded_at_the_cap() -> None:
    budget = RequestBudget(3, window=100.0)
    for t in range(3):
        assert budget.take(float(t)) is None
    assert budget.recorded == 3
    for t in range(3, 50):
        assert budget.take(float(t)) is not None
        assert budget.recorded == 3
    assert budget.take(100.0) is None  # the grant at 0 left
    assert budget.recorded == 3
    assert budget.take(1000.0) is None  # every old grant left; only this one is kept
    assert budget.recorded == 1


EARLIEST = -(10**12)  # before any time the tests use


def replay(per_hour: int, window: int, steps: list[int]) -> tuple[list[int], list[bool]]:
    """Takes at times built from ``steps`` (negative steps move back); grants and outcomes."""
    budget = RequestBudget(per_hour, float(window))
    granted: list[int] = []
    outcomes: list[bool] = []
    clock, last = 0, EARLIEST
    for step in steps:
        clock += step
        last = max(last, clock)
        wait = budget.take(float(clock))
        outcomes.append(wait is None)
        if wait is None:
            granted.append(last)
    return granted, outcomes


budget_args = (
    st.integers(1, 5),
    st.integers(1, 100),
    st.lists(st.integers(-20, 40), max_size=60),
)


@given(*budget_args)
def test_no_window_holds_more_than_per_hour_grants(
    per_hour: int, window: int, steps: list[int]
) -> None:
    granted, _ = replay(per_hour, window, steps)
    assert granted == sorted(granted)
    for i in range(len(granted) - per_hour):
        assert granted[i + per_hour] - granted[i] >= window


@given(*budget_args)
def test_granted_iff_fewer_than_per_hour_in_the_trailing_window(
    per_hour: int, window: int, steps: list[int]
) -> None:
    _, outcomes = replay(per_hour, window, steps)
    granted: list[int] = []
    clock, last = 0, EARLIEST
    for step, outcome in zip(steps, outcomes, strict=True):
        clock += step
        last = max(last, clock)
        recent = sum(1 for g in granted if last - window < g <= last)
        assert outcome == (recent < per_hour)
        if outcome:
            granted.append(last)


@given(
    st.integers(1, 4),
    st.floats(1e-3, 1e7),
    st.floats(0, 1e12),
    st.lists(st.floats(0, 1e6), min_size=1, max_size=12),
)
def test_waiting_the_returned_time_is_enough(
    per_hour: int, window: float, start: float, gaps: list[float]
) -> None:
    budget = RequestBudget(per_hour, window)
    now = start
    for gap in gaps:
        now += gap
        wait = budget.take(now)
        if wait is not None:
            assert 0 < wait <= window + 2 * math.ulp(now + window)
            assert budget.take(now + wait) is None
            now += wait


def test_the_wait_survives_rounding() -> None:
    # 2**53 + 1 is not a float: the plain difference would leave the caller one step short.
    budget = RequestBudget(1, window=2.0**53 + 2)
    assert budget.take(0.0) is None
    wait = budget.take(1.0)
    assert wait is not None
    assert budget.take(1.0 + wait) is None


class BudgetModel(RuleBasedStateMachine):
    """Takes and clock moves against a list of every grant ever made."""

    def __init__(self) -> None:
        super().__init__()
        self.per_hour = 1
        self.window = 1
        self.budget = RequestBudget(1, 1.0)
        self.clock = 0
        self.last = EARLIEST
        self.granted: list[int] = []

    @initialize(per_hour=st.integers(0, 4), window=st.integers(1, 30))
    def start(self, per_hour: int, window: int) -> None:
        self.per_hour, self.window = per_hour, window
        self.budget = RequestBudget(per_hour, float(window))

    @rule(dt=st.integers(0, 15))
    def advance(self, dt: int) -> None:
        self.clock += dt

    @rule(dt=st.integers(1, 15))
    def rewind(self, dt: int) -> None:
        self.clock -= dt

    @rule()
    def take(self) -> None:
        wait = self.budget.take(float(self.clock))
        self.last = max(self.last, self.clock)
        recent = sorted(g for g in self.granted if self.last - self.window < g <= self.last)
        if len(recent) < self.per_hour:
            assert wait is None
            self.granted.append(self.last)
        elif self.per_hour == 0:
            assert wait == math.inf
        else:
            assert wait == recent[0] + self.window - self.last

    @invariant()
    def the_record_stays_within_the_cap(self) -> None:
        assert self.budget.recorded <= self.per_hour


TestBudgetModel = BudgetModel.TestCase
