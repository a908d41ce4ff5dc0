"""Where an agent's speech goes, against lobby servers as real subprocesses: routes decided from
the wake (held when several conversations compete), drafts and their resends (across two
servers sharing a channel id), the prose modes, RFC-011 places, and the sleep announcement
that follows the prose written before it.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.models.base import ModelReply, ModelRequest
from protocol.hooks import ModelInfo
from tests.helpers import (
    RecordingModel,
    agent_configs,
    answered,
    barrier,
    config,
    hold_turn,
    incoming_answered,
    install,
    lobby,
    publish_received,
    publishes,
    ready,
    received,
    running_lobby,
    send_incoming,
    wait_trace,
)
from tests.lobby.control import LobbyControl, open_control_listener

pytestmark = pytest.mark.slow

ANSWER_ALL = '[[rules]]\nwhen = "."\nsay = "noted"\n'
ROOT = {"publish": {"target": "root"}}


def channel(cid: str, label: str, **extra: Any) -> dict[str, Any]:
    return {"id": cid, "type": "chat", "label": label, **extra}


async def register(ctl: LobbyControl, *descriptors: dict[str, Any]) -> None:
    mark = ctl.mark()
    ctl.send({"cmd": "register", "channels": list(descriptors)})
    await ctl.wait_for(answered("channels/register"), "registered", since=mark)


def notices(history: list[dict[str, Any]], kind: str) -> list[str]:
    return [
        m["blocks"][0]["text"]
        for m in history
        if (m.get("metadata") or {}).get("kind") == kind
        and (m.get("metadata") or {}).get("system") is True
    ]


def problems(ctl: LobbyControl) -> list[dict[str, Any]]:
    return [e for e in ctl.events if e.get("event") == "problem"]


async def refused_unsent(host: Host, ctl: LobbyControl, channel_id: str, thread: str) -> None:
    """Ada's post into ``thread`` of ``channel_id`` is refused, and nothing reaches the lobby."""
    before = len(received(ctl, "channels/publish"))
    refused = await host.execute_tool_call(
        "Ada",
        "channel_publish",
        {"channel_id": channel_id, "content": "threaded", "thread_id": thread},
    )
    assert refused["is_error"] is True
    await barrier(ctl)
    assert len(received(ctl, "channels/publish")) == before


class Rounds:
    """A model answering each call with the next scripted round (text and tool calls in one
    reply, as a real provider does); silence once the script is spent."""

    def __init__(self, *rounds: Sequence[dict[str, Any]]) -> None:
        self.name = "rounds"
        self.info = ModelInfo(
            id="rounds-1", vendor="tests", context_window=8192, capabilities=("tools",)
        )
        self.rounds = [list(r) for r in rounds]

    async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
        if not self.rounds:
            return ModelReply(blocks=(), model=self.name)
        blocks = self.rounds.pop(0)
        for b in blocks:
            if b.get("type") == "text" and on_delta is not None:
                await on_delta(b["text"])
        uses = any(b.get("type") == "tool_use" for b in blocks)
        return ModelReply(
            blocks=tuple(blocks), stop_reason="tool_use" if uses else "end_turn", model=self.name
        )


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"call_{name}", "name": name, "input": arguments}


# --- routes ---------------------------------------------------------------------------------


async def test_a_turn_woken_by_two_conversations_is_held_and_its_draft_resends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(say="which of you?")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            # the first turn runs; the next two wait for it
            release = await hold_turn(ctl, model, "lobby:#random", "r0", "first")
            send_incoming(ctl, "lobby:#general", "g1", "hello from general")
            await ctl.wait_for(incoming_answered("g1"), "g1 stored")
            send_incoming(ctl, "lobby:#random", "r1", "hello from random")
            await ctl.wait_for(incoming_answered("r1"), "r1 stored")
            release.set()
            # the first turn answers its one conversation
            await ctl.wait_for(publish_received("which of you?"), "the first reply")
            held = await wait_trace(
                lb.stream, lambda e: e.kind == "speech-held" and e.agent == "Ada", "held prose"
            )
            assert held.data["reason"] == "held"
            await host.run_until_idle()
            assert publishes(ctl) == [("lobby:#random", "which of you?")]
            history = host.history("Ada")
            [hold] = notices(history, "speech-notice")
            assert hold.startswith("[held]")
            assert "lobby:#general" in hold and "lobby:#random" in hold
            receipts = notices(history, "delivered-receipt")
            assert len(receipts) == 2 and all(r.startswith("[delivered]") for r in receipts)

            listing = await host.execute_tool_call("Ada", "drafts", {"action": "list"})
            assert listing["is_error"] is False
            shown = listing["content"][0]["text"]
            draft_id = held.data["draft"]
            assert draft_id in shown and "which of you?" in shown

            mark = ctl.mark()
            resent = await host.execute_tool_call(
                "Ada",
                "drafts",
                {"action": "resend", "ids": [draft_id], "destination": "#general"},
            )
            assert resent["is_error"] is False, resent
            await ctl.wait_for(publish_received("which of you?"), "the resend", since=mark)
            assert publishes(ctl)[-1] == ("lobby:#general", "which of you?")
            after = await host.execute_tool_call("Ada", "drafts", {"action": "list"})
            assert draft_id not in after["content"][0]["text"]  # delivered: no longer a draft


async def test_a_draft_resends_through_the_server_its_label_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two servers register the same channel id under different labels: a resend to the label
    that is unique goes through that label's server (I.2); the bare id is refused as
    ambiguous."""
    install(monkeypatch, RecordingModel(say="for the record"))
    with trio.fail_after(60):
        async with open_control_listener() as la, open_control_listener() as lb_:
            servers = [lobby(la.address, sid="one"), lobby(lb_.address, sid="two")]
            async with Host.open(
                config(tmp_path, servers, agent_configs(tmp_path, {"Ada": ""}))
            ) as host:
                stream = host.trace()
                one, two = await la.accept(), await lb_.accept()
                await ready(one, host, "one")
                await ready(two, host, "two")
                await register(one, channel("shared", "alpha", capabilities=ROOT))
                await register(two, channel("shared", "beta", capabilities=ROOT))
                # an unscoped push wakes Ada: no conversation to answer, so the reply is a draft
                one.send({"cmd": "push", "eventId": "e1", "text": "tick"})
                held = await wait_trace(stream, lambda e: e.kind == "speech-held", "the draft")
                assert held.data["reason"] == "no route"
                await host.run_until_idle()
                draft = held.data["draft"]

                ambiguous = await host.execute_tool_call(
                    "Ada", "drafts", {"action": "resend", "ids": [draft], "destination": "shared"}
                )
                assert ambiguous["is_error"] is True
                assert "several channels match" in ambiguous["content"][0]["text"]

                mark = two.mark()
                resent = await host.execute_tool_call(
                    "Ada", "drafts", {"action": "resend", "ids": [draft], "destination": "#beta"}
                )
                assert resent["is_error"] is False, resent
                await two.wait_for(publish_received("for the record"), "the resend", since=mark)
                await host.run_until_idle()
                assert publishes(two) == [("shared", "for the record")]
                assert publishes(one) == []


async def test_a_channel_that_does_not_declare_its_place_takes_no_prose(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ANSWER_ALL}) as lb:
            host, ctl = lb.host, lb.ctl
            await register(ctl, channel("lobby:#legacy", "legacy"))
            send_incoming(ctl, "lobby:#legacy", "l1", "anyone?")
            held = await wait_trace(lb.stream, lambda e: e.kind == "speech-held", "held prose")
            assert held.data["reason"] == "untargetable"
            assert held.channel_id == "lobby:#legacy"
            await host.run_until_idle()
            assert publishes(ctl) == []
            [notice] = notices(host.history("Ada"), "speech-notice")
            assert notice.startswith("[held]") and "lobby:#legacy" in notice
            # an explicit post without a thread may still go there (the legacy shape)
            done = await host.execute_tool_call(
                "Ada", "channel_publish", {"channel_id": "lobby:#legacy", "content": "by hand"}
            )
            assert done["is_error"] is False, done
            await ctl.wait_for(publish_received("by hand"), "the explicit post")
            [sent] = received(ctl, "channels/publish")
            assert "threadId" not in sent["params"]
            # but never into a thread: nothing is sent
            await refused_unsent(host, ctl, "lobby:#legacy", "t1")


async def test_a_turn_only_the_operator_woke_answers_the_operator(tmp_path: Path) -> None:
    """Local input is a conversation of its own: the reply to it is the operator's answer (the
    transcript shows it, the receipt counts it), neither published nor a draft with no route.
    With a channel in the turn too, the reply goes where the channel's route says."""
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ANSWER_ALL}) as lb:
            host, ctl = lb.host, lb.ctl
            await host.post_local("Ada", "are you there?")
            answer = await wait_trace(
                lb.stream, lambda e: e.kind in ("local-reply", "speech-held"), "the answer"
            )
            assert answer.kind == "local-reply" and answer.data == {"text": "noted"}
            assert answer.agent == "Ada" and answer.channel_id is None
            await host.run_until_idle()
            assert publishes(ctl) == []
            drafts = await host.execute_tool_call("Ada", "drafts", {"action": "list"})
            assert "d1" not in drafts["content"][0]["text"]
            [receipt] = notices(host.history("Ada"), "delivered-receipt")
            assert receipt == "[delivered] 1 segment to the operator (local input)."

            await host.hold("Ada")  # both wait for one turn
            await host.post_local("Ada", "and now?")
            send_incoming(ctl, "lobby:#general", "g1", "hi all")
            await ctl.wait_for(incoming_answered("g1"), "stored")
            await host.release("Ada")
            await ctl.wait_for(publish_received("noted"), "the reply in the channel")


async def test_replies_name_their_place_and_a_thread_only_where_it_is_exact(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ANSWER_ALL}) as lb:
            host, ctl = lb.host, lb.ctl
            exact = {"publish": {"target": "exact"}}
            await register(ctl, channel("lobby:#dev", "dev", capabilities=exact))
            # a root channel: the reply names the root (threadId null)
            send_incoming(ctl, "lobby:#general", "g1", "hi")
            await ctl.wait_for(publish_received("noted"), "the root reply")
            await host.run_until_idle()
            # a message in a thread of an exact channel: the reply goes into that thread
            mark = ctl.mark()
            send_incoming(ctl, "lobby:#dev", "d1", "in a thread", threadId="t-1")
            await ctl.wait_for(publish_received("noted"), "the thread reply", since=mark)
            await host.run_until_idle()
            sent = [m["params"] for m in received(ctl, "channels/publish")]
            assert [(p["channelId"], p["threadId"]) for p in sent] == [
                ("lobby:#general", None),
                ("lobby:#dev", "t-1"),
            ]
            assert all(isinstance(p.get("idempotencyKey"), str) for p in sent)
            assert problems(ctl) == []
            # a thread on a root channel is refused before anything is sent
            await refused_unsent(host, ctl, "lobby:#general", "t-1")


async def test_a_reply_whose_place_is_not_echoed_is_reported_unconfirmed(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ANSWER_ALL}) as lb:
            host, ctl = lb.host, lb.ctl
            ctl.send({"cmd": "publish_echo_thread", "mode": "omit"})
            await ctl.wait_for(lambda e: e["event"] == "publish_echo_thread", "mode set")
            send_incoming(ctl, "lobby:#general", "g1", "hi")
            event = await wait_trace(lb.stream, lambda e: e.kind == "published", "the publish")
            assert event.data["outcome"] == "unconfirmed"
            await host.run_until_idle()
            [receipt] = notices(host.history("Ada"), "delivered-receipt")
            assert "not confirmed" in receipt.lower()


# --- modes ----------------------------------------------------------------------------------


async def test_explicit_mode_bounces_unprefixed_prose_and_publishes_prefixed_segments(
    tmp_path: Path,
) -> None:
    rules = '[[rules]]\nwhen = "."\nsay = "just thinking aloud\\n>>#random over here"\n'
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": {"model": _scripted(tmp_path, rules), "prose_mode": "explicit"}}
        ) as lb:
            host, ctl = lb.host, lb.ctl
            send_incoming(ctl, "lobby:#general", "g1", "hi")
            await ctl.wait_for(publish_received("over here"), "the prefixed segment")
            await host.run_until_idle()
            assert publishes(ctl) == [("lobby:#random", "over here")]
            history = host.history("Ada")
            [bounce] = notices(history, "speech-notice")
            assert bounce.startswith("[bounced]")
            said = [m for m in history if m["role"] == "assistant"]
            assert said[-1]["blocks"][0]["text"] == "just thinking aloud\n>>#random over here"


async def test_disabled_mode_publishes_nothing_and_counts_what_it_held(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": {"model": _scripted(tmp_path, ANSWER_ALL), "prose_mode": "disabled"}}
        ) as lb:
            host, ctl = lb.host, lb.ctl
            send_incoming(ctl, "lobby:#general", "g1", "hi")
            await wait_trace(lb.stream, lambda e: e.kind == "delivered-receipt", "the receipt")
            await host.run_until_idle()
            assert publishes(ctl) == []
            assert received(ctl, "channels/typing") == []
            [receipt] = notices(host.history("Ada"), "delivered-receipt")
            assert "disabled" in receipt and "1" in receipt


async def test_hybrid_sleep_announcement_follows_the_prose_written_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An earlier round pinned #alpha; this round writes to #beta and then calls sleep: the
    words go to beta first, then the announcement, to beta; nothing goes to alpha (I.6)."""
    model = Rounds(
        [text(">>>#alpha\n"), call("lobby--roll", sides=6)],
        [text(">>>#beta hello"), call("sleep", seconds=600)],
    )
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": {"model": _scripted(tmp_path, ""), "prose_mode": "hybrid"}}
        ) as lb:
            host, ctl = lb.host, lb.ctl
            await register(
                ctl,
                channel("lobby:#alpha", "alpha", capabilities=ROOT),
                channel("lobby:#beta", "beta", capabilities=ROOT),
            )
            send_incoming(ctl, "lobby:#general", "g1", "good night")
            await ctl.wait_for(
                lambda e: publish_received()(e) and "Going quiet" in json.dumps(e), "announcement"
            )
            await host.run_until_idle()
            sent = publishes(ctl)
            assert sent == [
                ("lobby:#beta", "hello"),
                (
                    "lobby:#beta",
                    "💤 Going quiet for 10 minutes. I'll still see messages, but won't respond "
                    "until I wake.",
                ),
            ]


async def test_channel_open_moves_the_route_and_channel_publish_follows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Rounds(
        [call("channel_open", channel_id="lobby:#random")],
        [text("moved over"), call("channel_publish", content="posted by tool")],
    )
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            send_incoming(ctl, "lobby:#general", "g1", "please go to random")
            await ctl.wait_for(publish_received("posted by tool"), "the tool's post")
            await host.run_until_idle()
            # the tool's post follows the moved route; the round's prose is silenced by it
            assert publishes(ctl) == [("lobby:#random", "posted by tool")]
            held = [m for m in host.history("Ada") if m["role"] == "system"]
            assert any("draft" in m["blocks"][0]["text"] for m in held)


async def test_channel_publish_without_a_channel_is_refused_on_a_turn_with_no_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Rounds([call("channel_publish", content="to whom?")])
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            ctl.send({"cmd": "push", "eventId": "e1", "text": "tick"})
            result = await wait_trace(lb.stream, lambda e: e.kind == "tool-result", "result")
            assert result.data["is_error"] is True
            assert "name the channel" in result.data["content"][0]["text"]
            await host.run_until_idle()
            assert publishes(ctl) == []


async def test_channel_publish_without_a_channel_posts_where_the_turn_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the channel declares no publish target: prose is held there, an explicit post is not,
    # and the tool never says "no route" of a turn that came from a channel
    model = Rounds([call("channel_publish", content="by the tool")])
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            await register(ctl, channel("lobby:#legacy", "legacy"))
            send_incoming(ctl, "lobby:#legacy", "l1", "anyone?")
            result = await wait_trace(lb.stream, lambda e: e.kind == "tool-result", "result")
            assert result.data["is_error"] is False, result.data
            await ctl.wait_for(publish_received("by the tool"), "the tool's post")
            await host.run_until_idle()
            assert publishes(ctl) == [("lobby:#legacy", "by the tool")]


async def test_prose_addressed_to_a_channel_that_takes_none_is_told_the_true_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Rounds([text(">>>#legacy are you there?")])
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)
    with trio.fail_after(60):
        ada = {"model": _scripted(tmp_path, ""), "prose_mode": "hybrid"}
        async with running_lobby(tmp_path, {"Ada": ada}) as lb:
            host, ctl = lb.host, lb.ctl
            await register(ctl, channel("lobby:#legacy", "legacy"))
            send_incoming(ctl, "lobby:#general", "g1", "ask in legacy")
            held = await wait_trace(lb.stream, lambda e: e.kind == "speech-held", "held prose")
            assert held.data["reason"] == "untargetable"
            await host.run_until_idle()
            assert publishes(ctl) == []
            [notice] = [n for n in notices(host.history("Ada"), "speech-notice") if "legacy" in n]
            assert notice.startswith("[held] Prose addressed to")
            assert "call channel_publish" in notice
            # the prefix it suggests is the agent's own (hybrid: >>>), to a channel that takes it
            assert "start a message with >>>target naming a channel that takes prose" in notice
            assert ">>target" not in notice.replace(">>>target", "")


def _scripted(tmp_path: Path, rules: str) -> str:
    path = tmp_path / f"rules{abs(hash(rules))}.toml"
    path.write_text(rules, encoding="utf-8")
    return f"scripted:{path}"


async def test_default_outgoing_is_the_route_and_absent_when_the_turn_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(say="ok")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}, "--context") as lb:
            host, ctl = lb.host, lb.ctl
            release = await hold_turn(ctl, model, "lobby:#general", "g1", "one")
            send_incoming(ctl, "lobby:#general", "g2", "two")
            await ctl.wait_for(incoming_answered("g2"), "g2 stored")
            send_incoming(ctl, "lobby:#random", "r1", "three")
            await ctl.wait_for(incoming_answered("r1"), "r1 stored")
            release.set()
            await wait_trace(
                lb.stream, lambda e: e.kind == "speech-held" and e.agent == "Ada", "held turn"
            )
            await host.run_until_idle()
            await barrier(ctl)
            first, second = [
                m["params"].get("channels") or {} for m in received(ctl, "context/beforeInference")
            ]
            assert first["defaultOutgoing"] == {"channelId": "lobby:#general"}
            assert first["incoming"] == {"channelId": "lobby:#general", "messageId": "g1"}
            # two conversations: no route, so no default and no reply edge; both are candidates
            assert "defaultOutgoing" not in second and "incoming" not in second
            assert second["candidates"] == ["lobby:#general", "lobby:#random"]


async def test_an_addressed_message_from_elsewhere_mid_turn_suspends_the_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel(say="ok")
    install(monkeypatch, model)
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            host, ctl = lb.host, lb.ctl
            release = await hold_turn(ctl, model, "lobby:#general", "g1", "chatter")
            send_incoming(ctl, "lobby:#random", "r1", "@Ada over here", tags=["chat:mention"])
            await wait_trace(lb.stream, lambda e: e.kind == "route-suspended", "suspended")
            release.set()
            held = await wait_trace(lb.stream, lambda e: e.kind == "speech-held", "held prose")
            assert held.data["reason"] == "suspended"
            # the next turn answers the one who addressed Ada
            await ctl.wait_for(publish_received("ok"), "the reply")
            await host.run_until_idle()
            assert publishes(ctl) == [("lobby:#random", "ok")]


async def test_a_turn_stores_at_most_sixteen_notices_and_counts_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = "\n".join(f">>>#nowhere{i} lost {i}" for i in range(20))
    monkeypatch.setattr("actors.host.make_model", lambda cfg: Rounds([text(lines)]))
    with trio.fail_after(60):
        async with running_lobby(
            tmp_path, {"Ada": {"model": _scripted(tmp_path, ""), "prose_mode": "hybrid"}}
        ) as lb:
            host, ctl = lb.host, lb.ctl
            send_incoming(ctl, "lobby:#general", "g1", "hi")
            await wait_trace(lb.stream, lambda e: e.kind == "delivered-receipt", "the receipt")
            await host.run_until_idle()
            shown = notices(host.history("Ada"), "speech-notice")
            assert len(shown) == 16 + 1
            assert all(n.startswith("[target]") for n in shown[:16])
            assert shown[16] == "[notices] 4 more notices of this turn not shown"
            assert publishes(ctl) == []
            [receipt] = notices(host.history("Ada"), "delivered-receipt")
            assert "20" in receipt  # all twenty segments kept as drafts
