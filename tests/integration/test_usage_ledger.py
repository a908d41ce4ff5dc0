"""The usage ledger as a host keeps it: a real Host (real store in a temp dir) with the bundled
lobby as a stdio subprocess and scripted agents, one that answers and one that stays silent.
Every turn's usage is in the store, lasts a restart, and ``mcplive usage --json`` sums to what
the trace's ``turn-usage`` events said.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.cli.command import main
from actors.trace import TraceEvent
from store import Reader, db_path
from tests.helpers import (
    agent_configs,
    config,
    drain_ready,
    running_lobby,
    send_incoming,
    wait_trace,
)

pytestmark = pytest.mark.slow

AGENTS = {
    "Ada": '[[rules]]\nwhen = "."\nsay = "ok"\n',
    "Bea": '[[rules]]\nwhen = "never said here"\nsay = "no"\n',  # every turn of hers is silent
}
TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
TRACE_KEYS = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_tokens": "cache_read_input_tokens",
    "cache_write_tokens": "cache_creation_input_tokens",
}


def ada_used(e: TraceEvent) -> bool:
    return e.kind == "turn-usage" and e.agent == "Ada"


def usage_json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["usage", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def store_digest(data_dir: Path) -> dict[str, str]:
    """The store's files (but its shared-memory index, which any reader may touch), hashed."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.iterdir())
        if p.name.startswith(db_path(data_dir).name) and not p.name.endswith("-shm")
    }


async def test_the_ledger_holds_every_turn_after_a_restart_and_sums_to_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with running_lobby(tmp_path, AGENTS) as lb:
            for n in (1, 2):
                send_incoming(lb.ctl, "lobby:#general", f"u{n}", f"hello {n}")
                await wait_trace(lb.stream, ada_used, "Ada's turn", seen)
                await lb.host.run_until_idle()
            await lb.host.run_until_idle()
            seen.extend(await drain_ready(lb.stream))
            # read beside the running host
            beside = usage_json(capsys, "--data-dir", str(data_dir), "--by", "agent")
        cfg = config(tmp_path, [], agent_configs(tmp_path, AGENTS))
        async with Host.open(cfg) as host:  # reopened: the ledger is still there
            await host.run_until_idle()
    used = [e for e in seen if e.kind == "turn-usage"]
    by_agent = {name: [e for e in used if e.agent == name] for name in AGENTS}
    assert len(by_agent["Ada"]) >= 2 and len(by_agent["Bea"]) >= 1
    before = store_digest(data_dir)
    after = usage_json(capsys, "--data-dir", str(data_dir), "--by", "agent")
    assert store_digest(data_dir) == before  # the ledger's read changed no byte of the store
    assert after == beside
    rows = {r["agent"]: r for r in after}
    assert set(rows) == set(AGENTS)
    for name, events in by_agent.items():
        row = rows[name]
        assert row["calls"] == sum(e.data["calls"] for e in events)
        for key in TOKENS:
            assert row[key] == sum(e.data[TRACE_KEYS[key]] for e in events), (name, key)
        assert row["cost_usd"] is None  # a scripted model has no price
        assert row["input_tokens"] > 0
    assert rows["Bea"]["silent_turns"] == len(by_agent["Bea"])
    assert rows["Ada"]["silent_turns"] < len(by_agent["Ada"])
    # each row of the ledger names the turn and the wake that caused it
    with Reader(db_path(data_dir), read_only=True) as reader:
        totals = reader.usage()
    assert {(t.agent, t.server) for t in totals} == {("Ada", "lobby"), ("Bea", "lobby")}
    assert all(t.channel == "lobby:#general" for t in totals)
    # the config's price for the model (named as the ledger names it) gives its rows a cost
    ada_model = agent_configs(tmp_path, AGENTS)[0]["model"]
    priced = tmp_path / "priced.toml"
    priced.write_text(
        f'[host]\ndata_dir = "{data_dir}"\n[[agents]]\nname = "Ada"\nmodel = "{ada_model}"\n'
        '[prices."scripted:ada.toml"]\ninput = 1\noutput = 2\ncache_read = 0\ncache_write = 0\n',
        encoding="utf-8",
    )
    costed = {r["agent"]: r for r in usage_json(capsys, str(priced), "--by", "agent")}
    ada = costed["Ada"]
    assert ada["cost_usd"] == pytest.approx(
        (ada["input_tokens"] * 1 + ada["output_tokens"] * 2) / 1_000_000
    )
    assert costed["Bea"]["cost_usd"] is None  # Bea's model has no price: unknown, not 0
