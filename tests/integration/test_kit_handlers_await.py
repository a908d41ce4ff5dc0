"""No handler of a toolkit server deadlocks by awaiting a toolkit call.

For each kind of handler, a server (``tests.awaiting_server``) whose handler of that kind awaits
every call of the toolkit in turn runs under the real host, joined by the toolkit's memory
transport; the test makes the host run the handler. Every timeout of the host and of the server
is an hour, so a call that waits on something only its own handler's answer would release is
caught by the test's deadline rather than freed by a timeout. Real clock (the store writes in a
thread), a generous deadline, order-only assertions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import actors.channel.coalescer
from actors import Host
from protocol.errors import INVALID_REQUEST, RpcError
from tests.awaiting_server import CALLS, KINDS, ROOM, SERVER_ID, AwaitingServer, transports
from tests.helpers import config, scripted

pytestmark = pytest.mark.slow

HOUR = 3600.0
POST = "hello from Ada"
RULES = """
[[rules]]
when = "note (\\\\w+)"
calls = [{ tool = "aw--note", arguments = { text = "{1}" } }]
"""
ASSIST = '[[rules]]\nwhen = "2\\\\+2"\nsay = "The answer is four."\n'


def text_of(result: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in result["content"])


async def make_it_run(kind: str, host: Host, server: AwaitingServer) -> None:
    """Make the host run the server's handler of ``kind``; check what the host got back."""
    if kind == "publish":
        args = {"channel_id": ROOM, "content": POST}
        result = await host.execute_tool_call("Ada", "channel_publish", args)
        assert "delivered as" in text_of(result), result
    elif kind in ("open", "close"):
        result = await host.execute_tool_call("Ada", f"channel_{kind}", {"channel_id": ROOM})
        assert not result["is_error"] and "did not confirm" not in text_of(result), result
    elif kind == "tool":
        result = await host.execute_tool_call("Ada", f"{SERVER_ID}--work", {})
        assert text_of(result) == "worked", result
    elif kind in ("before_inference", "lifecycle"):
        await host.post_local("Ada", "hello")
    elif kind == "rollback":
        for word in ("one", "two"):
            await host.post_local("Ada", f"note {word}")
            await host.run_until_idle()
        noted = [
            m
            for m in host.history("Ada")
            if m["role"] == "tool" and m["metadata"].get("checkpoints")
        ]
        report = await host.rollback("Ada", to=noted[0]["id"])
        assert [s.get("success") for s in report["state"]] == [True], report
    elif kind == "render":
        coalesce = {"key": "tally", "deferred": True, "initial": True, "data": {"n": 1}}
        await server.kit.granted("pushEvents")
        await server.kit.push_event("tally fallback", coalesce=coalesce)
    # ``granted`` and ``ready`` run on the connection's first grant


@pytest.mark.parametrize("kind", KINDS)
async def test_a_handler_that_awaits_every_toolkit_call_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(actors.channel.coalescer, "RENDER_TIMEOUT_S", HOUR)
    server = AwaitingServer(kind)
    entry = {"id": SERVER_ID, "command": ["in-process"]}
    entry.update(request_timeout_s=HOUR, hook_timeout_s=HOUR)
    cfg = config(tmp_path, [entry], [{"name": "Ada", "model": scripted(tmp_path, "ada", RULES)}])
    cfg["host"]["inference_model"] = scripted(tmp_path, "assist", ASSIST)
    with trio.move_on_after(60) as deadline:
        async with trio.open_nursery() as nursery:
            monkeypatch.setattr(
                "actors.link.connection.open_transport", transports(nursery, server.kit)
            )
            async with Host.open(cfg) as host:
                await server.kit.granted("channels.incoming")
                await server.kit.registered.wait()  # this connection's registration answered
                await make_it_run(kind, host, server)
                await server.finished.wait()
                await host.run_until_idle()
            nursery.cancel_scope.cancel()
    assert not deadline.cancelled_caught, f"stuck in the {kind} handler after {server.done}"
    assert server.done == list(CALLS)
    results = server.results
    refused = {n: r for n, r in results.items() if isinstance(r, Exception)}
    if kind in ("before_inference", "render"):  # no inference while a hook awaits the server
        infer = refused.pop("infer", None)
        assert isinstance(infer, RpcError) and infer.code == INVALID_REQUEST, infer
    assert refused == {}, refused
    if kind not in ("before_inference", "render"):
        assert results["infer"].content == "The answer is four."
    assert results["send"]["accepted"] is True
    assert results["push_event"].accepted
    assert isinstance(results["model_info"]["id"], str)
    assert results["manifest_changed"] is True
