"""The console in a real browser: headless Chromium (the system's, ``/usr/bin/chromium``) opens
the console of a host running the bundled lobby example on its scripted models, sees Ada's reply
arrive live, posts a local message, pauses an agent, and runs none of the hostile text shown.
The other tests read what the page shows as an operator would: which rows the agent filter
leaves visible, where the transcript is scrolled, the answer to a question asked on the page, a
draft resent to a channel picked on the page, a collapsed line, the icon, a narrow screen.

The host runs on its own trio loop in a thread; Playwright's synchronous API drives the browser
from the test. With ``MCPLIVE_SCREENSHOT=PATH`` the test also saves a screenshot of the console
there (how the README's picture is made).
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.cli.command import _bundled_config
from actors.web.console import open_console

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
TIMEOUT_MS = 60_000

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is missing")
if not CHROMIUM.exists():
    pytest.skip(
        f"no browser: {CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True
    )


class HostThread:
    """The bundled lobby host with its console, on a trio loop in a thread of its own."""

    def __init__(self, data_dir: Path, config: dict[str, Any] | None = None) -> None:
        self.data_dir = data_dir
        self.config = _bundled_config(data_dir) if config is None else config
        self.started: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.thread = threading.Thread(target=self._run, name="host", daemon=True)
        self.token: trio.lowlevel.TrioToken | None = None
        self.stop: trio.Event | None = None
        self.host: Host | None = None

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to the test, which is waiting
            self.started.put(exc)

    async def _main(self) -> None:
        async with Host.open(self.config) as host:
            async with open_console(host, "127.0.0.1:0") as console:
                self.host = host
                self.token = trio.lowlevel.current_trio_token()
                self.stop = trio.Event()
                self.started.put(console.url)
                await self.stop.wait()

    def call(self, fn: Any, *args: Any) -> Any:
        return trio.from_thread.run_sync(fn, *args, trio_token=self.token)

    def emit(self, kind: str, **fields: Any) -> None:
        assert self.host is not None
        self.call(lambda: self.host.ctx.trace.emit(kind, **fields))


@contextmanager
def running_host(
    data_dir: Path, config: dict[str, Any] | None = None
) -> Iterator[tuple[HostThread, str]]:
    runner = HostThread(data_dir, config)
    runner.thread.start()
    got = runner.started.get(timeout=120)
    if isinstance(got, BaseException):
        raise got
    try:
        yield runner, got
    finally:
        if runner.stop is not None:
            runner.call(runner.stop.set)
        runner.thread.join(timeout=60)


def test_the_console_in_a_browser(tmp_path: Path) -> None:
    with running_host(tmp_path / "data") as (runner, url), sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 760})
            dialogs: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url)
            transcript = page.locator("#transcript")
            # the lobby's Alice says hello; Ada's answer appears without a reload
            transcript.get_by_text("Ada → Hi there! Ada here.").first.wait_for()
            assert page.locator("#link").text_content() == "live"
            shot = os.environ.get("MCPLIVE_SCREENSHOT")
            if shot:  # the README's picture: the lobby a little later, before the hostile text
                transcript.get_by_text("Ada → I looked up Paris for you.").first.wait_for()
                page.screenshot(path=shot)

            # hostile text in every field the transcript shows: sender, channel, tool result
            runner.emit(
                "incoming",
                server_id="lobby",
                channel_id=HOSTILE,
                data={"author": HOSTILE, "text": HOSTILE},
            )
            runner.emit(
                "tool-result",
                agent="Ada",
                data={"tool": HOSTILE, "content": [{"type": "text", "text": HOSTILE}]},
            )
            # and through a real path: the operator's own input, posted from the page
            page.select_option("#compose-agent", "Ada")
            page.fill("#compose-text", f"a note for Ada {HOSTILE}")
            page.click("#compose button[type=submit]")
            transcript.get_by_text(f"operator → Ada: a note for Ada {HOSTILE}").wait_for()
            transcript.get_by_text(f"{HOSTILE} | {HOSTILE}: {HOSTILE}").wait_for()
            assert page.locator("#transcript img").count() == 0
            assert page.locator("#transcript script").count() == 0

            # pause Grace from the agents page; her card says so, and so does the host
            page.click("nav button[data-page=agents]")
            grace = page.locator(".card[data-agent=Grace]")
            grace.get_by_role("button", name="Pause").click()
            grace.locator(".chip", has_text="held").wait_for()
            assert runner.host is not None
            assert runner.host.ctx.agent_statuses["Grace"].held is True

            # the history page opens on Ada's newest stored messages, the operator's note too
            page.click("nav button[data-page=history]")
            page.locator("#history").get_by_text("a note for Ada", exact=False).first.wait_for()
            assert page.locator("#history img").count() == 0

            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert dialogs == []
        finally:
            browser.close()


@contextmanager
def console_page(
    tmp_path: Path,
    *,
    config: dict[str, Any] | None = None,
    viewport: dict[str, int] | None = None,
) -> Iterator[tuple[HostThread, Any]]:
    """A page on the console of the bundled lobby (or ``config``), once Ada's first reply shows."""
    data_dir = tmp_path / "data"
    with (
        running_host(data_dir, config) as (runner, url),
        sync_api.sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport=viewport or {"width": 1280, "height": 760})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url)
            page.locator("#transcript").get_by_text("Ada → Hi there! Ada here.").first.wait_for()
            yield runner, page
        finally:
            browser.close()


def visible_rows(page: Any, agent: str) -> Any:
    return page.locator(f"#transcript li[data-agent={agent}]:visible")


def test_the_agent_filter_hides_the_other_agents_lines(tmp_path: Path) -> None:
    expect = sync_api.expect
    with console_page(tmp_path) as (_, page):
        visible_rows(page, "Grace").first.wait_for()  # Grace has answered too
        page.select_option("#filter-agent", "Grace")
        expect(visible_rows(page, "Ada")).to_have_count(0, timeout=TIMEOUT_MS)
        assert page.locator("#transcript li[data-agent=Ada]").count() > 0  # there, but hidden
        assert visible_rows(page, "Grace").count() > 0
        assert page.locator("#transcript li[data-agent='']:visible").count() > 0  # the lobby's
        page.select_option("#filter-agent", "")
        visible_rows(page, "Ada").first.wait_for()


AT_TAIL = """() => {
    const list = document.getElementById("transcript");
    return list.scrollHeight > list.clientHeight + 50
        && list.scrollTop + list.clientHeight >= list.scrollHeight - 2;
}"""
ROWS = "() => document.getElementById('transcript').childElementCount"


def test_the_transcript_follows_its_tail_unless_scrolled_up(tmp_path: Path) -> None:
    expect = sync_api.expect
    with console_page(tmp_path, viewport={"width": 1100, "height": 420}) as (_, page):
        page.wait_for_function(AT_TAIL)  # more lines than it shows, the newest in view
        # a visit to another page while lines arrive; back, the newest are in view
        page.click("nav button[data-page=agents]")
        rows = page.evaluate(ROWS)
        page.wait_for_function(f"() => ({ROWS})() >= {rows + 3}")
        page.click("nav button[data-page=transcript]")
        page.wait_for_function(AT_TAIL)
        new_lines = page.locator("#new-lines")
        assert new_lines.is_hidden()

        # the operator scrolls up to read: the view stays, and the new lines are counted
        page.evaluate(
            """() => {
                const list = document.getElementById("transcript");
                list.scrollTop = 0;
                list.dispatchEvent(new Event("scroll"));
            }"""
        )
        expect(new_lines).to_have_text(re.compile(r"^[0-9]+ new lines? ↓$"), timeout=TIMEOUT_MS)
        assert page.evaluate("document.getElementById('transcript').scrollTop") == 0
        new_lines.click()  # back to the tail, which it follows again
        page.wait_for_function(AT_TAIL)
        expect(new_lines).to_be_hidden()
        rows = page.evaluate(ROWS)
        page.wait_for_function(f"() => ({ROWS})() >= {rows + 2}")
        page.wait_for_function(AT_TAIL)


def with_agent(tmp_path: Path, name: str, say: str, servers: list[str]) -> dict[str, Any]:
    """The bundled lobby with a third agent, ``name``, whose scripted model says ``say`` to
    whatever woke her. Only the operator's input wakes her (her gate skips everything), so her
    turns are the operator's alone."""
    config = _bundled_config(tmp_path / "data")
    model = tmp_path / "model.toml"
    model.write_text(f"[[rules]]\nwhen = '.'\nsay = '{say}'\n", encoding="utf-8")
    gate = tmp_path / "gate.toml"
    gate.write_text('default = "skip"\n', encoding="utf-8")
    config["agents"].append(
        {
            "name": name,
            "model": f"scripted:{model}",
            "gate": str(gate),
            "prose_mode": "hybrid",
            "servers": servers,
        }
    )
    return config


def test_an_operators_question_is_answered_in_the_console(tmp_path: Path) -> None:
    expect = sync_api.expect
    # Lin hears no server: nothing but the operator's question is in her context
    config = with_agent(tmp_path, "Lin", "Hello, operator.", [])
    with console_page(tmp_path, config=config) as (_, page):
        transcript = page.locator("#transcript")
        page.select_option("#compose-agent", "Lin")
        page.fill("#compose-text", "hello Lin, are you there?")
        page.click("#compose button[type=submit]")
        transcript.get_by_text("operator → Lin: hello Lin, are you there?").wait_for()
        # her answer comes back to the operator, as the answer: not a draft with no route
        transcript.get_by_text("Lin → operator: Hello, operator.").wait_for()
        assert transcript.locator("li[data-kind=speech-held][data-agent=Lin]").count() == 0
        page.click("nav button[data-page=agents]")
        lin = page.locator(".card[data-agent=Lin]")
        lin.wait_for()
        expect(lin.locator("li[data-draft]")).to_have_count(0)


def test_a_draft_is_resent_to_a_channel_picked_on_the_page(tmp_path: Path) -> None:
    expect = sync_api.expect
    # Lin hears the lobby, and her prose names a channel it does not have
    config = with_agent(tmp_path, "Lin", ">>>#nowhere Saved for later.", ["lobby"])
    with console_page(tmp_path, config=config) as (_, page):
        page.select_option("#compose-agent", "Lin")
        page.fill("#compose-text", "please keep a draft")
        page.click("#compose button[type=submit]")
        # her prose named a channel that does not exist: a draft with no place of its own
        page.locator("#transcript li[data-kind=speech-held][data-agent=Lin]").wait_for()
        page.click("nav button[data-page=agents]")
        draft = page.locator(".card[data-agent=Lin] li[data-draft]")
        picker = draft.locator("select.destination")
        # the picker lists the channels Lin hears, registered by the lobby
        general, random = (
            json.dumps(["lobby", f"lobby:#{c}"], separators=(",", ":"))
            for c in ("general", "random")
        )  # as the page writes an option's value
        picker.locator(f"option[value='{general}']").wait_for(state="attached")
        assert picker.locator(f"option[value='{random}']").count() == 1
        picker.select_option(general)
        draft.get_by_role("button", name="Resend").click()
        expect(draft).to_have_count(0, timeout=TIMEOUT_MS)  # sent: no longer a draft
        page.click("nav button[data-page=transcript]")
        page.locator("#transcript").get_by_text("#general | Lin → Saved for later.").wait_for()


def test_a_collapsed_line_reads_as_words(tmp_path: Path) -> None:
    with console_page(tmp_path) as (runner, page):
        for n in range(12):  # events with no line of their own, from one source
            runner.emit("gate-decision", server_id="flood", data={"wake": False, "n": n})
        row = page.locator("#transcript li[data-kind=collapsed]", has_text="from flood")
        row.wait_for()
        line = row.locator(".text").text_content() or ""
        assert "gate decision events" in line, line
        assert "{" not in line and '"' not in line, line


def test_the_console_has_an_icon(tmp_path: Path) -> None:
    with console_page(tmp_path) as (_, page):
        answer = page.request.get(page.url.rstrip("/") + "/favicon.ico")
        assert answer.status == 200
        assert answer.headers["content-type"].startswith("image/svg+xml")
        assert b"<svg" in answer.body()
        assert page.locator("link[rel=icon]").get_attribute("href") == "/favicon.ico"


def test_lines_read_normally_on_a_narrow_screen(tmp_path: Path) -> None:
    with console_page(tmp_path, viewport={"width": 420, "height": 800}) as (_, page):
        row = page.locator("#transcript li", has_text="Ada → Hi there! Ada here.").first
        box = row.bounding_box()
        text_box = row.locator(".text").bounding_box()
        assert box is not None and text_box is not None
        assert text_box["width"] > 200, text_box
        assert box["width"] > 2 * box["height"], box
        assert page.evaluate("document.documentElement.scrollWidth") <= 420


def test_the_usage_page_draws_the_ledger_and_the_model_s_view_opens(tmp_path: Path) -> None:
    """The Usage page draws a bar a day (Ada's part of today's bar is there), her budget card
    and the ledger's rows; the Agents page shows her model and context fill, and opens what her
    model saw; a turn's usage line in the transcript opens it too."""
    with console_page(tmp_path) as (runner, page):
        page.click("nav button[data-page=usage]")
        chart = page.locator("#usage-chart svg.chart")
        chart.wait_for()
        assert chart.get_attribute("data-days") == "30"
        page.locator("#usage-chart rect[data-agent=Ada]").first.wait_for()
        assert "tokens" in (
            page.locator("#usage-chart rect[data-agent=Ada] title").first.text_content() or ""
        )
        page.locator("#usage-budgets .card[data-budget=Ada]").get_by_text("tokens today").wait_for()
        rows = page.locator("#usage-table tbody tr", has_text="Ada")
        rows.first.wait_for()
        assert "scripted:" in (rows.first.text_content() or "")
        page.select_option("#usage-days", "7")
        page.wait_for_function(
            "document.querySelector('#usage-chart svg.chart').dataset.days === '7'"
        )

        page.click("nav button[data-page=agents]")
        ada = page.locator(".card[data-agent=Ada]")
        # the context fill of her newest request, against her context_tokens (8,000)
        ada.get_by_text(re.compile(r"\d+ of 8000 tokens \(\d+ %\) in turn \d+")).wait_for()
        ada.get_by_role("button", name="What the model saw").click()
        view = page.locator("#request-view")
        view.wait_for(state="visible")
        page.locator("#request-facts").get_by_text("input tokens of its 8,000").wait_for()
        shown = json.loads(page.locator("#request-body").text_content() or "")
        assert shown["model"].startswith("scripted:") and shown["messages"]
        assert page.locator("#request-body *").count() == 0  # text, never markup
        view.get_by_role("button", name="Close").click()
        view.wait_for(state="hidden")
        page.click("nav button[data-page=transcript]")  # a turn's usage line opens it too
        page.locator("#transcript li[data-kind=turn-usage][data-agent=Grace]").first.click()
        view.wait_for(state="visible")
        page.locator("#request-title").get_by_text("What Grace's model saw").wait_for()
        view.get_by_role("button", name="Close").click()
        shots = os.environ.get("MCPLIVE_SCREENSHOTS")
        if shots:  # the docs' pictures of each page
            for name in ("transcript", "agents", "servers", "channels", "history", "usage"):
                page.click(f"nav button[data-page={name}]")
                page.wait_for_timeout(1500)  # let the page draw; only for the pictures
                page.screenshot(path=str(Path(shots) / f"console-{name}.png"))
        del runner


def test_the_history_page_lists_every_agent_with_times_and_ids(tmp_path: Path) -> None:
    with console_page(tmp_path) as (_, page):
        page.click("nav button[data-page=history]")
        page.select_option("#history-agent", "")  # all agents
        page.fill("#history-q", "hello")
        page.click("#history-form button[type=submit]")
        history = page.locator("#history")
        history.locator("li[data-agent=Ada]").first.wait_for()
        history.locator("li[data-agent=Grace]").first.wait_for()
        first = history.locator("li").first
        assert first.get_attribute("data-id") == first.locator(".id").text_content()
        assert re.search(r"\d{1,2}:\d{2}:\d{2}", first.locator(".time").text_content() or "")
        page.fill("#history-until", "2000-01-01")  # a day long before anything was stored
        page.click("#history-form button[type=submit]")
        sync_api.expect(history.locator("li")).to_have_count(0, timeout=TIMEOUT_MS)


def test_the_servers_page_shows_uptime_traffic_latency_and_disconnects(tmp_path: Path) -> None:
    with console_page(tmp_path) as (_, page):
        page.click("nav button[data-page=servers]")
        lobby = page.locator(".card[data-server=lobby]")
        lobby.get_by_text(re.compile(r"\(up \d+")).wait_for()
        lobby.get_by_text(re.compile(r"p50 \d+ ms · p95 \d+ ms")).wait_for()
        assert lobby.locator("svg.traffic polyline").count() == 2
        assert page.locator("#fleet").is_hidden()  # the embedded store has no fleet
        lobby.get_by_role("button", name="Reconnect").click()
        lobby.locator("ol.disconnects li").first.wait_for()
        lobby.locator(".chip", has_text="ready").wait_for()  # and back
        assert lobby.locator("ol.disconnects li").first.text_content()


def test_the_servers_page_shows_the_fleet_of_a_postgresql_store(
    tmp_path: Path, pg_dsn: str
) -> None:
    from store.leases import LeaseTable

    with LeaseTable(pg_dsn, lease_s=600) as table:  # another host holds Grace
        assert table.step("beta", ["agent:Grace"]).taken == ("agent:Grace",)
    config = _bundled_config(tmp_path / "data")
    config["host"].update(store=pg_dsn, host_id="alpha")
    with console_page(tmp_path, config=config) as (_, page):
        page.click("nav button[data-page=servers]")
        fleet = page.locator("#fleet")
        fleet.get_by_role("heading", name="Fleet").wait_for()
        hosts = fleet.locator("ul.fleet-hosts")
        hosts.get_by_text(re.compile(r"^alpha: last heartbeat \d+ s ago \(this host\)$")).wait_for()
        hosts.get_by_text(re.compile(r"^beta: last heartbeat \d+ s ago$")).wait_for()
        # Ada's lease is this host's own (its keeper took it); Grace's is beta's
        holder = fleet.locator("ul.fleet-leases li[data-resource='agent:Grace']")
        sync_api.expect(holder).to_have_text(
            re.compile(r"^agent:Grace → beta, epoch 1, expires in ")
        )
        mine = fleet.locator("ul.fleet-leases li[data-resource='agent:Ada']")
        sync_api.expect(mine).to_have_text(re.compile(r"^agent:Ada → alpha, epoch 1, expires in "))
        assert page.evaluate("window.__pwned") is None
