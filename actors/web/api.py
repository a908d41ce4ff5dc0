"""The console's JSON endpoints: what the pages read, and the operator's actions.

Reads (``GET``): ``/healthz``, ``/api/console``, ``/api/agents``, ``/api/servers``,
``/api/channels``, ``/api/recent``, ``/api/history/{agent}`` (``limit``, ``before``, ``q``).
Actions (``POST``, JSON bodies): ``/api/agents/{agent}/post`` (``text``), ``.../pause``,
``.../resume``, ``/api/servers/{server}/reconnect``,
``/api/agents/{agent}/drafts/{draft}/resend`` (``destination``, ``server_id``: default the
draft's own place) and ``.../dismiss``.

What the pages show of servers, agents and channels is the status file's record
(``actors.status``), so it is redacted the same way; every other answer goes through the host's
redactor too. Who may call which endpoint is ``actors.web.auth``'s business, checked before any
of these run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from actors.agent.speech import DRAFTS_NS
from actors.status import StatusWriter
from actors.transcript.stored import history_line
from protocol.display import json_safe, printable
from protocol.jsonrpc import decode
from protocol.metrics import CONTENT_TYPE, Family, exposition

from .feed import Feed

#: The most messages one history answer lists, and the messages a search reads at most.
HISTORY_LIMIT = 200
#: The longest local message the console posts, and the largest request body it reads.
MAX_TEXT = 20_000
MAX_BODY = 65_536


class BadRequest(Exception):
    """A request the console refuses, as one line (answered with 400)."""


class ConsoleApi:
    """The endpoints of one console, over a running host and its feed."""

    def __init__(self, host: Any, feed: Feed, info: Mapping[str, Any]) -> None:
        self.host = host
        self.feed = feed
        self.info = info  # the console's own facts: its address, whether a token is needed
        self.status = StatusWriter(host.ctx)  # its snapshot only: it writes nothing
        self.redactor = host.ctx.redactor

    def routes(self) -> list[Route]:
        get, post = ["GET"], ["POST"]
        return [
            Route("/healthz", self._handler(self.healthz), methods=get),
            Route("/metrics", self.metrics, methods=get),
            Route("/api/console", self._handler(self.console), methods=get),
            Route("/api/agents", self._handler(self.agents), methods=get),
            Route("/api/servers", self._handler(self.servers), methods=get),
            Route("/api/channels", self._handler(self.channels), methods=get),
            Route("/api/recent", self._handler(self.recent), methods=get),
            Route("/api/history/{agent}", self._handler(self.history), methods=get),
            Route("/api/agents/{agent}/post", self._handler(self.post_local), methods=post),
            Route("/api/agents/{agent}/pause", self._handler(self.pause), methods=post),
            Route("/api/agents/{agent}/resume", self._handler(self.resume), methods=post),
            Route("/api/servers/{server}/reconnect", self._handler(self.reconnect), methods=post),
            Route(
                "/api/agents/{agent}/drafts/{draft}/{action}",
                self._handler(self.draft),
                methods=post,
            ),
        ]

    def _handler(
        self, fn: Callable[[Request], Awaitable[Any]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                body = await fn(request)
            except BadRequest as exc:
                return self.json({"error": str(exc)}, 400)
            except KeyError as exc:
                return self.json({"error": str(exc.args[0]) if exc.args else "not found"}, 404)
            return self.json(body)

        return endpoint

    def json(self, body: Any, status: int = 200) -> JSONResponse:
        return JSONResponse(json_safe(body, self.redactor.text), status_code=status)

    # -- reads ------------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, Any]:
        return self.status.body()

    async def metrics(self, request: Request) -> Response:
        """The host's figures in the Prometheus text format (see :func:`metric_families`)."""
        text = exposition(metric_families(self._snapshot()))
        return Response(text, media_type=CONTENT_TYPE)

    async def healthz(self, request: Request) -> dict[str, Any]:
        snap = self._snapshot()
        return {
            "ok": True,
            "running": not self.host.ctx.closing,
            "mcplive": snap["mcplive"],
            "pid": snap["pid"],
            "servers": {s["id"]: s["state"] for s in snap["servers"]},
            "agents": {a["name"]: a["state"] for a in snap["agents"]},
        }

    async def console(self, request: Request) -> dict[str, Any]:
        cfg = self.host.config
        return {
            **self.info,
            "agents": [a.name for a in cfg.agents],
            "servers": [s.id for s in cfg.servers],
        }

    async def agents(self, request: Request) -> list[dict[str, Any]]:
        out = []
        for entry in self._snapshot()["agents"]:
            name = entry["name"]
            usage = self.feed.usage.get(name, ())
            out.append({**entry, "turn_usage": list(usage), "drafts": self._drafts(name)})
        return out

    def _drafts(self, agent: str) -> list[dict[str, Any]]:
        saved = self.host.ctx.store.reader.state(DRAFTS_NS).get(agent)
        items = saved.get("items") if isinstance(saved, Mapping) else None
        return [dict(d) for d in items if isinstance(d, Mapping)] if isinstance(items, list) else []

    async def servers(self, request: Request) -> list[dict[str, Any]]:
        return [
            {**entry, "mismatches": list(self.feed.mismatches.get(entry["id"], ()))}
            for entry in self._snapshot()["servers"]
        ]

    async def channels(self, request: Request) -> list[dict[str, Any]]:
        """Every registered channel with its publish target and, per agent that hears its
        server, whether it is open."""
        agents = self.host.config.agents
        out = []
        for server in self._snapshot()["servers"]:
            hearers = [a.name for a in agents if a.hears(server["id"])]
            for ch in server["channels"]:
                closed = set(ch["closed_for"])
                out.append(
                    {
                        "server_id": server["id"],
                        "id": ch["id"],
                        "label": printable(ch["label"]),
                        "registered": ch["registered"],
                        "publish": ch["place"],
                        "open_for": {name: name not in closed for name in hearers},
                    }
                )
        return out

    async def recent(self, request: Request) -> list[dict[str, Any]]:
        agent = request.query_params.get("agent")
        return [r for r in self.feed.recent if agent is None or r["agent"] == agent]

    async def history(self, request: Request) -> dict[str, Any]:
        """An agent's stored messages, newest ``limit`` (before message ``before``), or with
        ``q`` the newest ones whose text contains it (case-insensitive, through the store's text
        index as ``mcplive history --search`` reads it); ``more`` is the id to pass as
        ``before`` for older ones. The store is read in a worker thread, never on the loop."""
        agent = self._agent(request)
        params = request.query_params
        limit = _int(params.get("limit"), 50, "limit", HISTORY_LIMIT)
        before = params.get("before") or None
        query = params.get("q") or ""
        try:
            found, more = await self.host.ctx.store.read(self._page, agent, query, limit, before)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return {"messages": [_message(m) for m in found], "more": more}

    def _page(
        self, agent: str, query: str, limit: int, before: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The newest ``limit`` messages of ``agent`` before ``before`` holding ``query`` (any,
        when empty), oldest first, and the id to page on from (None: no older one)."""
        reader = self.host.ctx.store.reader
        bounds = {}
        if before is not None:
            seq = reader.seq_of(before, agent)
            if seq is None:
                raise ValueError(f"{agent} has no message {before!r}")
            bounds["before_seq"] = seq
        rows = reader.rows(
            agent=agent, contains=query or None, newest_first=True, limit=limit + 1, **bounds
        )
        more = rows[limit - 1].message["id"] if len(rows) > limit and limit else None
        return [row.message for row in reversed(rows[:limit])], more

    # -- actions ----------------------------------------------------------------------------
    async def post_local(self, request: Request) -> dict[str, Any]:
        agent = self._agent(request)
        text = (await _body(request)).get("text")
        if not isinstance(text, str) or not text.strip():
            raise BadRequest("text: give the message to post, as a non-empty string")
        if len(text) > MAX_TEXT:
            raise BadRequest(f"text: at most {MAX_TEXT:,} characters")
        await self.host.post_local(agent, text)
        return {"posted": True}

    async def pause(self, request: Request) -> dict[str, Any]:
        return {"changed": await self.host.hold(self._agent(request), source=_source(request))}

    async def resume(self, request: Request) -> dict[str, Any]:
        """Let a held agent run again, and resume one its model's refusal or its daily budget
        paused."""
        changed = await self.host.unpause(self._agent(request), source=_source(request))
        return {"changed": changed}

    async def reconnect(self, request: Request) -> dict[str, Any]:
        server = request.path_params["server"]
        if self.host.config.server(server) is None:
            raise KeyError(f"no server with id {server!r}")
        return {"reconnect": await self.host.reconnect(server, source=_source(request))}

    async def draft(self, request: Request) -> dict[str, Any]:
        agent = self._agent(request)
        draft, action = request.path_params["draft"], request.path_params["action"]
        if action not in ("resend", "dismiss"):
            raise KeyError(f"no draft action {action!r}; resend or dismiss")
        known = {d.get("id"): d for d in self._drafts(agent)}
        if draft not in known:
            raise KeyError(f"{agent} has no draft {draft!r}")
        source = _source(request)
        if action == "resend":
            body = await _body(request)
            place = known[draft].get("place") or {}
            given = body.get("destination")
            destination = given or place.get("channel_id")
            if not isinstance(destination, str) or not destination:
                raise BadRequest("destination: the draft has no place; name a channel")
            server_id = body.get("server_id") if given else place.get("server_id")
            result = await self.host.resend_drafts(
                agent, [draft], destination, server_id=server_id, source=source
            )
        else:
            result = await self.host.dismiss_drafts(agent, [draft], source=source)
        text = " ".join(b.get("text", "") for b in result.get("content", ()) if isinstance(b, dict))
        return {"ok": not result.get("is_error"), "result": text}

    def _agent(self, request: Request) -> str:
        name = str(request.path_params["agent"])
        if all(a.name != name for a in self.host.config.agents):
            raise KeyError(f"no agent named {name!r}")
        return name


def _source(request: Request) -> str:
    """Where a console action came from, for the audit record: ``console`` and the client's
    address."""
    client = request.client
    return f"console {client.host}" if client is not None and client.host else "console"


def _message(m: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message as the history page lists it: its id, role and the line ``mcplive
    history`` prints for it, less the id, agent and role the page shows apart."""
    line = history_line(m)
    shown = line.removeprefix(f"{m.get('id')} {m.get('agent')} {m.get('role')}").lstrip()
    return {"id": m.get("id"), "role": m.get("role"), "line": printable(shown)}


def _int(value: str | None, default: int, name: str, cap: int) -> int:
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"{name}: {value!r} is not a whole number") from None
    if not 1 <= number <= cap:
        raise BadRequest(f"{name}: must be from 1 to {cap}")
    return number


async def _body(request: Request) -> dict[str, Any]:
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise BadRequest(f"the request body is larger than {MAX_BODY:,} bytes")
    if not raw:
        return {}
    try:
        body = decode(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def metric_families(snap: Mapping[str, Any]) -> list[Family]:
    """What ``/metrics`` says, from the status snapshot: the loop, each server and each agent."""
    loop = snap.get("loop") or {}
    servers = snap.get("servers", [])
    agents = snap.get("agents", [])
    tokens = [
        ({"agent": a["name"], "kind": kind}, float(n))
        for a in agents
        for kind, n in sorted((a.get("usage") or {}).items())
    ]
    return [
        Family("mcplive_up", "Whether the host runs.", "gauge", [({}, 1.0)]),
        Family(
            "mcplive_loop_longest_step_seconds",
            "The longest time one task step held the host's loop.",
            "gauge",
            [({}, float(loop.get("longest_step_ms", 0.0)) / 1000)],
        ),
        Family(
            "mcplive_loop_stalls_total",
            "Task steps that held the host's loop 250 ms or more.",
            "counter",
            [({}, float(loop.get("stalls", 0)))],
        ),
        Family(
            "mcplive_server_ready",
            "Whether the server's link is ready (1) or not (0).",
            "gauge",
            [({"server": s["id"]}, float(s["state"] == "ready")) for s in servers],
        ),
        Family(
            "mcplive_server_connects_total",
            "Connections made to the server.",
            "counter",
            [({"server": s["id"]}, float(s["connects"])) for s in servers],
        ),
        Family(
            "mcplive_agent_turns_total",
            "Turns the agent took.",
            "counter",
            [({"agent": a["name"]}, float(a["turns"])) for a in agents],
        ),
        Family(
            "mcplive_agent_state",
            "The agent's state (1 for the one it is in).",
            "gauge",
            [({"agent": a["name"], "state": a["state"]}, 1.0) for a in agents],
        ),
        Family(
            "mcplive_agent_tokens_total", "Tokens the agent's model calls used.", "counter", tokens
        ),
    ]
