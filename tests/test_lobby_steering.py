"""The control link of the lobby (``tests/lobby/steering.py``): the lobby as a
stdio subprocess driven by a raw JSON-RPC host side, with a test's control listener."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from tests.lobby.control import LobbyControl, open_control_listener
from tests.test_lobby_server import (
    GENERAL,
    INIT_PARAMS,
    RANDOM,
    TIMEOUT,
    Lobby,
    is_response_to,
    lobby_process,
)


@asynccontextmanager
async def controlled_kit(*args: str) -> AsyncIterator[tuple[Lobby, LobbyControl]]:
    """the lobby with a control connection, accepted and said hello on."""
    async with (
        open_control_listener() as listener,
        lobby_process("--control-connect", listener.address, *args) as lobby,
    ):
        ctl = await listener.accept()
        async with ctl:
            hello = await ctl.wait_for(lambda e: e["event"] == "hello", "hello")
            assert hello["transport"] == "stdio"
            yield lobby, ctl


async def test_every_host_line_is_reported_and_ready_follows_the_registration() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.handshake()
            received = await ctl.wait_for(
                lambda e: e["event"] == "received" and e["message"]["method"] == "initialize",
                "initialize seen",
            )
            assert received["message"]["params"] == INIT_PARAMS
            await ctl.wait_for(lambda e: e["event"] == "ready", "ready")
            event = await ctl.wait_for(
                is_response_to("channels/register", "channels", [GENERAL, RANDOM]),
                "the registration",
            )
            accepted = [r["accepted"] for r in event["response"]["result"]["results"]]
            assert accepted == [True, True]
            assert await lobby.close_stdin_and_wait() == 0
            await ctl.wait_closed()


async def test_incoming_and_push_are_sent_and_their_answers_reported() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.handshake()
            ctl.send(
                {
                    "cmd": "incoming",
                    "channelId": "lobby:#general",
                    "messageId": "x1",
                    "text": "@Ada ping",
                    "tags": ["chat:mention"],
                    "threadId": "t1",
                }
            )
            incoming = await lobby.server_request("channels/incoming")
            [message] = incoming["params"]["messages"]
            assert message["messageId"] == "x1" and message["threadId"] == "t1"
            assert message["content"] == [{"type": "text", "text": "@Ada ping"}]
            assert message["tags"] == ["chat:mention"] and message["author"]["id"] == "alice"
            answer = {"results": [{"messageId": "x1", "accepted": True}]}
            await lobby.answer(incoming, answer)
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["request"]["id"] == incoming["id"],
                "answer to incoming x1",
            )
            assert event["response"]["result"] == answer and event["attempts"] == 1

            batch = [{**message, "messageId": "b1"}, {**message, "messageId": "b2"}]
            ctl.send({"cmd": "incoming_batch", "messages": batch})
            incoming = await lobby.server_request("channels/incoming")
            assert incoming["params"]["messages"] == batch
            await lobby.answer_error(incoming, -32602, "no")
            event = await ctl.wait_for(
                is_response_to("channels/incoming", "messages", batch), "the batch refused"
            )
            assert event["response"]["error"]["code"] == -32602

            ctl.send({"cmd": "push", "eventId": "p1", "text": "ding", "origin": {"k": 1}})
            push = await lobby.server_request("push/event")
            assert push["params"]["eventId"] == "p1" and push["params"]["origin"] == {"k": 1}
            assert push["params"]["featureSet"] == "lobby.events"
            await lobby.answer_error(push, -32002, "not ready")
            retried = await lobby.server_request("push/event")
            assert retried["params"]["eventId"] == "p1" and retried["id"] != push["id"]
            await lobby.answer(retried, {"accepted": True})
            event = await ctl.wait_for(is_response_to("push/event", "eventId", "p1"), "p1")
            assert event["response"]["result"] == {"accepted": True}
            assert event["attempts"] == 2
            assert await lobby.close_stdin_and_wait() == 0


async def test_commands_send_what_the_host_did_not_grant() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.request("initialize", INIT_PARAMS)
            await lobby.notify("notifications/initialized")
            await lobby.request("featureSets/update", {"effectiveCapabilities": []})
            await ctl.wait_for(lambda e: e["event"] == "ready", "ready")
            ctl.send({"cmd": "push", "eventId": "p9", "text": "sneaky"})
            push = await lobby.server_request("push/event")
            assert push["params"]["eventId"] == "p9"
            assert await lobby.close_stdin_and_wait() == 0


async def test_raw_line_and_problems() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.handshake()
            note = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
            ctl.send({"cmd": "raw", "message": note})
            assert await lobby.wait_for(lambda m: m == note, "raw notification") == note
            # a raw request keeps its id, and its answer is reported as a response
            listing = {"jsonrpc": "2.0", "id": "l1", "method": "channels/list"}
            ctl.send({"cmd": "raw", "message": listing})
            asked = await lobby.wait_for(lambda m: m.get("id") == "l1", "raw request")
            assert asked == listing
            await lobby.answer(asked, {"channels": []})
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["request"].get("id") == "l1", "l1"
            )
            assert event["response"]["result"] == {"channels": []}
            ctl.send({"cmd": "line", "text": "<<garbage>>"})
            ctl.send({"cmd": "raw", "message": note})  # in order: after the line
            assert await lobby.wait_for(lambda m: m == note, "raw notification") == note
            assert lobby.stray == ["<<garbage>>"]
            # an answer to nothing the lobby asked is a problem, and it is the only one
            mark = ctl.mark()
            await lobby.send({"jsonrpc": "2.0", "id": 999, "result": {}})
            error = await ctl.wait_for(lambda e: e["event"] == "error", "unknown id", since=mark)
            assert "999" in error["text"]
            ctl.send({"cmd": "nonsense"})
            error = await ctl.wait_for(
                lambda e: e["event"] == "error" and "nonsense" in e["text"], "unknown command"
            )
            assert await lobby.close_stdin_and_wait() == 0
            await ctl.wait_closed()
            problems = [e["text"] for e in ctl.events if e["event"] == "error"]
            assert len(problems) == 2, problems


async def test_ping_hang_and_crash() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.handshake()
            ctl.send({"cmd": "ping", "id": 7})
            assert await ctl.wait_for(lambda e: e["event"] == "pong", "pong") == {
                "event": "pong",
                "id": 7,
            }
            await ctl.send({"cmd": "hang"})
            await ctl.wait_for(lambda e: e["event"] == "hung", "hung")
            pinged = await lobby.send_request("ping")
            ctl.send({"cmd": "ping", "id": 8})
            await ctl.wait_for(lambda e: e.get("id") == 8, "pong while hung")
            assert not any(m.get("id") == pinged for m in lobby.inbox)
            assert lobby.proc.returncode is None
            ctl.send({"cmd": "crash"})
            await ctl.wait_closed()
            assert await lobby.proc.wait() == 1


async def test_flood_register_infer_and_model_info() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.handshake()
            ctl.send({"cmd": "flood", "count": 4, "text": "drip"})
            for _ in range(4):
                flood = await lobby.server_request("push/event")
                assert flood["params"]["payload"]["content"][0]["text"] == "drip"
                await lobby.answer(flood, {"accepted": flood["params"]["eventId"] != "f4"})
            done = await ctl.wait_for(lambda e: e["event"] == "flood_done", "flood done")
            assert done == {"event": "flood_done", "accepted": 3, "count": 4}
            pushes = [
                e for e in ctl.events if e["event"] == "response" and e["method"] == "push/event"
            ]
            assert len(pushes) == 4  # each answer reported once

            extra = {"id": "lobby:#extra", "type": "chat", "label": "extra"}
            ctl.send({"cmd": "register", "channels": [extra]})
            register = await lobby.server_request("channels/register")
            assert register["params"] == {"channels": [extra]}
            ask = [{"role": "user", "content": "sum up"}]
            ctl.send({"cmd": "infer", "messages": ask, "maxTokens": 50, "conversationId": "c1"})
            infer = await lobby.server_request("inference/request")
            assert infer["params"] == {
                "featureSet": "lobby.assist",
                "messages": ask,
                "stream": False,
                "conversationId": "c1",
                "preferences": {"maxTokens": 50},
            }
            result = {"content": "ok", "model": "m", "finishReason": "end_turn"}
            await lobby.answer(infer, result)
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["method"] == "inference/request", "infer"
            )
            assert event["response"]["result"] == result
            ctl.send({"cmd": "model_info"})
            info = await lobby.server_request("model/info")
            await lobby.answer_error(info, -32601, "no model here")
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["method"] == "model/info", "model/info"
            )
            assert event["response"]["error"]["code"] == -32601
            assert await lobby.close_stdin_and_wait() == 0


async def test_open_and_fsu_modes_switch_how_later_requests_are_answered() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit("--open-mode", "never") as (lobby, ctl):
            await lobby.handshake()
            unanswered = await lobby.send_request("channels/open", {"channelId": "lobby:#general"})
            # withheld by its handler (which runs after the request was received, and reads
            # the mode then), before the mode is switched
            await ctl.wait_for(
                lambda e: e["event"] == "open_withheld" and e["id"] == unanswered,
                "the first channels/open withheld",
            )
            ctl.send({"cmd": "open_mode", "mode": "answer"})
            await ctl.wait_for(lambda e: e["event"] == "open_mode", "open mode acknowledged")
            opened = await lobby.request("channels/open", {"channelId": "lobby:#general"})
            assert "result" in opened
            assert not any(m.get("id") == unanswered and "method" not in m for m in lobby.inbox)

            ctl.send({"cmd": "fsu_mode", "mode": "notification-only"})
            ctl.send({"cmd": "ping", "id": 1})  # commands are taken in order
            await ctl.wait_for(lambda e: e["event"] == "pong", "pong")
            grant = {"effectiveCapabilities": ["pushEvents"]}
            refused = await lobby.request("featureSets/update", grant)
            assert refused["error"]["code"] == -32601
            ctl.send({"cmd": "fsu_mode", "mode": "request"})
            ctl.send({"cmd": "ping", "id": 2})
            await ctl.wait_for(lambda e: e.get("id") == 2, "pong 2")
            receipt = await lobby.request("featureSets/update", grant)
            assert receipt["result"]["accepted"] is True
            assert await lobby.close_stdin_and_wait() == 0


async def test_a_new_manifest_is_announced_and_served() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.handshake()
            before = (await lobby.request("mcpl/manifest"))["result"]
            new = {**before, "featureSets": {}}
            ctl.send({"cmd": "manifest", "manifest": new, "domains": ["featureSets"]})
            changed = await lobby.wait_for(
                lambda m: m.get("method") == "mcpl/manifestChanged", "manifestChanged"
            )
            assert changed["params"]["domains"] == ["featureSets"]
            assert (await lobby.request("mcpl/manifest"))["result"] == new
            assert await lobby.close_stdin_and_wait() == 0


async def test_the_answers_to_the_lobbys_own_requests_are_reported() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit() as (lobby, ctl):
            await lobby.handshake()
            content = [{"type": "text", "text": "hi all"}]
            params = {"channelId": "lobby:#random", "content": content}
            reply = await lobby.request("channels/publish", {**params, "conversationId": "a:Ada"})
            assert reply["result"]["messageId"] == "out-1"
            echo = await lobby.server_request("channels/incoming")
            answer = {"results": [{"messageId": "out-1", "accepted": True}]}
            await lobby.answer(echo, answer)
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["request"]["id"] == echo["id"], "echo"
            )
            assert event["request"] == echo and event["response"]["result"] == answer
            assert await lobby.close_stdin_and_wait() == 0
            await ctl.wait_closed()
            # one report per answer: the registration and the echo
            reported = [e["request"]["method"] for e in ctl.events if e["event"] == "response"]
            assert reported == ["channels/register", "channels/incoming"]


async def test_extra_channels_are_registered_in_chunks_and_their_outcome_reported() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_kit("--channels", "150") as (lobby, ctl):
            await lobby.handshake()
            chunks = []
            for _ in range(2):
                register = await lobby.server_request("channels/register")
                chunks.append([c["id"] for c in register["params"]["channels"]])
                refused = {"accepted": False, "reason": "too many"}
                results = [
                    {"id": cid, **(refused if cid == "lobby:#c7" else {"accepted": True})}
                    for cid in chunks[-1]
                ]
                await lobby.answer(register, {"results": results})
            assert sorted(map(len, chunks)) == [50, 100]
            ids = {cid for chunk in chunks for cid in chunk}
            assert ids == {f"lobby:#c{i}" for i in range(1, 151)}
            event = await ctl.wait_for(lambda e: e["event"] == "channels", "the outcome")
            assert event == {
                "event": "channels",
                "accepted": 149,
                "refused": [{"id": "lobby:#c7", "reason": "too many"}],
            }
            assert await lobby.close_stdin_and_wait() == 0
