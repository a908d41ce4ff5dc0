"""The lobby written with the server toolkit (``tests/lobby/server.py``), as a stdio subprocess
driven by a raw JSON-RPC host side: what it declares, what its people and clock say, how it
echoes what an agent publishes, and its fault modes (``tests/lobby/faults.py``)."""

from __future__ import annotations

import trio

from tests.test_lobby_server import (
    ALL_CAPS,
    CHAT_USES,
    GENERAL,
    INIT_PARAMS,
    RANDOM,
    TIMEOUT,
    lobby_process,
    registered,
)


async def test_handshake_declares_the_lobby_sets_and_registers_both_channels() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            init = await lobby.request("initialize", INIT_PARAMS)
            result = init["result"]
            assert result["serverInfo"]["name"] == "lobby"
            mcpl = result["capabilities"]["experimental"]["mcpl"]
            assert mcpl["version"] == "0.5" and mcpl["pushEvents"] is True
            assert set(mcpl["featureSets"]) == {"lobby.chat", "lobby.events"}
            assert sorted(mcpl["featureSets"]["lobby.chat"]["uses"]) == sorted(CHAT_USES)
            assert mcpl["featureSets"]["lobby.events"]["uses"] == ["pushEvents"]
            await lobby.notify("notifications/initialized")
            receipt = await lobby.request("featureSets/update", {"effectiveCapabilities": ALL_CAPS})
            assert receipt["result"]["accepted"] is True
            register = await lobby.server_request("channels/register")
            assert register["params"] == {"channels": [GENERAL, RANDOM]}
            await lobby.answer(register, registered(register))
            assert await lobby.close_stdin_and_wait() == 0
            assert lobby.stray == []


async def test_people_talk_in_turn_and_the_clock_chimes_on_the_third_tick() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--interval", "0.05") as lobby:
            await lobby.handshake()
            messages = []
            for _ in range(3):
                incoming = await lobby.server_request("channels/incoming")
                [message] = incoming["params"]["messages"]
                messages.append(message)
                results = [{"messageId": message["messageId"], "accepted": True}]
                await lobby.answer(incoming, {"results": results})
            assert [m["messageId"] for m in messages] == ["m1", "m2", "m3"]
            assert [m["author"]["id"] for m in messages] == ["alice", "bob", "alice"]
            assert [m["channelId"] for m in messages] == [
                "lobby:#general",
                "lobby:#general",
                "lobby:#random",
            ]
            push = await lobby.server_request("push/event")
            assert push["params"]["featureSet"] == "lobby.events"
            assert push["params"]["eventId"] == "e1"
            assert push["params"]["payload"] == {
                "content": [{"type": "text", "text": "The lobby clock chimes."}]
            }
            await lobby.answer(push, {"accepted": True})
            assert await lobby.close_stdin_and_wait() == 0


async def test_a_publish_is_answered_then_echoed_under_the_agents_name() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.handshake()
            content = [{"type": "text", "text": "hi all"}]
            params = {"channelId": "lobby:#random", "content": content}
            params["conversationId"] = "agent:Ada"
            reply = await lobby.request("channels/publish", params)
            assert reply["result"] == {"delivered": True, "messageId": "out-1"}
            echo = await lobby.server_request("channels/incoming")
            [message] = echo["params"]["messages"]
            assert message["messageId"] == "out-1" and message["channelId"] == "lobby:#random"
            assert message["author"] == {"id": "agent:Ada", "name": "Ada"}
            assert message["content"] == content
            await lobby.answer(echo, {"results": [{"messageId": "out-1", "accepted": True}]})
            # a name that is a person's is shown as the host's own account
            params["conversationId"] = "agent:alice"
            await lobby.request("channels/publish", params)
            echo = await lobby.server_request("channels/incoming")
            assert echo["params"]["messages"][0]["author"] == {"id": "host", "name": "mcplive"}
            assert await lobby.close_stdin_and_wait() == 0


async def test_tools_answer() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.handshake()
            listed = await lobby.request("tools/list")
            assert [t["name"] for t in listed["result"]["tools"]] == ["forecast", "roll", "stall"]
            call = {"name": "forecast", "arguments": {"city": "Oslo"}}
            forecast = await lobby.request("tools/call", call)
            assert forecast["result"]["content"][0]["text"] == "Forecast for Oslo: sunny, 21°C"
            rolled = await lobby.request("tools/call", {"name": "roll", "arguments": {"sides": 1}})
            assert rolled["result"]["content"][0]["text"] == "1"
            assert await lobby.close_stdin_and_wait() == 0


async def test_fsu_never_takes_the_grant_but_leaves_the_update_unanswered() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none", "--fsu-mode", "never") as lobby:
            await lobby.request("initialize", INIT_PARAMS)
            await lobby.notify("notifications/initialized")
            update = await lobby.send_request(
                "featureSets/update", {"effectiveCapabilities": ALL_CAPS}
            )
            register = await lobby.server_request("channels/register")  # granted all the same
            await lobby.answer(register, registered(register))
            ping = await lobby.request("ping")
            assert ping["result"] == {}
            assert not any(m.get("id") == update and "method" not in m for m in lobby.inbox)
            assert await lobby.close_stdin_and_wait() == 0


async def test_notification_only_modes_refuse_the_request_forms() -> None:
    args = ("--script", "none", "--fsu-mode", "notification-only", "--publish-mode")
    with trio.fail_after(TIMEOUT):
        async with lobby_process(*args, "notification-only") as lobby:
            await lobby.request("initialize", INIT_PARAMS)
            await lobby.notify("notifications/initialized")
            refused = await lobby.request("featureSets/update", {"effectiveCapabilities": ALL_CAPS})
            assert refused["error"]["code"] == -32601
            params = {"channelId": "lobby:#general", "content": [{"type": "text", "text": "x"}]}
            publish = await lobby.request("channels/publish", params)
            assert publish["error"]["code"] == -32601
            assert await lobby.close_stdin_and_wait() == 0


async def test_open_never_and_a_stray_stdout_line() -> None:
    args = ("--script", "none", "--open-mode", "never", "--stray-stdout")
    with trio.fail_after(TIMEOUT):
        async with lobby_process(*args) as lobby:
            await lobby.handshake()
            opened = await lobby.send_request("channels/open", {"channelId": "lobby:#general"})
            assert (await lobby.request("ping"))["result"] == {}
            assert not any(m.get("id") == opened for m in lobby.inbox)
            assert lobby.stray == ["[lobby] client initialized"]
            assert await lobby.close_stdin_and_wait() == 0


async def test_the_array_form_shows_the_04_manifest() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none", "--feature-sets-form", "array") as lobby:
            init = await lobby.request("initialize", INIT_PARAMS)
            mcpl = init["result"]["capabilities"]["experimental"]["mcpl"]
            assert mcpl["version"] == "0.4" and "revision" not in mcpl
            assert [fs["name"] for fs in mcpl["featureSets"]] == ["lobby.chat", "lobby.events"]
            await lobby.notify("notifications/initialized")
            fetched = await lobby.request("mcpl/manifest")
            assert fetched["result"] == mcpl
            # the sets are what they were: a grant of nothing degrades both
            receipt = await lobby.request("featureSets/update", {})
            unavailable = {u["featureSet"] for u in receipt["result"]["unavailableFeatures"]}
            assert unavailable == {"lobby.chat", "lobby.events"}
            assert await lobby.close_stdin_and_wait() == 0
