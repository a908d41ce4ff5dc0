"""The operator console: a single page and its live feed, served from the host's own process.

``[host] web = "127.0.0.1:7340"`` (or ``mcplive run --web``) turns it on. It runs on the
host's trio loop: Hypercorn's trio worker serves a small Starlette app, whose parts are

- the page: ``actors/web/static`` (plain HTML, CSS and JavaScript, no build step), the per-run
  action key written into ``index.html`` as it is served;
- the JSON endpoints (``actors.web.api``) and the feed's websocket, ``/api/feed``: on connect
  one message with the recent records, then a message per batch of new ones
  (``actors.web.feed``);
- the page's icon, ``/favicon.ico`` (an SVG picture, ``static/favicon.svg``);
- the gate in front of all of them (``actors.web.auth``).

Every answer carries a content security policy that runs only the console's own script, so a
line that slipped through as markup would still run nothing; the page itself sets text only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from http.cookies import SimpleCookie
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config as ServerConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from actors.errors import ConfigError
from actors.transcript.lines import INFO
from actors.transcript.printer import TranscriptOptions

from .api import ConsoleApi
from .auth import COOKIE, DEFAULT_WEB, Guard, is_loopback, is_public, parse_web_address
from .feed import Feed, TooManyClients

STATIC = Path(str(resources.files("actors.web") / "static"))
ACTION_KEY_MARK = "{{ACTION_KEY}}"
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
log = logging.getLogger("mcplive.web")


@attrs.frozen(kw_only=True)
class Console:
    """A running console: where it listens (``port`` is the bound one, also for port 0)."""

    url: str
    host: str
    port: int
    guard: Guard
    feed: Feed


@asynccontextmanager
async def open_console(
    host: Any, address: str | None = None, token: str | None = None, *, level: int = INFO
) -> AsyncIterator[Console]:
    """Serve the console of ``host`` on ``address`` (default ``DEFAULT_WEB``; port 0 picks a
    free port) until the block ends; its transcript shows events of ``level`` and up. Without
    ``token`` the address must be a loopback one (a ``ConfigError`` says so otherwise)."""
    where = address or DEFAULT_WEB
    try:
        name, port = parse_web_address(where)
    except ValueError as exc:
        raise ConfigError(f"web: {exc}") from None
    loopback = is_loopback(name)
    if token is None and not loopback:
        raise ConfigError(
            f"web: {where!r} is not a loopback address; without an access token "
            "(host.web_token_env) the console serves loopback only"
        )
    guard = Guard(token=token, loopback=loopback)
    feed = Feed()
    info = {"token_required": token is not None}
    api = ConsoleApi(host, feed, info)
    app = _Gate(build_app(api, feed, guard), guard)
    async with trio.open_nursery() as nursery:
        stream = host.ctx.trace.subscribe_nowait(replay=True)
        options = TranscriptOptions(level=level, redactor=host.ctx.redactor)
        nursery.start_soon(feed.run, stream, options)
        binds = await nursery.start(partial(serve, app, _server_config(name, port)))
        url = binds[0].rstrip("/") + "/"
        bound = int(url.rsplit(":", 1)[1].strip("/"))
        info["url"] = url
        try:
            yield Console(url=url, host=name, port=bound, guard=guard, feed=feed)
        finally:
            stream.close()
            nursery.cancel_scope.cancel()


def _server_config(name: str, port: int) -> ServerConfig:
    config = ServerConfig()
    config.bind = [f"[{name}]:{port}" if ":" in name else f"{name}:{port}"]
    server_log = logging.getLogger("mcplive.web.server")
    server_log.setLevel(logging.WARNING)  # not its start-up lines: the host prints the address
    config.errorlog = server_log
    config.accesslog = None
    config.graceful_timeout = 1.0
    return config


def build_app(api: ConsoleApi, feed: Feed, guard: Guard) -> Starlette:
    index = (STATIC / "index.html").read_text(encoding="utf-8")
    page = index.replace(ACTION_KEY_MARK, guard.action_key)

    icon = (STATIC / "favicon.svg").read_bytes()

    async def home(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8")

    async def favicon(request: Request) -> Response:
        return Response(icon, media_type="image/svg+xml")

    async def follow(ws: WebSocket) -> None:
        try:
            backlog, client = feed.subscribe()
        except TooManyClients:
            await ws.close(code=1013)
            return
        try:
            await ws.accept()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_gone, ws, nursery.cancel_scope)
                await ws.send_text(json.dumps(backlog, ensure_ascii=False))
                while batch := await client.next_batch():
                    await ws.send_text(json.dumps(batch, ensure_ascii=False))
                nursery.cancel_scope.cancel()
            await ws.close()
        except (WebSocketDisconnect, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            client.close()

    return Starlette(
        routes=[
            Route("/", home, methods=["GET"]),
            Route("/favicon.ico", favicon, methods=["GET"]),
            *api.routes(),
            WebSocketRoute("/api/feed", follow),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )


async def _until_gone(ws: WebSocket, scope: trio.CancelScope) -> None:
    """Read what the page sends (nothing is expected) until it goes away."""
    try:
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass
    finally:
        scope.cancel()


class _Gate:
    """ASGI middleware: every request passes ``Guard`` first; the security headers go on every
    answer; ``/?token=…`` with the right token sets the cookie and drops the token from the
    address."""

    def __init__(self, app: Any, guard: Guard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        cookies = {k: m.value for k, m in SimpleCookie(headers.get("cookie", "")).items()}
        request = Request(scope) if scope["type"] == "http" else None
        offered = request.query_params.get("token") if request is not None else None
        if offered is not None and scope["path"] == "/" and self.guard.token_ok(offered):
            await self._sign_in(scope, receive, send)
            return
        if scope["type"] == "http" and is_public(scope["method"], scope["path"]):
            await self.app(scope, receive, _with_headers(send))
            return
        action = scope["type"] == "http" and scope["method"] not in ("GET", "HEAD")
        status = self.guard.refusal(headers, cookies, action=action)
        if status is None:
            await self.app(scope, receive, _with_headers(send))
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            why = "a foreign origin or host name" if status == 403 else "a valid token is needed"
            body = Response(
                json.dumps({"error": why}), status_code=status, media_type="application/json"
            )
            await body(scope, receive, _with_headers(send))

    async def _sign_in(self, scope: Any, receive: Any, send: Any) -> None:
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, str(self.guard.token), httponly=True, samesite="strict")
        await response(scope, receive, _with_headers(send))


def _with_headers(send: Any) -> Any:
    extra = [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *extra]}
        await send(message)

    return sending
