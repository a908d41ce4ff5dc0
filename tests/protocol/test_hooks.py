"""Context hooks: who is called, what is sent, which injections are kept; lifecycle params."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.content import MAX_TEXT_CHARS
from protocol.hooks import (
    MAX_INJECTIONS,
    OBSERVE,
    PHASES,
    POSITIONS,
    TERMINALS,
    Dropped,
    HookAnswer,
    Injection,
    ModelInfo,
    before_inference_params,
    channel_context,
    group_by_position,
    hook_role,
    inject_path,
    lifecycle_params,
    read_hook_result,
)
from protocol.mcpl import VOCABULARY

SID = "notes"
INJECTS = tuple(inject_path(p) for p in POSITIONS)
HOOK_PATHS = (OBSERVE, *INJECTS)
ALL_INJECT = frozenset(INJECTS)
MODEL = ModelInfo("claude-x", "anthropic", 200_000, ("vision", "tools"))

paths = st.sampled_from(sorted(VOCABULARY))
grants = st.frozensets(paths)
positions = st.sampled_from(POSITIONS)


def entry(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"namespace": "ns", "position": "beforeUser", "content": "hi"}
    base.update(over)
    return {k: v for k, v in base.items() if v is not ...}


def answer(*entries: Any, **extra: Any) -> dict[str, Any]:
    return {"featureSet": "notes", "contextInjections": list(entries), **extra}


def read(result: Any, grant: Any = ALL_INJECT) -> HookAnswer:
    return read_hook_result(result, SID, grant)


def only_drop(result: Any, grant: Any = ALL_INJECT) -> Dropped:
    got = read(result, grant)
    assert got.injections == ()
    assert len(got.dropped) == 1
    return got.dropped[0]


# --- paths and roles --------------------------------------------------------------------------


def test_paths_are_vocabulary_leaves() -> None:
    assert OBSERVE in VOCABULARY
    assert inject_path("system") == "contextHooks.beforeInference.inject.system"
    assert inject_path("afterUser") == "contextHooks.beforeInference.inject.afterUser"
    assert set(INJECTS) <= VOCABULARY
    assert POSITIONS == ("system", "beforeUser", "afterUser")


@pytest.mark.parametrize(
    ("grant", "role"),
    [
        ({OBSERVE}, "observe"),
        ({OBSERVE, *INJECTS}, "observe"),
        ({INJECTS[0]}, "inject-only"),
        ({INJECTS[1]}, "inject-only"),
        ({INJECTS[2], "pushEvents"}, "inject-only"),
        (set(), None),
        ({"pushEvents", "inferenceLifecycle", "modelInfo"}, None),
        ({"contextHooks.beforeInference", "contextHooks.beforeInference.inject"}, None),
    ],
)
def test_hook_role(grant: set[str], role: str | None) -> None:
    assert hook_role(grant) == role


@given(grants)
def test_hook_role_follows_the_hook_paths(grant: frozenset[str]) -> None:
    role = hook_role(grant)
    assert (role == "observe") == (OBSERVE in grant)
    assert (role is None) == grant.isdisjoint(HOOK_PATHS)


# --- request params ---------------------------------------------------------------------------


def test_model_info_wire_form() -> None:
    assert MODEL.to_wire() == {
        "id": "claude-x",
        "vendor": "anthropic",
        "contextWindow": 200_000,
        "capabilities": ["vision", "tools"],
    }


def test_channel_context_full_and_partial() -> None:
    assert channel_context(
        incoming=("discord:#a", "m1", "t1"), default_outgoing="ui", candidates=["ui", "x"]
    ) == {
        "incoming": {"channelId": "discord:#a", "messageId": "m1", "threadId": "t1"},
        "defaultOutgoing": {"channelId": "ui"},
        "candidates": ["ui", "x"],
    }
    assert channel_context(incoming=("c", None, None), default_outgoing=None, candidates=()) == {
        "incoming": {"channelId": "c"}
    }
    assert channel_context(incoming=("c", None, "t"), default_outgoing=None, candidates=()) == {
        "incoming": {"channelId": "c", "threadId": "t"}
    }
    assert channel_context(incoming=None, default_outgoing="ui", candidates=[]) == {
        "defaultOutgoing": {"channelId": "ui"}
    }
    assert channel_context(incoming=None, default_outgoing=None, candidates=["a"]) == {
        "candidates": ["a"]
    }
    assert channel_context(incoming=None, default_outgoing=None, candidates=[]) is None


ids = st.text(min_size=1, max_size=6)


@given(
    st.none() | st.tuples(ids, st.none() | ids, st.none() | ids),
    st.none() | ids,
    st.lists(ids, max_size=3),
)
def test_channel_context_omits_exactly_what_is_absent(
    incoming: tuple[str, str | None, str | None] | None,
    default_outgoing: str | None,
    candidates: list[str],
) -> None:
    got = channel_context(
        incoming=incoming, default_outgoing=default_outgoing, candidates=candidates
    )
    if incoming is None and default_outgoing is None and not candidates:
        assert got is None
        return
    assert got is not None
    assert ("incoming" in got) == (incoming is not None)
    assert ("defaultOutgoing" in got) == (default_outgoing is not None)
    assert got.get("candidates", []) == candidates
    if incoming is not None:
        edge = got["incoming"]
        assert edge["channelId"] == incoming[0]
        assert edge.get("messageId") == incoming[1]
        assert edge.get("threadId") == incoming[2]
        assert None not in edge.values()


def test_before_inference_params_for_an_observer() -> None:
    channels = {"defaultOutgoing": {"channelId": "ui"}}
    assert before_inference_params(
        inference_id="inf-1",
        conversation_id="conv-1",
        turn_index=3,
        user_message="hello",
        observe=True,
        model=MODEL,
        channels=channels,
    ) == {
        "inferenceId": "inf-1",
        "conversationId": "conv-1",
        "turnIndex": 3,
        "userMessage": "hello",
        "model": MODEL.to_wire(),
        "channels": channels,
    }


def test_before_inference_params_hide_the_message_from_inject_only_servers() -> None:
    params = before_inference_params(
        inference_id="inf-1",
        conversation_id="conv-1",
        turn_index=0,
        user_message="secret",
        observe=False,
        model=MODEL,
        channels=None,
    )
    assert params["userMessage"] is None
    assert "userMessage" in params
    assert "channels" not in params
    assert (params["inferenceId"], params["conversationId"]) == ("inf-1", "conv-1")
    assert "secret" not in repr(params)


@given(st.none() | st.text(max_size=10), st.booleans(), st.integers(0, 10**6))
def test_the_user_message_is_sent_only_to_observers(
    message: str | None, observe: bool, turn: int
) -> None:
    params = before_inference_params(
        inference_id="i",
        conversation_id="c",
        turn_index=turn,
        user_message=message,
        observe=observe,
        model=MODEL,
        channels=None,
    )
    assert params["userMessage"] == (message if observe else None)
    assert params["turnIndex"] == turn


# --- reading the answer -----------------------------------------------------------------------


def test_a_string_becomes_one_text_block() -> None:
    got = read(answer(entry(content="remember X", metadata={"score": 1})))
    assert got == HookAnswer(
        injections=(
            Injection(
                server_id=SID,
                namespace="ns",
                position="beforeUser",
                blocks=({"type": "text", "text": "remember X"},),
                metadata={"score": 1},
            ),
        ),
        dropped=(),
    )


def test_a_block_list_goes_through_the_content_conversion() -> None:
    content = [
        {"type": "text", "text": "a", "annotations": {"x": 1}},
        {"type": "image", "uri": "https://x/y.png", "secret": 1},
    ]
    (got,) = read(answer(entry(position="afterUser", content=content))).injections
    assert got.blocks == (
        {"type": "text", "text": "a"},
        {"type": "image", "uri": "https://x/y.png"},
    )
    assert got.position == "afterUser"


@pytest.mark.parametrize("metadata", [None, "m", 5, ["a"], ...])
def test_metadata_is_kept_only_when_an_object(metadata: Any) -> None:
    (got,) = read(answer(entry(metadata=metadata))).injections
    assert got.metadata is None


@pytest.mark.parametrize("result", [None, [], "x", 5, True, [{"contextInjections": []}]])
def test_a_result_that_is_not_an_object(result: Any) -> None:
    dropped = only_drop(result)
    assert (dropped.index, dropped.position) == (-1, None)
    assert "object" in dropped.reason


@pytest.mark.parametrize("result", [{}, {"featureSet": "x"}, {"contextInjections": None}])
def test_no_injections(result: Any) -> None:
    assert read(result) == HookAnswer(injections=(), dropped=())


@pytest.mark.parametrize("value", ["x", 5, {"namespace": "n"}, True])
def test_injections_that_are_not_an_array(value: Any) -> None:
    dropped = only_drop({"contextInjections": value})
    assert dropped.index == -1
    assert "contextInjections" in dropped.reason


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("not an entry", "object"),
        (["namespace"], "object"),
        (entry(namespace=...), "namespace"),
        (entry(namespace=""), "namespace"),
        (entry(namespace=5), "namespace"),
        (entry(namespace=None), "namespace"),
        (entry(position=...), "position"),
        (entry(position="System"), "position"),
        (entry(position="before"), "position"),
        (entry(position=["system"]), "position"),
        (entry(position=None), "position"),
        (entry(content=...), "content"),
        (entry(content=None), "content"),
        (entry(content=5), "content"),
        (entry(content={"type": "text", "text": "x"}), "content"),
        (entry(content=[]), "empty"),
        (entry(content=[{"type": 5, "uri": "u"}]), "content block"),
        (entry(content=[{"type": "text", "text": "ok"}, {"type": "text"}]), "text"),
        (entry(content="x" * (MAX_TEXT_CHARS + 1)), "over"),
    ],
)
def test_malformed_entries_are_dropped_alone(bad: Any, words: str) -> None:
    good = entry(namespace="good")
    got = read(answer(good, bad, good))
    assert [i.namespace for i in got.injections] == ["good", "good"]
    (dropped,) = got.dropped
    assert dropped.index == 1
    assert words in dropped.reason
    if isinstance(bad, dict):
        assert dropped.position == bad.get("position")


def test_the_content_limit_is_inclusive() -> None:
    (got,) = read(answer(entry(content="x" * MAX_TEXT_CHARS))).injections
    assert len(got.blocks[0]["text"]) == MAX_TEXT_CHARS


def test_content_without_a_server_is_dropped() -> None:
    got = read_hook_result(answer(entry()), "", ALL_INJECT)
    assert got.injections == ()
    assert "server" in got.dropped[0].reason


@pytest.mark.parametrize("position", POSITIONS)
def test_each_position_needs_its_own_path(position: str) -> None:
    others = ALL_INJECT - {inject_path(position)}
    dropped = only_drop(answer(entry(position=position)), others | {OBSERVE})
    assert dropped == Dropped(
        0, position, f"capability denied: contextHooks.beforeInference.inject.{position}"
    )
    (kept,) = read(answer(entry(position=position)), {inject_path(position)}).injections
    assert kept.position == position


def test_namespace_and_feature_set_never_authorize() -> None:
    result = answer(
        entry(namespace=inject_path("system"), position="system"),
        entry(namespace="contextHooks.beforeInference.inject.*", position="system"),
        featureSet=inject_path("system"),
    )
    got = read(result, {inject_path("beforeUser"), OBSERVE})
    assert got.injections == ()
    assert [d.reason for d in got.dropped] == [
        "capability denied: contextHooks.beforeInference.inject.system"
    ] * 2


def test_a_wildcard_in_the_grant_authorizes_nothing() -> None:
    grant = {"contextHooks.beforeInference.inject.*", "*.*.*.*", "contextHooks"}
    assert read(answer(entry()), grant).injections == ()


def test_mixed_answer_keeps_only_authorized_positions_in_order() -> None:
    result = answer(
        entry(namespace="a", position="system"),
        entry(namespace="b", position="afterUser"),
        entry(namespace="c", position="beforeUser"),
        entry(namespace="d", position="afterUser"),
    )
    got = read(result, {inject_path("afterUser"), inject_path("beforeUser")})
    assert [i.namespace for i in got.injections] == ["b", "c", "d"]
    assert [(d.index, d.position) for d in got.dropped] == [(0, "system")]


def test_at_the_cap_every_entry_is_read() -> None:
    got = read(answer(*[entry(namespace=f"n{i}") for i in range(MAX_INJECTIONS)]))
    assert len(got.injections) == MAX_INJECTIONS
    assert got.dropped == ()


def test_entries_past_the_cap_are_dropped_one_by_one() -> None:
    extra = 5
    entries = [
        entry(namespace=f"n{i}", position="afterUser") for i in range(MAX_INJECTIONS + extra)
    ]
    got = read(answer(*entries))
    assert [i.namespace for i in got.injections] == [f"n{i}" for i in range(MAX_INJECTIONS)]
    assert [d.index for d in got.dropped] == list(range(MAX_INJECTIONS, MAX_INJECTIONS + extra))
    assert all(d.position == "afterUser" for d in got.dropped)
    assert all(str(MAX_INJECTIONS) in d.reason and "cap" in d.reason for d in got.dropped)


def test_invalid_entries_count_toward_the_cap() -> None:
    entries = ["junk"] * MAX_INJECTIONS + [entry()]
    got = read(answer(*entries))
    assert got.injections == ()
    assert len(got.dropped) == MAX_INJECTIONS + 1
    assert "cap" in got.dropped[-1].reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
field_values = st.one_of(
    positions,
    st.just("ns"),
    st.just([{"type": "text", "text": "t"}]),
    st.just([{"type": "image", "data": "!!", "mimeType": "x"}]),
    json_values,
)
entries_st = st.one_of(
    json_values,
    st.dictionaries(
        st.sampled_from(["namespace", "position", "content", "metadata"]), field_values
    ),
)


@given(
    st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"contextInjections": st.lists(entries_st, max_size=MAX_INJECTIONS + 3)}
        ),
    ),
    grants,
)
def test_any_answer_is_read_without_raising_and_only_granted_positions_pass(
    result: Any, grant: frozenset[str]
) -> None:
    got = read_hook_result(result, SID, grant)
    assert len(got.injections) <= MAX_INJECTIONS
    for injection in got.injections:
        assert inject_path(injection.position) in grant
        assert injection.namespace and injection.blocks
        assert injection.server_id == SID
    entries = result.get("contextInjections") if isinstance(result, dict) else None
    if isinstance(entries, list):
        assert len(got.injections) + len(got.dropped) == len(entries)
        assert [d.index for d in got.dropped] == sorted(d.index for d in got.dropped)
    else:
        assert got.injections == ()
        assert all(d.index == -1 for d in got.dropped)


@given(
    st.lists(
        st.tuples(positions, st.booleans(), st.text(min_size=1, max_size=4)),
        max_size=MAX_INJECTIONS,
    ),
    st.frozensets(positions),
)
def test_an_entry_is_kept_iff_well_formed_and_its_position_is_granted(
    spec: list[tuple[str, bool, str]], granted: frozenset[str]
) -> None:
    entries = [entry(namespace=ns, position=pos, content="x" if ok else 7) for pos, ok, ns in spec]
    got = read(answer(*entries), {inject_path(p) for p in granted})
    expected = [(ns, pos) for pos, ok, ns in spec if ok and pos in granted]
    assert [(i.namespace, i.position) for i in got.injections] == expected
    assert [d.index for d in got.dropped] == [
        i for i, (pos, ok, _) in enumerate(spec) if not (ok and pos in granted)
    ]


# --- grouping ---------------------------------------------------------------------------------


def injection(position: str, namespace: str) -> Injection:
    return Injection(SID, namespace, position, ({"type": "text", "text": namespace},), None)


def test_group_by_position_has_every_position() -> None:
    assert group_by_position([]) == {p: () for p in POSITIONS}
    a, b, c = injection("afterUser", "a"), injection("system", "b"), injection("afterUser", "c")
    assert group_by_position([a, b, c]) == {
        "system": (b,),
        "beforeUser": (),
        "afterUser": (a, c),
    }


@given(st.lists(st.tuples(positions, st.text(max_size=3)), max_size=20))
def test_grouping_keeps_order_within_each_position(spec: list[tuple[str, str]]) -> None:
    items = [injection(p, n) for p, n in spec]
    groups = group_by_position(items)
    assert tuple(groups) == POSITIONS
    for position in POSITIONS:
        assert list(groups[position]) == [i for i in items if i.position == position]
    assert sum(len(g) for g in groups.values()) == len(items)


# --- inference/lifecycle ----------------------------------------------------------------------


def test_phases_and_terminals() -> None:
    assert PHASES == ("started", "completed", "aborted", "failed")
    assert frozenset({"completed", "aborted", "failed"}) == TERMINALS
    assert "started" not in TERMINALS


def test_completed_with_model_and_usage() -> None:
    assert lifecycle_params(
        phase="completed",
        inference_id="i",
        conversation_id="c",
        turn_index=2,
        model=MODEL,
        model_granted=True,
        usage=(100, 20),
    ) == {
        "inferenceId": "i",
        "conversationId": "c",
        "turnIndex": 2,
        "phase": "completed",
        "model": MODEL.to_wire(),
        "usage": {"inputTokens": 100, "outputTokens": 20},
    }


def test_started_without_model_grant() -> None:
    assert lifecycle_params(
        phase="started",
        inference_id="i",
        conversation_id="c",
        turn_index=0,
        model=MODEL,
        model_granted=False,
        usage=(1, 2),
    ) == {"inferenceId": "i", "conversationId": "c", "turnIndex": 0, "phase": "started"}


@pytest.mark.parametrize("phase", ["", "Started", "succeeded", "complete"])
def test_unknown_phase(phase: str) -> None:
    with pytest.raises(ValueError, match="phase"):
        lifecycle_params(
            phase=phase,
            inference_id="i",
            conversation_id="c",
            turn_index=0,
            model=None,
            model_granted=False,
            usage=None,
        )


@given(
    st.sampled_from(PHASES),
    st.booleans(),
    st.booleans(),
    st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
)
def test_lifecycle_members(
    phase: str, has_model: bool, granted: bool, usage: tuple[int, int] | None
) -> None:
    params = lifecycle_params(
        phase=phase,
        inference_id="i",
        conversation_id="c",
        turn_index=1,
        model=MODEL if has_model else None,
        model_granted=granted,
        usage=usage,
    )
    assert set(params) <= {"inferenceId", "conversationId", "turnIndex", "phase", "model", "usage"}
    assert params["phase"] == phase
    assert ("model" in params) == (has_model and granted)
    assert ("usage" in params) == (phase == "completed" and usage is not None)
    if usage is not None and phase == "completed":
        assert params["usage"] == {"inputTokens": usage[0], "outputTokens": usage[1]}
