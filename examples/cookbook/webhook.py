"""A webhook into a chat channel: what is POSTed to ``/hook`` is delivered into ``#alerts``,
where the agents read it and answer.

    python webhook.py --port 8766

    [[servers]]                     # in the host's config: started by the host, then dialled
    id = "hooks"
    command = ["python", "webhook.py", "--port", "8766"]
    url = "ws://127.0.0.1:8766/"

    curl -d '{"text": "build 512 failed", "author": "ci"}' http://127.0.0.1:8766/hook

The HTTP endpoint shares the websocket's port (``@server.on_http``), so this server runs over
a websocket. A body is JSON (``text``, and ``author``, else ``webhook``) or plain text. An
``X-Delivery-Id`` header becomes the message id, so a sender's retry is stored once. With
``HOOK_SECRET`` set, a request must carry it in ``X-Hook-Secret``.
"""

from __future__ import annotations

import argparse
import functools
import hmac
import json
import os

from actors.serverkit import HttpAnswer, HttpRequest, MCPLServer, Publish

server = MCPLServer("hooks")
alerts = server.channel("hooks:alerts", label="#alerts", publish_target="root")
SECRET = os.environ.get("HOOK_SECRET", "")


def reply(status: int, text: str) -> HttpAnswer:
    """A plain-text HTTP answer."""
    body = f"{text}\n".encode()
    return HttpAnswer(status=status, body=body, headers={"Content-Type": "text/plain"})


def read(body: bytes) -> tuple[str, str]:
    """The text and the author of one delivery."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        return str(data.get("text") or "").strip(), str(data.get("author") or "webhook")
    return body.decode("utf-8", "replace").strip(), "webhook"


@server.on_http
def hook(request: HttpRequest) -> HttpAnswer | None:
    """Take one delivery; the message goes out beside the connection (an HTTP handler is
    sync and quick)."""
    if request.path != "/hook":
        return None  # left to the toolkit: 404
    if request.method != "POST":
        return reply(405, "POST only")
    given = request.headers.get("x-hook-secret", "").encode()
    if SECRET and not hmac.compare_digest(given, SECRET.encode()):
        return reply(401, "wrong or missing X-Hook-Secret")
    text, author = read(request.body)
    if not text:
        return reply(400, "nothing to deliver")
    delivery = request.headers.get("x-delivery-id")
    message_id = f"hook-{delivery}" if delivery else None
    send = functools.partial(alerts.send, text, author=author, message_id=message_id)
    if not server.spawn(send, "delivery"):
        return reply(503, "no host is connected")
    return reply(202, "accepted")


@alerts.on_publish
def answered(publish: Publish) -> None:
    """An agent answered in #alerts: show it there (a real server might also post it back to
    the sender)."""
    publish.echo()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8766, help="0: any free port")
    args = parser.parse_args()
    server.run("websocket", host=args.host, port=args.port)
