"""``actors.web.metrics``: the collector over a host's published state, written by
``prometheus-client`` and read back by its parser. Hostile names (quotes, backslashes, line
feeds) stay inside their labels; the channel labels of a server are capped, the rest summed; every
sample carries the host's id."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from actors.link.end import StderrTail
from actors.link.vitals import CHANNEL_LABELS, LinkVitals
from actors.storage import CommitTimes
from actors.web.metrics import exposition, registry_for
from protocol.redact import Redactor

HOST_ID = "blue-1"


class Ref:
    def __init__(self, depth: int) -> None:
        self.depth = depth

    @property
    def queued(self) -> int:
        return self.depth


def fake_host(server_id: str, agent: str, channels: list[str]) -> tuple[Any, Any]:
    vitals = LinkVitals(server_id, StderrTail(Redactor(())))
    for n, channel in enumerate(channels, start=1):
        vitals.stored(channel, n)
    times = CommitTimes()
    for seconds in (0.0005, 0.003, 0.2, 9.0):
        times.add(seconds)
    ctx = SimpleNamespace(
        host_id=HOST_ID,
        redactor=Redactor(()),
        vitals={server_id: vitals},
        store=SimpleNamespace(commit_times=times),
        agents={agent: Ref(2)},
        connections={server_id: Ref(0)},
        channels={(server_id, c): Ref(i) for i, c in enumerate(channels[:3])},
    )
    config = SimpleNamespace(agents=[SimpleNamespace(name=agent, model='m"\n')])
    snap = {
        "servers": [{"id": server_id, "state": "ready", "connects": 3, "reconnects": 2}],
        "agents": [
            {
                "name": agent,
                "state": "idle",
                "turns": 4,
                "wakes": 9,
                "queued": 1,
                "model_errors": 2,
                "usage": {"input_tokens": 10, "output_tokens": 5},
            }
        ],
        "loop": {"longest_step_ms": 12.0, "stalls": 1},
    }
    return SimpleNamespace(ctx=ctx, config=config), snap


def samples(host: Any, snap: Any) -> list[Any]:
    text = exposition(registry_for(host, lambda: snap)).decode("utf-8")
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(host: Any, snap: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Each sample's value by its name and its labels other than ``host_id`` (which every
    sample carries: checked here, for every test)."""
    got = {}
    for s in samples(host, snap):
        labels = dict(s.labels)
        assert labels.pop("host_id") == HOST_ID, s
        got[(s.name, frozenset(labels.items()))] = s.value
    return got


hostile = st.text(min_size=1).filter(lambda t: "\x00" not in t)


@given(hostile, hostile, hostile)
def test_hostile_names_stay_inside_their_labels(server: str, agent: str, channel: str) -> None:
    host, snap = fake_host(server, agent, [channel])
    got = scrape(host, snap)
    stored = (
        "mcplive_messages_stored_total",
        frozenset({("server", server), ("channel", channel)}),
    )
    assert got[stored] == 1
    assert got[("mcplive_agent_turns_total", frozenset({("agent", agent)}))] == 4
    errors = frozenset({("agent", agent), ("model", 'm"\n')})
    assert got[("mcplive_model_errors_total", errors)] == 2


def test_every_family_and_the_commit_histogram() -> None:
    host, snap = fake_host('a"b\\c\nd', "Ada", ["#general"])
    got = scrape(host, snap)
    sid = 'a"b\\c\nd'
    assert got[("mcplive_up", frozenset())] == 1
    assert got[("mcplive_loop_stalls_total", frozenset())] == 1
    assert got[("mcplive_loop_longest_step_seconds", frozenset())] == 0.012
    assert got[("mcplive_server_ready", frozenset({("server", sid)}))] == 1
    assert got[("mcplive_server_reconnects_total", frozenset({("server", sid)}))] == 2
    assert got[("mcplive_agent_wakes_total", frozenset({("agent", "Ada")}))] == 9
    kinds = {("agent", "Ada"), ("model", 'm"\n')}
    assert got[("mcplive_model_tokens_total", frozenset({*kinds, ("kind", "input_tokens")}))] == 10
    # 0.5 ms, 3 ms, 200 ms and 9 s: cumulative counts per bucket, the last one past every bound
    assert got[("mcplive_store_commit_seconds_bucket", frozenset({("le", "0.001")}))] == 1
    assert got[("mcplive_store_commit_seconds_bucket", frozenset({("le", "0.005")}))] == 2
    assert got[("mcplive_store_commit_seconds_bucket", frozenset({("le", "5.0")}))] == 3
    assert got[("mcplive_store_commit_seconds_bucket", frozenset({("le", "+Inf")}))] == 4
    assert got[("mcplive_store_commit_seconds_count", frozenset())] == 4
    assert got[("mcplive_mailbox_depth", frozenset({("kind", "agent"), ("actor", "Ada")}))] == 2
    assert got[("mcplive_mailbox_depth_max", frozenset({("kind", "channel")}))] == 0


def test_channel_labels_are_capped_per_server_and_the_rest_summed() -> None:
    channels = [f"#c{n}" for n in range(CHANNEL_LABELS + 5)]
    host, snap = fake_host("lobby", "Ada", channels)
    got = scrape(host, snap)
    labelled = [k for k in got if k[0] == "mcplive_messages_stored_total"]
    assert len(labelled) == CHANNEL_LABELS
    # the first channels keep their labels; the later ones are summed, never dropped
    assert ("channel", "#c0") in labelled[0][1] or any(("channel", "#c0") in k[1] for k in labelled)
    rest = sum(range(CHANNEL_LABELS + 1, CHANNEL_LABELS + 6))
    other = ("mcplive_messages_stored_other_total", frozenset({("server", "lobby")}))
    assert got[other] == rest


def test_each_console_has_a_registry_of_its_own() -> None:
    host, snap = fake_host("lobby", "Ada", [])
    first, second = registry_for(host, lambda: snap), registry_for(host, lambda: snap)
    assert first is not second
    from prometheus_client import REGISTRY

    assert b"mcplive_up" not in exposition(REGISTRY)


def test_every_sample_carries_the_host_id() -> None:
    host, snap = fake_host("lobby", "Ada", ["#general", "#random"])
    found = samples(host, snap)
    names = {s.name for s in found}
    assert {"mcplive_up", "mcplive_store_commit_seconds_bucket", "mcplive_mailbox_depth"} <= names
    assert all(s.labels.get("host_id") == HOST_ID for s in found)
    text = exposition(registry_for(host, lambda: snap)).decode("utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines and all(f'host_id="{HOST_ID}"' in line for line in lines)
