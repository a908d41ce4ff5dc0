"""The fleet on a shared PostgreSQL store: a host heartbeats into the ``hosts`` table; ``mcplive
status CONFIG`` (readable and ``--json``) and the console's ``/api/fleet`` show each host's last
heartbeat and who holds each lease; a database that cannot be read is one line, and the exit
status stays the local host's verdict.

Real PostgreSQL, real processes and loopback HTTP; bounded polling, no fixed sleeps."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.fleet import heartbeat as heartbeat_module
from actors.fleet import view
from actors.fleet.heartbeat import Heartbeat
from actors.trace import TraceEvent
from actors.transcript.lines import WARNING, format_event, level_of
from actors.web.console import open_console
from protocol.leases import Lease
from store.leases import Fleet, HostRow, LeaseTable, read_fleet
from tests.cli_helpers import mcplive
from tests.helpers import running_lobby

pytestmark = pytest.mark.slow

DEADLINE = 120
UNREACHABLE = "postgresql://nobody:sekrit@127.0.0.1:1/none"


async def until(read: Callable[[], Any], ok: Callable[[Any], bool], what: str) -> Any:
    """``read()`` (in a worker thread) again until ``ok`` holds of its answer (bounded by the
    caller's deadline)."""
    while True:
        found = await trio.to_thread.run_sync(read)
        if ok(found):
            return found
        await trio.sleep(0.05)


def host_row(fleet: Fleet, host_id: str) -> HostRow | None:
    return next((h for h in fleet.hosts if h.host_id == host_id), None)


def status_config(path: Path, data_dir: Path, store: str | None) -> Path:
    lines = ["[host]", f"data_dir = {json.dumps(str(data_dir))}"]
    if store is not None:
        lines.append(f"store = {json.dumps(store)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def test_a_host_heartbeats_and_status_and_the_console_show_the_fleet(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(heartbeat_module, "HEARTBEAT_S", 0.2)
    with trio.fail_after(DEADLINE):
        async with running_lobby(
            tmp_path, {"Ada": ""}, host_keys={"store": pg_dsn, "host_id": "alpha"}
        ) as lb:
            assert lb.host.heartbeat is not None
            first = await until(
                lambda: read_fleet(pg_dsn), lambda f: host_row(f, "alpha") is not None, "a beat"
            )
            beat = host_row(first, "alpha")
            assert beat is not None and not beat.leaving
            await until(
                lambda: read_fleet(pg_dsn),
                lambda f: host_row(f, "alpha").heartbeat_at > beat.heartbeat_at,  # type: ignore[union-attr]
                "a later beat",
            )

            # this host's lease keeper holds Ada and the lobby's connection; another host of
            # the fleet steps, holding nothing
            def other_host_step() -> None:
                with LeaseTable(pg_dsn) as table:
                    step = table.step("beta", [])
                    assert step.held == {}

            await trio.to_thread.run_sync(other_host_step)
            config = status_config(tmp_path / "status.toml", lb.host.config.data_dir, pg_dsn)

            readable = await trio.to_thread.run_sync(
                lambda: mcplive("status", str(config), cwd=tmp_path)
            )
            out = readable.stdout
            # the verdict is this host's own (the lobby may not be ready in its status file yet)
            assert readable.returncode in (0, 1), (out, readable.stderr)
            assert "fleet:" in out
            assert "    alpha: last heartbeat" in out and "    beta: last heartbeat" in out
            assert "    agent:Ada → alpha, epoch 1, expires in" in out
            assert "    server:lobby → alpha, epoch 1, expires in" in out
            assert out.index("fleet:") < out.index("health:")

            as_json = await trio.to_thread.run_sync(
                lambda: mcplive("status", str(config), "--json", cwd=tmp_path)
            )
            assert as_json.returncode in (0, 1), as_json.stderr
            doc = json.loads(as_json.stdout)
            assert doc["host_id"] == "alpha" and doc["servers"]  # the status file, as it was
            fleet = doc["fleet"]
            assert {h["host_id"] for h in fleet["hosts"]} == {"alpha", "beta"}
            ada, lobby = fleet["leases"]
            assert ada["resource"] == "agent:Ada" and ada["holder"] == "alpha"
            assert ada["epoch"] == 1 and ada["state"] == "held" and ada["expires_in_s"] > 0
            assert (lobby["resource"], lobby["holder"]) == ("server:lobby", "alpha")

            async with (
                open_console(lb.host, "127.0.0.1:0", None) as console,
                httpx.AsyncClient(base_url=console.url) as http,
            ):
                info = (await http.get("/api/console")).json()
                assert info["fleet"] is True
                answer = await http.get("/api/fleet")
                assert answer.status_code == 200
                api = answer.json()
                assert api["enabled"] is True and api["host_id"] == "alpha"
                assert api["store"] == pg_dsn  # the test cluster's DSN holds no password
                assert {h["host_id"] for h in api["hosts"]} == {"alpha", "beta"}
                assert [(x["resource"], x["holder"], x["epoch"]) for x in api["leases"]] == [
                    ("agent:Ada", "alpha", 1),
                    ("server:lobby", "alpha", 1),
                ]
    # a clean stop marks the host leaving
    gone = await trio.to_thread.run_sync(lambda: read_fleet(pg_dsn))
    left = host_row(gone, "alpha")
    assert left is not None and left.leaving
    assert any(
        line.startswith("    alpha: last heartbeat") and line.endswith(", leaving")
        for line in view.lines(view.as_json(gone, pg_dsn))
    )


def test_an_unreachable_fleet_is_one_line_and_keeps_the_exit_status(tmp_path: Path) -> None:
    data = tmp_path / "data"
    local = status_config(tmp_path / "local.toml", data, None)
    shared = status_config(tmp_path / "shared.toml", data, UNREACHABLE)
    plain = mcplive("status", str(local), cwd=tmp_path)
    assert "fleet:" not in plain.stdout  # the embedded store has no fleet
    done = mcplive("status", str(shared), cwd=tmp_path)
    assert done.returncode == plain.returncode == 3  # no host runs here
    fleet_lines = [line for line in done.stdout.splitlines() if line.startswith("fleet")]
    assert len(fleet_lines) == 1 and fleet_lines[0].startswith("fleet: not read: ")
    assert "sekrit" not in done.stdout + done.stderr
    assert done.stdout.replace(fleet_lines[0] + "\n", "") == plain.stdout
    as_json = mcplive("status", str(shared), "--json", cwd=tmp_path)
    assert as_json.returncode == 3
    doc = json.loads(as_json.stdout)
    assert doc["running"] is False and doc["fleet"]["error"]
    assert "sekrit" not in as_json.stdout
    assert "fleet" not in json.loads(mcplive("status", str(local), "--json", cwd=tmp_path).stdout)


class _Trace:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields.get("data") or {}))


class _Ctx:
    host_id = "alpha"

    def __init__(self) -> None:
        self.trace = _Trace()


async def test_a_failing_heartbeat_is_one_line_not_a_crash() -> None:
    ctx = _Ctx()
    beat = Heartbeat(ctx, UNREACHABLE, every=0.05)  # type: ignore[arg-type]
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(beat.run)
            await until(lambda: beat.failures, lambda n: n >= 3, "three failed beats")
            nursery.cancel_scope.cancel()
    [(kind, data)] = ctx.trace.events
    assert kind == "heartbeat-failed" and "cannot connect" in data["error"]
    assert "sekrit" not in json.dumps(data)
    event = TraceEvent(kind=kind, data=data, ts=1e9)
    assert level_of(event) == WARNING
    line = format_event(event)
    assert line is not None
    assert line.startswith(
        "! heartbeat into the store postgresql://nobody:…@127.0.0.1:1/none failed: cannot connect"
    )


def test_the_readable_fleet() -> None:
    fleet = Fleet(
        now=1000.0,
        hosts=(HostRow("alpha", 900.0, 998.0, False), HostRow("beta", 100.0, 700.0, True)),
        leases=(
            Lease("agent:Ada", "alpha", 3, 1012.0),
            Lease("agent:Bob", "beta", 1, 996.0),
            Lease("server:lobby", None, 2, 990.0),
        ),
    )
    shown = view.lines(view.as_json(fleet, "postgresql://db"))
    assert shown == [
        "fleet:",
        "  hosts:",
        "    alpha: last heartbeat 2 s ago",
        "    beta: last heartbeat 5 min ago, leaving",
        "  leases:",
        "    agent:Ada → alpha, epoch 3, expires in 12 s",
        "    agent:Bob → beta, epoch 1, expired 4 s ago",
        "    server:lobby: free (epoch 2)",
    ]
    assert view.lines({"store": "x", "error": "cannot connect"}) == [
        "fleet: not read: cannot connect"
    ]
