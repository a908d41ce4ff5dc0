"""The operator console against a running host and a lobby server process: every endpoint over
real loopback HTTP, the live feed over a real websocket, the gate (tokens, the action key,
origins), the operator's actions, hostile text, and credentials that never leave the host.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import ConnectionRejected, open_websocket_url

from actors.errors import ConfigError
from actors.web.auth import ACTION_HEADER, COOKIE
from actors.web.console import STATIC, Console, open_console
from protocol.display import printable
from protocol.redact import REDACTED
from tests.helpers import (
    answered,
    incoming_answered,
    running_lobby,
    send_incoming,
    wait_trace,
)

pytestmark = pytest.mark.slow

HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi there! Ada here."\n'
ECHO = '[[rules]]\nwhen = "(?s)^(.*)$"\nsay = "heard: {1}"\n'
SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '<img src=x onerror="window.__pwned = 2">'
DEADLINE = 120
ROOT = {"target": "root"}


class Feed:
    """The console's websocket feed: records as they arrive."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.records: list[dict[str, Any]] = []
        self.batches = 0

    async def next_batch(self) -> list[dict[str, Any]]:
        batch = json.loads(await self.ws.get_message())
        self.batches += 1
        self.records += batch
        return list(batch)

    async def until(self, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        for record in self.records:
            if pred(record):
                return record
        while True:
            for record in await self.next_batch():
                if pred(record):
                    return record


@asynccontextmanager
async def console_on(host: Any, token: str | None = None) -> AsyncIterator[Console]:
    async with open_console(host, "127.0.0.1:0", token) as console:
        yield console


@asynccontextmanager
async def feed_of(console: Console, **headers: str) -> AsyncIterator[Feed]:
    url = f"ws://127.0.0.1:{console.port}/api/feed"
    async with open_websocket_url(url, extra_headers=list(headers.items())) as ws:
        yield Feed(ws)


def actions(console: Console) -> dict[str, str]:
    return {ACTION_HEADER: console.guard.action_key}


async def test_every_read_endpoint_and_the_live_feed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": HELLO}) as lb:
            # the History page's reads run in a worker thread, never on the host's loop
            reader = lb.host.ctx.store.reader
            read_on: list[bool] = []

            def rows(*args: Any, **kwargs: Any) -> Any:
                read_on.append(threading.current_thread() is threading.main_thread())
                return type(reader).rows(reader, *args, **kwargs)

            monkeypatch.setattr(reader, "rows", rows)
            async with (
                console_on(lb.host) as console,
                httpx.AsyncClient(base_url=console.url) as http,
                feed_of(console) as feed,
            ):
                assert console.url == f"http://127.0.0.1:{console.port}/"
                assert console.port != 0
                backlog = await feed.next_batch()  # the recent records, at once
                assert any(r["kind"] == "host-started" for r in backlog)
                send_incoming(lb.ctl, "lobby:#general", "m1", "hello Ada")
                said = await feed.until(
                    lambda r: r["kind"] == "published" and r["agent"] == "Ada", "Ada's reply"
                )
                assert "Hi there! Ada here." in said["line"]
                heard = next(r for r in feed.records if r["kind"] == "incoming")
                assert heard["channel_id"] == "lobby:#general" and "hello Ada" in heard["line"]
                assert heard["seq"] < said["seq"]
                await lb.host.run_until_idle()

                metrics = await http.get("/metrics")
                assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
                samples = {
                    (s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(metrics.text)
                    for s in family.samples
                }
                here = ("host_id", lb.host.ctx.host_id)
                assert samples[("mcplive_server_ready", (here, ("server", "lobby")))] == 1
                assert samples[("mcplive_agent_turns_total", (("agent", "Ada"), here))] >= 1
                assert ("mcplive_loop_stalls_total", (here,)) in samples
                health = (await http.get("/healthz")).json()
                assert health["ok"] and health["running"]
                assert health["servers"] == {"lobby": "ready"}
                assert health["agents"] == {"Ada": "idle"}
                info = (await http.get("/api/console")).json()
                assert info["url"] == console.url and info["token_required"] is False
                assert info["agents"] == ["Ada"] and info["servers"] == ["lobby"]
                [ada] = (await http.get("/api/agents")).json()
                assert ada["name"] == "Ada" and ada["turns"] >= 1 and ada["state"] == "idle"
                assert ada["turn_usage"][-1]["phase"] == "completed"
                assert "cache_read_input_tokens" in ada["turn_usage"][-1]
                [lobby] = (await http.get("/api/servers")).json()
                assert lobby["state"] == "ready" and lobby["reconnects"] == 0
                assert "mismatches" in lobby and "stderr_tail" in lobby
                channels = (await http.get("/api/channels")).json()
                general = next(c for c in channels if c["id"] == "lobby:#general")
                assert general["open_for"] == {"Ada": True} and general["publish"]
                recent = (await http.get("/api/recent", params={"agent": "Ada"})).json()
                assert recent and all(r["agent"] == "Ada" for r in recent)
                history = (await http.get("/api/history/Ada")).json()
                lines = [m["line"] for m in history["messages"]]
                assert any("hello Ada" in line for line in lines)
                assert any("Hi there! Ada here." in line for line in lines)
                found = (await http.get("/api/history/Ada", params={"q": "HELLO ADA"})).json()
                assert [m["role"] for m in found["messages"]] == ["user"]
                assert found["more"] is None
                # a search pages like the plain list: the newest first, then older ones
                send_incoming(lb.ctl, "lobby:#general", "m2", "hello Ada, again")
                await feed.until(lambda r: "again" in (r["line"] or ""), "the second hello")
                await lb.host.run_until_idle()
                newest = (
                    await http.get("/api/history/Ada", params={"q": "hello ada", "limit": "1"})
                ).json()
                assert ["again" in m["line"] for m in newest["messages"]] == [True]
                params = {"q": "hello ada", "before": newest["more"]}
                rest = (await http.get("/api/history/Ada", params=params)).json()
                assert [m["role"] for m in rest["messages"]] == ["user"] and rest["more"] is None
                assert "again" not in rest["messages"][0]["line"]
                assert read_on and not any(read_on)
                one = (await http.get("/api/history/Ada", params={"limit": "1"})).json()
                assert len(one["messages"]) == 1 and one["more"] is not None
                older = await http.get("/api/history/Ada", params={"before": one["more"]})
                assert older.status_code == 200
                assert (await http.get("/api/history/Nobody")).status_code == 404
                assert (
                    await http.get("/api/history/Ada", params={"limit": "x"})
                ).status_code == 400
                assert (
                    await http.get("/api/history/Ada", params={"before": "m?"})
                ).status_code == 400

                page = await http.get("/")
                assert page.headers["content-type"].startswith("text/html")
                assert console.guard.action_key in page.text
                assert "script-src 'self'" in page.headers["content-security-policy"]
                for name in ("app.js", "app.css"):
                    static = await http.get(f"/static/{name}")
                    assert static.status_code == 200
                    assert static.text == (STATIC / name).read_text(encoding="utf-8")


async def test_operator_actions(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ECHO}) as lb:
            host = lb.host
            async with (
                console_on(host) as console,
                httpx.AsyncClient(base_url=console.url, headers=actions(console)) as http,
                feed_of(console) as feed,
            ):
                # local input reaches the agent, and her answer comes back to the operator on
                # the feed: nothing else woke her turn, so it is neither published nor a draft
                posted = await http.post("/api/agents/Ada/post", json={"text": "from the desk"})
                assert posted.json() == {"posted": True}
                await feed.until(lambda r: r["kind"] == "local", "the local line")
                answer = await feed.until(
                    lambda r: r["kind"] in ("local-reply", "published", "speech-held"),
                    "Ada's answer",
                )
                assert answer["kind"] == "local-reply", answer
                assert answer["line"] == "Ada → operator: heard: from the desk"
                bad = await http.post("/api/agents/Ada/post", json={"text": "  "})
                assert bad.status_code == 400
                assert (
                    await http.post("/api/agents/Nobody/post", json={"text": "x"})
                ).status_code == 404
                not_json = await http.post("/api/agents/Ada/post", content=b"{")
                assert not_json.status_code == 400
                # a body nested past what the parser follows is bad input too, not a 500
                deep = b'{"text": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"  # within MAX_BODY
                too_deep = await http.post("/api/agents/Ada/post", content=deep)
                assert too_deep.status_code == 400 and "\n" not in too_deep.text.strip()

                # pause holds her turns; resume lets them run again
                assert (await http.post("/api/agents/Ada/pause")).json() == {"changed": True}
                [ada] = (await http.get("/api/agents")).json()
                assert ada["state"] == "held"
                send_incoming(lb.ctl, "lobby:#general", "p1", "while held")
                await lb.ctl.wait_for(incoming_answered("p1"), "stored while held")
                assert (await http.post("/api/agents/Ada/resume")).json() == {"changed": True}
                await feed.until(lambda r: "heard: while held" in (r["line"] or ""), "after resume")
                [ada] = (await http.get("/api/agents")).json()
                assert ada["state"] in ("idle", "turn")

                # reconnect ends the link in force and dials again at once
                answer = await http.post("/api/servers/lobby/reconnect")
                assert answer.json() == {"reconnect": "closing"}
                gone = await feed.until(lambda r: r["kind"] == "disconnected", "the link ended")
                assert "operator asked for a reconnect" in gone["data"]["reason"]
                ctl = await lb.listener.accept()  # the lobby's new process
                await feed.until(
                    lambda r: r["kind"] == "ready" and r["seq"] > gone["seq"], "ready again"
                )
                assert (await http.post("/api/servers/nowhere/reconnect")).status_code == 404
                await ctl.wait_for(answered("channels/register"), "channels again")
                [lobby] = (await http.get("/api/servers")).json()
                assert lobby["reconnects"] == 1


async def test_drafts_are_resent_and_dismissed(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ECHO}) as lb:
            host, ctl = lb.host, lb.ctl
            mark = ctl.mark()
            legacy = {"id": "lobby:#legacy", "type": "chat", "label": "legacy"}
            ctl.send({"cmd": "register", "channels": [legacy]})
            await ctl.wait_for(answered("channels/register"), "registered", since=mark)
            async with (
                console_on(host) as console,
                httpx.AsyncClient(base_url=console.url, headers=actions(console)) as http,
            ):
                for message_id in ("l1", "l2"):
                    send_incoming(ctl, "lobby:#legacy", message_id, f"text {message_id}")
                    await wait_trace(
                        lb.stream, lambda e: e.kind == "speech-held", "prose kept as a draft"
                    )
                    await host.run_until_idle()
                drafts = (await http.get("/api/agents")).json()[0]["drafts"]
                assert [d["text"] for d in drafts] == ["heard: text l1", "heard: text l2"]
                first, second = drafts[0]["id"], drafts[1]["id"]
                sent = await http.post(
                    f"/api/agents/Ada/drafts/{first}/resend",
                    json={"destination": "lobby:#general"},
                )
                assert sent.json()["ok"] is True, sent.json()
                assert "delivered" in sent.json()["result"]
                gone = await http.post(f"/api/agents/Ada/drafts/{second}/dismiss")
                assert gone.json()["ok"] is True
                left = (await http.get("/api/agents")).json()[0]["drafts"]
                assert [d["id"] for d in left] == []
                missing = await http.post(f"/api/agents/Ada/drafts/{second}/dismiss")
                assert missing.status_code == 404
                wrong = await http.post(f"/api/agents/Ada/drafts/{first}/burn")
                assert wrong.status_code == 404


async def test_the_gate_without_a_token(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            async with (
                console_on(lb.host) as console,
                httpx.AsyncClient(base_url=console.url) as http,
            ):
                assert (await http.get("/api/agents")).status_code == 200
                # an action needs the page's action key, even on loopback
                assert (await http.post("/api/agents/Ada/pause")).status_code == 401
                wrong = {ACTION_HEADER: "guess"}
                assert (await http.post("/api/agents/Ada/pause", headers=wrong)).status_code == 401
                ok = await http.post("/api/agents/Ada/pause", headers=actions(console))
                assert ok.status_code == 200
                # another site's page, or a foreign name pointed at this machine
                foreign = {"origin": "http://evil.example", **actions(console)}
                assert (
                    await http.post("/api/agents/Ada/resume", headers=foreign)
                ).status_code == 403
                assert (await http.get("/api/agents", headers=foreign)).status_code == 403
                rebound = {"host": f"evil.example:{console.port}"}
                assert (await http.get("/api/agents", headers=rebound)).status_code == 403
                own = {"origin": f"http://127.0.0.1:{console.port}", **actions(console)}
                assert (await http.post("/api/agents/Ada/resume", headers=own)).status_code == 200
                with pytest.raises(ConnectionRejected):
                    async with feed_of(console, origin="http://evil.example"):
                        pass


async def test_the_gate_with_a_token(tmp_path: Path) -> None:
    token = "console-secret-7f3a"
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            async with (
                console_on(lb.host, token) as console,
                httpx.AsyncClient(base_url=console.url) as http,
            ):
                for path in ("/", "/healthz", "/metrics", "/api/agents", "/static/app.js"):
                    assert (await http.get(path)).status_code == 401, path
                    wrong = {"authorization": "Bearer nope"}
                    assert (await http.get(path, headers=wrong)).status_code == 401, path
                # the icon alone needs no token: one picture for everyone, nothing of the host
                icon = await http.get("/favicon.ico")
                assert icon.status_code == 200
                assert icon.headers["content-type"] == "image/svg+xml"
                assert "content-security-policy" in icon.headers
                assert (await http.post("/favicon.ico")).status_code == 401
                bearer = {"authorization": f"Bearer {token}"}
                assert (await http.get("/healthz", headers=bearer)).status_code == 200
                assert (await http.get("/metrics", headers=bearer)).status_code == 200
                # the bearer header alone is enough for an action (no page can send it)
                assert (await http.post("/api/agents/Ada/pause", headers=bearer)).status_code == 200
                assert (await http.get("/", params={"token": "nope"})).status_code == 401
                signed = await http.get("/", params={"token": token})
                assert signed.status_code == 303 and signed.headers["location"] == "/"
                assert token not in signed.headers["location"]
                cookie = signed.cookies[COOKIE]
                assert "httponly" in signed.headers["set-cookie"].lower()
                browser = {"cookie": f"{COOKIE}={cookie}"}
                assert (await http.get("/api/agents", headers=browser)).status_code == 200
                # the cookie alone does not make an action: the page's key goes with it
                plain = await http.post("/api/agents/Ada/resume", headers=browser)
                assert plain.status_code == 401
                keyed = await http.post(
                    "/api/agents/Ada/resume", headers={**browser, **actions(console)}
                )
                assert keyed.status_code == 200
                with pytest.raises(ConnectionRejected):
                    async with feed_of(console):
                        pass
                async with feed_of(console, cookie=f"{COOKIE}={cookie}") as feed:
                    assert await feed.next_batch()


async def test_a_console_off_loopback_needs_a_token(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ""}, wait_ready=False) as lb:
            with pytest.raises(ConfigError, match="not a loopback address"):
                async with open_console(lb.host, "0.0.0.0:0"):
                    pass
            with pytest.raises(ConfigError, match="HOST:PORT"):
                async with open_console(lb.host, "127.0.0.1"):
                    pass


async def test_hostile_text_stays_text_and_credentials_stay_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api_key = "sk-ant-api03-verysecretkey0123456789"
    server_token = "lobby-bearer-secret-55a1"
    monkeypatch.setenv("ANTHROPIC_API_KEY", api_key)
    rules = (
        '[[rules]]\nwhen = "(?i)weather in (\\\\S+)"\n'
        'calls = [{ tool = "lobby--forecast", arguments = { city = "{1}" } }]\n'
        'say = "looked up {1}"\n'
    )
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": rules}, token=server_token) as lb:
            host, ctl = lb.host, lb.ctl
            mark = ctl.mark()
            hostile = {
                "id": "lobby:#x",
                "type": "chat",
                "label": IMG,
                "publish": {"target": "root"},
            }
            # a right-to-left override: "\u202egnp.exe" shows as "exe.png" where it is not escaped
            reversed_name = {**hostile, "id": "lobby:#y", "label": "\u202egnp.exe"}
            ctl.send({"cmd": "register", "channels": [hostile, reversed_name]})
            await ctl.wait_for(answered("channels/register"), "registered", since=mark)
            async with (
                console_on(host) as console,
                httpx.AsyncClient(base_url=console.url, headers=actions(console)) as http,
                feed_of(console) as feed,
            ):
                send_incoming(
                    ctl,
                    "lobby:#x",
                    "h1",
                    f"{SCRIPT} weather in {IMG.replace(' ', '')} {api_key} {server_token} "
                    "\u202egnp.exe",
                    author={"id": "u1", "name": SCRIPT},
                )
                await feed.until(lambda r: r["kind"] == "tool-result", "the tool's result")
                await feed.until(lambda r: r["kind"] in ("published", "speech-held"), "reply")
                await host.run_until_idle()
                await http.post("/api/agents/Ada/post", json={"text": f"{SCRIPT} {api_key}"})
                await host.run_until_idle()
                bodies = [json.dumps(feed.records)]
                for path in (
                    "/healthz",
                    "/api/console",
                    "/api/agents",
                    "/api/servers",
                    "/api/channels",
                    "/api/recent",
                    "/api/history/Ada",
                    "/",
                    "/static/app.js",
                ):
                    answer = await http.get(path)
                    assert answer.status_code == 200, path
                    bodies.append(answer.text)
                    if path.startswith("/api") or path == "/healthz":
                        assert answer.headers["content-type"] == "application/json"
                everything = "\n".join(bodies)
                assert api_key not in everything and server_token not in everything
                assert REDACTED in json.dumps(
                    feed.records, ensure_ascii=False
                )  # they were sent, and replaced
                # hostile text arrives as JSON strings in every field it was sent through
                channels = (await http.get("/api/channels")).json()
                assert any(c["label"] == IMG for c in channels)
                # a bidi control reaches no page as it is: the pages show it escaped, as the
                # transcript does
                [reversed_channel] = [c for c in channels if c["id"] == "lobby:#y"]
                assert reversed_channel["label"] == printable("\u202egnp.exe") != "\u202egnp.exe"
                stored = (await http.get("/api/history/Ada")).json()["messages"]
                assert any(printable("\u202egnp.exe") in m["line"] for m in stored)
                assert not any("\u202e" in m["line"] for m in stored)
                heard = next(r for r in feed.records if r["kind"] == "incoming")
                assert SCRIPT in heard["line"]
                assert SCRIPT in json.dumps(heard["data"])
                result = next(r for r in feed.records if r["kind"] == "tool-result")
                assert "onerror" in result["line"]


def test_the_page_sets_text_only() -> None:
    for name in ("app.js", "servers.js", "usage.js"):
        script = (STATIC / name).read_text(encoding="utf-8")
        for risky in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert script.count(risky) == 0, (name, risky)
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.S)
    assert [code for _, code in scripts] == ["", "", ""]  # no inline code
    assert [re.search(r'src="([^"]+)"', attrs)[1] for attrs, _ in scripts] == [  # type: ignore[index]
        "/static/app.js",
        "/static/servers.js",
        "/static/usage.js",
    ]
