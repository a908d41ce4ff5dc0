"""A server's deeply nested values never reach the store, and a stored record that does not decode
is skipped with one report instead of stopping an agent or ``mcplive history``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.depth import MAX_DEPTH, depth
from store import Reader, db_path, encode_body
from tests.cli_helpers import mcplive
from tests.helpers import (
    answered,
    publish_received,
    running_lobby,
    send_incoming,
    wait_trace,
)

pytestmark = pytest.mark.slow

PING = '[[rules]]\nwhen = "ping"\nsay = "pong"\n'


def nested(levels: int) -> dict[str, Any]:
    """An object ``levels`` deep."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"x": value}
    return value


def deepest_push(levels: int) -> str:
    """A push request (id 9001) whose ``origin`` is ``levels`` deep, as JSON text."""
    head = (
        '{"jsonrpc":"2.0","id":9001,"method":"push/event","params":{"featureSet":"lobby.events",'
        '"eventId":"deepest","timestamp":"2026-01-01T00:00:00Z",'
        '"payload":{"content":[{"type":"text","text":"deep"}]},"origin":'
    )
    return head + '{"x":' * (levels - 1) + "{}" + "}" * (levels - 1) + "}}"


def answer_to(rid: int) -> Any:
    """Control-event predicate: the host's answer to our raw request ``rid`` (or an error
    answer with a null id: one the host could not read the id of)."""
    return lambda e: (
        e["event"] == "received"
        and "method" not in e["message"]
        and e["message"].get("id", "") in (rid, None)
    )


def parse_error(event: dict[str, Any]) -> bool:
    message = event["message"]
    return event["event"] == "received" and message.get("error", {}).get("code") == -32700


async def test_a_deep_origin_is_refused_and_the_agent_keeps_answering(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with running_lobby(tmp_path, {"Ada": PING}) as lb:
            ctl = lb.ctl
            ctl.send({"cmd": "push", "eventId": "deep", "text": "deep", "origin": nested(500)})
            answer = await ctl.wait_for(answered("push/event", "eventId", "deep"), "deep push")
            error = answer["response"]["error"]
            assert error["code"] == -32602
            assert error["data"] == {
                "member": "origin",
                "reason": f"nested deeper than {MAX_DEPTH}",
            }
            # as deep as the parser may follow (written as text: no encoder here goes that deep)
            ctl.send({"cmd": "line", "text": deepest_push(985)})
            near = await ctl.wait_for(answer_to(9001), "answer to the deepest push")
            assert near["message"].get("error", {}).get("code") in (-32602, -32700), near
            # JSON nested past what the parser follows is answered as a parse error
            mark = ctl.mark()
            ctl.send({"cmd": "line", "text": "[" * 100_000 + "]" * 100_000})
            refused = await ctl.wait_for(parse_error, "parse error answer", since=mark)
            assert refused["message"]["id"] is None
            send_incoming(ctl, "lobby:#general", "p1", "ping")
            await ctl.wait_for(publish_received("pong"), "pong")
            await lb.host.run_until_idle()
        async with running_lobby(tmp_path, {"Ada": PING}) as lb:  # the same data dir again
            send_incoming(lb.ctl, "lobby:#general", "p2", "ping")
            await lb.ctl.wait_for(publish_received("pong"), "pong after a restart")
            await lb.host.run_until_idle()
    with Reader(db_path(tmp_path / "data"), read_only=True) as reader:
        stored = reader.history()
        assert reader.take_skipped() == []
    assert stored
    assert all(depth(m) <= MAX_DEPTH + 8 for m in stored)
    assert "deep" not in {m["metadata"].get("occurrence") for m in stored}


def damage(data_dir: Path) -> None:
    """Store for Ada, as an older host could have, a record the codec refuses (500 deep) and a
    record that is not CBOR at all."""
    deep = encode_body([{"type": "text", "text": "too deep"}], {"adapter_origin": nested(500)})
    conn = sqlite3.connect(db_path(data_dir))
    rows = [("old-deep", deep), ("old-garbage", b"\xff\x00")]
    for message_id, body in rows:
        conn.execute(
            "INSERT INTO messages (id, agent, role, created_at, body) "
            "VALUES (?, 'Ada', 'user', 1.0, ?)",
            (message_id, body),
        )
    conn.commit()
    conn.close()


async def test_a_corrupt_record_is_skipped_by_turns_and_history(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(120):
        async with running_lobby(tmp_path, {"Ada": PING}) as lb:
            send_incoming(lb.ctl, "lobby:#general", "p1", "ping")
            await lb.ctl.wait_for(publish_received("pong"), "pong")
            await lb.host.run_until_idle()
        damage(data)
        async with running_lobby(tmp_path, {"Ada": PING}) as lb:
            send_incoming(lb.ctl, "lobby:#general", "p2", "ping")
            await lb.ctl.wait_for(publish_received("pong"), "pong beside corrupt records")
            skipped = await wait_trace(
                lb.stream, lambda e: e.kind == "record-skipped", "record-skipped"
            )
            assert skipped.data["what"] == "message"
            assert skipped.data["key"] in {"old-deep", "old-garbage"}
            ids = [m["id"] for m in lb.host.history("Ada")]
            assert "old-deep" not in ids and "old-garbage" not in ids
            await lb.host.run_until_idle()
    result = mcplive("history", "--data-dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    errors = result.stderr.splitlines()
    assert len(errors) == 2
    assert all(line.startswith("mcplive: history: skipped stored message") for line in errors)
    assert "'old-deep'" in result.stderr and "'old-garbage'" in result.stderr
    assert result.stdout.count(" ping") == 2 and result.stdout.count("pong") >= 2
