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

from examples.lobby_control import open_control_listener
from store import Reader
from tests.helpers import (
    LOBBY,
    RecordingModel,
    answered,
    incoming_answered,
    install,
    ready,
    running_lobby,
    send_incoming,
    wait_trace,
)

pytestmark = pytest.mark.slow


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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            release = model.hold()
            send_incoming(ctl, "lobby:#general", "g1", "keep busy")
            await model.entered.wait()  # Ada's first turn read its context before the pushes
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
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(say="")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            release = model.hold()
            send_incoming(ctl, "lobby:#general", "g1", "keep busy")
            await model.entered.wait()
            await push(ctl, "t1", "a secret typo", key="msg", initial=True)
            gone = await push(ctl, "t2", "", key="msg", retract=True)
            assert gone["result"]["coalesce"]["outcome"] == "retracted"
            release.set()
            await host.run_until_idle()
            assert all("a secret typo" not in seen_texts(model, i) for i in range(len(model.seen)))


async def test_malformed_coalesce_members_are_refused_per_lane(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
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
    tmp_path: Path,
) -> None:
    """refs-and-headers I.1: the correction inherits the subject's thread, so its header, its
    source and its route name the thread, and the reply publishes into it."""
    rules = '[[rules]]\nwhen = "edited"\nsay = "seen the edit"\n'
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": rules}) as lb:
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
        f'[host]\ndata_dir = "data"\n\n[[servers]]\nid = "lobby"\ncommand = [{cmd}]\n\n'
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
                proc.send_signal(signal.SIGINT)
                with trio.move_on_after(20):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
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
