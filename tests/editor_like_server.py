"""A stdio MCPL server that registers its channel right after answering ``initialize`` and reads
nothing else until that request is answered, as the public mcpl-editor does:
``python -m tests.editor_like_server [--greet] [--early-pings N] [--silent-launches N
--launches PATH]``.

1. It answers ``initialize`` as mcpl-editor does (channels ``register``/``observe``/``publish``,
   ``observe`` being the 0.4 name of ``incoming``, in one feature set, ``editor.notes``; a set
   ``editor.observe`` using ``stateUpdate``, which MCPL never had; and MCP tools), then at
   once sends ``channels/register`` for
   ``editor:#notes``.
2. Until that request is answered it serves nothing: what the host sends meanwhile
   (``notifications/initialized``, ``featureSets/update``) is only kept. An error answer ends it
   (exit 1), as the editor's serve loop dies on one.
3. Then it serves what it kept and what follows: ``featureSets/update`` (accepted),
   ``tools/list``, ``tools/call``, ``ping`` and ``channels/publish`` (logged to stderr as
   ``published: <text>``). Its tool ``open_file`` answers ``opened <path>`` and then sends a chat
   message in its channel (``channels/incoming``, from Uma: ``please review <path>``); its tool
   ``quit`` answers and exits.

Options, each for one test:

- With ``--greet`` it sends a chat message (``hello``, from Uma) as soon as its register is
  accepted, and waits for its answer too (logging ``greeting answered: …``) before it serves
  anything else: the host's ``featureSets/update`` is still unanswered then.
- With ``--early-pings N`` it sends N ``ping`` requests (ids ``early0``…) before it answers
  ``initialize``, then waits for their answers before it does anything else (logging each:
  ``early0: answered``, ``early3: -32002 …``), and only then registers.
- With ``--launches PATH`` it counts its launches in that file; each of the first
  ``--silent-launches`` answers ``initialize`` and then nothing at all (logging ``holding
  <method>`` for each request it reads): a server that connects but never becomes ready.

Every stderr line reaches the host's trace as a ``server-log`` event. Standard library only (its
wire is ``tests.stdio_wire``); :func:`server_config` is its entry in a host's config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tests.stdio_wire import receive, send

ROOM = "editor:#notes"
# as mcpl-editor 0.1.1 declares itself: "0.5", but with the 0.4 name of channels.incoming
# (``observe``), and a set that uses a capability MCPL never had (``stateUpdate``)
MANIFEST = {
    "version": "0.5",
    "pushEvents": True,
    "stateUpdate": True,
    "channels": {"register": True, "publish": True, "observe": True},
    "featureSets": {
        "editor.notes": {
            "description": "Notes on the open files.",
            "uses": ["channels.register", "channels.observe", "channels.publish"],
        },
        "editor.observe": {
            "description": "Document changes.",
            "uses": ["pushEvents", "stateUpdate"],
        },
    },
}
CHANNEL = {
    "id": ROOM,
    "type": "chat",
    "label": "#notes",
    "direction": "bidirectional",
    "capabilities": {"publish": {"target": "root"}},
}
TOOLS = [
    {"name": n, "description": d, "inputSchema": {"type": "object"}}
    for n, d in (("open_file", "Open a file in the editor."), ("quit", "Close the editor."))
]


def server_config(*args: str, **keys: Any) -> dict[str, Any]:
    """This server as a host config's ``[[servers]]`` entry (id ``editor``)."""
    command = [sys.executable, "-m", "tests.editor_like_server", *args]
    root = str(Path(__file__).resolve().parents[1])
    return {"id": "editor", "command": command, "env": {"PYTHONPATH": root}, **keys}


def log(text: str) -> None:
    print(f"[editor] {text}", file=sys.stderr, flush=True)


def launch_number(path: str | None) -> int:
    if path is None:
        return 1
    counter = Path(path)
    n = int(counter.read_text() or "0") + 1 if counter.exists() else 1
    counter.write_text(str(n))
    return n


def chat(rid: str, text: str) -> None:
    """Send a chat message from Uma in the channel (request ``rid``)."""
    note = {"channelId": ROOM, "messageId": f"m-{rid}", "author": {"id": "u1", "name": "Uma"}}
    note["content"] = [{"type": "text", "text": text}]
    note["timestamp"] = "2026-01-01T00:00:00.000Z"
    send({"id": rid, "method": "channels/incoming", "params": {"messages": [note]}})


def serve(message: dict[str, Any]) -> None:
    """Answer one message of the host (a response or a notification needs none)."""
    method, rid = message.get("method"), message.get("id")
    params = message.get("params") or {}
    if method == "channels/publish":
        text = " ".join(b.get("text", "") for b in params.get("content", []))
        log(f"published: {text}")
    if method is None or rid is None:
        return
    if method == "featureSets/update":
        result: dict[str, Any] = {"accepted": True}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call" and params.get("name") in ("open_file", "quit"):
        path = (params.get("arguments") or {}).get("path", "")
        text = f"opened {path}" if params["name"] == "open_file" else "bye"
        send({"id": rid, "result": {"content": [{"type": "text", "text": text}]}})
        if params["name"] == "quit":
            log("quitting")
            sys.exit(0)
        chat(f"in-{rid}", f"please review {path}")
        return
    elif method == "channels/publish":
        result = {"delivered": True, "messageId": f"pub-{rid}"}
        if "threadId" in params:  # RFC-011: the place it landed in is echoed
            result["threadId"] = params["threadId"]
    elif method == "ping":
        result = {}
    else:
        send({"id": rid, "error": {"code": -32601, "message": f"Method not found: {method}"}})
        return
    send({"id": rid, "result": result})


def answers(kept: list[dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    """Read until the answers to our requests ``ids`` are in (in the order they came), keeping
    whatever else the host sends, unserved, in ``kept``; exit if the host closes first."""
    out: list[dict[str, Any]] = []
    while len(out) < len(ids):
        message = receive()
        if message is None:
            sys.exit(0)
        if "method" not in message and message.get("id") in ids:
            out.append(message)
        else:
            kept.append(message)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.editor_like_server")
    parser.add_argument("--silent-launches", type=int, default=0)
    parser.add_argument("--launches")
    parser.add_argument("--early-pings", type=int, default=0)
    parser.add_argument("--greet", action="store_true")
    args = parser.parse_args()
    silent = launch_number(args.launches) <= args.silent_launches
    init = receive()
    assert init is not None and init.get("method") == "initialize", init
    for n in range(args.early_pings):
        send({"id": f"early{n}", "method": "ping"})
    caps = {"tools": {}, "experimental": {"mcpl": MANIFEST}}
    info = {"name": "editor", "version": "1"}
    result = {"protocolVersion": "2024-11-05", "capabilities": caps, "serverInfo": info}
    send({"id": init["id"], "result": result})
    if silent:
        while (message := receive()) is not None:
            if "method" in message and "id" in message:
                log(f"holding {message['method']}")
        return 0
    kept: list[dict[str, Any]] = []  # what waits until the awaited answers are in
    for answer in answers(kept, [f"early{n}" for n in range(args.early_pings)]):
        error = answer.get("error")
        how = f"{error['code']} {error['message']}" if error else "answered"
        log(f"{answer['id']}: {how}")
    send({"id": "reg-1", "method": "channels/register", "params": {"channels": [CHANNEL]}})
    (message,) = answers(kept, ["reg-1"])  # the serve loop waits on its register
    if "error" in message:
        log(f"channels/register failed: {message['error']}; the serve loop ends")
        return 1
    log(f"channels/register answered: {message.get('result')}")
    if args.greet:
        chat("greet", "hello")
        (message,) = answers(kept, ["greet"])
        log(f"greeting answered: {message.get('result') or message.get('error')}")
    for message in kept:
        serve(message)
    while (message := receive()) is not None:
        serve(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
