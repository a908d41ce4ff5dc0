"""The console's actions leave a trace: each of Pause, Resume, Reconnect, Resend and Dismiss,
driven over real loopback HTTP against a running host and a lobby server process, prints one
transcript line naming the action and the client's address, is a ``operator-action`` event in
``--json``, and is a row of the store's audit record. A reconnect the operator asked for reads
as such, not as a crash. A reload on SIGHUP that resumes a paused agent is recorded as its.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import io
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors import Host
from actors.config import load_config
from actors.reload import reload_on_sighup
from actors.trace import TraceEvent
from actors.transcript.lines import INFO, format_event, level_of
from actors.transcript.printer import TranscriptOptions, TranscriptPrinter
from actors.web.auth import ACTION_HEADER
from actors.web.console import Console, open_console
from store import AuditEntry
from tests.helpers import answered, running_lobby, send_incoming, wait_trace
from tests.integration.test_budget import budget_config

pytestmark = pytest.mark.slow

ECHO = '[[rules]]\nwhen = "(?s)^(.*)$"\nsay = "heard: {1}"\n'
DEADLINE = 120
CONSOLE = "console 127.0.0.1"


@asynccontextmanager
async def console_client(host: Any) -> AsyncIterator[tuple[Console, httpx.AsyncClient]]:
    async with open_console(host, "127.0.0.1:0", None) as console:
        headers = {ACTION_HEADER: console.guard.action_key}
        async with httpx.AsyncClient(base_url=console.url, headers=headers) as http:
            yield console, http


def printed(event: TraceEvent, *, as_json: bool = False) -> str:
    """What the transcript prints for ``event`` (``--json``: one JSON object)."""
    out = io.StringIO()
    TranscriptPrinter(out, TranscriptOptions(json=as_json)).handle(event, 0.0)
    return out.getvalue()


async def acted(stream: Any, action: str) -> TraceEvent:
    return await wait_trace(
        stream,
        lambda e: e.kind == "operator-action" and e.data.get("action") == action,
        f"the {action} told",
    )


def last_record(host: Host) -> AuditEntry:
    return host.ctx.store.reader.audit(limit=1)[-1]


def check_told(event: TraceEvent, line: str, host: Host, **data: Any) -> None:
    """The event's transcript line, its ``--json`` record and the stored row agree."""
    assert format_event(event) == line
    assert printed(event).rstrip("\n").endswith(" " + line)  # after its local time
    record = json.loads(printed(event, as_json=True))
    assert record["kind"] == "operator-action" and record["level"] == "info"
    assert {k: record["data"][k] for k in data} == data
    row = last_record(host)
    assert (row.action, row.target, row.source, row.changed, row.detail) == (
        data["action"],
        data["target"],
        data["source"],
        data["changed"],
        record["data"]["detail"],
    )
    assert abs(row.at - event.ts) < 1e-3


async def test_pause_and_resume_from_the_console_are_told_and_recorded(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ECHO}) as lb:
            host = lb.host
            async with console_client(host) as (_, http):
                assert (await http.post("/api/agents/Ada/pause")).json() == {"changed": True}
                paused = await acted(lb.stream, "pause")
                assert paused.agent == "Ada"
                check_told(
                    paused,
                    f"· operator ({CONSOLE}): paused Ada",
                    host,
                    action="pause",
                    target="Ada",
                    source=CONSOLE,
                    changed=True,
                )
                # a second pause changes nothing, and says so
                assert (await http.post("/api/agents/Ada/pause")).json() == {"changed": False}
                again = await acted(lb.stream, "pause")
                check_told(
                    again,
                    f"· operator ({CONSOLE}): paused Ada: already held (nothing changed)",
                    host,
                    action="pause",
                    target="Ada",
                    source=CONSOLE,
                    changed=False,
                )
                assert (await http.post("/api/agents/Ada/resume")).json() == {"changed": True}
                resumed = await acted(lb.stream, "resume")
                check_told(
                    resumed,
                    f"· operator ({CONSOLE}): resumed Ada: released its turns",
                    host,
                    action="resume",
                    target="Ada",
                    source=CONSOLE,
                    changed=True,
                )
                actions = [(r.action, r.changed) for r in host.ctx.store.reader.audit()]
                assert actions == [("pause", True), ("pause", False), ("resume", True)]


async def test_a_reconnect_from_the_console_is_told_as_the_operators_not_as_a_crash(
    tmp_path: Path,
) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ECHO}) as lb:
            host = lb.host
            seen: list[TraceEvent] = []
            async with console_client(host) as (_, http):
                answer = await http.post("/api/servers/lobby/reconnect")
                assert answer.json() == {"reconnect": "closing"}
                # the record and the link's end, in either order
                while not {"disconnected", "operator-action"} <= {e.kind for e in seen}:
                    await wait_trace(
                        lb.stream,
                        lambda e: e.kind in ("disconnected", "operator-action"),
                        "the link ended and the action told",
                        seen,
                    )
                [gone] = [e for e in seen if e.kind == "disconnected"]
                [told] = [e for e in seen if e.kind == "operator-action"]
                assert told.data["action"] == "reconnect"
                check_told(
                    told,
                    f"· operator ({CONSOLE}): reconnected lobby: the link closed, dialling again",
                    host,
                    action="reconnect",
                    target="lobby",
                    source=CONSOLE,
                    changed=True,
                )
                assert told.server_id == "lobby"
                # the link's end: the operator's doing, no wait, no stderr lines, no alarm
                assert not printed(gone).split(" ", 2)[2].startswith("!")
                assert gone.data["retry_in_s"] == 0 and gone.data["stderr_tail"] == []
                assert level_of(gone) == INFO
                line = format_event(gone)
                assert line == "· lobby link closed as the operator asked; reconnecting now"
                assert gone.data["requested"] is True
                # and at once: the next link is dialled without a backoff's wait
                dialled = await wait_trace(
                    lb.stream, lambda e: e.kind == "connecting", "dialled again", seen
                )
                assert dialled.data["attempt"] == 2
                ctl = await lb.listener.accept()
                await wait_trace(lb.stream, lambda e: e.kind == "ready", "ready again", seen)
                await ctl.wait_for(answered("channels/register"), "channels again")
                assert not [e for e in seen if (format_event(e) or "").startswith("!")]
                [lobby] = (await http.get("/api/servers")).json()
                assert lobby["reconnects"] == 1 and lobby["last_error"] is None  # no error


async def test_resend_and_dismiss_from_the_console_are_told_and_recorded(tmp_path: Path) -> None:
    with trio.fail_after(DEADLINE):
        async with running_lobby(tmp_path, {"Ada": ECHO}) as lb:
            host, ctl = lb.host, lb.ctl
            mark = ctl.mark()
            legacy = {"id": "lobby:#legacy", "type": "chat", "label": "legacy"}
            ctl.send({"cmd": "register", "channels": [legacy]})
            await ctl.wait_for(answered("channels/register"), "registered", since=mark)
            async with console_client(host) as (_, http):
                for message_id in ("l1", "l2"):
                    send_incoming(ctl, "lobby:#legacy", message_id, f"text {message_id}")
                    await wait_trace(
                        lb.stream, lambda e: e.kind == "speech-held", "prose kept as a draft"
                    )
                    await host.run_until_idle()
                drafts = (await http.get("/api/agents")).json()[0]["drafts"]
                first, second = drafts[0]["id"], drafts[1]["id"]
                sent = await http.post(
                    f"/api/agents/Ada/drafts/{first}/resend",
                    json={"destination": "lobby:#general"},
                )
                assert sent.json()["ok"] is True, sent.json()
                resent = await acted(lb.stream, "resend")
                detail = resent.data["detail"]
                assert detail.startswith("resent to ") and f"{first}: delivered as" in detail
                check_told(
                    resent,
                    f"· operator ({CONSOLE}): resent drafts of Ada: {detail}",
                    host,
                    action="resend",
                    target="Ada",
                    source=CONSOLE,
                    changed=True,
                )
                gone = await http.post(f"/api/agents/Ada/drafts/{second}/dismiss")
                assert gone.json()["ok"] is True
                dismissed = await acted(lb.stream, "dismiss")
                check_told(
                    dismissed,
                    f"· operator ({CONSOLE}): dismissed drafts of Ada: "
                    f"{second}: dismissed 1 draft(s)",
                    host,
                    action="dismiss",
                    target="Ada",
                    source=CONSOLE,
                    changed=True,
                )
                actions = [r.action for r in host.ctx.store.reader.audit()]
                assert actions == ["resend", "dismiss"]


async def test_a_reload_on_sighup_that_resumes_an_agent_records_it(tmp_path: Path) -> None:
    cfg = budget_config(tmp_path)
    with trio.fail_after(60):
        async with Host.open(cfg) as host:
            stream = host.trace()
            for n in range(1, 4):  # the third turn reaches the budget
                await host.post_local("Ada", f"turn {n}")
                await host.run_until_idle()
            await wait_trace(stream, lambda e: e.kind == "budget-paused", "paused")
            assert host.ctx.store.reader.audit() == []
            async with trio.open_nursery() as nursery:
                await nursery.start(reload_on_sighup, host, lambda: load_config(cfg))
                os.kill(os.getpid(), signal.SIGHUP)
                seen: list[TraceEvent] = []
                reloaded = await wait_trace(
                    stream, lambda e: e.kind == "config-reloaded", "the reload", seen
                )
                nursery.cancel_scope.cancel()
            assert reloaded.data["resumed"] == ["Ada"]
            [told] = [e for e in seen if e.kind == "operator-action"]
            check_told(
                told,
                "· operator (SIGHUP): resumed Ada: after a config reload",
                host,
                action="resume",
                target="Ada",
                source="SIGHUP",
                changed=True,
            )
            # paused again after one more turn; a reload through the Python API names its source
            await host.post_local("Ada", "turn 4")
            await host.run_until_idle()
            await wait_trace(stream, lambda e: e.kind == "budget-paused", "paused again")
            await host.reload(cfg)
            assert [(r.source, r.action) for r in host.ctx.store.reader.audit()] == [
                ("SIGHUP", "resume"),
                ("api", "resume"),
            ]
