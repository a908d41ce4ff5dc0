"""A small stdio MCPL server that gets things wrong on purpose, for the tests of what the host
shows of a server's failures: ``python -m tests.faulty_server [--exit-code N]``.

Its manifest advertises ``pushEvents`` and ``channels.register``/``channels.incoming``, and
declares two feature sets: ``faulty.events`` (``uses: [pushEvents]``, sound) and
``faulty.ghost``, which also uses ``channels.publish``, a capability it never advertised (a
declaration mismatch). Once the host's ``featureSets/update`` is answered it registers
``faulty:#room`` and sends, waiting for each answer:

1. ``push/event`` for the undeclared feature set ``faulty.nope`` (refused: -32003);
2. ``push/event`` for ``faulty.ghost``, which the host cannot enable (refused: -32001);
3. ``push/event`` without an ``eventId`` (refused: -32602);
4. ``channels/incoming`` with ``r1`` for ``faulty:#room`` (accepted) and ``x1`` for a channel
   it never registered (refused item: ``unknown_channel``).

Then it writes a line to stderr and exits with ``--exit-code`` (default 3). Every line it
receives is ignored except the answers it waits for; it uses only the standard library (its
wire is ``tests.stdio_wire``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tests.stdio_wire import receive as receive_or_none
from tests.stdio_wire import send

MANIFEST = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True},
    "featureSets": {
        "faulty.events": {"description": "sound", "uses": ["pushEvents"]},
        "faulty.ghost": {
            "description": "uses what it never advertised",
            "uses": ["pushEvents", "channels.publish"],
        },
    },
}
ROOM = "faulty:#room"


def receive() -> dict[str, Any]:
    message = receive_or_none()
    if message is None:
        log("the host closed stdin")
        sys.exit(0)
    return message


def log(text: str) -> None:
    print(f"[faulty] {text}", file=sys.stderr, flush=True)


def answer_of(rid: int) -> dict[str, Any]:
    """Wait for the answer to our request ``rid``, answering the host's requests meanwhile."""
    while True:
        message = receive()
        if message.get("id") == rid and "method" not in message:
            return message
        if "method" in message and "id" in message:
            send({"id": message["id"], "result": {}})


def handshake() -> None:
    init = receive()
    assert init.get("method") == "initialize", init
    capabilities = {"experimental": {"mcpl": MANIFEST}}
    info = {"name": "faulty", "version": "1"}
    result = {"protocolVersion": "2024-11-05", "capabilities": capabilities, "serverInfo": info}
    send({"id": init["id"], "result": result})
    while True:
        message = receive()
        if message.get("method") == "featureSets/update" and "id" in message:
            send({"id": message["id"], "result": {"accepted": True}})
            return


def push(rid: int, params: dict[str, Any]) -> dict[str, Any]:
    send({"id": rid, "method": "push/event", "params": params})
    return answer_of(rid)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faulty_server")
    parser.add_argument("--exit-code", type=int, default=3)
    args = parser.parse_args()
    handshake()
    room = {"id": ROOM, "type": "chat", "label": "room", "direction": "bidirectional"}
    send({"id": 1, "method": "channels/register", "params": {"channels": [room]}})
    answer_of(1)
    content = {"content": [{"type": "text", "text": "tick"}]}
    now = "2026-01-01T00:00:00.000Z"
    event = {"timestamp": now, "payload": content}
    push(2, {"featureSet": "faulty.nope", "eventId": "n1", **event})
    push(3, {"featureSet": "faulty.ghost", "eventId": "g1", **event})
    push(4, {"featureSet": "faulty.events", **event})
    author = {"id": "u1", "name": "Uma"}
    base = {"author": author, "timestamp": now, **content}
    messages = [
        {"channelId": ROOM, "messageId": "r1", **base},
        {"channelId": "faulty:#nowhere", "messageId": "x1", **base},
    ]
    send({"id": 5, "method": "channels/incoming", "params": {"messages": messages}})
    answer_of(5)
    log(f"all answers in; exiting with code {args.exit_code}")
    return int(args.exit_code)


if __name__ == "__main__":
    sys.exit(main())
