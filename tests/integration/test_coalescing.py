"""RFC-006 event coalescing over a real lobby subprocess: an unread occurrence is replaced in
place, a read one is followed by the next, retractions, and malformed members refused per
lane. Real clock, order-only assertions."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from store import Reader
from tests.helpers import (
    LOBBY,
    RecordingModel,
    answered,
    hold_turn,
    incoming_answered,
    install,
    interrupt,
    ready,
    running_lobby,
    wait_trace,
)
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["stdio", "websocket"])
def websocket(request: pytest.FixtureRequest) -> bool:
    """Each lane test runs over a stdio lobby and over a loopback websocket lobby."""
    return bool(request.param == "websocket")


async def push(ctl: Any, event_id: str, text: str, **coalesce: Any) -> dict[str, Any]:
    """Send a coalesced push; the host's whole answer."""
    mark = ctl.mark()
    ctl.send({"cmd": "push", "eventId": event_id, "text": text, "coalesce": coalesce})
    event = await ctl.wait_for(answered("push/event", "eventId", event_id), event_id, since=mark)
    response: dict[str, Any] = event["response"]
    return response


def seen_texts(model: RecordingModel, call: int) -> str:
    return " ".join(
        b.get("text", "")
        for m in model.seen[call].messages
        for b in m.get("blocks", [])
        if b.get("type") == "text"
    )


async def test_an_unread_occurrence_is_replaced_and_a_read_one_is_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, websocket: bool
) -> None:
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, websocket=websocket) as lb:
            host, ctl = lb.host, lb.ctl
            # Ada's first turn read its context before the pushes
            release = await hold_turn(ctl, model, "lobby:#general", "g1", "keep busy")
            first = await push(ctl, "s1", "build 1 running", key="build", initial=True)
            assert first["result"]["coalesce"] == {"outcome": "first"}
            second = await push(ctl, "s2", "build 1 passed", key="build")
            assert second["result"]["coalesce"] == {"outcome": "replaced", "priorEventId": "s1"}
            release.set()
            await wait_trace(lb.stream, lambda e: e.kind == "turn-end", "the first turn")
            await host.run_until_idle()
            seen = seen_texts(model, 1)  # the second turn: the replacement only
            assert "build 1 passed" in seen and "build 1 running" not in seen
            # read now: the next one is appended after it
            third = await push(ctl, "s3", "build 2 running", key="build")
            assert third["result"]["coalesce"]["outcome"] == "appended"
            await host.run_until_idle()
            seen = seen_texts(model, -1)
            assert seen.index("build 1 passed") < seen.index("build 2 running")
            # a retry of an admitted occurrence gets the same answer, and nothing is stored
            again = await push(ctl, "s2", "build 1 passed", key="build")
            assert again["result"]["coalesce"] == second["result"]["coalesce"]
            stored = [
                m for m in host.history("Ada") if m["metadata"].get("coalesce_key") == "build"
            ]
            assert [m["metadata"]["event_id"] for m in stored] == ["s1", "s2", "s3"]


async def test_a_retraction_removes_an_unread_occurrence_without_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, websocket: bool
) -> None:
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, websocket=websocket) as lb:
            host, ctl = lb.host, lb.ctl
            release = await hold_turn(ctl, model, "lobby:#general", "g1", "keep busy")
            await push(ctl, "t1", "a secret typo", key="msg", initial=True)
            gone = await push(ctl, "t2", "", key="msg", retract=True)
            assert gone["result"]["coalesce"]["outcome"] == "retracted"
            release.set()
            await host.run_until_idle()
            assert all("a secret typo" not in seen_texts(model, i) for i in range(len(model.seen)))


async def test_malformed_coalesce_members_are_refused_per_lane(
    tmp_path: Path, websocket: bool
) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, websocket=websocket) as lb:
            host, ctl = lb.host, lb.ctl
            long_key = "k" * 257
            refused = await push(ctl, "x1", "too long", key=long_key)
            assert refused["error"]["code"] == -32602
            assert refused["error"]["data"] == {"field": "coalesce.key", "reason": "too_long"}
            mark = ctl.mark()
            ctl.send(
                {
                    "cmd": "incoming",
                    "channelId": "lobby:#general",
                    "messageId": "m1",
                    "text": "edit without an occurrence id",
                    "coalesce": {"key": "message:m1"},
                }
            )
            answer = await ctl.wait_for(incoming_answered("m1"), "m1", since=mark)
            [result] = answer["response"]["result"]["results"]
            assert result == {"messageId": "m1", "accepted": False, "reason": "coalesce_invalid"}
            await host.run_until_idle()
            assert not any(m["metadata"].get("event_id") == "x1" for m in host.history("Ada"))


async def test_a_channel_scoped_correction_without_a_thread_keeps_its_thread(
    tmp_path: Path, websocket: bool
) -> None:
    """refs-and-headers I.1: the correction inherits the subject's thread, so its header, its
    source and its route name the thread, and the reply publishes into it."""
    rules = '[[rules]]\nwhen = "edited"\nsay = "seen the edit"\n'
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": rules}, websocket=websocket) as lb:
            host, ctl = lb.host, lb.ctl
            exact = {"publish": {"target": "exact"}}
            mark = ctl.mark()
            ctl.send(
                {
                    "cmd": "register",
                    "channels": [
                        {"id": "lobby:#dev", "type": "chat", "label": "dev", "capabilities": exact}
                    ],
                }
            )
            await ctl.wait_for(answered("channels/register"), "registered", since=mark)
            mark = ctl.mark()
            ctl.send(
                {
                    "cmd": "incoming",
                    "channelId": "lobby:#dev",
                    "messageId": "m1",
                    "threadId": "T",
                    "eventId": "m1-created",
                    "text": "first draft",
                    "coalesce": {"key": "message:m1", "initial": True},
                }
            )
            await ctl.wait_for(incoming_answered("m1"), "m1", since=mark)
            await host.run_until_idle()
            fixed = await push(
                ctl, "m1-edited", "edited text", key="message:m1", channelId="lobby:#dev"
            )
            assert fixed["result"]["accepted"] is True
            await ctl.wait_for(
                lambda e: (
                    e["event"] == "received" and e["message"].get("method") == "channels/publish"
                ),
                "the reply",
            )
            await host.run_until_idle()
            [edit] = [
                m for m in host.history("Ada") if m["metadata"].get("event_id") == "m1-edited"
            ]
            assert "· thread T" in edit["metadata"]["source_header"]
            assert edit["blocks"][0]["text"] == edit["metadata"]["source_header"]
            assert edit["metadata"]["inbound_source"]["thread"] == "T"
            [reply] = [
                e["message"]["params"]
                for e in ctl.events
                if e.get("event") == "received" and e["message"].get("method") == "channels/publish"
            ]
            assert (reply["channelId"], reply["threadId"]) == ("lobby:#dev", "T")


STEPS: list[tuple[str, dict[str, Any], str]] = [
    ("c1", {"key": "A", "initial": True}, "first"),
    ("c2", {"key": "A"}, "replaced"),
    ("c3", {"key": "A", "retract": True}, "retracted"),
    ("c4", {"key": "B", "initial": True}, "first"),
]


#: The outcome of the first occurrence sent after the restart, by how many were acknowledged.
FIRST_NEW_AFTER_RESTART = {1: "appended", 2: "consumed", 3: "first"}


def _host_config(tmp_path: Path, address: str) -> Path:
    """A host whose agent is never woken by pushes (so nothing is read while it runs)."""
    (tmp_path / "gate.toml").write_text('default = "skip"\n', encoding="utf-8")
    (tmp_path / "a.toml").write_text("", encoding="utf-8")
    cmd = ", ".join(f'"{c}"' for c in [*LOBBY, "--control-connect", address])
    path = tmp_path / "host.toml"
    path.write_text(
        f'[host]\ndata_dir = "data"\n\n[[servers]]\nid = "lobby"\ncommand = [{cmd}]\n'
        f'env = {{ PYTHONPATH = "{ROOT}" }}\n\n'  # the test lobby, found from this folder
        '[[agents]]\nname = "Ada"\nmodel = "scripted:a.toml"\ngate = "gate.toml"\n',
        encoding="utf-8",
    )
    return path


async def _send(ctl: Any, steps: list[tuple[str, dict[str, Any], str]]) -> list[dict[str, Any]]:
    out = []
    for event_id, coalesce, _ in steps:
        text = "" if coalesce.get("retract") else f"text of {event_id}"
        out.append(await push(ctl, event_id, text, **coalesce))
    return out


@pytest.mark.parametrize("acknowledged", [1, 2, 3, 4])
async def test_a_host_killed_after_each_commit_loses_and_duplicates_nothing(
    tmp_path: Path, acknowledged: int
) -> None:
    with trio.fail_after(120):
        async with open_control_listener() as listener:
            argv = [
                sys.executable,
                "-m",
                "actors.cli",
                "run",
                str(_host_config(tmp_path, listener.address)),
            ]
            proc = await trio.lowlevel.open_process(argv, stdout=subprocess.DEVNULL)
            try:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                before = await _send(ctl, STEPS[:acknowledged])
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
            assert [r["result"]["coalesce"]["outcome"] for r in before] == [
                o for _, _, o in STEPS[:acknowledged]
            ]
            # the host restarts; the server retries everything, then goes on
            proc = await trio.lowlevel.open_process(argv, stdout=subprocess.DEVNULL)
            try:
                ctl = await listener.accept(timeout=60)
                await ready(ctl)
                after = await _send(ctl, STEPS)
            finally:
                await interrupt(proc)
    # a retried occurrence gets its original answer
    assert [r["result"] for r in after[:acknowledged]] == [r["result"] for r in before]
    # and what came unread before the crash was kept as an ordinary item: the next occurrence of
    # its subject follows it instead of replacing it (conservative recovery)
    if acknowledged in FIRST_NEW_AFTER_RESTART:
        assert (
            after[acknowledged]["result"]["coalesce"]["outcome"]
            == (FIRST_NEW_AFTER_RESTART[acknowledged])
        )
    assert all(r["result"]["accepted"] is True for r in after)
    reader = Reader(tmp_path / "data" / "store.sqlite3")
    try:
        stored = [
            m["metadata"]["event_id"]
            for m in reader.history("Ada")
            if m["metadata"].get("coalesce_key") is not None
        ]
    finally:
        reader.close()
    assert len(stored) == len(set(stored))  # nothing stored twice
    # every occurrence that was to be appended is stored (retractions without a notice are not)
    appended = {e for e, c, _ in STEPS if not c.get("retract")}
    assert appended <= set(stored)


# ---- deferred batches (RFC-006 §5): rendered through push/render at assembly -----------------


async def synced(ctl: Any, tag: str) -> None:
    """Every control event the lobby emitted before this point has been read."""
    mark = ctl.mark()
    ctl.send({"cmd": "ping", "id": tag})
    await ctl.wait_for(lambda e: e["event"] == "pong" and e.get("id") == tag, tag, since=mark)


def renders(ctl: Any) -> list[dict[str, Any]]:
    """The push/render requests the lobby handled (its ``render`` events), oldest first."""
    return [e for e in ctl.events if e.get("event") == "render"]


def rendered_items(host: Any, agent: str = "Ada") -> list[dict[str, Any]]:
    return [
        m
        for m in host.history(agent)
        if (m["metadata"].get("inbound_source") or {}).get("lane") == "render"
    ]


async def notice(ctl: Any, event_id: str, fallback: str, key: str, **extra: Any) -> None:
    answer = await push(ctl, event_id, fallback, key=key, deferred=True, **extra)
    assert answer["result"]["accepted"] is True, answer


async def test_a_deferred_batch_is_rendered_once_and_read_by_the_next_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, websocket: bool
) -> None:
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, websocket=websocket) as lb:
            host, ctl = lb.host, lb.ctl
            # the first turn assembled before the notices came
            release = await hold_turn(ctl, model, "lobby:#general", "g1", "keep busy")
            for n in (1, 2, 3):
                await notice(ctl, f"d{n}", f"fallback {n}", "build", data={"n": n})
            await synced(ctl, "before")
            assert renders(ctl) == []  # nothing is rendered before an assembly needs it
            release.set()
            await host.run_until_idle()
            await synced(ctl, "rendered")
            [render] = renders(ctl)
            params = render["params"]
            assert [n["eventId"] for n in params["notices"]] == ["d1", "d2", "d3"]
            assert [n["data"] for n in params["notices"]] == [{"n": 1}, {"n": 2}, {"n": 3}]
            assert (params["key"], params["eventId"], params["dropped"]) == ("build", "d3", 0)
            text = render["result"]["content"][0]["text"]
            assert len(model.seen) == 2
            seen = seen_texts(model, 1)
            assert text in seen and "fallback" not in seen
            [item] = rendered_items(host)
            assert item["metadata"]["event_id"] == "d3"
            assert item["metadata"]["coalesce_key"] == "build"
            assert item["blocks"][0]["text"] == item["metadata"]["source_header"]
            # a later turn with no new notice renders nothing again
            await host.post_local("Ada", "anything new?")
            await host.run_until_idle()
            await synced(ctl, "after")
            assert len(model.seen) == 3
            assert len(renders(ctl)) == 1
            assert len(rendered_items(host)) == 1


async def test_an_empty_render_materializes_nothing_and_runs_no_inference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, websocket: bool
) -> None:
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, websocket=websocket) as lb:
            host, ctl = lb.host, lb.ctl
            mark = ctl.mark()
            ctl.send({"cmd": "render_mode", "mode": "empty"})
            await ctl.wait_for(lambda e: e["event"] == "render_mode", "render mode", since=mark)
            await notice(ctl, "e1", "fallback e1", "typing")
            await ctl.wait_for(lambda e: e["event"] == "render", "the render")
            await host.run_until_idle()
            await synced(ctl, "after")
            assert len(renders(ctl)) == 1
            assert rendered_items(host) == []
            assert model.seen == []  # rev 8: only a deferred batch caused it, and it was empty


@pytest.mark.parametrize("mode", ["error", "never"])
async def test_a_failed_render_materializes_the_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, websocket: bool
) -> None:
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, websocket=websocket) as lb:
            host, ctl = lb.host, lb.ctl
            mark = ctl.mark()
            ctl.send({"cmd": "render_mode", "mode": mode})
            await ctl.wait_for(lambda e: e["event"] == "render_mode", "render mode", since=mark)
            await notice(ctl, "f1", "the fallback text", "ci")
            await ctl.wait_for(lambda e: e["event"] == "render", "the render")
            await host.run_until_idle()
            [item] = rendered_items(host)
            assert "the fallback text" in " ".join(b.get("text", "") for b in item["blocks"])
            assert len(model.seen) == 1
            assert "the fallback text" in seen_texts(model, 0)


@pytest.mark.parametrize("scoped", [False, True])
async def test_a_rendered_reference_is_stubbed_and_bound_to_the_pushing_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scoped: bool
) -> None:
    from protocol.source import channel_header, unscoped_header
    from tests.helpers import config, scripted, ws_lobby
    from tests.integration.test_reference_binding import bound_to, http_of
    from tests.lobby.server import builtin_files

    board = builtin_files()["board.png"]
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with (
            open_control_listener() as listener,
            ws_lobby("--files", "--control-connect", listener.address) as url,
        ):
            servers = [{"id": "lobby", "url": url}]
            agents = [{"name": "Ada", "model": scripted(tmp_path, "ada", "")}]
            async with Host.open(config(tmp_path, servers, agents)) as host:
                ctl = await listener.accept()
                await ready(ctl, host)
                extra: dict[str, Any] = {}
                if scoped:
                    mark = ctl.mark()
                    ctl.send(
                        {
                            "cmd": "register",
                            "channels": [{"id": "lobby:#dev", "type": "chat", "label": "dev"}],
                        }
                    )
                    await ctl.wait_for(answered("channels/register"), "registered", since=mark)
                    extra["channelId"] = "lobby:#dev"
                uri = f"{http_of(url)}/files/board.png"
                content = [
                    {"type": "text", "text": "the board now"},
                    {
                        "type": "resource",
                        "uri": uri,
                        "mimeType": board.mime_type,
                        "sizeBytes": board.size,
                        "digest": board.digest,
                        "name": board.name,
                    },
                ]
                mark = ctl.mark()
                ctl.send({"cmd": "render_mode", "mode": "result", "content": content})
                await ctl.wait_for(lambda e: e["event"] == "render_mode", "mode", since=mark)
                await notice(ctl, "r1", "fallback r1", "board", **extra)
                await ctl.wait_for(lambda e: e["event"] == "render", "the render")
                await host.run_until_idle()
                [item] = rendered_items(host)
                header = (
                    channel_header("lobby", "lobby:#dev", "dev", None, None)
                    if scoped
                    else unscoped_header("lobby")
                )
                assert item["metadata"]["source_header"] == header
                assert item["blocks"][0]["text"] == header
                assert item["metadata"]["channel_id"] == ("lobby:#dev" if scoped else None)
                stubs = [b for b in item["blocks"] if "ref_id" in b]
                assert len(stubs) == 1 and uri not in stubs[0]["text"]
                assert item["metadata"]["references"] == [stubs[0]["ref_id"]]
                assert await bound_to(host, stubs[0]["ref_id"]) == ("lobby",)
                assert stubs[0]["text"] in seen_texts(model, 0)
