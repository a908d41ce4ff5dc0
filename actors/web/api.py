"""The console's JSON endpoints: what the pages read, and the operator's actions.

Reads (``GET``): ``/healthz``, ``/api/console``, ``/api/agents``, ``/api/servers``,
``/api/channels``, ``/api/recent``, ``/api/history/{agent}`` (``limit``, ``before``, ``q``),
``/api/fleet`` (the hosts and lease holders of a PostgreSQL store).
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

import datetime as dt
import functools
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from actors.agent.speech import DRAFTS_NS
from actors.fleet import view as fleet_view
from actors.link.vitals import TRAFFIC_MINUTES
from actors.models.usage import rows_of
from actors.status import StatusWriter, vitals_entry
from actors.transcript.stored import history_line
from protocol.display import json_safe, printable
from protocol.jsonrpc import decode
from protocol.prices import prices
from protocol.status import iso

from .feed import Feed
from .metrics import CONTENT_TYPE, exposition, registry_for

#: The most messages one history answer lists, and the messages a search reads at most.
HISTORY_LIMIT = 200
#: The longest local message the console posts, and the largest request body it reads.
MAX_TEXT = 20_000
MAX_BODY = 65_536


#: The most of a request's body the console shows, in bytes of its indented JSON.
REQUEST_SHOWN_BYTES = 2 * 1024 * 1024

#: The most days the Usage page reads at once.
USAGE_DAYS = 366


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
        self.registry = registry_for(host, self._snapshot)  # this console's own, never global
        self._fleet_reads = trio.CapacityLimiter(1)  # one fleet read at a time, however polled

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
            Route("/api/usage", self._handler(self.usage), methods=get),
            Route("/api/fleet", self._handler(self.fleet), methods=get),
            Route("/api/history", self._handler(self.history), methods=get),
            Route("/api/history/{agent}", self._handler(self.history), methods=get),
            Route("/api/agents/{agent}/request", self._handler(self.last_request), methods=get),
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
            return body if isinstance(body, Response) else self.json(body)

        return endpoint

    def json(self, body: Any, status: int = 200) -> JSONResponse:
        return JSONResponse(json_safe(body, self.redactor.text), status_code=status)

    # -- reads ------------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, Any]:
        return self.status.body()

    async def metrics(self, request: Request) -> Response:
        """The host's figures in the Prometheus text format (see :mod:`actors.web.metrics`)."""
        return Response(exposition(self.registry), headers={"content-type": CONTENT_TYPE})

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
            "host_id": self.host.ctx.host_id,
            "fleet": cfg.store is not None,
            "agents": [a.name for a in cfg.agents],
            "servers": [s.id for s in cfg.servers],
        }

    async def agents(self, request: Request) -> list[dict[str, Any]]:
        """Each agent's status, with its model, its last turns' usage, its last folds, the
        facts of its newest model request (no body: ``/api/agents/NAME/request`` has it) and
        its drafts."""
        models = {a.name: a.model for a in self.host.config.agents}
        out = []
        for entry in self._snapshot()["agents"]:
            name = entry["name"]
            usage = self.feed.usage.get(name, ())
            seen = self.host.ctx.last_requests.get(name)
            out.append(
                {
                    **entry,
                    "model": models.get(name),
                    "turn_usage": list(usage),
                    "folds": list(self.feed.folds.get(name, ())),
                    "last_request": None if seen is None else _request_facts(seen),
                    "drafts": self._drafts(name),
                }
            )
        return out

    def _drafts(self, agent: str) -> list[dict[str, Any]]:
        saved = self.host.ctx.store.reader.state(DRAFTS_NS).get(agent)
        items = saved.get("items") if isinstance(saved, Mapping) else None
        return [dict(d) for d in items if isinstance(d, Mapping)] if isinstance(items, list) else []

    async def servers(self, request: Request) -> list[dict[str, Any]]:
        """Each server's status entry, its recent declaration mismatches, and its vitals with
        the last ``TRAFFIC_MINUTES`` minutes of traffic and its uptime (see the console docs)."""
        now, wall = trio.current_time(), time.time()
        out = []
        for entry in self._snapshot()["servers"]:
            live = self.host.ctx.vitals.get(entry["id"])
            vitals = None
            if live is not None:
                vitals = vitals_entry(live.snapshot(), now, minutes=TRAFFIC_MINUTES)
                since = live.connected_since
                vitals["uptime_s"] = round(wall - since, 3) if since is not None else None
            mismatches = list(self.feed.mismatches.get(entry["id"], ()))
            out.append({**entry, "mismatches": mismatches, "vitals": vitals})
        return out

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

    async def last_request(self, request: Request) -> dict[str, Any] | Response:
        """The agent's newest model request of a turn as its provider sent it: the model,
        the turn and tool round, the input tokens the provider counted for it against the
        agent's ``context_tokens``, and the body as indented JSON (redacted; cut at
        :data:`REQUEST_SHOWN_BYTES`, ``truncated`` then true), made in a worker thread.
        ``request`` is None before the agent's first model call."""
        agent = self._agent(request)
        seen = self.host.ctx.last_requests.get(agent)
        if seen is None:
            return {"agent": agent, "request": None}
        facts = json_safe(_request_facts(seen), self.redactor.text)
        # the body is made safe and redacted whole in the thread: no string of it is clipped
        text, size = await trio.to_thread.run_sync(shown_body, seen.body, self.redactor.text)
        shown = {**facts, "bytes": size, "truncated": size > len(text.encode()), "body": text}
        return JSONResponse({"agent": agent, "request": shown})

    async def usage(self, request: Request) -> dict[str, Any]:
        """The usage ledger's last ``days`` UTC days (30 by default, at most
        :data:`USAGE_DAYS`), one row per day, agent and model with its tokens and cost (None:
        a price unknown), and each agent's day and budgets as its status has them (``today``;
        the host's total under ``host``). Read in a worker thread, never on the loop."""
        days = _int(request.query_params.get("days"), 30, "days", USAGE_DAYS)
        ctx = self.host.ctx
        first = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=days - 1)
        since = dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC).timestamp()
        totals = await ctx.store.read(functools.partial(ctx.store.reader.usage, since=since))
        rows = rows_of(totals, None, prices(ctx.config.prices))
        snap = self._snapshot()
        return {
            "days": [(first + dt.timedelta(days=n)).isoformat() for n in range(days)],
            "rows": [row.as_json(None) for row in rows],
            "today": {a["name"]: a.get("today") or {} for a in snap["agents"]},
            "host": snap.get("today") or {},
        }

    async def fleet(self, request: Request) -> dict[str, Any]:
        """The fleet as ``mcplive status --json`` has it (:func:`actors.fleet.view.read`: each
        host's last heartbeat, each lease's holder; ``error``, one line, when the database could
        not be read), read in a worker thread with short timeouts. ``enabled`` is false, and
        nothing is read, on the embedded store: one host has no fleet."""
        dsn = self.host.config.store
        if dsn is None:
            return {"enabled": False}
        found = await trio.to_thread.run_sync(
            fleet_view.read, dsn, limiter=self._fleet_reads, abandon_on_cancel=True
        )
        return {"enabled": True, "host_id": self.host.ctx.host_id, **found}

    async def history(self, request: Request) -> dict[str, Any]:
        """Stored messages of one agent (``/api/history/NAME``) or of every agent
        (``/api/history``), newest ``limit`` (before message ``before``); with ``q`` the newest
        ones whose text contains it (case-insensitive, through the store's text index as
        ``mcplive history --search`` reads it); with ``since`` / ``until`` (``YYYY-MM-DD``, UTC
        days, both included) those stored on those days. ``more`` is the id to pass as
        ``before`` for older ones. The store is read in a worker thread, never on the loop."""
        agent = self._agent(request) if "agent" in request.path_params else None
        params = request.query_params
        limit = _int(params.get("limit"), 50, "limit", HISTORY_LIMIT)
        before = params.get("before") or None
        query = params.get("q") or ""
        since = _day(params.get("since"), "since")
        until = _day(params.get("until"), "until")
        if until is not None:
            until += 86_400  # the whole day
        page = functools.partial(self._page, agent, query, limit, before, since, until)
        try:
            found, more = await self.host.ctx.store.read(page)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return {"messages": [_message(m, at) for m, at in found], "more": more}

    def _page(
        self,
        agent: str | None,
        query: str,
        limit: int,
        before: str | None,
        since: float | None = None,
        until: float | None = None,
    ) -> tuple[list[tuple[dict[str, Any], float]], str | None]:
        """The newest ``limit`` messages (of ``agent``, or of all) before ``before``, stored in
        [``since``, ``until``), holding ``query`` (any, when empty), oldest first with their
        times, and the id to page on from (None: no older one)."""
        reader = self.host.ctx.store.reader
        bounds: dict[str, Any] = {"since": since, "until": until}
        if before is not None:
            seq = reader.seq_of(before, agent)
            if seq is None:
                raise ValueError(f"{agent or 'no agent'} has no message {before!r}")
            bounds["before_seq"] = seq
        rows = reader.rows(
            agent=agent, contains=query or None, newest_first=True, limit=limit + 1, **bounds
        )
        more = rows[limit - 1].message["id"] if len(rows) > limit and limit else None
        return [(row.message, row.created_at) for row in reversed(rows[:limit])], more

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
                raise BadRequest("destination: the draft has no place; choose a channel for it")
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


def _message(m: Mapping[str, Any], at: float) -> dict[str, Any]:
    """A stored message as the history page lists it: its id, agent, role and time (``ts``,
    when it was stored) and the line ``mcplive history`` prints for it, less the id, agent and
    role the page shows apart."""
    line = history_line(m)
    shown = line.removeprefix(f"{m.get('id')} {m.get('agent')} {m.get('role')}").lstrip()
    return {
        "id": m.get("id"),
        "agent": m.get("agent"),
        "role": m.get("role"),
        "ts": iso(at),
        "line": printable(shown),
    }


def _day(value: str | None, name: str) -> float | None:
    """The start (UTC) of the day ``YYYY-MM-DD`` a query parameter names, or None."""
    if not value:
        return None
    try:
        day = dt.date.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"{name}: {value!r} is not a date (YYYY-MM-DD)") from None
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def _request_facts(seen: Any) -> dict[str, Any]:
    """A LastRequest's facts, without its body."""
    return {
        "at": iso(seen.at),
        "model": seen.model,
        "turn": seen.turn,
        "round": seen.round,
        "input_tokens": seen.input_tokens,
        "context_budget": seen.context_budget,
    }


def shown_body(body: Any, redact: Callable[[str], str]) -> tuple[str, int]:
    """``body`` as indented JSON with every credential redacted (its strings made well formed,
    never clipped), cut at :data:`REQUEST_SHOWN_BYTES` (at a character's start), and its whole
    size in bytes."""
    safe = json_safe(body, redact, clip_at=None)
    whole = json.dumps(safe, indent=1, ensure_ascii=False).encode()
    return whole[:REQUEST_SHOWN_BYTES].decode("utf-8", "ignore"), len(whole)


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
