"""An agent answering on a 0.4-era MCPL server (``tests.legacy_server``, a real stdio
subprocess) whose channels declare no publish target: by default its plain speech is held as a
draft and the operator and the agent are told why and what changes it; with the server's
``publish_undeclared`` the reply reaches the server in RFC-011's legacy form, unconfirmed.
Also: prose for a channel opened with ``channel_open`` that is not published is kept as a
draft, and a publish names the agent's one ``conversationId``. The lobby (declared channels,
and undeclared ones it registers on command) shows the operator's notice is given once per
channel, bounded by the channel cap, and that a config reload takes the key.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import actors.context
from actors import Host
from actors.messages import Call
from actors.trace import TraceEvent
from tests.cli_helpers import Running, mcplive
from tests.helpers import (
    answered,
    config,
    publish_received,
    publishes,
    running_lobby,
    scripted,
    send_incoming,
    wait_trace,
)
from tests.helpers import received as lobby_received

pytestmark = pytest.mark.slow

DEADLINE_S = 60
ROOT_CAPS = {"capabilities": {"publish": {"target": "root"}}}
ROOT_CHANNEL = {"id": "lobby:#last", "type": "chat", "label": "last", **ROOT_CAPS}
ANSWER = '[[rules]]\nwhen = "."\nsay = "noted"\n'
OPEN_DEV = (
    '[[rules]]\nwhen = "anyone"\n'
    'calls = [{ tool = "channel_open", arguments = { channel_id = "legacy:#dev" } }]\n'
    'say = "moving to dev"\n'
)


def legacy(record: Path, *extra: str, **keys: Any) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.legacy_server", "--record", str(record), *extra]
    return {"id": "legacy", "command": command, **keys}


def host_config(tmp_path: Path, rules: str, *extra: str, **keys: Any) -> dict[str, Any]:
    agent = {"name": "Ada", "model": scripted(tmp_path, "ada", rules)}
    return config(tmp_path, [legacy(tmp_path / "received.jsonl", *extra, **keys)], [agent])


def received(tmp_path: Path) -> list[dict[str, Any]]:
    """What the legacy server recorded of the host's ``channels/publish``, oldest first."""
    path = tmp_path / "received.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def all_texts(host: Host) -> list[str]:
    return [
        "".join(b.get("text", "") for b in m["blocks"] if b.get("type") == "text")
        for m in host.history("Ada")
    ]


def turn_end(e: TraceEvent) -> bool:
    return e.kind == "turn-end" and e.agent == "Ada"


async def one_turn(host: Host, seen: list[TraceEvent]) -> None:
    """Wait for Ada's turn (woken by the server's message) and for everything it left."""
    await wait_trace(host.trace(), turn_end, "Ada's turn", seen)
    await host.run_until_idle()


async def server_barrier(host: Host) -> None:
    """A round trip to the legacy server: it reads its input in order, so once it answers, it
    has recorded every notification the host sent it before."""
    conn = host.ctx.connections["legacy"]
    await conn.ask(Call(method="channels/list", params={}), timeout=DEADLINE_S)


async def drafts(host: Host) -> str:
    result = await host.execute_tool_call("Ada", "drafts", {"action": "list"})
    return " ".join(b.get("text", "") for b in result["content"])


async def test_by_default_speech_to_an_undeclared_channel_is_held_and_everyone_is_told(
    tmp_path: Path,
) -> None:
    seen: list[TraceEvent] = []
    with trio.fail_after(DEADLINE_S):
        async with Host.open(host_config(tmp_path, ANSWER)) as host:
            await one_turn(host, seen)
            # the agent was woken and answered; the answer is a draft, nothing reached the server
            held = [e for e in seen if e.kind == "speech-held"]
            assert [e.data["text"] for e in held] == ["noted"]
            await server_barrier(host)
            assert received(tmp_path) == []
            listing = await drafts(host)
            assert "noted" in listing and "legacy:#general" in listing
            # the agent's notice says what it can do about it
            [notice] = [t for t in all_texts(host) if t.startswith("[held]")]
            assert "channel_publish" in notice
            assert "publish_undeclared = true for server legacy in the host config" in notice
            # the operator was told once per channel, naming the key that changes it
            told = [e for e in seen if e.kind == "publish-undeclared"]
            assert sorted(e.channel_id for e in told) == ["legacy:#dev", "legacy:#general"]
            for e in told:
                assert e.data["publish_undeclared"] is False
                assert "held" in e.data["text"]
                assert "publish_undeclared on [[servers]] legacy" in e.data["text"]
            # channel_publish still posts there, in the legacy form
            posted = await host.execute_tool_call(
                "Ada", "channel_publish", {"channel_id": "legacy:#general", "content": "hi"}
            )
            assert posted["is_error"] is False
            [got] = received(tmp_path)
            assert got["form"] == "request" and "threadId" not in got["params"]


async def test_publish_undeclared_publishes_in_the_legacy_form_unconfirmed(
    tmp_path: Path,
) -> None:
    seen: list[TraceEvent] = []
    cfg = host_config(tmp_path, ANSWER, publish_undeclared=True)
    with trio.fail_after(DEADLINE_S):
        async with Host.open(cfg) as host:
            await one_turn(host, seen)
            [got] = received(tmp_path)
            assert got["form"] == "request"
            params = got["params"]
            assert params["channelId"] == "legacy:#general"
            assert "threadId" not in params
            assert params["content"] == [{"type": "text", "text": "noted"}]
            # the server said delivered: true, but it never said where: unconfirmed
            [published] = [e for e in seen if e.kind == "published"]
            assert published.data["outcome"] == "unconfirmed"
            receipt = [t for t in all_texts(host) if t.startswith("[delivered]")][-1]
            assert "Not confirmed: 1 segment to #general" in receipt
            assert "delivered] 1 segment" not in receipt
            told = [e for e in seen if e.kind == "publish-undeclared"]
            assert len(told) == 2
            assert all(e.data["publish_undeclared"] is True for e in told)
            assert all("unconfirmed" in e.data["text"] for e in told)
            # an explicit post to the same channel is judged by the same rule as the prose
            posted = await host.execute_tool_call(
                "Ada", "channel_publish", {"channel_id": "legacy:#general", "content": "by hand"}
            )
            assert posted["is_error"] is False
            assert "delivery unconfirmed" in posted["content"][0]["text"]
            assert "does not declare where posts land" in posted["content"][0]["text"]
            assert len(received(tmp_path)) == 2
            # a thread of such a channel is still no place to post
            refused = await host.execute_tool_call(
                "Ada",
                "channel_publish",
                {"channel_id": "legacy:#general", "content": "x", "thread_id": "t1"},
            )
            assert refused["is_error"] is True
            assert len(received(tmp_path)) == 2


async def test_a_server_taking_only_notifications_gets_one_and_the_outcome_is_unknown(
    tmp_path: Path,
) -> None:
    seen: list[TraceEvent] = []
    cfg = host_config(tmp_path, ANSWER, "--notifications-only", publish_undeclared=True)
    with trio.fail_after(DEADLINE_S):
        async with Host.open(cfg) as host:
            await one_turn(host, seen)
            await server_barrier(host)
            [got] = received(tmp_path)
            assert got["form"] == "notification" and "threadId" not in got["params"]
            [published] = [e for e in seen if e.kind == "published"]
            assert published.data["outcome"] == "unknown"
            receipt = [t for t in all_texts(host) if t.startswith("[delivered]")][-1]
            assert "Outcome unknown: 1 segment to #general" in receipt


async def test_speech_for_an_opened_channel_that_is_not_published_is_kept_as_a_draft(
    tmp_path: Path,
) -> None:
    """``channel_open`` moves the route to an undeclared channel: the reply is a draft, and
    the receipt says so (it was lost before: ``Failed: 1 segment to #dev``, no draft)."""
    seen: list[TraceEvent] = []
    with trio.fail_after(DEADLINE_S):
        async with Host.open(host_config(tmp_path, OPEN_DEV)) as host:
            await one_turn(host, seen)
            await server_barrier(host)
            assert received(tmp_path) == []
            listing = await drafts(host)
            assert "moving to dev" in listing and "legacy:#dev" in listing
            receipt = [t for t in all_texts(host) if t.startswith("[delivered]")][-1]
            assert "Kept as drafts: 1 segment" in receipt
            assert "Failed" not in receipt
            # one notice, about the channel the reply was for (not the one that woke Ada)
            [held] = [t for t in all_texts(host) if t.startswith("[held]")]
            assert "#dev" in held and "#general" not in held
            assert "channel_publish" in held and "publish_undeclared" in held


async def test_a_refused_publish_is_kept_as_a_draft_and_the_receipt_says_so(
    tmp_path: Path,
) -> None:
    seen: list[TraceEvent] = []
    cfg = host_config(tmp_path, OPEN_DEV, "--refuse", "read-only room", publish_undeclared=True)
    with trio.fail_after(DEADLINE_S):
        async with Host.open(cfg) as host:
            await one_turn(host, seen)
            [got] = received(tmp_path)
            assert got["params"]["channelId"] == "legacy:#dev"
            listing = await drafts(host)
            assert "moving to dev" in listing
            receipt = [t for t in all_texts(host) if t.startswith("[delivered]")][-1]
            assert "Failed: 1 segment to #dev" in receipt
            assert "read-only room; kept as a draft" in receipt
            assert "Kept as drafts: 1 segment" in receipt


async def test_a_publish_names_the_agents_conversation(tmp_path: Path) -> None:
    """The ``conversationId`` of a publish is the one the hooks and lifecycle carry."""
    seen: list[TraceEvent] = []
    cfg = host_config(tmp_path, ANSWER, publish_undeclared=True)
    with trio.fail_after(DEADLINE_S):
        async with Host.open(cfg) as host:
            await one_turn(host, seen)
            [got] = received(tmp_path)
            assert got["params"]["conversationId"] == "agent:Ada"


# ---- what the operator sees -------------------------------------------------------------------


def toml_config(
    tmp_path: Path, *, publish_undeclared: bool = False, extra: tuple[str, ...] = ()
) -> Path:
    model = scripted(tmp_path, "ada", ANSWER).removeprefix("scripted:")
    command = [sys.executable, "-m", "tests.legacy_server", "--record", "received.jsonl", *extra]
    flag = "publish_undeclared = true\n" if publish_undeclared else ""
    path = tmp_path / "mcplive.toml"
    path.write_text(
        f'[host]\ndata_dir = "data"\n\n[[servers]]\nid = "legacy"\n'
        f"command = {json.dumps(command)}\n{flag}\n"
        f'[[agents]]\nname = "Ada"\nmodel = {json.dumps("scripted:" + model)}\n',
        encoding="utf-8",
    )
    return path


def test_the_transcript_says_once_per_channel_why_speech_is_held(tmp_path: Path) -> None:
    running = Running("run", str(toml_config(tmp_path)), cwd=tmp_path)
    try:
        running.wait_for(lambda line: "kept as a draft" in line, "Ada's held reply")
        assert running.interrupt() == 0
    finally:
        running.close()
    told = [line for line in running.lines if "declares no publish target" in line]
    assert len(told) == 2, running.lines
    assert any("#general (legacy:#general)" in line for line in told)
    assert any("#dev (legacy:#dev)" in line for line in told)
    for line in told:
        assert "held as drafts" in line
        assert "set publish_undeclared on [[servers]] legacy to true" in line
    assert received(tmp_path) == []


@pytest.mark.parametrize(
    ("flag", "extra"),
    [(False, ()), (True, ()), (False, ("--no-list",))],
    ids=["default", "publish_undeclared", "no-channels-list"],
)
def test_check_connect_names_the_channels_without_a_publish_target(
    tmp_path: Path, flag: bool, extra: tuple[str, ...]
) -> None:
    config = toml_config(tmp_path, publish_undeclared=flag, extra=extra)
    result = mcplive("check", str(config), "--connect", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "server legacy (live):" in out
    # every channel the host holds, whether the server answers channels/list or not
    assert "    channels: 2" in out
    assert "legacy:#general (#general): publish target none declared" in out
    assert "channels without a publish target: 2" in out
    lines = [line.strip() for line in out.splitlines() if "declares no publish target" in line]
    assert len(lines) == 2, out
    for line in lines:
        assert "publish_undeclared on [[servers]] legacy" in line
        assert ("held as drafts" in line) is not flag


async def test_the_operator_is_told_once_per_channel_not_on_every_registration(
    tmp_path: Path,
) -> None:
    """Registering the same undeclared descriptor again says nothing new; a channel that
    declared a target in between and then withdrew it is told of again."""
    plain = {"id": "lobby:#plain", "type": "chat", "label": "plain"}
    declared = {**plain, "capabilities": {"publish": {"target": "root"}}}
    sentinel = ROOT_CHANNEL
    with trio.fail_after(DEADLINE_S):
        async with running_lobby(tmp_path, {"Ada": ANSWER}) as lb:
            for descriptor in (plain, plain, declared, plain, plain, sentinel):
                mark = lb.ctl.mark()
                lb.ctl.send({"cmd": "register", "channels": [descriptor]})
                await lb.ctl.wait_for(answered("channels/register"), "registered", since=mark)
            seen: list[TraceEvent] = []
            await wait_trace(
                lb.stream,
                lambda e: e.kind == "channel-registered" and e.channel_id == "lobby:#last",
                "the last registration",
                seen,
            )
            told = [e.channel_id for e in seen if e.kind == "publish-undeclared"]
            # the lobby's own channels declare a target: never told of
            assert told == ["lobby:#plain", "lobby:#plain"]


async def test_at_the_channel_cap_a_refused_channel_is_not_remembered_or_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the operator was told of is kept only for the link's registered channels, so it is
    bounded by the channels a server may register: one refused at that cap leaves no trace."""
    monkeypatch.setattr(actors.context, "MAX_CHANNELS_PER_SERVER", 3)  # the lobby has 2
    extra = [{"id": f"lobby:#x{i}", "type": "chat", "label": f"x{i}"} for i in range(2)]
    with trio.fail_after(DEADLINE_S):
        async with running_lobby(tmp_path, {"Ada": ANSWER}) as lb:
            mark = lb.ctl.mark()
            lb.ctl.send({"cmd": "register", "channels": [*extra, ROOT_CHANNEL]})
            answer = await lb.ctl.wait_for(answered("channels/register"), "register", since=mark)
            accepted = [r["accepted"] for r in answer["response"]["result"]["results"]]
            assert accepted == [True, False, False]
            seen: list[TraceEvent] = []
            await wait_trace(
                lb.stream,
                lambda e: e.kind == "refused" and e.channel_id == ROOT_CHANNEL["id"],
                "the last refusal",
                seen,
            )
            told = [e.channel_id for e in seen if e.kind == "publish-undeclared"]
            assert told == ["lobby:#x0"]


async def test_a_config_reload_takes_publish_undeclared_for_the_next_reply(
    tmp_path: Path,
) -> None:
    plain = {"id": "lobby:#plain", "type": "chat", "label": "plain"}
    with trio.fail_after(DEADLINE_S):
        async with running_lobby(tmp_path, {"Ada": ANSWER}) as lb:
            mark = lb.ctl.mark()
            lb.ctl.send({"cmd": "register", "channels": [plain]})
            await lb.ctl.wait_for(answered("channels/register"), "registered", since=mark)
            send_incoming(lb.ctl, "lobby:#plain", "p1", "first")
            await wait_trace(lb.stream, turn_end, "the first turn")
            await lb.host.run_until_idle()
            assert publishes(lb.ctl) == []
            on = attrs.evolve(
                lb.host.config,
                servers=tuple(
                    attrs.evolve(s, publish_undeclared=True) for s in lb.host.config.servers
                ),
            )
            report = await lb.host.reload(on)
            assert report["changed"] == ["lobby.publish_undeclared"] and not report["restart"]
            send_incoming(lb.ctl, "lobby:#plain", "p2", "second")
            await lb.ctl.wait_for(publish_received("noted"), "the reply")
            [publish] = lobby_received(lb.ctl, "channels/publish")
            params = publish["params"]
            assert params["channelId"] == "lobby:#plain" and "threadId" not in params
