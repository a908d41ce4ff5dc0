"""A stdio MCPL server whose text holds lone surrogates, for the tests of what the host makes of
them: ``python -m tests.surrogate_server``.

Every string below that holds ``\\ud800`` (or ``\\udfff``) is written as that JSON escape, which
decodes to a lone surrogate: a code point no UTF-8 text can hold. Once the host's
``featureSets/update`` is answered it registers ``odd:#room`` and sends, waiting for each answer:

1. ``push/event`` for ``odd.events`` whose text and ``eventId`` hold a lone surrogate;
2. ``channels/incoming`` with one message whose text and author name hold one, and a second
   whose text holds a valid pair written as escapes (``\\ud83d\\ude00``, one emoji);
3. a notification whose method name holds one.

Then it writes a line to stderr and waits for stdin to close. It uses only the standard library
(its wire is ``tests.stdio_wire``).
"""

from __future__ import annotations

import sys
from typing import Any

from tests.stdio_wire import receive, send

MANIFEST = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True},
    "featureSets": {"odd.events": {"description": "odd text", "uses": ["pushEvents"]}},
}
ROOM = "odd:#room"
LONE = "\ud800"


def answer_of(rid: int) -> dict[str, Any]:
    """Wait for the answer to our request ``rid``, answering the host's requests meanwhile."""
    while (message := receive()) is not None:
        if message.get("id") == rid and "method" not in message:
            return message
        if "method" in message and "id" in message:
            send({"id": message["id"], "result": {}})
    sys.exit(0)


def handshake() -> None:
    init = receive()
    assert init is not None and init.get("method") == "initialize", init
    capabilities = {"experimental": {"mcpl": MANIFEST}}
    info = {"name": "odd", "version": "1"}
    result = {"protocolVersion": "2024-11-05", "capabilities": capabilities, "serverInfo": info}
    send({"id": init["id"], "result": result})
    while (message := receive()) is not None:
        if message.get("method") == "featureSets/update" and "id" in message:
            send({"id": message["id"], "result": {"accepted": True}})
            return
    sys.exit(0)


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


def main() -> int:
    handshake()
    room = {"id": ROOM, "type": "chat", "label": "room", "direction": "bidirectional"}
    send({"id": 1, "method": "channels/register", "params": {"channels": [room]}})
    answer_of(1)
    now = "2026-01-01T00:00:00.000Z"
    push = {"featureSet": "odd.events", "eventId": f"e{LONE}1", "timestamp": now}
    send({"id": 2, "method": "push/event", "params": {**push, "payload": text(f"bell {LONE}!")}})
    answer_of(2)
    author = {"id": "u1", "name": f"Uma{LONE}"}
    messages = [
        {
            "channelId": ROOM,
            "messageId": "m1",
            "author": author,
            "timestamp": now,
            **text(f"hello \udfff{LONE} world"),
        },
        {
            "channelId": ROOM,
            "messageId": "m2",
            "author": author,
            "timestamp": now,
            **text("pair \ud83d\ude00 kept"),
        },
    ]
    send({"id": 3, "method": "channels/incoming", "params": {"messages": messages}})
    answer_of(3)
    send({"method": f"odd/{LONE}", "params": {"note": LONE}})
    print("[odd] all sent", file=sys.stderr, flush=True)
    while receive() is not None:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
