"""The status file's format and the health verdict drawn from it (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import status as fmt

NOW = 1_800_000_000.0
STATES = ("ready", "mcp-only", "connecting", "disconnected")

server_st = st.fixed_dictionaries(
    {
        "id": st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        "state": st.sampled_from(STATES),
        "last_error": st.none() | st.text(max_size=20),
    }
)
agent_st = st.fixed_dictionaries(
    {
        "name": st.from_regex(r"[A-Z][a-z]{0,7}", fullmatch=True),
        "paused": st.none() | st.text(min_size=1, max_size=20),
    }
)


def doc(
    *,
    pid: int = 42,
    age: float = 1.0,
    interval: float = 5.0,
    running: bool = True,
    servers: list[dict[str, Any]] | None = None,
    agents: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "format": fmt.FORMAT,
        "pid": pid,
        "interval_s": interval,
        "running": running,
        "started_at": fmt.iso(NOW - 100),
        "written_at": fmt.iso(NOW - age),
        "servers": servers if servers is not None else [{"id": "lobby", "state": "ready"}],
        "agents": agents if agents is not None else [{"name": "Ada", "paused": None}],
    }


@given(st.lists(server_st, max_size=5), st.lists(agent_st, max_size=5), st.booleans())
def test_fresh_file_of_the_lock_holder(
    servers: list[dict[str, Any]], agents: list[dict[str, Any]], running: bool
) -> None:
    verdict = fmt.assess(doc(servers=servers, agents=agents, running=running), 42, NOW)
    down = [s for s in servers if s["state"] not in fmt.READY_STATES]
    paused = [a for a in agents if a["paused"]]
    expected = len(down) + len(paused) + (not running)
    assert len(verdict.problems) == expected
    assert verdict.code == (fmt.DEGRADED if expected else fmt.HEALTHY)
    for s in down:
        assert any(p.startswith(f"{s['id']} {s['state']}") for p in verdict.problems)


@given(st.none() | st.builds(doc), st.floats(allow_nan=False))
def test_no_lock_holder_means_not_running_whatever_the_file_says(
    d: dict[str, Any] | None, now: float
) -> None:
    assert fmt.assess(d, None, now).code == fmt.NOT_RUNNING


@given(st.floats(min_value=0, max_value=1e6), st.floats(min_value=0.1, max_value=600))
def test_old_content_in_a_file_touched_in_time_is_a_host_that_cannot_write(
    touched_age: float, interval: float
) -> None:
    # the content is past stale; the heartbeat's touch says whether the host still runs
    old = doc(age=fmt.STALE_INTERVALS * interval + 60, interval=interval)
    verdict = fmt.assess(old, 42, NOW, NOW - touched_age)
    if touched_age < fmt.STALE_INTERVALS * interval:
        assert verdict.code == fmt.DEGRADED
        assert verdict.problems[0].startswith("the status file could not be written for")
    elif touched_age > fmt.STALE_INTERVALS * interval:
        assert verdict.code == fmt.UNKNOWN and "hung?" in verdict.problems[0]


@given(st.floats(min_value=0, max_value=1e6), st.floats(min_value=0.1, max_value=600))
def test_stale_exactly_past_the_allowed_intervals(age: float, interval: float) -> None:
    verdict = fmt.assess(doc(age=age, interval=interval), 42, NOW)
    stale = age > fmt.STALE_INTERVALS * interval + 0.002  # the file keeps milliseconds
    fresh = age < fmt.STALE_INTERVALS * interval - 0.002
    if stale:
        assert verdict.code == fmt.UNKNOWN and "ago" in verdict.problems[0]
    elif fresh:
        assert verdict.code == fmt.HEALTHY


def test_unknown_when_the_holder_has_no_file_or_another_hosts_file() -> None:
    assert fmt.assess(None, 42, NOW).code == fmt.UNKNOWN
    other = fmt.assess(doc(pid=7), 42, NOW)
    assert other.code == fmt.UNKNOWN and "pid 7" in other.summary
    # a lock whose file names no pid (0): the file is taken at its word
    assert fmt.assess(doc(pid=7), 0, NOW).code == fmt.HEALTHY


def test_summary_lines() -> None:
    assert fmt.assess(doc(), 42, NOW).summary == "ok"
    down = doc(servers=[{"id": "flaky", "state": "disconnected", "last_error": "exit 3"}])
    assert fmt.assess(down, 42, NOW).summary == "degraded: flaky disconnected (exit 3)"
    paused = doc(agents=[{"name": "Ada", "paused": "credential refused"}])
    assert fmt.assess(paused, 42, NOW).summary == "degraded: Ada paused (credential refused)"
    assert fmt.assess(None, None, NOW).summary.startswith("not running: ")


@given(st.builds(doc, pid=st.integers(1, 2**22), age=st.floats(0, 1e5), running=st.booleans()))
def test_parse_reads_what_is_written(d: dict[str, Any]) -> None:
    assert fmt.parse(json.dumps(d)) == d


@given(st.text(max_size=200) | st.builds(json.dumps, st.dictionaries(st.text(), st.integers())))
def test_parse_refuses_anything_else_with_one_error(text: str) -> None:
    try:
        fmt.parse(text)
    except fmt.StatusFormatError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize(
    "key,value",
    [("pid", "42"), ("interval_s", 0), ("interval_s", float("inf")), ("written_at", "yesterday")],
)
def test_parse_refuses_bad_fields(key: str, value: Any) -> None:
    with pytest.raises(fmt.StatusFormatError, match=key):
        fmt.parse(json.dumps({**doc(), key: value}))


@given(st.floats(min_value=0, max_value=4e9))
def test_iso_round_trips_to_the_millisecond(at: float) -> None:
    back = fmt.seconds(fmt.iso(at))
    assert back is not None and abs(back - at) < 0.001


@given(st.floats(min_value=0, max_value=1e8), st.floats(min_value=0, max_value=1e8))
def test_describe_age_is_short_and_ordered_by_unit(a: float, b: float) -> None:
    assert len(fmt.describe_age(a)) <= 14
    units = ["s", "min", "h", "d"]

    def rank(age: float) -> int:
        text = fmt.describe_age(age)
        return max(i for i, u in enumerate(units) if f" {u}" in text)

    if a <= b:
        assert rank(a) <= rank(b)


def test_states() -> None:
    assert fmt.server_state(True, True, False) == "ready"
    assert fmt.server_state(True, True, True) == "mcp-only"
    assert fmt.server_state(True, False, False) == "connecting"
    assert fmt.server_state(False, False, False) == "disconnected"
    assert fmt.agent_state("401", True, True) == "paused"
    assert fmt.agent_state(None, True, True) == "held"
    assert fmt.agent_state(None, False, True) == "turn"
    assert fmt.agent_state(None, False, False) == "idle"
