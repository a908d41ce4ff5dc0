"""The benchmark's rows run end to end on tiny sizes (real stdio servers, a real store), and its
checks and its latency rule hold. Figures are not asserted: speed is the benchmark's to print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from examples.bench import community as bench_community
from examples.bench import fleet as bench_fleet
from examples.bench import ingest as bench_ingest
from examples.bench import marking as bench_marking
from examples.bench import scale as bench_scale
from examples.bench import silence as bench_silence
from examples.bench import wakes as bench_wakes
from store import Append, Database, Reader, db_path

pytestmark = pytest.mark.slow

DEADLINE_S = 120


async def test_the_thinnest_host_stores_what_mcplive_stores(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        shape = await bench_ingest.check_shape(tmp_path, 15)
    assert shape["problems"] == []
    assert shape["rows"] == 15
    assert shape["marked"] == 3  # messages 0, 7 and 14 carry a forged header


def _store(data_dir: Path, texts: list[str]) -> None:
    rows = bench_ingest.ThinRows()
    rows.register([{"id": "bench:#load", "label": "load"}])
    at = bench_ingest.accepted_now()
    ops = []
    for i, text in enumerate(texts):
        message: dict[str, Any] = {**bench_ingest.sample(i)}
        message["content"] = [{"type": "text", "text": text}]
        key = f"bench:#load\x00b{i}"
        ops.append(
            Append(records=(rows.record(message, at, 1.0),), dedupe=("incoming", "bench", key))
        )
    with Database(db_path(data_dir)) as db:
        db.apply(ops)


def test_the_store_comparison_names_a_row_that_differs(tmp_path: Path) -> None:
    _store(tmp_path / "a", ["one", "two [source: x]"])
    _store(tmp_path / "b", ["one", "two [source: y]"])
    _store(tmp_path / "c", ["one"])
    same = bench_ingest.compare_stores(tmp_path / "a", tmp_path / "a", 2)
    assert same["problems"] == []
    assert same["marked"] == 1
    differs = bench_ingest.compare_stores(tmp_path / "a", tmp_path / "b", 2)
    assert differs["problems"] == ["b1: ['metadata', 'blocks'] differ"] or differs["problems"] == [
        "b1: ['blocks', 'metadata'] differ"
    ]
    short = bench_ingest.compare_stores(tmp_path / "a", tmp_path / "c", 2)
    assert short["problems"][0] == "row counts: mcplive 2, thin 1, sent 2"


@given(
    sent=st.lists(st.floats(0, 100), max_size=20),
    calls=st.lists(st.tuples(st.floats(0, 100), st.integers(0, 25)), max_size=20),
)
def test_a_message_waits_for_the_first_call_after_it_that_saw_it(
    sent: list[float], calls: list[tuple[float, int]]
) -> None:
    times = dict(enumerate(sorted(sent)))
    got = bench_wakes.to_model_call(times, calls)
    expected = []
    for n, at in sorted(times.items()):
        seen = -1
        for moment, newest in sorted(calls):
            seen = max(seen, newest)
            if moment >= at and seen >= n:
                expected.append(moment - at)
                break
    assert got == expected


def test_a_silent_call_is_placed_at_its_turns_end_and_saw_what_was_stored_before() -> None:
    log = bench_wakes.CallLog()
    log.incoming(0)
    log.event("turn-start", 1.0, {})
    log.incoming(1)  # stored while the turn runs: not counted as seen by this call
    log.event("tokens", 1.5, {"delta": "0"})
    log.event("turn-end", 2.0, {})
    log.incoming(2)
    log.event("turn-start", 3.0, {})
    log.event("turn-end", 3.25, {})  # said nothing
    assert log.calls == [(1.5, 0), (3.25, 2)]
    assert log.during_turns([0.5, 1.2, 2.5, 3.1]) == 2
    sent = {0: 0.5, 1: 1.2, 2: 2.5}
    assert bench_wakes.to_model_call(sent, log.calls) == [1.0, 2.05, 0.75]


@pytest.mark.parametrize("probe", [0, 5])
async def test_latency_to_the_model_call(tmp_path: Path, probe: int) -> None:
    with trio.fail_after(DEADLINE_S):
        result = await bench_wakes.run_model_latency(tmp_path, 30, 500.0, probe)
    assert len(result["latencies"]) == (30 if probe == 0 else 6)
    assert result["calls"] >= 1


async def test_agents_hearing_one_channel(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        run = await bench_scale.run_agents(tmp_path, 2, 20)
    assert run["seconds"] > 0 and run["cpu"] > 0 and run["bytes"] > 0


async def test_servers_registering_channels_at_once(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        run = await bench_scale.run_channels(tmp_path, 2, 3, 12)
    assert run["accepted"] == 6
    assert run["register_s"] > 0


async def test_search_first_turn_and_rollback_on_a_stored_history(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        run = await bench_scale.run_store(tmp_path, 300)
    assert run["found"] == 3
    assert run["set_aside"] >= 99  # the 99 newer stored ones, the local message and after


def test_marking_and_its_baseline_find_the_same_openings() -> None:
    marked, plain = bench_marking.measure([bench_marking.block(50), "x [ Source: y"], 51)
    assert marked > 0 and plain > 0


async def test_the_community_preset_answers_what_is_addressed_for_fewer_turns(
    tmp_path: Path,
) -> None:
    with trio.fail_after(DEADLINE_S):
        runs = await bench_community.compare(tmp_path, 12)
    none, preset = runs["none"], runs["community"]
    for run in (none, preset):
        assert run["lines"] == 12
        assert run["addressed"] == 3
        assert run["answered"] == 3, run["unanswered"]
        assert run["replies"] == 3
    assert none["turns"] == 12 * len(bench_community.AGENTS)  # every line woke every agent
    assert preset["turns"] == 3  # only the addressed agent, once per addressed line
    assert preset["silent"] == 0 < none["silent"]
    assert preset["tokens"] < none["tokens"]


async def test_the_silence_row_measures_both_providers_from_the_ledger(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE_S):
        runs = await bench_silence.measure(tmp_path, 3)
    assert set(runs) == set(bench_silence.PROVIDERS)
    for run in runs.values():
        assert run["turns"] == run["silent"] == 3
        assert 0 < run["read"] <= run["prompt"]
        assert run["share"] == run["read"] / run["prompt"]


async def test_the_ingest_row_runs_on_postgresql(tmp_path: Path, pg_dsn: str) -> None:
    """Row (a) on a PostgreSQL store: every message answered, and stored there."""
    with trio.fail_after(DEADLINE_S):
        seconds = await bench_ingest.run_mcplive(tmp_path, 50, ["--closed"], pg_dsn)
    assert seconds > 0
    with Reader(pg_dsn, read_only=True) as reader:
        assert reader.count() >= 50


@pytest.mark.parametrize("hosts", [1, 2])
async def test_the_fleet_row_runs_on_one_and_two_host_processes(
    tmp_path: Path, pg_dsn: str, hosts: int
) -> None:
    """The fleet's throughput row: every agent answered every line, on one host process or
    with the leases spread over two."""
    with trio.fail_after(DEADLINE_S):
        run = await bench_fleet.run_throughput(tmp_path, pg_dsn, hosts, 2, 3)
    assert run["replies"] == 6 and run["seconds"] > 0
    assert set(run["cpu"]) == {f"host-{k + 1}" for k in range(hosts)} | {"database", "servers"}
    assert 0 <= run["remote"] <= (2 if hosts == 2 else 0)


async def test_the_failover_row_answers_from_the_other_host_after_a_kill(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The failover row: the agent answers again after its host was killed, no sooner than
    its lease let the other host take it (the lease less one renewal period, the most the last
    renewal can precede the kill, and a second's slack for a step's own time)."""
    with trio.fail_after(DEADLINE_S):
        run = await bench_fleet.run_failover(tmp_path, pg_dsn)
    assert run["lease_s"] - run["renew_s"] - 1 <= run["seconds"] < DEADLINE_S
    assert run["server_moved"]  # one agent and one server: the first host took both
    assert run["reconnected"] is not None and run["reconnected"] <= run["seconds"]
