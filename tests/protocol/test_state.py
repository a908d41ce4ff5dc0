"""Opaque checkpoints in tool results, rollback targets and results, the lineage table."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import errors
from protocol.state import (
    CHECKPOINT_NOT_FOUND,
    MAX_CHECKPOINT_CHARS,
    MAX_LINEAGES,
    Lineages,
    Recorded,
    RollbackOutcome,
    StateError,
    ToolState,
    read_rollback_result,
    read_tool_state,
    rollback_params,
    rollback_targets,
)

MEM = ("mem", "memory.kv")
NOTES = ("notes", "notes.main")


def tool_result(state: Any = ...) -> dict[str, Any]:
    out: dict[str, Any] = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    if state is not ...:
        out["state"] = state
    return out


def malformed(state: Any) -> str:
    with pytest.raises(StateError) as info:
        read_tool_state(tool_result(state))
    reason = str(info.value)
    assert reason and "\n" not in reason
    return reason


# --- state in tool results --------------------------------------------------------------------


@pytest.mark.parametrize("result", [tool_result(), tool_result(None), None, [], "x", {}])
def test_no_state(result: Any) -> None:
    assert read_tool_state(result) is None


def test_an_opaque_checkpoint() -> None:
    assert read_tool_state(tool_result({"checkpoint": "c2", "parent": "c1"})) == ToolState(
        checkpoint="c2", parent="c1", has_data=False, has_patch=False
    )


def test_a_root_checkpoint_with_data() -> None:
    got = read_tool_state(tool_result({"checkpoint": "c1", "parent": None, "data": {"k": 1}}))
    assert got == ToolState(checkpoint="c1", parent=None, has_data=True, has_patch=False)


def test_a_patch_and_an_absent_parent() -> None:
    got = read_tool_state(tool_result({"checkpoint": "c3", "patch": [{"op": "add"}], "x": 1}))
    assert got == ToolState(checkpoint="c3", parent=None, has_data=False, has_patch=True)


def test_null_data_or_patch_count_as_absent() -> None:
    got = read_tool_state(tool_result({"checkpoint": "c", "data": None, "patch": [{}]}))
    assert got is not None
    assert (got.has_data, got.has_patch) == (False, True)


def test_checkpoint_length_at_the_cap() -> None:
    top = "c" * MAX_CHECKPOINT_CHARS
    got = read_tool_state(tool_result({"checkpoint": top, "parent": top}))
    assert got is not None and got.checkpoint == top
    assert "checkpoint" in malformed({"checkpoint": top + "c"})
    assert "parent" in malformed({"checkpoint": "c", "parent": top + "c"})


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ("c1", "object"),
        (["c1"], "object"),
        (5, "object"),
        ({}, "checkpoint"),
        ({"checkpoint": ""}, "checkpoint"),
        ({"checkpoint": 7}, "checkpoint"),
        ({"checkpoint": None}, "checkpoint"),
        ({"checkpoint": "c", "parent": 1}, "parent"),
        ({"checkpoint": "c", "parent": ""}, "parent"),
        ({"checkpoint": "c", "parent": ["p"]}, "parent"),
        ({"checkpoint": "c", "data": {}, "patch": []}, "both"),
    ],
)
def test_malformed_state(state: Any, words: str) -> None:
    assert words in malformed(state)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)


@given(
    st.one_of(
        json_values,
        st.dictionaries(st.sampled_from(["checkpoint", "parent", "data", "patch"]), json_values),
    )
)
def test_any_state_reads_or_raises_state_error(state: Any) -> None:
    try:
        got = read_tool_state(tool_result(state))
    except StateError as exc:
        assert str(exc)
        return
    if got is None:
        assert state is None
        return
    assert isinstance(got.checkpoint, str) and got.checkpoint == state["checkpoint"]
    assert 0 < len(got.checkpoint) <= MAX_CHECKPOINT_CHARS
    assert not (got.has_data and got.has_patch)
    assert got.has_data == (state.get("data") is not None)


# --- rollback targets -------------------------------------------------------------------------


ORDER = ["m1", "m2", "m3", "m4", "m5"]


def rec(message: str, lineage: tuple[str, str], checkpoint: str, parent: str | None) -> Recorded:
    return Recorded(message_id=message, lineage=lineage, checkpoint=checkpoint, parent=parent)


HISTORY = [
    rec("m1", MEM, "a1", None),
    rec("m3", MEM, "a2", "a1"),
    rec("m3", MEM, "a3", "a2"),
    rec("m4", NOTES, "n2", "n1"),
    rec("m5", MEM, "a4", "a3"),
]
NOW = {MEM: "a4", NOTES: "n2"}


def test_rollback_to_the_last_checkpoint_at_or_before_the_message() -> None:
    assert rollback_targets(HISTORY, "m3", ORDER, NOW) == {MEM: "a3", NOTES: "n1"}
    assert rollback_targets(HISTORY, "m2", ORDER, NOW) == {MEM: "a1", NOTES: "n1"}
    assert rollback_targets(HISTORY, "m4", ORDER, NOW) == {MEM: "a3"}


def test_nothing_to_do_at_the_newest_message() -> None:
    assert rollback_targets(HISTORY, "m5", ORDER, NOW) == {}


def test_without_an_earlier_checkpoint_the_parent_of_the_next_is_used() -> None:
    history = [rec("m2", MEM, "a5", "a4"), rec("m3", MEM, "a6", "a5")]
    assert rollback_targets(history, "m1", ORDER, {MEM: "a6"}) == {MEM: "a4"}


def test_a_lineage_whose_first_checkpoint_is_a_root_has_nothing_to_go_back_to() -> None:
    assert rollback_targets([rec("m2", MEM, "a1", None)], "m1", ORDER, {MEM: "a1"}) == {}
    history = [rec("m2", MEM, "a1", None), rec("m2", NOTES, "n9", "n8")]
    assert rollback_targets(history, "m1", ORDER, {}) == {NOTES: "n8"}


def test_the_current_checkpoint_is_left_alone() -> None:
    assert rollback_targets(HISTORY, "m3", ORDER, {MEM: "a3", NOTES: "n1"}) == {}
    assert rollback_targets(HISTORY, "m3", ORDER, {MEM: "a3"}) == {NOTES: "n1"}


def test_records_of_unknown_messages_are_ignored() -> None:
    history = [*HISTORY, rec("elsewhere", MEM, "zz", "a3")]
    assert rollback_targets(history, "m3", ORDER, NOW) == {MEM: "a3", NOTES: "n1"}


def test_the_message_must_be_known() -> None:
    with pytest.raises(ValueError, match="m9"):
        rollback_targets(HISTORY, "m9", ORDER, NOW)
    with pytest.raises(ValueError):
        rollback_targets([], "m1", [], {})


def test_message_order_decides_not_record_order() -> None:
    history = [rec("m3", MEM, "late", "x"), rec("m1", MEM, "early", None)]
    assert rollback_targets(history, "m2", ORDER, {}) == {MEM: "early"}


LINEAGES = [MEM, NOTES, ("mem", "memory.other")]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Recorded], list[str], str]:
    order = [f"m{i}" for i in range(draw(st.integers(1, 8)))]
    records: list[Recorded] = []
    for seq in range(draw(st.integers(0, 15))):
        lineage = draw(st.sampled_from(LINEAGES))
        message = draw(st.sampled_from([*order, "gone"]))
        parent = draw(st.none() | st.sampled_from([f"c{i}" for i in range(seq + 1)]))
        records.append(rec(message, lineage, f"c{seq}", parent))
    return records, order, draw(st.sampled_from(order))


def in_force_after(records: list[Recorded], order: list[str], message: str) -> dict[Any, Any]:
    """Replay the conversation message by message; what each lineage holds after ``message``."""
    held: dict[Any, Any] = {}
    for current in order[: order.index(message) + 1]:
        for r in records:
            if r.message_id == current:
                held[r.lineage] = r.checkpoint
    return held


@given(histories(), st.dictionaries(st.sampled_from(LINEAGES), st.sampled_from(["c0", "c1"])))
def test_targets_match_a_replay(
    history: tuple[list[Recorded], list[str], str], current: dict[Any, str]
) -> None:
    records, order, to_message = history
    got = rollback_targets(records, to_message, order, current)
    held = in_force_after(records, order, to_message)
    cut = order.index(to_message)
    for lineage in LINEAGES:
        later = [r for r in records if r.lineage == lineage and r.message_id in order[cut + 1 :]]
        later.sort(key=lambda r: order.index(r.message_id))
        if lineage in held:
            target = held[lineage]
        elif later and later[0].parent is not None:
            target = later[0].parent
        else:
            target = None
        if target is None or target == current.get(lineage):
            assert lineage not in got
        else:
            assert got[lineage] == target


@given(histories())
def test_after_rolling_back_there_is_nothing_left_to_do(
    history: tuple[list[Recorded], list[str], str],
) -> None:
    records, order, to_message = history
    first = rollback_targets(records, to_message, order, {})
    assert rollback_targets(records, to_message, order, first) == {}
    newest = in_force_after(records, order, order[-1])
    assert rollback_targets(records, order[-1], order, newest) == {}


# --- rollback requests and results ------------------------------------------------------------


def test_rollback_params() -> None:
    assert rollback_params("memory.kv", "a3") == {"featureSet": "memory.kv", "checkpoint": "a3"}


def test_checkpoint_not_found_code() -> None:
    assert CHECKPOINT_NOT_FOUND == -32005 == errors.CHECKPOINT_NOT_FOUND


def test_a_rollback_to_the_requested_checkpoint() -> None:
    assert read_rollback_result({"checkpoint": "a3", "success": True}, "a3") == RollbackOutcome(
        requested="a3", checkpoint="a3", success=True, rolled_forward=False, reason=None
    )


def test_a_rollback_that_rolls_forward() -> None:
    got = read_rollback_result({"checkpoint": "a7", "success": True, "reason": "fork"}, "a3")
    assert got == RollbackOutcome(
        requested="a3", checkpoint="a7", success=True, rolled_forward=True, reason="fork"
    )


def test_a_failed_rollback_keeps_a_string_reason_only() -> None:
    got = read_rollback_result({"checkpoint": "a4", "success": False, "reason": "busy"}, "a3")
    assert (got.success, got.reason) == (False, "busy")
    got = read_rollback_result({"checkpoint": "a4", "success": False, "reason": 5}, "a3")
    assert got.reason is None


@pytest.mark.parametrize(
    ("result", "words"),
    [
        (None, "object"),
        ([], "object"),
        ({"success": True}, "checkpoint"),
        ({"checkpoint": "", "success": True}, "checkpoint"),
        ({"checkpoint": 3, "success": True}, "checkpoint"),
        ({"checkpoint": "c" * (MAX_CHECKPOINT_CHARS + 1), "success": True}, "checkpoint"),
        ({"checkpoint": "c"}, "success"),
        ({"checkpoint": "c", "success": "true"}, "success"),
        ({"checkpoint": "c", "success": 1}, "success"),
    ],
)
def test_malformed_rollback_results(result: Any, words: str) -> None:
    with pytest.raises(StateError, match=words):
        read_rollback_result(result, "c")


@given(st.text(min_size=1, max_size=5), st.text(min_size=1, max_size=5), st.booleans())
def test_rolled_forward_iff_another_checkpoint(requested: str, answer: str, ok: bool) -> None:
    got = read_rollback_result({"checkpoint": answer, "success": ok}, requested)
    assert got.rolled_forward == (answer != requested)
    assert (got.checkpoint, got.success, got.requested) == (answer, ok, requested)


# --- the lineage table ------------------------------------------------------------------------


def test_record_and_current() -> None:
    table = Lineages()
    assert table.current(MEM) is None
    table.record(MEM, "a1")
    table.record(NOTES, "n1")
    table.record(MEM, "a2")
    assert (table.current(MEM), table.current(NOTES)) == ("a2", "n1")
    assert len(table) == 2


def test_forget_server() -> None:
    table = Lineages()
    table.record(MEM, "a1")
    table.record(("mem", "memory.other"), "o1")
    table.record(NOTES, "n1")
    table.forget_server("mem")
    assert table.to_state() == {"notes\x00notes.main": "n1"}
    table.forget_server("absent")
    assert len(table) == 1


@pytest.mark.parametrize(
    ("lineage", "checkpoint"),
    [(("", "fs"), "c"), (("a\x00b", "fs"), "c"), (MEM, ""), (MEM, "c" * 257)],
)
def test_record_refuses_what_cannot_be_stored(lineage: tuple[str, str], checkpoint: str) -> None:
    table = Lineages()
    with pytest.raises(ValueError):
        table.record(lineage, checkpoint)
    assert len(table) == 0


def test_the_table_at_its_cap() -> None:
    assert Lineages.MAX_LINEAGES == MAX_LINEAGES == 1024
    table = Lineages()
    for i in range(MAX_LINEAGES):
        table.record((f"s{i}", "fs"), f"c{i}")
    assert len(table) == MAX_LINEAGES
    assert table.current(("s0", "fs")) == "c0"
    table.record(("s0", "fs"), "c0b")  # recorded again: now the most recent
    table.record(("new", "fs"), "x")
    assert len(table) == MAX_LINEAGES
    assert table.current(("s1", "fs")) is None  # the least recently recorded went
    assert table.current(("s0", "fs")) == "c0b"
    assert table.current(("new", "fs")) == "x"


def test_from_state_keeps_the_newest_entries_up_to_the_cap() -> None:
    value = {f"s{i}\x00fs": f"c{i}" for i in range(MAX_LINEAGES + 10)}
    table = Lineages.from_state(value)
    assert len(table) == MAX_LINEAGES
    assert table.current(("s9", "fs")) is None
    assert table.current(("s10", "fs")) == "c10"


def test_state_form() -> None:
    table = Lineages()
    table.record(MEM, "a1")
    table.record(NOTES, "n1")
    assert table.to_state() == {"mem\x00memory.kv": "a1", "notes\x00notes.main": "n1"}


@pytest.mark.parametrize("value", [None, [], "x", 5, [["mem\x00fs", "c"]]])
def test_from_state_of_a_non_object_is_empty(value: Any) -> None:
    assert len(Lineages.from_state(value)) == 0


def test_from_state_skips_malformed_entries() -> None:
    table = Lineages.from_state(
        {
            "mem\x00memory.kv": "a1",
            "no-separator": "c",
            "\x00fs": "c",
            "bad\x00cp": 5,
            "empty\x00cp": "",
            "long\x00cp": "c" * (MAX_CHECKPOINT_CHARS + 1),
            "nul\x00in\x00name": "c",
        }
    )
    assert table.to_state() == {"mem\x00memory.kv": "a1", "nul\x00in\x00name": "c"}
    assert table.current(("nul", "in\x00name")) == "c"


servers = st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=4)
names = st.text(max_size=4)
checkpoints = st.text(min_size=1, max_size=8)


@given(st.lists(st.tuples(servers, names, checkpoints), max_size=30))
def test_state_round_trips(records: list[tuple[str, str, str]]) -> None:
    table = Lineages()
    model: dict[tuple[str, str], str] = {}
    for server, name, checkpoint in records:
        table.record((server, name), checkpoint)
        model.pop((server, name), None)
        model[(server, name)] = checkpoint
    restored = Lineages.from_state(table.to_state())
    assert restored.to_state() == table.to_state()
    for lineage, checkpoint in model.items():
        assert restored.current(lineage) == checkpoint
    assert list(table.to_state()) == [f"{s}\x00{n}" for s, n in model]
