"""``actors.status.StatusWriter``: the file it keeps, its redaction, its last write, and a
write that fails. Real clock (the writer paces itself on wall-clock time), generous deadlines,
waits on the document it last wrote."""

from __future__ import annotations

import errno
import json
import os
import types
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors.config import AgentConfig, HostConfig, ServerConfig
from actors.messages import AgentStatus, ConnStatus
from actors.status import StatusWriter, write_atomic
from actors.trace import TraceBus
from protocol import status as fmt
from protocol.redact import REDACTED

TOKEN = "tok-secret-123456"
API_KEY = "sk-ant-test-987654"


def fake_ctx(data_dir: Path) -> Any:
    config = HostConfig(
        data_dir=data_dir,
        servers=(
            ServerConfig(id="lobby", command=("lobby",), token=TOKEN),
            ServerConfig(id="clock", command=("clock",)),
        ),
        agents=(AgentConfig(name="Ada", model="scripted:/a"), AgentConfig(name="Bob", model="x")),
        base_dir=data_dir,
    )
    down = ConnStatus(
        server_id="lobby",
        connected=False,
        ready=False,
        mcp_only=False,
        grant=frozenset(),
        tools=(),
        channels=(),
        connects=3,
        last_error=f"handshake refused: HTTP 401: Bearer {TOKEN}",
        stderr_tail=tuple(f"line {i} {TOKEN}" for i in range(30)),
    )
    paused = AgentStatus(
        name="Ada", paused=f"the credential {API_KEY} was refused", turns=2, last_turn_at=1e9
    )
    return types.SimpleNamespace(
        config=config,
        statuses={"lobby": down},
        agent_statuses={"Ada": paused},
        trace=TraceBus(),
    )


async def test_the_file_follows_the_statuses_without_a_credential_and_ends_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", API_KEY)
    ctx = fake_ctx(tmp_path)
    writer = StatusWriter(ctx, check_every=0.01)
    path = tmp_path / fmt.FILE_NAME
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            first = await writer.written.wait_value(lambda d: d is not None)
            text = path.read_text(encoding="utf-8")
            assert fmt.parse(text) == first
            assert TOKEN not in text and API_KEY not in text and REDACTED in text
            lobby, clock = first["servers"]
            assert (lobby["state"], lobby["connects"], lobby["reconnects"]) == (
                "disconnected",
                3,
                2,
            )
            assert lobby["last_error"] == f"handshake refused: HTTP 401: Bearer {REDACTED}"
            assert len(lobby["stderr_tail"]) == 20 and lobby["stderr_tail"][-1].startswith(
                "line 29"
            )
            assert clock["state"] == "connecting" and clock["grant"] == []
            ada, bob = first["agents"]
            assert ada["state"] == "paused" and ada["turns"] == 2
            assert ada["last_turn_at"] == fmt.iso(1e9)
            assert bob["state"] == "starting"
            assert fmt.assess(first, first["pid"], fmt.seconds(first["written_at"]) or 0).code == 1
            # a change is written without waiting for the heartbeat
            ctx.statuses["lobby"] = attrs.evolve(
                ctx.statuses["lobby"], connected=True, ready=True, grant=frozenset({"tools"})
            )
            ctx.agent_statuses["Ada"] = AgentStatus(name="Ada")
            ctx.agent_statuses["Bob"] = AgentStatus(name="Bob", turn_running=True, queued=4)
            ctx.statuses["clock"] = attrs.evolve(ctx.statuses["lobby"], server_id="clock")
            later = await writer.written.wait_value(
                lambda d: d is not None and d["agents"][1]["state"] == "turn"
            )
            assert later["servers"][0]["grant"] == ["tools"]
            assert fmt.assess(later, later["pid"], fmt.seconds(later["written_at"]) or 0).code == 0
            nursery.cancel_scope.cancel()
    last = fmt.parse(path.read_text(encoding="utf-8"))
    assert last["running"] is False and last["agents"][1]["queued"] == 4
    assert os.listdir(tmp_path) == [fmt.FILE_NAME]  # no temporary file left


async def test_a_failing_write_is_one_line_per_streak(tmp_path: Path) -> None:
    blocked = tmp_path / "data"
    blocked.write_text("a file where the data dir should be")
    ctx = fake_ctx(blocked)
    writer = StatusWriter(ctx, check_every=0.01)
    stream = ctx.trace.subscribe_nowait(kinds=frozenset({"status-unwritten"}))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            first = await stream.receive()
            assert first.data["path"] == str(blocked / fmt.FILE_NAME)
            blocked.unlink()
            blocked.mkdir()  # the streak ends with the next write
            await writer.written.wait_value(lambda d: d is not None)
            blocked.joinpath(fmt.FILE_NAME).unlink()
            blocked.joinpath(fmt.FILE_NAME).mkdir()  # a folder in its place: a new streak
            ctx.agent_statuses["Bob"] = AgentStatus(name="Bob", held=True)  # worth a write
            second = await stream.receive()
            assert second.kind == "status-unwritten"
            nursery.cancel_scope.cancel()
    with pytest.raises(trio.WouldBlock):
        stream.receive_nowait()  # the last write failed too, but within the same streak


async def test_a_write_that_fails_still_touches_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = fake_ctx(tmp_path)
    writer = StatusWriter(ctx, check_every=0.01)
    path = tmp_path / fmt.FILE_NAME
    stream = ctx.trace.subscribe_nowait(kinds=frozenset({"status-unwritten"}))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            first = await writer.written.wait_value(lambda d: d is not None)
            before = path.stat().st_mtime_ns

            def full(path: Path, data: bytes) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")

            monkeypatch.setattr("actors.status.write_atomic", full)
            ctx.agent_statuses["Bob"] = AgentStatus(name="Bob", held=True)  # worth a write
            failed = await stream.receive()
            assert failed.data["error"] == "No space left on device"
            # the content is the last one written, the file's time is the heartbeat's
            assert fmt.parse(path.read_text(encoding="utf-8")) == first
            assert path.stat().st_mtime_ns > before
            nursery.cancel_scope.cancel()


def test_write_atomic_replaces_whole_and_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    write_atomic(path, b'{"a": 1}')
    write_atomic(path, b'{"a": 2}')
    assert json.loads(path.read_bytes()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]
    path.unlink()
    path.mkdir()
    with pytest.raises(OSError):
        write_atomic(path, b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["status.json"]


def test_the_summary_shows_a_stderr_tail_only_for_a_server_in_trouble(tmp_path: Path) -> None:
    from actors.cli.status import summary

    tail = ["[lobby] chatter"]
    doc = {
        "mcplive": "0",
        "pid": 1,
        "started_at": "2026-01-01T00:00:00.000Z",
        "written_at": "2026-01-01T00:00:00.000Z",
        "running": True,
        "servers": [
            {"id": "up", "state": "ready", "reconnects": 0, "stderr_tail": tail},
            {"id": "down", "state": "disconnected", "reconnects": 2, "stderr_tail": ["boom"]},
        ],
        "agents": [],
    }
    verdict = types.SimpleNamespace(summary="degraded: down disconnected")
    lines = summary(tmp_path, 1, doc, verdict, 0.0)
    assert "    stderr: boom" in lines
    assert not any("chatter" in line for line in lines)


def test_each_server_lists_its_channels_capped_with_their_count(tmp_path: Path) -> None:
    """The file lists a server's first channels by id (at most ``MAX_CHANNELS``) with how many
    it has, each with where prose goes and for whom it is closed; ``mcplive status`` names the
    first few on one line."""
    from actors.cli.status import channels_line
    from actors.directory import ChannelDirectory
    from actors.status import MAX_CHANNELS
    from protocol.lanes import ChannelDescriptor

    ctx = fake_ctx(tmp_path)
    directory = ctx.channel_directory = ChannelDirectory()
    rooted = {"publish": {"target": "root"}}
    for i in reversed(range(MAX_CHANNELS + 10)):
        desc = ChannelDescriptor(id=f"c{i:03}", label=f"#{i}", capabilities=rooted if i else None)
        directory.register("lobby", desc, {"Ada": True, "Bob": i % 2 == 0}, False)
    directory.unregister("lobby", "c002")
    lobby, clock = StatusWriter(ctx).body()["servers"]
    assert lobby["channel_count"] == MAX_CHANNELS + 10
    assert [c["id"] for c in lobby["channels"]] == [f"c{i:03}" for i in range(MAX_CHANNELS)]
    c0, c1, c2 = lobby["channels"][:3]
    assert (c0["place"], c0["closed_for"], c0["label"]) == ("held", [], "#0")
    assert (c1["place"], c1["closed_for"]) == ("root", ["Bob"])
    assert c2["registered"] is False
    assert (clock["channel_count"], clock["channels"]) == (0, [])
    line = channels_line(lobby)
    assert line.startswith("channels (60): #0 (prose held), #1 (closed for Bob), #2 (unregistered)")
    assert line.endswith(", … and 52 more")


def test_the_summary_shows_times_as_the_transcript_does(tmp_path: Path) -> None:
    """The file keeps UTC (ISO 8601); ``mcplive status`` shows the local date and time, as the
    transcript's lines start."""
    from actors.cli.status import summary
    from actors.transcript.printer import local_stamp

    doc = {
        "mcplive": "0",
        "pid": 1,
        "started_at": fmt.iso(1e9),
        "written_at": fmt.iso(1e9 + 5),
        "running": False,
        "servers": [],
        "agents": [{"name": "Ada", "state": "idle", "turns": 2, "last_turn_at": fmt.iso(1e9 + 3),
                    "last_outcome": "completed", "queued": 0}],
    }  # fmt: skip
    verdict = types.SimpleNamespace(summary="ok")
    running = summary(tmp_path, 1, doc, verdict, 1e9 + 6)
    assert f"  Ada: idle; 2 turns, last turn {local_stamp(1e9 + 3)} (completed); 0 queued" in (
        running
    )
    stopped = summary(tmp_path, None, doc, verdict, 1e9 + 6)
    assert f"  last status: pid 1, written {local_stamp(1e9 + 5)} (it was stopping)" in stopped


def test_the_status_names_a_postgresql_store_without_its_password(tmp_path: Path) -> None:
    from actors.config import load_config
    from actors.status import snapshot
    from protocol.redact import Redactor

    raw = {
        "host": {"data_dir": str(tmp_path), "store": "postgresql://ops:s3cret@db.example/live"},
        "agents": [{"name": "Ada", "model": f"scripted:{tmp_path / 'x.toml'}"}],
    }
    (tmp_path / "x.toml").write_text("", encoding="utf-8")
    cfg = load_config(raw)
    doc = snapshot(cfg, {}, {}, pid=1, started_at=0.0, running=True, redactor=Redactor([]))
    assert "s3cret" not in doc["store"] and doc["store"].startswith("postgresql://ops")
    embedded = load_config({**raw, "host": {"data_dir": str(tmp_path)}})
    doc = snapshot(embedded, {}, {}, pid=1, started_at=0.0, running=True, redactor=Redactor([]))
    assert doc["store"] == str(tmp_path / "store.sqlite3")
