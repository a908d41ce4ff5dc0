"""The example lobby server, driven as a real subprocess speaking raw JSON-RPC."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from tests.lobby.control import LobbyControl, open_control_listener
from tests.lobby.server import LobbyOptions, serve_ws

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 20

ALL_CAPS = [
    "pushEvents",
    "channels.register",
    "channels.publish",
    "channels.incoming",
    "channels.lifecycle",
    "channels.streaming",
    "channels.typing",
]
INIT_PARAMS = {
    "protocolVersion": "2024-11-05",
    "capabilities": {"experimental": {"mcpl": {"version": "0.5", "pushEvents": True}}},
    "clientInfo": {"name": "lobby-test", "version": "0"},
}
GENERAL = {
    "id": "lobby:#general",
    "type": "chat",
    "label": "general",
    "direction": "bidirectional",
    "capabilities": {"publish": {"target": "root"}},
}
RANDOM = {**GENERAL, "id": "lobby:#random", "label": "random"}
CHAT_USES = [
    "channels.register",
    "channels.publish",
    "channels.incoming",
    "channels.lifecycle",
    "channels.streaming",
    "channels.typing",
]
# Channels the tests register through the control socket: threads honoured exactly, and no
# RFC-011 declaration at all.
DEV = {
    **GENERAL,
    "id": "lobby:#dev",
    "label": "dev",
    "capabilities": {"publish": {"target": "exact"}},
}
PLAIN = {"id": "lobby:#plain", "type": "chat", "label": "plain", "direction": "bidirectional"}

Message = dict[str, Any]


class Peer:
    """A raw JSON-RPC host side: requests numbered from 1, unmatched messages kept in order."""

    def __init__(self) -> None:
        self.inbox: collections.deque[Message] = collections.deque()
        self.stray: list[str] = []
        self._ids = iter(range(1, 1_000_000))

    async def _send_text(self, text: str) -> None:
        raise NotImplementedError

    async def _receive_text(self) -> str:
        raise NotImplementedError

    async def send(self, message: Any) -> None:
        await self._send_text(json.dumps(message))

    async def notify(self, method: str, params: Any = None) -> None:
        message: Message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self.send(message)

    async def send_request(self, method: str, params: Any = None) -> int:
        rid = next(self._ids)
        await self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        return rid

    async def request(self, method: str, params: Any = None) -> Message:
        rid = await self.send_request(method, params)
        return await self.response_to(rid)

    async def response_to(self, rid: int) -> Message:
        return await self.wait_for(
            lambda m: m.get("id") == rid and "method" not in m, f"response to #{rid}"
        )

    async def answer(self, request: Message, result: Any) -> None:
        await self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    async def answer_error(self, request: Message, code: int, message: str) -> None:
        error = {"code": code, "message": message}
        await self.send({"jsonrpc": "2.0", "id": request["id"], "error": error})

    async def wait_for(self, pred: Callable[[Message], bool], what: str) -> Message:
        """Take the first message (oldest first) matching ``pred``; others stay in the inbox."""
        while True:
            for message in self.inbox:
                if pred(message):
                    self.inbox.remove(message)
                    return message
            text = await self._receive_text()
            try:
                message = json.loads(text)
            except ValueError:
                self.stray.append(text)
                continue
            assert isinstance(message, dict), f"not an object while waiting for {what}: {text}"
            assert message.get("jsonrpc") == "2.0", text
            self.inbox.append(message)

    async def server_request(self, method: str) -> Message:
        return await self.wait_for(
            lambda m: m.get("method") == method and "id" in m, f"{method} request"
        )

    async def handshake(self, update: Any = None, init_params: Any = None) -> Message:
        """initialize, initialized, featureSets/update, then answer channels/register.

        Returns the initialize result.
        """
        init = await self.request("initialize", init_params or INIT_PARAMS)
        await self.notify("notifications/initialized")
        receipt = await self.request(
            "featureSets/update", update or {"effectiveCapabilities": ALL_CAPS}
        )
        assert receipt["result"]["accepted"] is True
        register = await self.server_request("channels/register")
        await self.answer(register, registered(register))
        return init["result"]


def registered(register: Message) -> Message:
    return {"results": [{"id": d["id"], "accepted": True} for d in register["params"]["channels"]]}


class Lobby(Peer):
    """The lobby as a stdio subprocess."""

    def __init__(self, proc: trio.Process, stderr: Any) -> None:
        super().__init__()
        self.proc = proc
        self._stderr = stderr
        self._buf = bytearray()
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin = proc.stdin
        self._stdout = proc.stdout

    async def _send_text(self, text: str) -> None:
        await self.send_raw((text + "\n").encode())

    async def send_raw(self, data: bytes) -> None:
        await self._stdin.send_all(data)

    async def _receive_text(self) -> str:
        line = await self.read_line()
        assert line is not None, "the lobby closed stdout; stderr:\n" + self.stderr_text()
        return line

    async def read_line(self) -> str | None:
        while (nl := self._buf.find(b"\n")) < 0:
            data = await self._stdout.receive_some(65536)
            if not data:
                return None
            self._buf += data
        line = bytes(self._buf[:nl]).decode()
        del self._buf[: nl + 1]
        return line

    async def close_stdin_and_wait(self) -> int:
        await self._stdin.aclose()
        while await self.read_line() is not None:
            pass
        return await self.proc.wait()

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")


@asynccontextmanager
async def lobby_process(*args: str, run_id: str | None = "") -> AsyncIterator[Lobby]:
    """The lobby as a subprocess. Its ids are bare (``m1``) unless ``run_id`` says otherwise
    (None: the lobby's own default, a random tag per process)."""
    tagged = [] if run_id is None else ["--run-id", run_id]
    async with stdio_process([sys.executable, "-m", "tests.lobby", *tagged, *args]) as lobby:
        yield lobby


@asynccontextmanager
async def stdio_process(
    argv: list[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> AsyncIterator[Lobby]:
    """A stdio server as a subprocess, driven by the test as its host; killed on the way out."""
    with tempfile.TemporaryFile() as stderr:
        proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=cwd, env=env
        )
        try:
            yield Lobby(proc, stderr)
        finally:
            if proc.returncode is None:
                proc.kill()
            with trio.CancelScope(shield=True):
                await proc.wait()
                await proc.stdin.aclose()  # type: ignore[union-attr]
                await proc.stdout.aclose()  # type: ignore[union-attr]


class WsPeer(Peer):
    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        super().__init__()
        self.ws = ws
        self.frames: list[str] = []

    async def _send_text(self, text: str) -> None:
        await self.ws.send_message(text)

    async def _receive_text(self) -> str:
        frame = await self.ws.get_message()
        assert isinstance(frame, str)
        self.frames.append(frame)
        return frame


# ---- handshake --------------------------------------------------------------------------------


async def test_handshake_object_form_registration_and_clean_exit() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            init = await lobby.request("initialize", INIT_PARAMS)
            assert init["id"] == 1
            result = init["result"]
            assert result["protocolVersion"] == "2024-11-05"
            assert result["serverInfo"]["name"] == "lobby"
            assert result["capabilities"]["tools"] == {"listChanged": True}  # it may add tools
            mcpl = result["capabilities"]["experimental"]["mcpl"]
            assert mcpl["version"] == "0.5"
            assert mcpl["pushEvents"] is True
            assert mcpl["channels"] == {
                "register": True,
                "publish": True,
                "incoming": True,
                "lifecycle": True,
                "streaming": True,
                "typing": True,
            }
            assert set(mcpl["featureSets"]) == {"lobby.chat", "lobby.events"}
            assert sorted(mcpl["featureSets"]["lobby.chat"]["uses"]) == sorted(CHAT_USES)
            assert mcpl["featureSets"]["lobby.events"]["uses"] == ["pushEvents"]
            assert all(fs["description"] for fs in mcpl["featureSets"].values())

            await lobby.notify("notifications/initialized")
            receipt = await lobby.request("featureSets/update", {"effectiveCapabilities": ALL_CAPS})
            assert receipt["result"] == {"accepted": True}

            register = await lobby.server_request("channels/register")
            assert register["id"] == 1  # the lobby numbers its own requests from 1 too
            assert register["params"] == {"channels": [GENERAL, RANDOM]}
            await lobby.answer(register, registered(register))

            assert await lobby.close_stdin_and_wait() == 0
            assert lobby.stray == []
            assert "ERROR" not in lobby.stderr_text()


async def test_handshake_array_form_and_degradation_receipts() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none", "--feature-sets-form", "array") as lobby:
            init = await lobby.request("initialize", INIT_PARAMS)
            mcpl = init["result"]["capabilities"]["experimental"]["mcpl"]
            assert mcpl["version"] == "0.4"
            assert [fs["name"] for fs in mcpl["featureSets"]] == ["lobby.chat", "lobby.events"]
            assert sorted(mcpl["featureSets"][0]["uses"]) == sorted(CHAT_USES)

            await lobby.notify("notifications/initialized")
            # One-segment wildcards cover the channel leaves.
            receipt = await lobby.request(
                "featureSets/update", {"effectiveCapabilities": ["pushEvents", "channels.*"]}
            )
            assert receipt["result"] == {"accepted": True}
            # Granted the channels, it registers them.
            register = await lobby.server_request("channels/register")
            await lobby.answer(register, registered(register))
            # An update without effectiveCapabilities grants nothing: both sets degrade.
            receipt = await lobby.request("featureSets/update", {})
            assert receipt["result"]["accepted"] is True
            assert receipt["result"]["mode"] == "degraded"
            unavailable = {u["featureSet"]: u for u in receipt["result"]["unavailableFeatures"]}
            assert unavailable["lobby.events"] == {
                "featureSet": "lobby.events",
                "missingCapabilities": ["pushEvents"],
                "effect": "disabled",
                "reason": "capability_denied",
            }
            assert sorted(unavailable["lobby.chat"]["missingCapabilities"]) == sorted(CHAT_USES)
            # A path both granted and denied is malformed.
            bad = await lobby.request(
                "featureSets/update",
                {"effectiveCapabilities": ["pushEvents"], "deniedCapabilities": ["pushEvents"]},
            )
            assert bad["error"]["code"] == -32602
            assert await lobby.close_stdin_and_wait() == 0


async def test_mcp_only_has_no_mcpl_but_still_registers() -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_control_listener() as listener,
            lobby_process("--mcp-only", "--control-connect", listener.address) as lobby,
        ):
            ctl = await listener.accept()
            init = await lobby.request("initialize", INIT_PARAMS)
            assert init["result"]["capabilities"] == {"tools": {}}
            await lobby.notify("notifications/initialized")
            # Ready right after initialized: the registration comes unasked.
            register = await lobby.server_request("channels/register")
            await ctl.wait_for(lambda e: e["event"] == "ready", "ready")
            fsu = await lobby.request("featureSets/update", {"effectiveCapabilities": ALL_CAPS})
            assert fsu["error"]["code"] == -32601
            listing = await lobby.request("tools/list")
            assert {t["name"] for t in listing["result"]["tools"]} == {"forecast", "roll", "stall"}
            # -32601 is final (only -32002 is retried): reported after a single attempt.
            await lobby.answer_error(register, -32601, "Method not found")
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["request"]["id"] == register["id"],
                "the registration's outcome",
            )
            assert event["attempts"] == 1
            assert event["response"]["error"]["code"] == -32601
            assert await lobby.close_stdin_and_wait() == 0
            await ctl.aclose()


async def test_fsu_notification_only() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none", "--fsu-mode", "notification-only") as lobby:
            await lobby.request("initialize", INIT_PARAMS)
            await lobby.notify("notifications/initialized")
            refused = await lobby.request("featureSets/update", {"effectiveCapabilities": ALL_CAPS})
            assert refused["error"]["code"] == -32601
            # The request is refused as a 0.4-era server would, yet its grant is taken: the
            # host's notification that follows may only narrow it (SPEC §6.7).
            register = await lobby.server_request("channels/register")
            assert register["params"]["channels"] == [GENERAL, RANDOM]
            await lobby.notify("featureSets/update", {"effectiveCapabilities": ALL_CAPS})
            await lobby.answer(register, registered(register))
            assert (await lobby.request("ping"))["result"] == {}
            assert await lobby.close_stdin_and_wait() == 0


async def test_fsu_never_answered_but_lobby_serves_on() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none", "--fsu-mode", "never") as lobby:
            await lobby.request("initialize", INIT_PARAMS)
            await lobby.notify("notifications/initialized")
            fsu_id = await lobby.send_request(
                "featureSets/update", {"effectiveCapabilities": ALL_CAPS}
            )
            register = await lobby.server_request("channels/register")
            await lobby.request("ping")
            # Answers go out in processing order, so a receipt would have come before the pong.
            assert not any(m.get("id") == fsu_id and "method" not in m for m in lobby.inbox)
            await lobby.answer(register, registered(register))
            assert await lobby.close_stdin_and_wait() == 0


async def test_stray_stdout_line_after_initialized() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none", "--stray-stdout") as lobby:
            await lobby.handshake()
            assert lobby.stray == ["[lobby] client initialized"]
            assert (await lobby.request("ping"))["result"] == {}
            assert await lobby.close_stdin_and_wait() == 0


async def test_not_ready_answers_are_retried_with_fresh_ids() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.request("initialize", INIT_PARAMS)
            await lobby.notify("notifications/initialized")
            await lobby.request("featureSets/update", {"effectiveCapabilities": ALL_CAPS})
            first = await lobby.server_request("channels/register")
            await lobby.answer_error(first, -32002, "not ready")
            second = await lobby.server_request("channels/register")
            assert second["params"] == first["params"]
            assert second["id"] != first["id"]
            await lobby.answer(second, registered(second))
            assert await lobby.close_stdin_and_wait() == 0
            assert "ERROR" not in lobby.stderr_text()


# ---- tools, channels, bad input ---------------------------------------------------------------


async def test_tools() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.handshake()
            listing = await lobby.request("tools/list")
            tools = {t["name"]: t for t in listing["result"]["tools"]}
            assert set(tools) == {"forecast", "roll", "stall"}
            assert all(t["inputSchema"]["type"] == "object" for t in tools.values())

            forecast = await lobby.request(
                "tools/call", {"name": "forecast", "arguments": {"city": "Paris"}}
            )
            assert forecast["result"]["content"] == [
                {"type": "text", "text": "Forecast for Paris: sunny, 21°C"}
            ]
            roll = await lobby.request("tools/call", {"name": "roll", "arguments": {"sides": 6}})
            assert 1 <= int(roll["result"]["content"][0]["text"]) <= 6
            bad_roll = await lobby.request(
                "tools/call", {"name": "roll", "arguments": {"sides": "six"}}
            )
            assert bad_roll["error"]["code"] == -32602
            unknown = await lobby.request("tools/call", {"name": "teleport", "arguments": {}})
            assert unknown["error"]["code"] == -32602

            stall_id = await lobby.send_request("tools/call", {"name": "stall", "arguments": {}})
            unknown_method = await lobby.request("resources/list")
            assert unknown_method["error"]["code"] == -32601
            assert not any(m.get("id") == stall_id for m in lobby.inbox)
            assert await lobby.close_stdin_and_wait() == 0


async def test_channel_lifecycle_requests() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.handshake()
            opened = await lobby.request("channels/open", {"channelId": "lobby:#random"})
            assert opened["result"] == {"channel": RANDOM}
            by_address = await lobby.request(
                "channels/open", {"type": "chat", "address": "#general"}
            )
            assert by_address["result"] == {"channel": GENERAL}
            failed = await lobby.request("channels/open", {"type": "chat", "address": "#nowhere"})
            assert failed["error"]["code"] == -32024
            closed = await lobby.request("channels/close", {"channelId": "lobby:#random"})
            assert closed["result"] == {"closed": True}
            listing = await lobby.request("channels/list")
            assert listing["result"] == {"channels": [GENERAL, RANDOM]}
            removed = await lobby.request("context/afterInference", {})
            assert removed["error"]["code"] == -32601
            assert await lobby.close_stdin_and_wait() == 0


async def test_bad_input_is_logged_and_survived() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.handshake()
            await lobby.send_raw(b"this is not json\n\n")
            await lobby.send_raw(b"\xff\xfe not utf-8\n")
            await lobby.send_raw(b"[" * 100_000 + b"\n")  # too deep to parse
            await lobby.send_raw(b"[1, 2]\n")
            await lobby.send({"id": 77, "method": "ping"})  # no "jsonrpc"
            await lobby.send({"jsonrpc": "2.0", "id": 4242, "result": {}})  # nobody asked
            await lobby.send({"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"})

            no_version = await lobby.response_to(77)
            assert no_version["error"]["code"] == -32600
            assert (await lobby.request("ping"))["result"] == {}  # all of it was read by now
            # JSON-RPC 2.0 §5.1, with a null id: the line too deep to parse -32700, the batch
            # and the object id -32600, in the order they came (lines that are not JSON at
            # all, or not UTF-8, are only logged)
            refused = [m["error"] for m in lobby.inbox if m.get("id") is None]
            assert [e["code"] for e in refused] == [-32700, -32600, -32600]
            assert "nested too deeply" in refused[0]["message"]
            assert "batch" in refused[1]["message"]
            assert await lobby.close_stdin_and_wait() == 0
            stderr = lobby.stderr_text()
            assert "not JSON, skipped" in stderr
            assert "not UTF-8" in stderr
            assert "response to unknown or expired request 4242" in stderr


# ---- publish ----------------------------------------------------------------------------------


async def test_publish_reply_then_echo() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none") as lobby:
            await lobby.handshake()
            content = [{"type": "text", "text": "hello lobby"}]
            reply = await lobby.request(
                "channels/publish",
                {
                    "conversationId": "c1",
                    "channelId": "lobby:#general",
                    "content": content,
                },
            )
            # No threadId: the legacy shape, posted at the root, no threadId echoed anywhere.
            assert reply["result"] == {"delivered": True, "messageId": "out-1"}
            echo = await lobby.server_request("channels/incoming")
            [message] = echo["params"]["messages"]
            assert message["messageId"] == "out-1"
            assert message["channelId"] == "lobby:#general"
            assert message["author"] == {"id": "host", "name": "mcplive"}
            assert message["content"] == content
            assert "threadId" not in message
            assert isinstance(message["timestamp"], str)
            results = [{"messageId": "out-1", "accepted": True, "conversationId": "c1"}]
            await lobby.answer(echo, {"results": results})

            unknown = await lobby.request(
                "channels/publish", {"channelId": "lobby:#nowhere", "content": content}
            )
            assert unknown["error"]["code"] == -32023
            assert await lobby.close_stdin_and_wait() == 0
            assert "[lobby] #general <- mcplive: hello lobby" in lobby.stderr_text()


async def test_publish_notification_only_and_no_echo() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process(
            "--script", "none", "--publish-mode", "notification-only"
        ) as lobby:
            await lobby.handshake()
            params = {"channelId": "lobby:#random", "content": [{"type": "text", "text": "yo"}]}
            refused = await lobby.request("channels/publish", params)
            assert refused["error"]["code"] == -32601
            await lobby.notify("channels/publish", params)
            echo = await lobby.server_request("channels/incoming")
            assert echo["params"]["messages"][0]["messageId"] == "out-1"
            assert echo["params"]["messages"][0]["channelId"] == "lobby:#random"
            await lobby.answer(echo, {"results": [{"messageId": "out-1", "accepted": True}]})
            assert await lobby.close_stdin_and_wait() == 0

        async with lobby_process("--script", "none", "--no-echo") as lobby:
            await lobby.handshake()
            reply = await lobby.request("channels/publish", params)
            assert reply["result"]["delivered"] is True
            assert (await lobby.request("ping"))["result"] == {}
            assert lobby.inbox == collections.deque()  # no echo before the pong
            assert await lobby.close_stdin_and_wait() == 0


# ---- scripted people --------------------------------------------------------------------------


async def test_scripted_people_talk_and_the_clock_chimes() -> None:
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
            assert [m["messageId"] for m in messages] == ["m1", "m2", "m3"]  # --run-id ''
            assert [m["author"]["id"] for m in messages] == ["alice", "bob", "alice"]
            assert {m["channelId"] for m in messages} == {"lobby:#general", "lobby:#random"}
            assert all(m["content"][0]["type"] == "text" for m in messages)

            push = await lobby.server_request("push/event")
            params = push["params"]
            assert params["featureSet"] == "lobby.events"
            assert params["eventId"] == "e1"
            assert params["payload"] == {
                "content": [{"type": "text", "text": "The lobby clock chimes."}]
            }
            assert params.get("tags", []) == []  # no tags: the member may be left out
            assert isinstance(params["timestamp"], str)
            await lobby.answer(push, {"accepted": True})
            assert await lobby.close_stdin_and_wait() == 0


async def first_ids(run_id: str | None) -> tuple[str, str]:
    """The first scripted message id and the first post id of a fresh lobby process."""
    async with lobby_process("--interval", "0.05", "--no-echo", run_id=run_id) as lobby:
        await lobby.handshake()
        incoming = await lobby.server_request("channels/incoming")
        [message] = incoming["params"]["messages"]
        await lobby.answer(
            incoming, {"results": [{"messageId": message["messageId"], "accepted": True}]}
        )
        params = {"channelId": "lobby:#general", "content": [{"type": "text", "text": "hi"}]}
        reply = await lobby.request("channels/publish", params)
        assert await lobby.close_stdin_and_wait() == 0
        return message["messageId"], reply["result"]["messageId"]


async def test_each_process_makes_up_fresh_ids() -> None:
    # a second run must not repeat the first run's ids: a host that kept them would skip them
    with trio.fail_after(TIMEOUT):
        first, second = await first_ids(None), await first_ids(None)
        assert first != second
        for message_id, post_id in (first, second):
            tag, _, rest = message_id.partition("-")
            assert rest == "m1" and len(tag) == 4
            assert post_id == f"{tag}-out-1"
        assert await first_ids("run7") == ("run7-m1", "run7-out-1")


# ---- control ----------------------------------------------------------------------------------


def is_response_to(method: str, key: str, value: Any) -> Callable[[Message], bool]:
    return lambda e: (
        e["event"] == "response"
        and e["request"]["method"] == method
        and e["request"]["params"][key] == value
    )


async def test_control_commands_and_crash() -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_control_listener() as listener,
            lobby_process("--control-connect", listener.address) as lobby,
        ):
            ctl = await listener.accept()
            hello = await ctl.wait_for(lambda e: e["event"] == "hello", "hello")
            assert hello["transport"] == "stdio"
            await lobby.handshake()
            await ctl.wait_for(lambda e: e["event"] == "ready", "ready")
            received = await ctl.wait_for(
                lambda e: e["event"] == "received" and e["message"]["method"] == "initialize",
                "initialize seen",
            )
            assert received["message"]["params"] == INIT_PARAMS
            await ctl.wait_for(
                is_response_to("channels/register", "channels", [GENERAL, RANDOM]),
                "answer to the registration",
            )

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
            assert message["messageId"] == "x1"
            assert message["content"] == [{"type": "text", "text": "@Ada ping"}]
            assert message["tags"] == ["chat:mention"]
            assert message["threadId"] == "t1"
            assert message["author"]["id"] == "alice"
            answer = {"results": [{"messageId": "x1", "accepted": True}]}
            await lobby.answer(incoming, answer)
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["request"]["id"] == incoming["id"],
                "answer to incoming x1",
            )
            assert event["response"]["result"] == answer

            ctl.send({"cmd": "push", "eventId": "p1", "text": "ding", "origin": {"k": 1}})
            push = await lobby.server_request("push/event")
            assert push["params"]["eventId"] == "p1"
            assert push["params"]["origin"] == {"k": 1}
            await lobby.answer_error(push, -32002, "not ready")
            retried = await lobby.server_request("push/event")
            assert retried["params"]["eventId"] == "p1"
            await lobby.answer(retried, {"accepted": True})
            event = await ctl.wait_for(is_response_to("push/event", "eventId", "p1"), "p1")
            assert event["response"]["result"] == {"accepted": True}
            assert event["attempts"] == 2

            raw = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
            ctl.send({"cmd": "raw", "message": raw})
            assert await lobby.wait_for(lambda m: m == raw, "raw notification") == raw
            ctl.send({"cmd": "line", "text": "<<garbage>>"})
            ctl.send({"cmd": "flood", "count": 4, "text": "drip"})
            for _ in range(4):
                flood = await lobby.server_request("push/event")
                await lobby.answer(flood, {"accepted": flood["params"]["eventId"] != "f4"})
            assert lobby.stray == ["<<garbage>>"]
            done = await ctl.wait_for(lambda e: e["event"] == "flood_done", "flood done")
            assert done == {"event": "flood_done", "accepted": 3, "count": 4}

            await lobby.send({"jsonrpc": "2.0", "id": 999, "result": {}})
            error = await ctl.wait_for(lambda e: e["event"] == "error", "unknown id error")
            assert "unknown request id" in error["text"]

            ctl.send({"cmd": "crash"})
            await ctl.wait_closed()
            assert await lobby.proc.wait() == 1
            await ctl.aclose()


async def test_control_reports_initialized_not_next_and_hang() -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_control_listener() as listener,
            lobby_process("--control-connect", listener.address) as lobby,
        ):
            ctl: LobbyControl = await listener.accept()
            await lobby.request("initialize", INIT_PARAMS)
            listing = await lobby.request("tools/list")  # too early: initialized must be next
            assert "result" in listing
            error = await ctl.wait_for(lambda e: e["event"] == "error", "handshake error")
            assert "notifications/initialized" in error["text"]

            await ctl.send({"cmd": "hang"})
            await ctl.wait_for(lambda e: e["event"] == "hung", "hung")
            assert lobby.proc.returncode is None
            ctl.send({"cmd": "ping", "id": 7})
            assert await ctl.wait_for(lambda e: e["event"] == "pong", "pong") == {
                "event": "pong",
                "id": 7,
            }
            await ctl.aclose()


# ---- RFC-011 targeted publish -----------------------------------------------------------------


@asynccontextmanager
async def controlled_lobby(
    *args: str, init_params: Message | None = None, update: Message | None = None
) -> AsyncIterator[tuple[Lobby, LobbyControl]]:
    """A stdio lobby past its handshake (everything granted), with its control connection."""
    async with (
        open_control_listener() as listener,
        lobby_process("--control-connect", listener.address, *args) as lobby,
    ):
        ctl = await listener.accept()
        async with ctl:
            await lobby.handshake(update, init_params)
            await ctl.wait_for(lambda e: e["event"] == "ready", "ready")
            yield lobby, ctl


async def register_channels(lobby: Lobby, ctl: LobbyControl, *channels: Message) -> None:
    ctl.send({"cmd": "register", "channels": list(channels)})
    register = await lobby.server_request("channels/register")
    assert register["params"] == {"channels": list(channels)}
    await lobby.answer(register, registered(register))


async def incoming_in_thread(lobby: Lobby, ctl: LobbyControl, cid: str, thread: str) -> None:
    """Alice says something in a thread: from now on the lobby knows that thread."""
    ctl.send(
        {
            "cmd": "incoming",
            "channelId": cid,
            "messageId": f"in-{thread}",
            "text": "hi",
            "threadId": thread,
        }
    )
    incoming = await lobby.server_request("channels/incoming")
    assert incoming["params"]["messages"][0]["threadId"] == thread
    await lobby.answer(incoming, {"results": [{"messageId": f"in-{thread}", "accepted": True}]})


def text(words: str) -> list[Message]:
    return [{"type": "text", "text": words}]


async def publish(lobby: Lobby, cid: str, **thread: Any) -> Message:
    """A channels/publish request; ``threadId=...`` is sent only when given (None: JSON null)."""
    params = {"conversationId": "c1", "channelId": cid, "content": text("hello"), **thread}
    reply = await lobby.request("channels/publish", params)
    return reply["result"]


async def echo_of(lobby: Lobby, message_id: str) -> Message:
    """The lobby's echo of a post the host made, answered; its author is the host's."""
    message = await answered_echo(lobby, message_id)
    assert message["author"] == {"id": "host", "name": "mcplive"}
    return message


async def answered_echo(lobby: Lobby, message_id: str) -> Message:
    """The lobby's echo (``channels/incoming``) of the post ``message_id``, answered."""
    echo = await lobby.wait_for(
        lambda m: (
            m.get("method") == "channels/incoming"
            and m["params"]["messages"][0]["messageId"] == message_id
        ),
        f"echo of {message_id}",
    )
    await lobby.answer(echo, {"results": [{"messageId": message_id, "accepted": True}]})
    [message] = echo["params"]["messages"]
    return message


def assert_refused(result: Message) -> None:
    assert set(result) == {"delivered", "reason"}, result  # no messageId: nothing was posted
    assert result["delivered"] is False
    assert isinstance(result["reason"], str) and result["reason"]


async def assert_nothing_posted(lobby: Lobby) -> None:
    """An echo would have been queued right after the refusal, so before the pong."""
    assert (await lobby.request("ping"))["result"] == {}
    assert not any(m.get("method") == "channels/incoming" for m in lobby.inbox), lobby.inbox


async def test_publish_root_channel_honours_null_and_refuses_threads() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            # null is the root: honoured, echoed as null, and the echo message has no thread.
            result = await publish(lobby, "lobby:#general", threadId=None)
            assert result == {"delivered": True, "messageId": "out-1", "threadId": None}
            assert "threadId" not in await echo_of(lobby, "out-1")

            # A root channel has no threads, even one its incoming messages named.
            await incoming_in_thread(lobby, ctl, "lobby:#general", "t1")
            for thread in ("t1", "t-never-seen"):
                assert_refused(await publish(lobby, "lobby:#general", threadId=thread))
            await assert_nothing_posted(lobby)
            # Nothing was posted, so the next post is only the second one.
            result = await publish(lobby, "lobby:#random", threadId=None)
            assert result["messageId"] == "out-2"
            await echo_of(lobby, "out-2")
            assert await lobby.close_stdin_and_wait() == 0
            stderr = lobby.stderr_text()
            assert "#general [t1] <-" not in stderr
            assert "refused, nothing posted" in stderr
            assert "ERROR" not in stderr


async def test_publish_exact_channel_honours_known_threads_only() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            await register_channels(lobby, ctl, DEV, PLAIN)
            await incoming_in_thread(lobby, ctl, "lobby:#dev", "t-seen")
            ctl.send({"cmd": "threads", "channelId": "lobby:#dev", "threads": ["t-declared"]})
            await ctl.wait_for(lambda e: e["event"] == "threads", "threads declared")
            # A thread of another channel is no thread of this one.
            ctl.send({"cmd": "threads", "channelId": "lobby:#elsewhere", "threads": ["t-other"]})
            await ctl.wait_for(
                lambda e: e["event"] == "threads" and e["channelId"] == "lobby:#elsewhere",
                "the other channel's threads",
            )

            result = await publish(lobby, "lobby:#dev", threadId="t-seen")
            assert result == {"delivered": True, "messageId": "out-1", "threadId": "t-seen"}
            assert (await echo_of(lobby, "out-1"))["threadId"] == "t-seen"
            result = await publish(lobby, "lobby:#dev", threadId="t-declared")
            assert result == {"delivered": True, "messageId": "out-2", "threadId": "t-declared"}
            assert (await echo_of(lobby, "out-2"))["threadId"] == "t-declared"
            result = await publish(lobby, "lobby:#dev", threadId=None)
            assert result == {"delivered": True, "messageId": "out-3", "threadId": None}
            assert "threadId" not in await echo_of(lobby, "out-3")

            for thread in ("t-unknown", "t-other"):
                assert_refused(await publish(lobby, "lobby:#dev", threadId=thread))
            await assert_nothing_posted(lobby)
            assert await lobby.close_stdin_and_wait() == 0
            assert "ERROR" not in lobby.stderr_text()


async def test_publish_undeclared_channel_refuses_any_thread_id() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            await register_channels(lobby, ctl, PLAIN)
            await incoming_in_thread(lobby, ctl, "lobby:#plain", "t1")
            for thread in ("t1", None):
                assert_refused(await publish(lobby, "lobby:#plain", threadId=thread))
            await assert_nothing_posted(lobby)
            # Without threadId it is a legacy publish, posted as ever.
            assert await publish(lobby, "lobby:#plain") == {"delivered": True, "messageId": "out-1"}
            assert "threadId" not in await echo_of(lobby, "out-1")
            assert await lobby.close_stdin_and_wait() == 0


async def test_publish_invalid_thread_values_are_refused() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            await register_channels(lobby, ctl, DEV)
            await incoming_in_thread(lobby, ctl, "lobby:#dev", "t1")
            for cid in ("lobby:#dev", "lobby:#general"):
                for value in (7, 0, "", {"id": "t1"}, ["t1"], True, False):
                    assert_refused(await publish(lobby, cid, threadId=value))
            await assert_nothing_posted(lobby)
            # A malformed publish is still a JSON-RPC error, as before.
            unknown = await lobby.request(
                "channels/publish", {"channelId": "lobby:#nowhere", "content": [], "threadId": None}
            )
            assert unknown["error"]["code"] == -32023
            assert await lobby.close_stdin_and_wait() == 0


async def test_publish_echo_thread_modes() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            await register_channels(lobby, ctl, DEV)
            await incoming_in_thread(lobby, ctl, "lobby:#dev", "t1")

            await ctl.send({"cmd": "publish_echo_thread", "mode": "omit"})
            await ctl.wait_for(
                lambda e: e == {"event": "publish_echo_thread", "mode": "omit"}, "omit"
            )
            result = await publish(lobby, "lobby:#dev", threadId="t1")
            assert result == {"delivered": True, "messageId": "out-1"}
            # Posted in the thread all the same: only the result's echo is missing.
            assert (await echo_of(lobby, "out-1"))["threadId"] == "t1"
            assert await publish(lobby, "lobby:#dev", threadId=None) == {
                "delivered": True,
                "messageId": "out-2",
            }

            await ctl.send({"cmd": "publish_echo_thread", "mode": "wrong"})
            await ctl.wait_for(lambda e: e.get("mode") == "wrong", "wrong")
            result = await publish(lobby, "lobby:#dev", threadId="t1")
            assert result["delivered"] is True and result["messageId"] == "out-3"
            assert isinstance(result["threadId"], str) and result["threadId"] != "t1"
            result = await publish(lobby, "lobby:#dev", threadId=None)
            assert result["delivered"] is True and result["messageId"] == "out-4"
            assert "threadId" in result and result["threadId"] is not None
            # Refusals and legacy publishes are not touched by the mode.
            assert_refused(await publish(lobby, "lobby:#dev", threadId="t-unknown"))
            assert await publish(lobby, "lobby:#dev") == {"delivered": True, "messageId": "out-5"}

            await ctl.send({"cmd": "publish_echo_thread", "mode": "echo"})
            await ctl.wait_for(lambda e: e.get("mode") == "echo", "echo")
            result = await publish(lobby, "lobby:#dev", threadId="t1")
            assert result == {"delivered": True, "messageId": "out-6", "threadId": "t1"}

            await ctl.send({"cmd": "publish_echo_thread", "mode": "sometimes"})
            error = await ctl.wait_for(lambda e: e["event"] == "error", "bad mode refused")
            assert "publish_echo_thread" in error["text"]
            assert await lobby.close_stdin_and_wait() == 0


async def test_publish_notification_with_thread_id_is_refused_as_a_problem() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            params = {"channelId": "lobby:#general", "content": text("psst")}
            await lobby.notify("channels/publish", {**params, "threadId": None})
            await lobby.notify("channels/publish", params)
            # The first posted message is the second notification's.
            assert (await echo_of(lobby, "out-1"))["content"] == text("psst")
            error = await ctl.wait_for(lambda e: e["event"] == "error", "refused notification")
            assert "threadId" in error["text"]
            assert await lobby.close_stdin_and_wait() == 0


# ---- channels/outgoing/* and channels/typing --------------------------------------------------


class Fences:
    """Which error events the lobby reported for what it read since the last fence.

    A ping request is the fence: the lobby reports each message it reads (``received``) before
    handling it, so every problem found in earlier messages comes before the ping's event.
    """

    def __init__(self, lobby: Lobby, ctl: LobbyControl) -> None:
        self.lobby = lobby
        self.ctl = ctl
        self.last: Message | None = None

    async def problems(self) -> list[str]:
        rid = await self.lobby.send_request("ping")
        await self.lobby.response_to(rid)
        fence = await self.ctl.wait_for(
            lambda e: (
                e["event"] == "received"
                and e["message"].get("method") == "ping"  # not an answer to a lobby request
                and e["message"].get("id") == rid
            ),
            "ping fence",
        )
        events = self.ctl.events
        start = 0 if self.last is None else _index(events, self.last)
        self.last = fence
        return [e["text"] for e in events[start : _index(events, fence)] if e["event"] == "error"]


def _index(events: list[Message], event: Message) -> int:
    return next(i for i, e in enumerate(events) if e is event)


def chunk(inference: str, cid: str, index: Any, delta: Any, **extra: Any) -> Message:
    return {
        "inferenceId": inference,
        "conversationId": "c1",
        "channelId": cid,
        "index": index,
        "delta": delta,
        **extra,
    }


def complete(inference: str, cid: str, words: str, **extra: Any) -> Message:
    params = {"inferenceId": inference, "conversationId": "c1", "channelId": cid}
    return {**params, "content": text(words), **extra}


async def test_outgoing_chunks_one_index_counter_per_inference() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            fences = Fences(lobby, ctl)
            assert await fences.problems() == []
            # One inference streaming to two channels: one counter across both.
            for params in (
                chunk("i1", "lobby:#general", 0, "Hel"),
                chunk("i1", "lobby:#random", 1, "Ah"),
                chunk("i1", "lobby:#general", 2, "lo"),
                chunk("i1", "lobby:#random", 3, "oy"),
            ):
                await lobby.notify("channels/outgoing/chunk", params)
            await lobby.notify(
                "channels/outgoing/complete", complete("i1", "lobby:#general", "Hello")
            )
            await lobby.notify(
                "channels/outgoing/complete", complete("i1", "lobby:#random", "Ahoy")
            )
            assert await fences.problems() == []
            streamed = [e for e in ctl.events if e["event"] == "streamed"]
            assert streamed == [
                {
                    "event": "streamed",
                    "inferenceId": "i1",
                    "channelId": "lobby:#general",
                    "text": "Hello",
                },
                {
                    "event": "streamed",
                    "inferenceId": "i1",
                    "channelId": "lobby:#random",
                    "text": "Ahoy",
                },
            ]

            # A gap.
            await lobby.notify("channels/outgoing/chunk", chunk("i2", "lobby:#general", 0, "a"))
            await lobby.notify("channels/outgoing/chunk", chunk("i2", "lobby:#general", 2, "b"))
            [gap] = await fences.problems()
            assert "index 2, expected 1" in gap
            # A counter per channel instead of per inference.
            await lobby.notify("channels/outgoing/chunk", chunk("i3", "lobby:#general", 0, "a"))
            await lobby.notify("channels/outgoing/chunk", chunk("i3", "lobby:#random", 0, "b"))
            [restart] = await fences.problems()
            assert "index 0, expected 1" in restart
            # Not starting at 0, a non-integer index, a non-string delta, an unknown channel.
            await lobby.notify("channels/outgoing/chunk", chunk("i4", "lobby:#general", 1, "a"))
            await lobby.notify("channels/outgoing/chunk", chunk("i5", "lobby:#general", "0", "a"))
            await lobby.notify("channels/outgoing/chunk", chunk("i6", "lobby:#general", 0, 42))
            await lobby.notify("channels/outgoing/chunk", chunk("i7", "lobby:#nowhere", 0, "a"))
            assert len(await fences.problems()) == 4
            assert await lobby.close_stdin_and_wait() == 0


async def test_outgoing_thread_ids_only_where_a_target_is_declared() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            await register_channels(lobby, ctl, DEV, PLAIN)
            fences = Fences(lobby, ctl)
            assert await fences.problems() == []
            await lobby.notify(
                "channels/outgoing/chunk", chunk("i1", "lobby:#dev", 0, "a", threadId="t1")
            )
            await lobby.notify(
                "channels/outgoing/chunk", chunk("i2", "lobby:#general", 0, "a", threadId=None)
            )
            assert await fences.problems() == []
            for params in (
                chunk("i3", "lobby:#plain", 0, "a", threadId=None),
                chunk("i4", "lobby:#plain", 0, "a", threadId="t1"),
                chunk("i5", "lobby:#dev", 0, "a", threadId=7),
                chunk("i6", "lobby:#dev", 0, "a", threadId=""),
            ):
                await lobby.notify("channels/outgoing/chunk", params)
            assert len(await fences.problems()) == 4
            assert await lobby.close_stdin_and_wait() == 0


async def test_outgoing_complete_once_per_inference_and_channel() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            fences = Fences(lobby, ctl)
            await lobby.notify("channels/outgoing/chunk", chunk("i1", "lobby:#general", 0, "hi"))
            await lobby.notify("channels/outgoing/complete", complete("i1", "lobby:#general", "hi"))
            assert await fences.problems() == []
            await lobby.notify("channels/outgoing/complete", complete("i1", "lobby:#general", "hi"))
            [twice] = await fences.problems()
            assert "second complete" in twice
            assert [e["text"] for e in ctl.events if e["event"] == "streamed"] == ["hi"]
            bad = {**complete("i2", "lobby:#general", ""), "content": "hi"}
            await lobby.notify("channels/outgoing/complete", bad)
            assert len(await fences.problems()) == 1
            assert await lobby.close_stdin_and_wait() == 0
            assert "by mcplive: streamed 'hi', complete 'hi' (same text)" in lobby.stderr_text()


async def test_typing_is_validated() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            await register_channels(lobby, ctl, DEV)
            fences = Fences(lobby, ctl)
            await lobby.notify("channels/typing", {"channelId": "lobby:#general", "typing": True})
            await lobby.notify("channels/typing", {"channelId": "lobby:#random", "typing": False})
            params = {"channelId": "lobby:#dev", "typing": True, "threadId": "t1"}
            await lobby.notify("channels/typing", params)
            assert await fences.problems() == []
            await lobby.notify("channels/typing", {"channelId": "lobby:#nowhere", "typing": True})
            [unknown] = await fences.problems()
            assert "unknown channel" in unknown
            await lobby.notify("channels/typing", {"channelId": "lobby:#general", "typing": "yes"})
            [not_bool] = await fences.problems()
            assert "boolean" in not_bool
            await lobby.notify("channels/typing", {"channelId": "lobby:#general"})
            assert len(await fences.problems()) == 1
            params = {"channelId": "lobby:#general", "typing": True, "threadId": "t1"}
            await lobby.notify("channels/typing", params)
            assert len(await fences.problems()) == 1
            assert await lobby.close_stdin_and_wait() == 0
            assert "channels/typing #general: true" in lobby.stderr_text()


# ---- channels/open never answered -------------------------------------------------------------


async def test_open_mode_never_leaves_opens_unanswered() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--script", "none", "--open-mode", "never") as lobby:
            await lobby.handshake()
            open_id = await lobby.send_request("channels/open", {"channelId": "lobby:#random"})
            closed = await lobby.request("channels/close", {"channelId": "lobby:#random"})
            assert closed["result"] == {"closed": True}
            listing = await lobby.request("channels/list")
            assert listing["result"] == {"channels": [GENERAL, RANDOM]}
            # Answers go out in processing order: an answer to the open would be here by now.
            assert not any(m.get("id") == open_id for m in lobby.inbox)
            assert await lobby.close_stdin_and_wait() == 0
            assert "not answering channels/open" in lobby.stderr_text()


async def test_open_mode_command() -> None:
    with trio.fail_after(TIMEOUT):
        async with controlled_lobby() as (lobby, ctl):
            await ctl.send({"cmd": "open_mode", "mode": "never"})
            await ctl.wait_for(lambda e: e == {"event": "open_mode", "mode": "never"}, "never")
            open_id = await lobby.send_request("channels/open", {"channelId": "lobby:#random"})
            assert (await lobby.request("ping"))["result"] == {}
            assert not any(m.get("id") == open_id for m in lobby.inbox)

            await ctl.send({"cmd": "open_mode", "mode": "answer"})
            await ctl.wait_for(lambda e: e == {"event": "open_mode", "mode": "answer"}, "answer")
            opened = await lobby.request("channels/open", {"channelId": "lobby:#random"})
            assert opened["result"] == {"channel": RANDOM}
            assert await lobby.close_stdin_and_wait() == 0


# ---- RFC-006 event coalescing -----------------------------------------------------------------

ABSENT = object()
EVERY_LEAF = {
    "pushEvents": True,
    "channelsIncoming": True,
    "deferred": True,
    "channelScopedPush": True,
    "retryWindowMs": 3_600_000,
}
NO_LEAF = {
    "pushEvents": False,
    "channelsIncoming": False,
    "deferred": False,
    "channelScopedPush": False,
    "retryWindowMs": None,
}


def init_with(coalescing: Any) -> Message:
    """initialize params whose MCPL manifest advertises ``coalescing`` (ABSENT: no member)."""
    mcpl: Message = {"version": "0.5", "pushEvents": True}
    if coalescing is not ABSENT:
        mcpl["eventCoalescing"] = coalescing
    return {**INIT_PARAMS, "capabilities": {"experimental": {"mcpl": mcpl}}}


def coalescing_lobby(coalescing: Any = True, **kwargs: Any) -> Any:
    return controlled_lobby(init_params=init_with(coalescing), **kwargs)


async def command_errors(lobby: Lobby, ctl: LobbyControl, since: int, count: int) -> list[str]:
    """The first ``count`` error events after ``since`` (bad control commands); then a ping
    round trip, so anything those commands had sent to the host would be in the inbox."""
    found: list[Message] = []
    while len(found) < count:
        found.append(
            await ctl.wait_for(
                lambda e: e["event"] == "error" and all(e is not f for f in found),
                f"error {len(found) + 1} of {count}",
                since=since,
            )
        )
    assert (await lobby.request("ping"))["result"] == {}
    return [e["text"] for e in found]


@pytest.mark.parametrize(
    ("advertised", "leaves"),
    [
        (True, EVERY_LEAF),
        (
            {"pushEvents": True, "deferred": False, "retryWindowMs": 7_200_000},
            {**NO_LEAF, "pushEvents": True, "retryWindowMs": 7_200_000},
        ),
        (
            {"channelsIncoming": True},
            {**NO_LEAF, "channelsIncoming": True, "retryWindowMs": 3_600_000},
        ),
        (ABSENT, NO_LEAF),
    ],
    ids=["true", "object", "object-defaults", "absent"],
)
async def test_coalescing_advertisement_is_recorded(advertised: Any, leaves: Message) -> None:
    with trio.fail_after(TIMEOUT):
        async with coalescing_lobby(advertised) as (lobby, ctl):
            event = await ctl.wait_for(lambda e: e["event"] == "coalescing", "coalescing")
            expected = None if advertised is ABSENT else advertised
            assert event == {"event": "coalescing", "advertised": expected, "leaves": leaves}
            assert await Fences(lobby, ctl).problems() == []
            assert await lobby.close_stdin_and_wait() == 0


async def test_malformed_coalescing_advertisement_is_a_problem() -> None:
    with trio.fail_after(TIMEOUT):
        bad = {"pushEvents": True, "deferred": "yes", "retryWindowMs": 5}
        async with coalescing_lobby(bad) as (lobby, ctl):
            event = await ctl.wait_for(lambda e: e["event"] == "coalescing", "coalescing")
            assert event["leaves"] == {**NO_LEAF, "pushEvents": True, "retryWindowMs": 5}
            problems = await Fences(lobby, ctl).problems()
            assert len(problems) == 2
            assert "eventCoalescing.deferred" in problems[0]
            assert "eventCoalescing.retryWindowMs" in problems[1]
            assert await lobby.close_stdin_and_wait() == 0
        async with coalescing_lobby("yes") as (lobby, ctl):
            [problem] = await Fences(lobby, ctl).problems()
            assert "eventCoalescing must be true or an object" in problem
            assert await lobby.close_stdin_and_wait() == 0


PLAIN_KEY = {"key": "status", "initial": True}
DEFERRED_KEY = {"key": "K", "deferred": True, "data": {"n": 1}}
CHANNEL_KEY = {"key": "message:m1", "channelId": "lobby:#general"}


async def answered(ctl: LobbyControl, request: Message) -> Message:
    """The lobby's ``response`` event for its ``request``: its answer has been checked."""
    return await ctl.wait_for(
        lambda e: e["event"] == "response" and e["request"]["id"] == request["id"],
        f"the answer to {request['method']} #{request['id']}",
    )


async def pushed(peer: Peer, ctl: LobbyControl, event_id: str, result: Any = None) -> Message:
    """The lobby's push/event ``event_id``, answered ``result`` (default: accepted, with the
    outcome "first" if it carries coalesce) and checked by the lobby."""
    push = await peer.wait_for(
        lambda m: m.get("method") == "push/event" and m["params"]["eventId"] == event_id,
        f"push {event_id}",
    )
    if result is None:
        result = {"accepted": True}
        if "coalesce" in push["params"]:
            result["coalesce"] = {"outcome": "first"}
    await peer.answer(push, result)
    await answered(ctl, push)
    return push["params"]


@pytest.mark.parametrize(
    ("advertised", "carried", "withheld"),
    [
        (True, ["p1", "p2", "p3", "p4"], {}),
        (
            {"pushEvents": True},
            ["p1", "p4"],
            {"p2": ["deferred"], "p3": ["channelScopedPush"]},
        ),
        (
            {"channelsIncoming": True, "deferred": True, "channelScopedPush": True},
            ["p4"],
            {"p1": ["pushEvents"], "p2": ["pushEvents"], "p3": ["pushEvents"]},
        ),
        (
            ABSENT,
            ["p4"],
            {
                "p1": ["pushEvents"],
                "p2": ["pushEvents", "deferred"],
                "p3": ["pushEvents", "channelScopedPush"],
            },
        ),
    ],
    ids=["true", "push-only", "no-push", "absent"],
)
async def test_coalesce_push_is_sent_only_when_advertised_or_forced(
    advertised: Any, carried: list[str], withheld: dict[str, list[str]]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with coalescing_lobby(advertised) as (lobby, ctl):
            sent = {"p1": PLAIN_KEY, "p2": DEFERRED_KEY, "p3": CHANNEL_KEY, "p4": DEFERRED_KEY}
            for event_id, coalesce in sent.items():
                cmd = {"cmd": "push", "eventId": event_id, "text": "x", "coalesce": coalesce}
                if event_id == "p4":
                    cmd["force"] = True
                ctl.send(cmd)
            for event_id, coalesce in sent.items():
                params = await pushed(lobby, ctl, event_id)
                assert params["payload"]["content"] == text("x")
                if event_id in carried:
                    assert params["coalesce"] == coalesce
                else:
                    assert "coalesce" not in params
            events = [e for e in ctl.events if e["event"] == "coalesce_withheld"]
            assert {e["eventId"]: e["missing"] for e in events} == withheld
            assert all(e["method"] == "push/event" for e in events)
            assert all(e["coalesce"] == sent[e["eventId"]] for e in events)
            # A bad coalesce or force is refused as a problem, nothing is sent.
            mark = ctl.mark()
            ctl.send({"cmd": "push", "eventId": "bad1", "text": "x", "coalesce": "status"})
            ctl.send({"cmd": "push", "eventId": "bad2", "text": "x", "coalesce": {}, "force": 1})
            problems = await command_errors(lobby, ctl, mark, 2)
            assert "coalesce must be an object" in problems[0]
            assert "force must be a boolean" in problems[1]
            assert not any(m.get("method") == "push/event" for m in lobby.inbox)
            assert await lobby.close_stdin_and_wait() == 0


async def test_share_carries_coalesce_when_advertised() -> None:
    with trio.fail_after(TIMEOUT):
        async with open_control_listener() as listener, trio.open_nursery() as nursery:
            options = LobbyOptions(script="none", files=True, control_connect=listener.address)
            port = await nursery.start(serve_ws, "127.0.0.1", 0, options)
            for advertised, carried in ((True, True), ({"deferred": True}, False)):
                async with ws_peer(f"ws://127.0.0.1:{port}") as peer:
                    ctl = await listener.accept()
                    await peer.handshake(init_params=init_with(advertised))
                    await ctl.wait_for(lambda e: e["event"] == "ready", "ready")
                    coalesce = {"key": "board", "initial": True}
                    cmd = {"cmd": "share", "file": "board.png", "eventId": "s1"}
                    ctl.send({**cmd, "coalesce": coalesce})
                    params = await pushed(peer, ctl, "s1")
                    assert params["payload"]["content"][1]["type"] == "resource"
                    assert ("coalesce" in params) is carried
                    ctl.send({**cmd, "eventId": "s2", "coalesce": coalesce, "force": True})
                    assert (await pushed(peer, ctl, "s2"))["coalesce"] == coalesce
                    await ctl.aclose()
            nursery.cancel_scope.cancel()


def notice(event_id: str, second: int, data: Any = ABSENT) -> Message:
    n: Message = {"eventId": event_id, "timestamp": f"2026-10-06T12:00:{second:02d}.000Z"}
    if data is not ABSENT:
        n["data"] = data
    return n


def render_params(**changes: Any) -> Message:
    """A well-formed push/render request for two notices; ``changes`` replace or add members."""
    params: Message = {
        "featureSet": "lobby.events",
        "key": "K",
        "eventId": "d2",
        "notices": [notice("d1", 1, {"n": 1}), notice("d2", 2, {"n": 2})],
        "dropped": 0,
    }
    params.update(changes)
    return {k: v for k, v in params.items() if v is not ABSENT}


async def set_render_mode(ctl: LobbyControl, mode: str, **args: Any) -> None:
    mark = ctl.mark()
    ctl.send({"cmd": "render_mode", "mode": mode, **args})
    await ctl.wait_for(lambda e: e["event"] == "render_mode", f"render mode {mode}", since=mark)


async def test_render_modes() -> None:
    with trio.fail_after(TIMEOUT):
        async with coalescing_lobby(True) as (lobby, ctl):
            fences = Fences(lobby, ctl)
            # The default: a text summarizing the notices' data.
            answer = await lobby.request("push/render", render_params())
            assert answer["result"] == {"content": text('2 updates: {"n":1}, {"n":2}; 0 dropped')}
            notices = [notice("d1", 1), notice("d2", 1, None), notice("d3", 2, "s")]
            params = render_params(notices=notices, eventId="d3", dropped=70)
            answer = await lobby.request("push/render", params)
            assert answer["result"] == {"content": text('3 updates: -, null, "s"; 70 dropped')}

            custom = [{"type": "text", "text": "Board: 3 moves"}]
            await set_render_mode(ctl, "result", content=custom)
            assert (await lobby.request("push/render", render_params()))["result"] == {
                "content": custom
            }
            await set_render_mode(ctl, "empty", content=custom)
            answer = await lobby.request("push/render", render_params())
            assert answer["result"] == {"content": []}
            await set_render_mode(ctl, "error")
            answer = await lobby.request("push/render", render_params())
            assert answer["error"]["code"] == -32603
            assert "result" not in answer

            await set_render_mode(ctl, "never")
            never_id = await lobby.send_request("push/render", render_params())
            assert (await lobby.request("ping"))["result"] == {}
            assert not any(m.get("id") == never_id for m in lobby.inbox)

            await set_render_mode(ctl, "slow", delaySeconds=0.5)
            started = trio.current_time()
            slow_id = await lobby.send_request("push/render", render_params())
            assert (await lobby.request("ping"))["result"] == {}  # served while it waits
            assert not any(m.get("id") == slow_id for m in lobby.inbox)
            answer = await lobby.response_to(slow_id)
            assert trio.current_time() - started >= 0.5
            assert answer["result"] == {"content": text('2 updates: {"n":1}, {"n":2}; 0 dropped')}
            assert not any(m.get("id") == never_id for m in lobby.inbox)

            await ctl.wait_for(lambda e: e["event"] == "render" and e["mode"] == "slow", "slow")
            renders = [e for e in ctl.events if e["event"] == "render"]
            modes = ["result", "result", "result", "empty", "error", "never", "slow"]
            assert [e["mode"] for e in renders] == modes
            assert all(e["params"]["key"] == "K" for e in renders)
            assert renders[0]["result"] == {
                "content": text('2 updates: {"n":1}, {"n":2}; 0 dropped')
            }
            assert renders[4]["error"]["code"] == -32603
            assert renders[6]["delaySeconds"] == 0.5
            assert await fences.problems() == []
            # The lobby asked for no inference while rendering.
            assert not any(m.get("method") == "inference/request" for m in lobby.inbox)

            mark = ctl.mark()
            for bad in (
                {"mode": "later"},
                {"mode": "result", "content": "text"},
                {"mode": "slow", "delaySeconds": -1},
                {"mode": "slow", "delaySeconds": True},
            ):
                ctl.send({"cmd": "render_mode", **bad})
            problems = await command_errors(lobby, ctl, mark, 4)
            assert all("bad control command" in p and "render_mode" in p for p in problems)
            # Still in the slow mode.
            await lobby.send_request("push/render", render_params())
            render = await ctl.wait_for(lambda e: e["event"] == "render", "render", since=mark)
            assert render["mode"] == "slow"
            assert await lobby.close_stdin_and_wait() == 0


async def test_render_params_are_validated() -> None:
    with trio.fail_after(TIMEOUT):
        async with coalescing_lobby(True) as (lobby, ctl):
            fences = Fences(lobby, ctl)
            await lobby.request("push/render", render_params(channelId="lobby:#general"))
            assert await fences.problems() == []
            cases = [
                (render_params(key=ABSENT), "no key"),
                (render_params(key=""), "key must be a non-empty string"),
                (render_params(key="k" * 257), "longer than 256 bytes"),
                (
                    render_params(notices=[notice("d1", 2), notice("d2", 1)]),
                    "not oldest first",
                ),
                (render_params(dropped=1.5), "dropped must be a non-negative integer"),
                (render_params(dropped="0"), "dropped must be a non-negative integer"),
                (render_params(eventId="d1"), "not the latest notice's"),
                (
                    render_params(notices=[{"eventId": "d2", "timestamp": "soon"}]),
                    "unreadable timestamp",
                ),
                (render_params(notices=[]), "notices must be a non-empty list"),
                (render_params(channelId="lobby:#nowhere"), "unknown channel"),
                (render_params(featureSet=7), "featureSet"),
            ]
            for params, expected in cases:
                answer = await lobby.request("push/render", params)
                assert "result" in answer  # still answered as the mode says
                [problem] = await fences.problems()
                assert problem.startswith("push/render: ") and expected in problem, problem
            assert await lobby.close_stdin_and_wait() == 0

        # A host that advertised no deferred mode, or did not grant pushEvents, renders nothing.
        async with coalescing_lobby({"pushEvents": True}) as (lobby, ctl):
            await lobby.request("push/render", render_params())
            [problem] = await Fences(lobby, ctl).problems()
            assert "did not advertise eventCoalescing.deferred" in problem
            assert await lobby.close_stdin_and_wait() == 0
        update = {"effectiveCapabilities": [c for c in ALL_CAPS if c != "pushEvents"]}
        async with coalescing_lobby(True, update=update) as (lobby, ctl):
            await lobby.request("push/render", render_params())
            [problem] = await Fences(lobby, ctl).problems()
            assert "pushEvents grant" in problem
            assert await lobby.close_stdin_and_wait() == 0


async def test_render_is_mcpl_only() -> None:
    with trio.fail_after(TIMEOUT):
        async with lobby_process("--mcp-only") as lobby:
            await lobby.request("initialize", init_with(True))
            await lobby.notify("notifications/initialized")
            answer = await lobby.request("push/render", render_params())
            assert answer["error"]["code"] == -32601
            register = await lobby.server_request("channels/register")
            await lobby.answer(register, registered(register))
            assert await lobby.close_stdin_and_wait() == 0


async def incoming_sent(lobby: Lobby, ctl: LobbyControl, results: list[Message]) -> list[Message]:
    """The lobby's next channels/incoming, answered ``{"results": results}`` and checked by the
    lobby; its messages."""
    incoming = await lobby.server_request("channels/incoming")
    await lobby.answer(incoming, {"results": results})
    await answered(ctl, incoming)
    return incoming["params"]["messages"]


async def test_incoming_with_event_id_and_coalesce() -> None:
    with trio.fail_after(TIMEOUT):
        async with coalescing_lobby(True) as (lobby, ctl):
            fences = Fences(lobby, ctl)
            key = {"key": "message:m1"}
            base = {"cmd": "incoming", "channelId": "lobby:#general", "messageId": "m1"}
            ctl.send({**base, "text": "hi", "eventId": "ev1", "coalesce": key})
            first = {"outcome": "first"}
            [message] = await incoming_sent(
                lobby, ctl, [{"messageId": "m1", "accepted": True, "coalesce": first}]
            )
            assert message["eventId"] == "ev1" and message["coalesce"] == key
            assert message["messageId"] == "m1" and message["content"] == text("hi")
            # An edit: a new occurrence of the same message, same key.
            ctl.send({**base, "text": "hi all", "eventId": "ev2", "coalesce": key})
            replaced = {"outcome": "replaced", "priorEventId": "ev1"}
            result = {"messageId": "m1", "accepted": True, "coalesce": replaced}
            [edit] = await incoming_sent(lobby, ctl, [result])
            assert (edit["eventId"], edit["messageId"], edit["coalesce"]) == ("ev2", "m1", key)
            event = await ctl.wait_for(
                lambda e: e["event"] == "response" and e["request"]["params"]["messages"] == [edit],
                "answer to the edit",
            )
            assert event["response"]["result"] == {"results": [result]}
            # A batch passes its messages through as given.
            batch = [
                {**message, "messageId": "m2", "eventId": "ev3", "coalesce": {"key": "message:m2"}},
                {
                    **message,
                    "messageId": "m3",
                    "eventId": "ev4",
                    "coalesce": {"key": "message:m3", "retract": True},
                },
            ]
            ctl.send({"cmd": "incoming_batch", "messages": batch})
            results = [
                {"messageId": "m2", "accepted": True, "coalesce": {"outcome": "first"}},
                {"messageId": "m3", "accepted": False, "reason": "coalesce_invalid"},
            ]
            assert await incoming_sent(lobby, ctl, results) == batch
            assert await fences.problems() == []
            # An admitted coalesced message whose result has no outcome, or a bad outcome.
            ctl.send({**base, "messageId": "m4", "text": "x", "eventId": "ev5", "coalesce": key})
            await incoming_sent(lobby, ctl, [{"messageId": "m4", "accepted": True}])
            ctl.send({**base, "messageId": "m5", "text": "x", "eventId": "ev6", "coalesce": key})
            bad = {"outcome": "merged"}
            await incoming_sent(
                lobby, ctl, [{"messageId": "m5", "accepted": True, "coalesce": bad}]
            )
            problems = await fences.problems()
            assert len(problems) == 2
            assert "m4: admitted with coalesce, but the answer has no outcome" in problems[0]
            assert "m5: malformed coalesce result" in problems[1]
            # A bad eventId is refused as a problem, nothing is sent.
            mark = ctl.mark()
            ctl.send({**base, "text": "x", "eventId": 7})
            [refused] = await command_errors(lobby, ctl, mark, 1)
            assert "eventId must be a non-empty string" in refused
            assert not any(m.get("method") == "channels/incoming" for m in lobby.inbox)
            assert await lobby.close_stdin_and_wait() == 0
            stderr = lobby.stderr_text()
            assert "m1=ok (coalesce first)" in stderr
            assert "m1=ok (coalesce replaced, prior ev1)" in stderr
            assert "m3=coalesce_invalid" in stderr


async def test_incoming_coalesce_withheld_unless_advertised_or_forced() -> None:
    with trio.fail_after(TIMEOUT):
        async with coalescing_lobby({"pushEvents": True}) as (lobby, ctl):
            fences = Fences(lobby, ctl)
            key = {"key": "message:m1"}
            base = {"cmd": "incoming", "channelId": "lobby:#general", "messageId": "m1"}
            ctl.send({**base, "text": "hi", "eventId": "ev1", "coalesce": key})
            ok = [{"messageId": "m1", "accepted": True}]
            [message] = await incoming_sent(lobby, ctl, ok)
            assert message["eventId"] == "ev1" and "coalesce" not in message
            withheld = await ctl.wait_for(
                lambda e: e["event"] == "coalesce_withheld", "withheld incoming"
            )
            assert withheld == {
                "event": "coalesce_withheld",
                "method": "channels/incoming",
                "eventId": "ev1",
                "messageId": "m1",
                "coalesce": key,
                "missing": ["channelsIncoming"],
            }
            ctl.send({**base, "text": "hi", "eventId": "ev2", "coalesce": key, "force": True})
            [forced] = await incoming_sent(lobby, ctl, ok)
            assert forced["coalesce"] == key
            batch = [{**message, "coalesce": key}, {**message, "messageId": "m2"}]
            ctl.send({"cmd": "incoming_batch", "messages": batch})
            two = [*ok, {"messageId": "m2", "accepted": True}]
            assert await incoming_sent(lobby, ctl, two) == [message, batch[1]]
            ctl.send({"cmd": "incoming_batch", "messages": batch, "force": True})
            assert await incoming_sent(lobby, ctl, two) == batch
            # The host advertised no coalescing on this lane: no outcome is no problem.
            assert await fences.problems() == []
            assert await lobby.close_stdin_and_wait() == 0


async def test_push_response_carries_the_coalesce_result() -> None:
    with trio.fail_after(TIMEOUT):
        async with coalescing_lobby(True) as (lobby, ctl):
            fences = Fences(lobby, ctl)
            results = {
                "c1": {"accepted": True, "coalesce": {"outcome": "replaced", "priorEventId": "c0"}},
                "c2": {"accepted": True, "coalesce": {"outcome": "first"}},
                "c3": {"accepted": False, "reason": "feature_set_disabled"},
            }
            for event_id, result in results.items():
                ctl.send({"cmd": "push", "eventId": event_id, "text": "x", "coalesce": PLAIN_KEY})
                await pushed(lobby, ctl, event_id, result)
                event = await ctl.wait_for(
                    is_response_to("push/event", "eventId", event_id), event_id
                )
                assert event["response"]["result"] == result
                assert event["request"]["params"]["coalesce"] == PLAIN_KEY
            assert await fences.problems() == []
            for event_id, result in (
                ("c4", {"accepted": True}),
                ("c5", {"accepted": True, "coalesce": {"outcome": "merged"}}),
                ("c6", {"accepted": True, "coalesce": {"outcome": "first", "priorEventId": 3}}),
            ):
                ctl.send({"cmd": "push", "eventId": event_id, "text": "x", "coalesce": PLAIN_KEY})
                await pushed(lobby, ctl, event_id, result)  # its answer checked
            problems = await fences.problems()
            assert len(problems) == 3
            assert (
                "push/event c4: admitted with coalesce, but the answer has no outcome"
                in problems[0]
            )
            assert "push/event c5: malformed coalesce result" in problems[1]
            assert "push/event c6: malformed coalesce result" in problems[2]
            assert await lobby.close_stdin_and_wait() == 0
            stderr = lobby.stderr_text()
            assert "push/event c1: accepted (coalesce replaced, prior c0)" in stderr
            assert "push/event c2: accepted (coalesce first)" in stderr


# ---- websockets -------------------------------------------------------------------------------


@asynccontextmanager
async def ws_lobby(*args: str) -> AsyncIterator[str]:
    async with lobby_process("--ws", "127.0.0.1:0", "--script", "none", *args) as lobby:
        line = await lobby.read_line()
        assert line is not None and line.startswith("LISTENING ws://127.0.0.1:"), line
        yield line.removeprefix("LISTENING ")


@asynccontextmanager
async def ws_peer(url: str, token: str | None = None) -> AsyncIterator[WsPeer]:
    headers = [(b"Authorization", f"Bearer {token}".encode())] if token else None
    async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:
        yield WsPeer(ws)


async def test_websocket_sessions_are_independent() -> None:
    with trio.fail_after(TIMEOUT):
        async with ws_lobby() as url, ws_peer(url) as one, ws_peer(url) as two:
            await one.handshake()
            await two.handshake()
            params = {"channelId": "lobby:#general", "content": [{"type": "text", "text": "hi"}]}
            reply = await one.request("channels/publish", params)
            assert reply["result"] == {"delivered": True, "messageId": "out-1"}
            echo = await one.server_request("channels/incoming")
            assert echo["params"]["messages"][0]["messageId"] == "out-1"
            # The second session has its own counters.
            reply = await two.request("channels/publish", params)
            assert reply["result"]["messageId"] == "out-1"
            forecast = await two.request(
                "tools/call", {"name": "forecast", "arguments": {"city": "Oslo"}}
            )
            assert forecast["result"]["content"][0]["text"] == "Forecast for Oslo: sunny, 21°C"
            for frame in one.frames + two.frames:
                assert not frame.endswith("\n")
                json.loads(frame)


async def _rejected_status(url: str, token: str | None) -> int:
    try:
        async with ws_peer(url, token):
            pass
    except trio_websocket.ConnectionRejected as exc:
        return exc.status_code
    except BaseExceptionGroup as group:
        matched, _ = group.split(trio_websocket.ConnectionRejected)
        assert matched is not None, group
        return matched.exceptions[0].status_code  # type: ignore[union-attr]
    pytest.fail("the connection was accepted")


async def test_websocket_bearer_token() -> None:
    with trio.fail_after(TIMEOUT):
        async with ws_lobby("--token", "s3cret") as url:
            assert await _rejected_status(url, None) == 401
            assert await _rejected_status(url, "wrong") == 401
            async with ws_peer(url, "s3cret") as peer:
                init = await peer.handshake()
                assert init["serverInfo"]["name"] == "lobby"


async def test_serve_ws_in_process() -> None:
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_ws, "127.0.0.1", 0, LobbyOptions(script="none"))
            async with ws_peer(f"ws://127.0.0.1:{port}") as peer:
                await peer.handshake()
                roll = await peer.request("tools/call", {"name": "roll", "arguments": {"sides": 1}})
                assert roll["result"]["content"][0]["text"] == "1"
            nursery.cancel_scope.cancel()
