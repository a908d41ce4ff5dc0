"""A stdio MCPL server whose feature set omits a use it exercises, as servers written against an
older draft do: ``python -m tests.omitted_use_server [--record PATH]``.

Its manifest advertises ``pushEvents`` and ``channels.register``/``incoming``/``publish`` and
declares two feature sets:

- ``omit.chat`` (``uses``: the three channel capabilities, but not ``pushEvents``), the set it
  names in every call, pushes included;
- ``omit.legacy`` (``uses``: ``pushEvents`` and the 0.4-era ``contextHooks.beforeInference``,
  which is no longer an MCPL capability), a set no 0.5 host can enable.

Once the host's ``featureSets/update`` is answered it registers ``omit:#general`` (publish
target ``root``), then sends, waiting for each answer:

1. two ``push/event`` naming ``omit.chat`` (``e1``, ``e2``): refused with -32002, since the set's
   ``uses`` lacks ``pushEvents``;
2. ``channels/incoming`` with ``m1`` ("hello") from Uma in ``omit:#general``.

Then it answers the host until stdin ends: ``channels/publish`` with a fresh message id, ``ping``
with ``{}``, anything else with -32601.

With ``--record PATH`` it appends one JSON object per line to PATH for what a test checks:
``{"update": params}`` for each ``featureSets/update``, ``{"answer": method, "id": ...,
"reply": the host's whole answer}`` for each request it made, ``{"publish": params}`` for each
``channels/publish``. Standard library only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

from tests.stdio_wire import receive, send

CHANNEL = "omit:#general"
CHAT_SET = "omit.chat"
LEGACY_SET = "omit.legacy"
MANIFEST = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "incoming": True, "publish": True},
    "featureSets": {
        CHAT_SET: {
            "description": "the general channel, and pushes into it",
            "uses": ["channels.register", "channels.incoming", "channels.publish"],
        },
        LEGACY_SET: {
            "description": "a 0.4-era context hook",
            "uses": ["pushEvents", "contextHooks.beforeInference"],
        },
    },
}
NOW = "2026-01-01T00:00:00.000Z"


class Server:
    def __init__(self, record: str | None) -> None:
        self.record_path = record
        self.published = itertools.count(1)

    # -- the wire -------------------------------------------------------------------------------
    send = staticmethod(send)
    receive = staticmethod(receive)

    @staticmethod
    def log(text: str) -> None:
        print(f"[omit] {text}", file=sys.stderr, flush=True)

    def record(self, entry: dict[str, Any]) -> None:
        if self.record_path is not None:
            with open(self.record_path, "a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")

    # -- what the host sends --------------------------------------------------------------------
    def handle(self, message: dict[str, Any]) -> None:
        """Answer one request of the host (a notification needs no answer)."""
        method, rid = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method == "featureSets/update":
            self.record({"update": params})
        if rid is None:
            return
        if method == "featureSets/update":
            self.send({"id": rid, "result": {"accepted": True}})
        elif method == "channels/publish":
            self.record({"publish": params})
            self.send({"id": rid, "result": {"delivered": True, "messageId": self.next_id()}})
        elif method == "ping":
            self.send({"id": rid, "result": {}})
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            self.send({"id": rid, "error": error})

    def next_id(self) -> str:
        return f"omit-pub-{next(self.published)}"

    def request(self, rid: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send a request and wait for its answer, answering the host meanwhile."""
        self.send({"id": rid, "method": method, "params": params})
        while (message := self.receive()) is not None:
            if message.get("id") == rid and "method" not in message:
                self.record({"answer": method, "id": rid, "reply": message})
                return message
            self.handle(message)
        self.log("the host closed stdin while a request was pending")
        sys.exit(0)

    # -- the exchange ---------------------------------------------------------------------------
    def handshake(self) -> None:
        init = self.receive()
        assert init is not None and init.get("method") == "initialize", init
        result = {
            "protocolVersion": "2024-11-05",
            "capabilities": {"experimental": {"mcpl": MANIFEST}},
            "serverInfo": {"name": "omitted-use", "version": "1"},
        }
        self.send({"id": init["id"], "result": result})
        while (message := self.receive()) is not None:
            self.handle(message)
            if message.get("method") == "featureSets/update":
                return
        sys.exit(0)

    def run(self) -> None:
        self.handshake()
        room = {
            "id": CHANNEL,
            "type": "chat",
            "label": "#general",
            "direction": "bidirectional",
            "capabilities": {"publish": {"target": "root"}},
        }
        self.request(1, "channels/register", {"channels": [room]})
        for rid, event_id in ((2, "e1"), (3, "e2")):
            reply = self.request(
                rid,
                "push/event",
                {
                    "featureSet": CHAT_SET,
                    "eventId": event_id,
                    "timestamp": NOW,
                    "origin": {"mcplChannelId": CHANNEL},
                    "payload": {"content": [{"type": "text", "text": f"tick {event_id}"}]},
                },
            )
            self.log(f"push {event_id} answered: {json.dumps(reply.get('error') or reply)}")
        hello = {
            "channelId": CHANNEL,
            "messageId": "m1",
            "author": {"id": "u1", "name": "Uma"},
            "timestamp": NOW,
            "content": [{"type": "text", "text": "hello"}],
        }
        self.request(4, "channels/incoming", {"messages": [hello]})
        while (message := self.receive()) is not None:
            self.handle(message)
        self.log("the host closed stdin")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.omitted_use_server")
    parser.add_argument("--record", help="append what the host sent and answered to this file")
    args = parser.parse_args()
    Server(args.record).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
