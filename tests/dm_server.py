"""A small stdio MCPL server that announces a direct-message channel and uses it in the same
write, as a chat connector does when a new user writes first: ``python -m tests.dm_server``.

Its manifest (0.5) advertises ``pushEvents`` and ``channels.register``/``publish``/``incoming``
in one feature set, ``dm.chat``, and MCP tools. It registers no channel at the start. The host
cues it with a tool call:

- ``cue {"what": "push"}``: one write holding a ``channels/changed`` notification that adds
  ``dm:d1`` (``@d1``) and a ``push/event`` whose ``origin.mcplChannelId`` is ``dm:d1``;
- ``cue {"what": "dm"}``: one write holding a ``channels/changed`` notification that adds
  ``dm:d2`` (``@d2``) and a ``channels/incoming`` message in ``dm:d2``;
- ``cue {"what": "register"}``: one write holding a ``channels/register`` request for ``dm:d3``
  (``@d3``) and a ``push/event`` naming it.

The tool call is answered once the host has answered the push or the message: its text is the
host's whole answer, as JSON. ``published {}`` answers with the params of every
``channels/publish`` received so far (a JSON list). Each channel declares where a post lands
(``capabilities.publish.target``), so the host's plain replies go there. It uses only the
standard library and ends at EOF on stdin.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from typing import Any

FEATURE_SET = "dm.chat"
USES = ["channels.register", "channels.publish", "channels.incoming", "pushEvents"]
MANIFEST = {
    "version": "0.5",
    "pushEvents": True,
    "channels": {"register": True, "publish": True, "incoming": True},
    "featureSets": {FEATURE_SET: {"description": "direct messages", "uses": USES}},
}
TOOLS = [
    {
        "name": "cue",
        "description": "announce a DM channel and use it in the same write",
        "inputSchema": {"type": "object", "properties": {"what": {"type": "string"}}},
    },
    {
        "name": "published",
        "description": "what the host published so far",
        "inputSchema": {"type": "object", "properties": {}},
    },
]
AUTHOR = {"id": "d1", "name": "dee"}
TIMESTAMP = "2026-01-01T00:00:00.000Z"


def line(message: dict[str, Any]) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode()


def write(*messages: dict[str, Any]) -> None:
    """Every message in one ``os.write``: the host reads them back to back."""
    data = b"".join(line(m) for m in messages)
    while data:
        data = data[os.write(1, data) :]


def dm_channel(user: str) -> dict[str, Any]:
    return {
        "id": f"dm:{user}",
        "type": "dm",
        "label": f"@{user}",
        "direction": "bidirectional",
        "capabilities": {"publish": {"target": "root"}},
    }


def content(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


class Server:
    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.published: list[dict[str, Any]] = []
        self.cues: dict[Any, Any] = {}  # our request id -> the tool call waiting for its answer

    def cue(self, call_id: Any, what: str) -> None:
        rid = f"cue-{next(self.ids)}"
        self.cues[rid] = call_id
        if what in ("push", "register"):
            user = "d1" if what == "push" else "d3"
            if what == "push":
                params = {"added": [dm_channel(user)]}
                change: dict[str, Any] = {"method": "channels/changed", "params": params}
            else:
                params = {"channels": [dm_channel(user)]}
                change = {"id": f"reg-{rid}", "method": "channels/register", "params": params}
            push = {
                "id": rid,
                "method": "push/event",
                "params": {
                    "featureSet": FEATURE_SET,
                    "eventId": f"e-{rid}",
                    "timestamp": TIMESTAMP,
                    "origin": {"mcplChannelId": f"dm:{user}"},
                    "payload": {"content": content(f"hello from a push in dm:{user}")},
                },
            }
            write(change, push)
        else:
            changed = {"method": "channels/changed", "params": {"added": [dm_channel("d2")]}}
            message = {
                "channelId": "dm:d2",
                "messageId": f"m-{rid}",
                "author": {"id": "d2", "name": "dee"},
                "timestamp": TIMESTAMP,
                "content": content("hello, first message from a new user"),
            }
            incoming = {"id": rid, "method": "channels/incoming", "params": {"messages": [message]}}
            write(changed, incoming)

    def answer(self, message: dict[str, Any]) -> None:
        method, rid = message["method"], message["id"]
        params = message.get("params") or {}
        result: Any = {}
        if method == "initialize":
            result = {
                "protocolVersion": "2024-11-05",
                "capabilities": {"tools": {}, "experimental": {"mcpl": MANIFEST}},
                "serverInfo": {"name": "dm-test", "version": "0"},
            }
        elif method == "featureSets/update":
            result = {"accepted": True}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call" and params.get("name") == "cue":
            self.cue(rid, str((params.get("arguments") or {}).get("what")))
            return  # answered with the host's answer to what the cue sent
        elif method == "tools/call" and params.get("name") == "published":
            result = {"content": content(json.dumps(self.published))}
        elif method == "channels/publish":
            self.published.append(params)
            result = {"delivered": True, "messageId": f"pub-{len(self.published)}"}
        elif method != "ping":
            write({"id": rid, "error": {"code": -32601, "message": f"no {method}"}})
            return
        write({"id": rid, "result": result})

    def run(self) -> int:
        while raw := sys.stdin.readline():
            message = json.loads(raw)
            if "method" in message and "id" in message:
                self.answer(message)
            elif "method" not in message and message.get("id") in self.cues:
                call_id = self.cues.pop(message["id"])
                answer = {"content": content(json.dumps(message)), "isError": False}
                write({"id": call_id, "result": answer})
        return 0


if __name__ == "__main__":
    sys.exit(Server().run())
