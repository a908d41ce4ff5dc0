"""The console's parts without a server: its address rules and config keys, the gate's
decisions, the feed's bounds (a follower that falls behind, the recent records, the followers'
cap), its records made by the transcript's printer, and the reconnect switch."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from actors.config import ConfigErrors, load_config
from actors.errors import ConfigError
from actors.link.reconnect import REASON, ReconnectSwitch
from actors.trace import TraceEvent
from actors.transcript.printer import TranscriptOptions
from actors.web.auth import (
    ACTION_HEADER,
    COOKIE,
    Guard,
    WebAddressError,
    address_problem,
    console_token,
    is_loopback,
    parse_web_address,
)
from actors.web.feed import MAX_CLIENTS, Feed, TooManyClients
from actors.web.run import console_note, web_options
from protocol.redact import REDACTED, Redactor


def agents_only(tmp_path: Path) -> dict[str, Any]:
    rules = tmp_path / "ada.toml"
    rules.write_text("", encoding="utf-8")
    return {"agents": [{"name": "Ada", "model": f"scripted:{rules}"}]}


# -- addresses and config ------------------------------------------------------------------------


@given(st.sampled_from(["127.0.0.1", "localhost", "127.8.9.10"]), st.integers(0, 65535))
def test_an_address_parses_back_to_its_parts(host: str, port: int) -> None:
    assert parse_web_address(f"{host}:{port}") == (host, port)
    assert address_problem(f"{host}:{port}", None) is None


@pytest.mark.parametrize("value", ["", "127.0.0.1", "127.0.0.1:99999", "x:y", "h:1/path", 7340])
def test_a_bad_address_is_one_line(value: Any) -> None:
    with pytest.raises(WebAddressError):
        parse_web_address(value)
    problem = address_problem(value, None)
    assert problem is not None and problem.startswith("host.web:") and "\n" not in problem


def test_ipv6_and_names() -> None:
    assert parse_web_address("[::1]:0") == ("::1", 0)
    assert is_loopback("::1") and is_loopback("LOCALHOST") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert not is_loopback("192.168.1.2")


def test_off_loopback_needs_a_token_variable(tmp_path: Path) -> None:
    base = agents_only(tmp_path)
    with pytest.raises(ConfigErrors) as caught:
        load_config({**base, "host": {"web": "0.0.0.0:7340", "data_dir": str(tmp_path)}})
    [problem] = caught.value.problems
    assert "not a loopback address" in problem and "web_token_env" in problem
    cfg = load_config({**base, "host": {"web": "0.0.0.0:7340", "web_token_env": "CONSOLE_TOKEN"}})
    assert (cfg.web, cfg.web_token_env) == ("0.0.0.0:7340", "CONSOLE_TOKEN")
    with pytest.raises(ConfigErrors, match="web_token_env: must be the name"):
        load_config({**base, "host": {"web_token_env": "not a name"}})
    assert load_config(base).web is None


def test_run_serves_the_console_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = agents_only(tmp_path)
    plain = load_config(base)
    assert web_options(plain, flag=False) is None
    assert web_options(plain, flag=True) == web_options(plain, True)
    options = web_options(plain, flag=True)
    assert options is not None and options.address == "127.0.0.1:7340" and options.token is None
    named = load_config({**base, "host": {"web": "127.0.0.1:0", "web_token_env": "CT"}})
    monkeypatch.delenv("CT", raising=False)
    with pytest.raises(ConfigError, match="CT is not set"):
        web_options(named, flag=False)
    monkeypatch.setenv("CT", "s3cret-token")
    options = web_options(named, flag=False)
    assert options is not None and options.token == "s3cret-token"
    note = console_note("http://127.0.0.1:1/", "CT")
    assert "s3cret" not in note and "$CT" in note
    assert console_token(None) is None


# -- the gate ------------------------------------------------------------------------------------

HOST = {"host": "127.0.0.1:7340"}


def test_without_a_token_reads_pass_and_actions_need_the_key() -> None:
    guard = Guard(token=None, loopback=True)
    key = {ACTION_HEADER: guard.action_key}
    assert guard.refusal(HOST, {}, action=False) is None
    assert guard.refusal(HOST, {}, action=True) == 401
    assert guard.refusal({**HOST, ACTION_HEADER: "x"}, {}, action=True) == 401
    assert guard.refusal({**HOST, **key}, {}, action=True) is None
    own = {"origin": "http://127.0.0.1:7340"}
    assert guard.refusal({**HOST, **key, **own}, {}, action=True) is None
    assert guard.refusal({**HOST, **key, "origin": "http://evil.test"}, {}, action=True) == 403
    assert guard.refusal({"host": "evil.test:7340"}, {}, action=False) == 403
    assert Guard(token=None, loopback=True).action_key != guard.action_key


def test_with_a_token_every_request_carries_it() -> None:
    guard = Guard(token="t0ken-value", loopback=False)
    there = {"host": "console.example:7340"}
    key = {ACTION_HEADER: guard.action_key}
    assert guard.refusal(there, {}, action=False) == 401
    assert guard.refusal({**there, "authorization": "Bearer wrong"}, {}, action=False) == 401
    assert guard.refusal({**there, "authorization": "Bearer t0ken-value"}, {}, action=True) is None
    assert guard.refusal({**there, "authorization": "bearer t0ken-value"}, {}, action=False) is None
    cookie = {COOKIE: "t0ken-value"}
    assert guard.refusal(there, cookie, action=False) is None
    assert guard.refusal(there, cookie, action=True) == 401
    assert guard.refusal({**there, **key}, cookie, action=True) is None
    assert guard.refusal({**there, **key}, {COOKIE: "t0ken-valuX"}, action=True) == 401
    assert not guard.token_ok(None) and guard.token_ok("t0ken-value")


# -- the feed ------------------------------------------------------------------------------------


def record(n: int, **fields: Any) -> dict[str, Any]:
    base = {"kind": "note", "agent": None, "server_id": None, "ts": None, "data": {}}
    return {**base, "line": f"line {n}", **fields}


async def test_a_follower_that_falls_behind_loses_the_oldest_and_is_told() -> None:
    feed = Feed(client_cap=3)
    backlog, client = feed.subscribe()
    assert backlog == []
    for n in range(5):
        feed.add(record(n))
    batch = await client.next_batch()
    assert batch[0]["kind"] == "feed-skipped" and batch[0]["data"] == {"count": 2}
    assert "2 events skipped" in batch[0]["line"]
    assert [r["line"] for r in batch[1:]] == ["line 2", "line 3", "line 4"]
    feed.add(record(5))
    assert [r["line"] for r in await client.next_batch()] == ["line 5"]  # no marker now
    # exactly at the cap nothing is lost
    for n in range(3):
        feed.add(record(10 + n))
    assert [r["kind"] for r in await client.next_batch()] == ["note"] * 3


async def test_recent_records_and_the_followers_cap() -> None:
    feed = Feed(recent_cap=2)
    for n in range(3):
        feed.add(record(n))
    backlog, first = feed.subscribe()
    assert [r["line"] for r in backlog] == ["line 1", "line 2"]
    assert [r["seq"] for r in backlog] == [2, 3]
    clients = [first] + [feed.subscribe()[1] for _ in range(MAX_CLIENTS - 1)]
    with pytest.raises(TooManyClients):
        feed.subscribe()
    clients[0].close()
    feed.subscribe()  # a slot came free


async def events(items: Iterable[TraceEvent]) -> AsyncIterator[TraceEvent]:
    for item in items:
        yield item
        await trio.lowlevel.checkpoint()


async def test_records_are_the_transcripts_lines_redacted_and_collapsed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    secret = "sk-ant-secret-0123456789"
    trace = [
        TraceEvent(
            kind="incoming",
            server_id="lobby",
            channel_id="lobby:#g",
            data={"author": "<b>Eve</b>", "text": f"hi {secret}"},
        ),
        *[TraceEvent(kind="diagnostic", server_id="lobby", data={"text": "bad item 1"})] * 30,
        TraceEvent(kind="turn-usage", agent="Ada", data={"input_tokens": 5, "phase": "completed"}),
        TraceEvent(kind="declaration-mismatch", server_id="lobby", data={"text": "x differs"}),
        TraceEvent(kind="tokens", agent="Ada", data={"delta": "debug only"}),
    ]
    feed = Feed()
    _, client = feed.subscribe()
    await feed.run(events(trace), TranscriptOptions(redactor=Redactor([secret])))
    records = list(feed.recent)
    heard = records[0]
    assert heard["line"] == f"lobby lobby:#g | <b>Eve</b>: hi {REDACTED}"
    assert heard["data"]["text"] == f"hi {REDACTED}"
    kinds = [r["kind"] for r in records]
    assert kinds.count("diagnostic") < 30 and "collapsed" in kinds  # as the terminal does
    assert "tokens" not in kinds  # below the level
    assert [u["input_tokens"] for u in feed.usage["Ada"]] == [5]
    assert [m["text"] for m in feed.mismatches["lobby"]] == ["x differs"]
    assert len(await client.next_batch()) == len(records)
    assert await client.next_batch() == []  # the feed ended


# -- the reconnect switch -----------------------------------------------------------------------


class FakeLink:
    def __init__(self) -> None:
        self.closed = trio.Event()
        self.reasons: list[str] = []

    def close(self, reason: str) -> None:
        self.reasons.append(reason)
        self.closed.set()


async def test_a_reconnect_cuts_the_backoff_short(autojump_clock: trio.testing.MockClock) -> None:
    switch = ReconnectSwitch()
    start = trio.current_time()
    await switch.wait(5)
    assert trio.current_time() - start == pytest.approx(5)  # nothing asked: the whole wait
    link = FakeLink()
    assert switch.request(link) == "closing" and link.reasons == [REASON]
    assert switch.request(link) == "dialling"  # already closed
    start = trio.current_time()
    await switch.wait(300)
    assert trio.current_time() == start  # asked before the wait: none at all
    async with trio.open_nursery() as nursery:
        nursery.start_soon(switch.wait, 300)
        await trio.sleep(1)
        assert switch.request(None) == "dialling"
    assert trio.current_time() - start == pytest.approx(1)
