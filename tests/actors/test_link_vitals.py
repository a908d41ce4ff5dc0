"""``actors.link.vitals``: a server's vitals, each bounded at its cap with the stated policy,
published as immutable snapshots; traffic counted on trio's clock (a ``MockClock``) and read
back per whole minute; and a ``Link`` counting what it writes at once."""

from __future__ import annotations

import itertools

import attrs
import pytest
import trio
import trio.testing

from actors.link.end import TAIL_LINES, StderrTail
from actors.link.vitals import (
    CHANNEL_LABELS,
    DISCONNECTS,
    LATENCY_SAMPLES,
    LinkVitals,
    ServerVitals,
)
from actors.status import vitals_entry
from protocol.redact import Redactor

TOKEN = "tok-9f8e7d6c5b4a"


def vitals() -> tuple[LinkVitals, itertools.count[int]]:
    ticks = itertools.count(1_700_000_000)
    clock = lambda: float(next(ticks))  # noqa: E731 - each reading one second later
    return LinkVitals("lobby", StderrTail(Redactor([TOKEN]), clock), clock), ticks


def test_disconnects_at_their_cap_forget_the_oldest() -> None:
    v, _ = vitals()
    for n in range(DISCONNECTS + 3):
        v.connecting()
        v.ready()
        v.ended(f"exited with code {n}\nand more", ready_for=n * 1.5 if n else None)
    snap = v.snapshot()
    assert len(snap.disconnects) == DISCONNECTS
    assert snap.disconnects[0].reason == "exited with code 3 and more"  # one line
    assert snap.disconnects[-1].ready_for_s == (DISCONNECTS + 2) * 1.5
    assert [d.at for d in snap.disconnects] == sorted(d.at for d in snap.disconnects)
    assert snap.connects == DISCONNECTS + 3 and snap.connected_since is None


def test_latencies_at_their_cap_keep_the_newest() -> None:
    v, _ = vitals()
    for n in range(LATENCY_SAMPLES + 100):
        v.answered(1000.0 if n < 100 else 0.01)  # the slow ones are the oldest
    latency = v.snapshot().latency
    assert latency == {"count": LATENCY_SAMPLES, "p50_s": 0.01, "p95_s": 0.01, "max_s": 0.01}


def test_channel_counts_at_their_cap_are_sticky_and_the_rest_summed() -> None:
    v, _ = vitals()
    for n in range(CHANNEL_LABELS + 10):
        v.stored(f"#c{n}")
    v.stored(None)  # outside any channel: past the cap too
    v.stored("#c0", 4)  # a channel counted keeps its place
    snap = v.snapshot()
    assert len(snap.stored) == CHANNEL_LABELS
    assert snap.stored["#c0"] == 5 and f"#c{CHANNEL_LABELS}" not in snap.stored
    assert snap.stored_other == 11


def test_stderr_lines_keep_their_time_at_the_tail_cap_redacted() -> None:
    v, _ = vitals()
    for n in range(TAIL_LINES + 5):
        v.tail.add(f"line {n} {TOKEN}")
        v.stderr_line()
    lines = v.snapshot().stderr
    assert len(lines) == TAIL_LINES
    assert lines[0][1].startswith("line 5 ") and TOKEN not in lines[0][1]
    assert [at for at, _ in lines] == sorted(at for at, _ in lines)
    assert v.tail.lines() == tuple(line for _, line in lines)  # what the status file had
    entry = vitals_entry(v.snapshot(), None)
    assert entry["stderr"][0]["at"].startswith("2023-11-14T22:")
    assert entry["per_minute"] == {"minutes": 1, "in": None, "out": None}


def test_a_snapshot_is_immutable_and_rebuilt_only_after_a_change() -> None:
    v, _ = vitals()
    first = v.snapshot()
    assert v.snapshot() is first
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        first.connects = 9  # type: ignore[misc]
    v.answered(0.5)
    second = v.snapshot()
    assert second is not first and first.latency["count"] == 0
    v.traffic.add(0.0, received=1)
    assert v.snapshot() is not second
    v.stored("#x")
    assert isinstance(v.snapshot(), ServerVitals) and v.snapshot().stored == {"#x": 1}


async def _traffic_per_minute() -> None:
    v, _ = vitals()
    v.traffic.add(trio.current_time(), received=3, sent=1)
    await trio.sleep(60)
    v.traffic.add(trio.current_time(), received=2)
    await trio.sleep(60)
    entry = vitals_entry(v.snapshot(), trio.current_time(), minutes=3)
    # the mock clock starts at 0: minutes -1 (nothing), 0 and 1; minute 2 is in progress
    assert entry["per_minute"] == {"minutes": 3, "in": [0, 3, 2], "out": [0, 1, 0]}
    await trio.sleep(3600)  # an hour later the window holds nothing of it
    later = vitals_entry(v.snapshot(), trio.current_time(), minutes=60)
    assert later["per_minute"]["in"] == [0] * 60


def test_traffic_per_minute_on_a_mock_clock() -> None:
    trio.run(_traffic_per_minute, clock=trio.testing.MockClock(autojump_threshold=0))
