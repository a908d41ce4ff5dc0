"""The lobby's files (``--ws --files``): plain HTTP ``GET /files/<name>`` on the
websocket port, for the references its pushes carry (``board.png``, ``notes.txt``).

Answered through the toolkit's HTTP hook (:meth:`actors.serverkit.MCPLServer.on_http`, here on
the listener every session shares): a known file gets 200, anything else 404, a method other
than ``GET`` 405. Each request answered is logged and reported, before the answer goes out, as
an ``http`` event {method, path, status, authorization} to the control link of every session
that is live at the time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from actors.serverkit import HttpAnswer, HttpRequest
from tests.lobby.words import LobbyFile, builtin_files, short

#: the live sessions' event senders (one per control link), told of every HTTP request
Listeners = set[Callable[[dict[str, Any]], None]]


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


class LobbyFiles:
    """The files one websocket listener serves, and who hears of each request."""

    def __init__(self, files: dict[str, LobbyFile] | None = None) -> None:
        self.files = files if files is not None else builtin_files()
        self.listeners: Listeners = set()
        self._served = 0

    def answer(self, request: HttpRequest) -> HttpAnswer | None:
        """The answer to one plain HTTP request (None for the toolkit's own ``/refs/``)."""
        if request.path.startswith("/refs/"):
            return None
        name = request.path.removeprefix("/files/") if request.path.startswith("/files/") else None
        headers = {"Content-Type": "text/plain"}
        if request.method != "GET":
            status, body = 405, b"only GET\n"
            headers["Allow"] = "GET"
        elif name is None or name not in self.files:
            status, body = 404, b"no such file\n"
        else:
            f = self.files[name]
            status, body, headers = 200, f.data, {"Content-Type": f.mime_type}
        authorization = request.headers.get("authorization")
        self._served += 1
        _log(
            f"http#{self._served}: HTTP {request.method} {request.path} -> {status} "
            f"(authorization: {short(authorization)})"
        )
        event = {
            "event": "http",
            "method": request.method,
            "path": request.path,
            "status": status,
            "authorization": authorization,
        }
        for emit in list(self.listeners):
            emit(event)
        return HttpAnswer(status=status, body=body, headers=headers)
