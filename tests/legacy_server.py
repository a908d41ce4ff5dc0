"""A small stdio MCPL server in the style of the 0.4-era servers in use today, and a sample of
what such a server does: ``python -m tests.legacy_server --record FILE [options]``.

* Its manifest says ``version: "0.4"``, ``channels: true`` and declares its feature set in the
  0.4 **array** form (``[{name, description, uses}]``).
* Once the host's ``featureSets/update`` is answered, it registers its channels (``#general``,
  ``#dev``) with no ``capabilities.publish.target``: it makes no promise about where a post
  lands, as no server of that era does.
* Then it sends one ``channels/incoming`` message from a user (author ``{id, name}``) to
  ``#general``, saying ``--say`` (default ``hello, is anyone there?``).
* It records every ``channels/publish`` it receives, request or notification, as one JSON line
  ``{"form": "request"|"notification", "params": {...}}`` in ``--record`` (written before it
  answers), and answers the request form with ``{delivered: true, messageId}``, or with
  ``--refuse REASON`` with ``{delivered: false, reason}`` (nothing posted). With
  ``--notifications-only`` it takes only the notification form, as the oldest servers do: a
  request gets -32601 and is not recorded.
* It answers ``channels/list`` with its channels and ``ping``; anything else it is asked gets
  -32601 (method not found), as a server that knows only these would answer.

It uses only the standard library (its wire is ``tests.stdio_wire``): one JSON-RPC message per line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from tests.stdio_wire import send

FEATURE_SET = "legacy.chat"
MANIFEST = {
    "version": "0.4",
    "channels": True,
    "featureSets": [
        {
            "name": FEATURE_SET,
            "description": "Chat rooms.",
            "uses": ["channels.register", "channels.publish", "channels.incoming"],
        }
    ],
}
#: No ``capabilities``: where a post lands is the server's business.
CHANNELS = [
    {"id": "legacy:#general", "type": "chat", "label": "#general", "direction": "bidirectional"},
    {"id": "legacy:#dev", "type": "chat", "label": "#dev", "direction": "bidirectional"},
]
USER = {"id": "u1", "name": "Uma"}
METHOD_NOT_FOUND = -32601


class Legacy:
    def __init__(
        self,
        record: Path,
        say: str,
        refuse: str | None,
        notifications_only: bool,
        no_list: bool = False,
    ) -> None:
        self.record = record
        self.say = say
        self.refuse = refuse
        self.notifications_only = notifications_only
        self.no_list = no_list  # a server that registers by request and lists nothing
        self.ids = itertools.count(1)
        self.posts = itertools.count(1)
        self.register = -1  # the id of our channels/register, once sent

    # -- the wire ----------------------------------------------------------------------------
    send = staticmethod(send)

    def request(self, method: str, params: dict[str, Any]) -> int:
        rid = next(self.ids)
        self.send({"id": rid, "method": method, "params": params})
        return rid

    def log(self, text: str) -> None:
        print(f"[legacy] {text}", file=sys.stderr, flush=True)

    # -- what the host sends ---------------------------------------------------------------------
    def answer(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The result of the host's request ``method``, or ``{"error": …}``."""
        if method == "initialize":
            return {
                "result": {
                    "protocolVersion": "2024-11-05",
                    "capabilities": {"experimental": {"mcpl": MANIFEST}},
                    "serverInfo": {"name": "legacy-chat", "version": "0.4.2"},
                }
            }
        if method == "featureSets/update":
            return {"result": {"accepted": True}}
        if method == "ping":
            return {"result": {}}
        if method == "channels/list" and not self.no_list:
            return {"result": {"channels": CHANNELS}}
        if method == "channels/publish" and not self.notifications_only:
            self.keep("request", params)
            if self.refuse is not None:
                return {"result": {"delivered": False, "reason": self.refuse}}
            return {"result": {"delivered": True, "messageId": f"post-{next(self.posts)}"}}
        return {"error": {"code": METHOD_NOT_FOUND, "message": f"Method not found: {method}"}}

    def keep(self, form: str, params: dict[str, Any]) -> None:
        with self.record.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"form": form, "params": params}) + "\n")
        self.log(f"publish ({form}) to {params.get('channelId')}")

    def after(self, method: str) -> None:
        """What the server does once it has answered ``method``: after the policy, register
        the channels; the answer to that comes back through :meth:`on_result`."""
        if method == "featureSets/update":
            self.register = self.request("channels/register", {"channels": CHANNELS})

    def on_result(self, rid: Any) -> None:
        if rid == self.register:
            message = {
                "channelId": CHANNELS[0]["id"],
                "messageId": "in-1",
                "author": USER,
                "timestamp": "2026-01-01T00:00:00Z",
                "content": [{"type": "text", "text": self.say}],
            }
            self.request("channels/incoming", {"messages": [message]})

    def run(self) -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            message = json.loads(line)
            method = message.get("method")
            if method is None:
                self.on_result(message.get("id"))
            elif "id" in message:
                self.send({"id": message["id"], **self.answer(method, message.get("params") or {})})
                self.after(method)
            elif method == "channels/publish":
                self.keep("notification", message.get("params") or {})
        self.log("the host closed stdin")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.legacy_server")
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--say", default="hello, is anyone there?")
    parser.add_argument("--refuse", default=None, metavar="REASON")
    parser.add_argument("--notifications-only", action="store_true")
    parser.add_argument("--no-list", action="store_true", help="answer channels/list -32601")
    args = parser.parse_args()
    Legacy(args.record, args.say, args.refuse, args.notifications_only, args.no_list).run()


if __name__ == "__main__":
    main()
