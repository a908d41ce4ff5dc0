"""Model failures and usage as an operator sees them: a real Host (real store in a temp dir) whose
agents use the Anthropic provider against the fake Messages API on loopback HTTP.

Real clock, generous deadlines, order-only assertions. Transcript lines are the CLI's own
``format_event`` applied to the trace events the host emitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors import Host
from actors.config import load_config
from actors.messages import AgentStatus
from actors.models.base import USAGE_KEYS, Usage
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from store import Reader, db_path
from tests.fake_anthropic import (
    FakeScript,
    HttpError,
    Reply,
    serve_fake_anthropic,
    text_block,
    tool_use_block,
)
from tests.helpers import (
    config,
    publish_received,
    received,
    running_lobby,
    scripted,
    send_incoming,
    wait_trace,
)

pytestmark = pytest.mark.slow

ADA = {"name": "Ada", "model": "anthropic:claude-test"}
HELLO = '[[rules]]\nwhen = "(?i)hello"\nsay = "Hi there!"\n'


def of(agent: str, kind: str) -> Any:
    return lambda e: e.agent == agent and e.kind == kind


def kinds(seen: list[TraceEvent], agent: str) -> list[str]:
    return [e.kind for e in seen if e.agent == agent and e.kind != "tokens"]


def status(host: Host, agent: str) -> AgentStatus:
    found = host.ctx.agent_statuses[agent]
    assert isinstance(found, AgentStatus)
    return found


def said(host: Host, agent: str) -> list[dict[str, Any]]:
    return [m for m in host.history(agent) if m["role"] == "assistant"]


def texts(request_body: dict[str, Any]) -> str:
    return str(request_body["messages"])


async def fake_api(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, script: FakeScript
) -> None:
    base_url = await nursery.start(serve_fake_anthropic, script)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")


@pytest.mark.parametrize(
    ("status_code", "error_type", "problem"),
    [
        (401, "authentication_error", "refused the credential"),
        (403, "permission_error", "denied the credential permission"),
    ],
)
async def test_a_refused_credential_pauses_the_agent_until_resumed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    status_code: int,
    error_type: str,
    problem: str,
) -> None:
    script = FakeScript([HttpError(status=status_code, error_type=error_type, message="no")])
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await fake_api(nursery, monkeypatch, script)
            bea = {"name": "Bea", "model": scripted(tmp_path, "bea", HELLO)}
            async with Host.open(config(tmp_path, [], [ADA, bea])) as host:
                stream = host.trace()
                fresh = AgentStatus(name="Ada", usage=Usage().as_dict())
                assert attrs.evolve(status(host, "Ada"), today={}) == fresh  # today: the budgets

                # one call, refused: the agent pauses with one line
                await host.post_local("Ada", "first")
                paused = await wait_trace(stream, of("Ada", "agent-paused"), "pause", seen)
                await host.run_until_idle()
                assert len(script.requests) == 1
                line = format_event(paused)
                assert line is not None and "\n" not in line
                assert line.startswith(f"! Ada paused: anthropic {problem} (HTTP {status_code} ")
                assert "no model calls until resumed" in line
                assert "fix the key (ANTHROPIC_API_KEY)" in line and "resume" in line
                assert "error" not in kinds(seen, "Ada")  # the pause is the one line
                now = status(host, "Ada")
                assert now.paused == paused.data["reason"]
                assert (now.queued, now.turns, now.last_outcome) == (1, 1, "failed")
                assert (now.wakes, now.model_errors) == (1, 1)  # the refused call
                assert not now.turn_running

                # further wakes are stored and wait; no call is made; other agents go on
                await host.post_local("Ada", "second")
                await host.post_local("Ada", "third")
                await host.post_local("Bea", "hello Bea")
                await wait_trace(stream, of("Bea", "turn-end"), "Bea's turn", seen)
                await host.run_until_idle()
                assert len(script.requests) == 1
                assert kinds(seen, "Ada").count("turn-start") == 1
                assert status(host, "Ada").queued == 3
                assert "assistant" in [m["role"] for m in host.history("Bea")]

                # resumed: one turn answers every wake that waited
                script.add(Reply(blocks=[text_block("back")]))
                assert await host.resume("Ada") is True
                resumed = await wait_trace(stream, of("Ada", "agent-resumed"), "resume", seen)
                assert format_event(resumed) == "· Ada resumed (3 waiting wakes)"
                await wait_trace(stream, of("Ada", "turn-end"), "the turn", seen)
                await host.run_until_idle()
                assert len(script.requests) == 2
                sent = texts(script.requests[1].body)
                assert all(t in sent for t in ("first", "second", "third"))
                assert kinds(seen, "Ada").count("turn-start") == 2
                assert said(host, "Ada")[-1]["blocks"] == [text_block("back")]
                after = status(host, "Ada")
                assert after.paused is None and after.queued == 0
                assert (after.turns, after.last_outcome) == (2, "completed")
                assert (after.wakes, after.model_errors) == (3, 1)
                assert after.last_turn_at is not None and not after.turn_running
                assert await host.resume("Ada") is False  # not paused any more
                # the usage ledger counts the refused call's turn as failed
                with Reader(db_path(tmp_path / "data"), read_only=True) as reader:
                    ledger = reader.usage(agent="Ada")
                assert sum(t.turns for t in ledger) == 2
                assert sum(t.failed_turns for t in ledger) == 1
                assert sum(t.calls for t in ledger) == 1
            nursery.cancel_scope.cancel()


async def test_a_missing_key_pauses_without_a_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = FakeScript()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await fake_api(nursery, monkeypatch, script)
            # the config is checked while the key is set (a missing key is a config problem);
            # the key goes away before the first call
            checked = load_config(config(tmp_path, [], [ADA]))
            monkeypatch.delenv("ANTHROPIC_API_KEY")
            async with Host.open(checked) as host:
                stream = host.trace()
                await host.post_local("Ada", "hi")
                paused = await wait_trace(stream, of("Ada", "agent-paused"), "pause")
                assert paused.data["reason"] == (
                    "anthropic has no credential (ANTHROPIC_API_KEY is not set)"
                )
                await host.post_local("Ada", "again")
                await host.run_until_idle()
                assert script.requests == []
                assert status(host, "Ada").queued == 2
            nursery.cancel_scope.cancel()


async def test_retries_are_traced_as_they_happen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the provider's own backoff on the real clock: its first wait is under a second
    script = FakeScript(
        [
            HttpError(status=529, error_type="overloaded_error", message="Overloaded"),
            Reply(blocks=[text_block("made it")]),
        ]
    )
    seen: list[TraceEvent] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await fake_api(nursery, monkeypatch, script)
            async with Host.open(config(tmp_path, [], [ADA])) as host:
                stream = host.trace()
                await host.post_local("Ada", "hi")
                retry = await wait_trace(stream, of("Ada", "model-retry"), "the retry", seen)
                assert len(script.requests) == 1  # shown before the retry is sent
                assert retry.data["failure"] == "overloaded (529)"
                assert (retry.data["attempt"], retry.data["retries"]) == (1, 4)
                assert 0 < retry.data["wait_s"] <= 1.0
                line = format_event(retry)
                assert line is not None
                assert line.startswith("? Ada: anthropic: overloaded (529), retry 1/4 in ")
                await wait_trace(stream, of("Ada", "turn-end"), "the turn", seen)
                await host.run_until_idle()
                assert len(script.requests) == 2
                order = kinds(seen, "Ada")
                assert order.index("turn-start") < order.index("model-retry")
                assert order.index("model-retry") < order.index("turn-end")
                assert order.count("model-retry") == 1
                assert said(host, "Ada")[-1]["blocks"] == [text_block("made it")]
                # the retried call counts as a model error, though the turn completed
                ada = host.ctx.agent_statuses["Ada"]
                assert (ada.model_errors, ada.last_outcome) == (1, "completed")
            nursery.cancel_scope.cancel()


async def test_usage_per_turn_is_stored_shown_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = {
        "input_tokens": 100,
        "output_tokens": 20,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 50,
    }
    second = {
        "input_tokens": 130,
        "output_tokens": 9,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 0,
    }
    total = {k: first[k] + second[k] for k in first}
    script = FakeScript(
        [
            Reply(
                blocks=[tool_use_block("tu_1", "lobby--forecast", {"city": "Lima"})],
                stop_reason="tool_use",
                **first,
            ),
            Reply(blocks=[text_block("Lima looks sunny.")], **second),
        ]
    )
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await fake_api(nursery, monkeypatch, script)
            agents = {"Ada": {"model": "anthropic:claude-test"}}
            async with running_lobby(tmp_path, agents, "--context") as lb:
                send_incoming(lb.ctl, "lobby:#general", "u1", "weather in Lima?")
                await lb.ctl.wait_for(publish_received(), "reply")
                used = await wait_trace(lb.stream, of("Ada", "turn-usage"), "usage", seen)
                await lb.host.run_until_idle()

                # stored: each call's usage on its assistant message, the running total too
                replies = said(lb.host, "Ada")
                assert [m["metadata"]["usage"] for m in replies] == [first, second]
                assert [m["metadata"]["turn_usage"] for m in replies] == [first, total]

                # shown: one line per turn
                assert {k: used.data[k] for k in total} == total
                assert (used.data["calls"], used.data["phase"]) == (2, "completed")
                assert format_event(used) == (
                    "· Ada: turn used 230 in, 29 out, cache 2,000 read, 50 written tokens"
                )
                assert kinds(seen, "Ada").count("turn-usage") == 1

                # reported: the agent's status sums it, the lifecycle carries the same counts
                assert status(lb.host, "Ada").usage == total
                await lb.ctl.wait_for(
                    lambda e: any(
                        p["params"].get("phase") == "completed"
                        for p in received(lb.ctl, "inference/lifecycle")
                    ),
                    "lifecycle completed",
                )
                [done] = [
                    p["params"]
                    for p in received(lb.ctl, "inference/lifecycle")
                    if p["params"]["phase"] == "completed"
                ]
                assert done["usage"] == {"inputTokens": 230, "outputTokens": 29}
                # and the usage ledger keeps it, with the turn and the wake
                with Reader(db_path(tmp_path / "data"), read_only=True) as reader:
                    [row] = reader.usage()
                assert (row.agent, row.model, row.calls, row.turns) == (
                    "Ada",
                    "anthropic:claude-test",
                    2,
                    1,
                )
                assert (row.server, row.channel, row.silent_turns) == ("lobby", "lobby:#general", 0)
                assert (
                    row.input_tokens,
                    row.output_tokens,
                    row.cache_read_tokens,
                    row.cache_write_tokens,
                ) == tuple(total[k] for k in USAGE_KEYS)
            nursery.cancel_scope.cancel()


async def test_status_reflects_a_hold_and_a_turn_of_a_scripted_agent(tmp_path: Path) -> None:
    with trio.fail_after(60):
        cfg = config(tmp_path, [], [{"name": "Bea", "model": scripted(tmp_path, "bea", HELLO)}])
        async with Host.open(cfg) as host:
            stream = host.trace()
            assert await host.hold("Bea") is True
            await host.post_local("Bea", "hello")
            await host.run_until_idle()
            held = status(host, "Bea")
            assert (held.held, held.queued, held.turns, held.last_outcome) == (True, 1, 0, None)
            assert await host.release("Bea") is True
            used = await wait_trace(stream, of("Bea", "turn-usage"), "usage")
            await host.run_until_idle()
            done = status(host, "Bea")
            assert (done.held, done.queued, done.turns, done.last_outcome) == (
                False,
                0,
                1,
                "completed",
            )
            # the scripted model estimates: a token per four characters, no cache
            assert done.usage["output_tokens"] == len("Hi there!") // 4 + 1
            assert done.usage["input_tokens"] > 0
            assert done.usage["cache_read_input_tokens"] == 0
            assert {k: used.data[k] for k in done.usage} == done.usage
