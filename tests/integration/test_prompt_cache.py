"""Prompt caching and model failures as an agent lives them: a real Host (real store in a temp
dir) with the bundled lobby as a stdio subprocess, and an agent on the Anthropic provider talking
to the fake Messages API on loopback HTTP, its prompt cache on.

Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.models.anthropic import AnthropicModel
from actors.models.base import Usage
from actors.trace import TraceEvent
from actors.transcript.lines import format_event
from tests.fake_anthropic import (
    FakeScript,
    Garbled,
    Reply,
    Stall,
    marked_prefixes,
    serve_fake_anthropic,
    text_block,
    tool_use_block,
)
from tests.helpers import publish_received, publishes, running_lobby, send_incoming, wait_trace

pytestmark = pytest.mark.slow

AGENTS = {"Ada": {"model": "anthropic:claude-test"}}


def of(agent: str, kind: str) -> Any:
    return lambda e: e.agent == agent and e.kind == kind


async def fake_api(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch, script: FakeScript, **model: Any
) -> None:
    """The fake on loopback; every agent's model is an AnthropicModel pointed at it."""
    base_url = await nursery.start(serve_fake_anthropic, script)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setattr(
        "actors.host.make_model",
        lambda cfg: AnthropicModel(
            cfg.model.partition(":")[2], base_url=base_url, backoff_base_s=0.01, **model
        ),
    )


def replies(host: Any, agent: str) -> list[dict[str, Any]]:
    return [m for m in host.history(agent) if m["role"] == "assistant"]


async def turn(lb: Any, message_id: str, text: str, answer: str, seen: list[TraceEvent]) -> Any:
    """One message in, one published answer out; the turn's usage event."""
    send_incoming(lb.ctl, "lobby:#general", message_id, text)
    await lb.ctl.wait_for(publish_received(answer), f"answer {answer!r}")
    used = await wait_trace(lb.stream, of("Ada", "turn-usage"), "usage", seen)
    await lb.host.run_until_idle()
    return used


async def test_the_second_turn_reads_the_prefix_the_first_turn_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # turn one calls a lobby tool, then answers; turn two answers
    script = FakeScript(
        [
            Reply(
                blocks=[tool_use_block("tu_1", "lobby--forecast", {"city": "Lima"})],
                stop_reason="tool_use",
            ),
            Reply(blocks=[text_block("Lima looks sunny.")]),
            Reply(blocks=[text_block("Still here.")]),
        ],
        prompt_cache=True,
    )
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await fake_api(nursery, monkeypatch, script)
            async with running_lobby(tmp_path, AGENTS) as lb:
                first = await turn(lb, "u1", "weather in Lima?", "Lima looks sunny.", seen)
                second = await turn(lb, "u2", "are you there?", "Still here.", seen)

                # the same prefix is marked on consecutive requests, byte for byte (but for the
                # marks): the system text (and tools), and the end of the request before,
                # which the next marks to read it (the tool round as read back from the store
                # on turn two is the same bytes as it was sent within turn one)
                one, two, three = (marked_prefixes(r.body) for r in script.requests)
                assert len(one) == 2 and len(two) == 3 and len(three) == 3
                assert two[:2] == one
                assert three[:2] == [two[0], two[2]]
                # the stored metadata shows what each call wrote and read
                calls = [Usage.of(m["metadata"]["usage"]) for m in replies(lb.host, "Ada")]
                assert calls[0].cache_read_input_tokens == 0
                assert calls[0].cache_creation_input_tokens > 0
                assert calls[1].cache_read_input_tokens == calls[0].cache_creation_input_tokens
                assert calls[2].cache_read_input_tokens == (
                    calls[1].cache_read_input_tokens + calls[1].cache_creation_input_tokens
                )
                # and so does the transcript, a line per turn
                turns = (calls[0] + calls[1], calls[2])
                for used, total in zip((first, second), turns, strict=True):
                    assert format_event(used) == f"· Ada: turn used {total.describe()} tokens"
                assert f"cache {calls[2].cache_read_input_tokens:,} read" in str(
                    format_event(second)
                )
            nursery.cancel_scope.cancel()


async def test_with_context_hooks_the_next_turn_reads_up_to_the_injection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the lobby injects a status line before the newest message on every turn: each turn
    # marks the end of what came before it, and the next turn reads that
    answers = ["One.", "Two.", "Three."]
    script = FakeScript([Reply(blocks=[text_block(a)]) for a in answers], prompt_cache=True)
    seen: list[TraceEvent] = []
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await fake_api(nursery, monkeypatch, script)
            async with running_lobby(tmp_path, AGENTS, "--context") as lb:
                for n, answer in enumerate(answers):
                    await turn(lb, f"u{n}", f"message {n}", answer, seen)
                bodies = [r.body for r in script.requests]
                assert all("[context from lobby" in str(b["messages"]) for b in bodies)
                second, third = marked_prefixes(bodies[1]), marked_prefixes(bodies[2])
                # turn two's marks: system, before its injection, its end; turn three marks
                # the second of them again to read it
                assert len(second) == 3
                assert second[1] in third
                assert b"[context from lobby" not in second[1]
                calls = [Usage.of(m["metadata"]["usage"]) for m in replies(lb.host, "Ada")]
                assert calls[2].cache_read_input_tokens > calls[1].cache_read_input_tokens > 0
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("failure", "line"),
    [
        (Garbled(prefix_blocks=[text_block("Half an ans")]), "malformed stream event"),
        (Stall(head=True, prefix_blocks=[text_block("Half an ans")]), "no complete reply"),
    ],
)
async def test_a_failed_stream_fails_the_turn_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Any, line: str
) -> None:
    # a garbled stream, or one that stops and never goes on (each attempt is bounded), after
    # some text: the turn fails in one line, stores no half reply, and the next turn goes on
    script = FakeScript([failure, failure, Reply(blocks=[text_block("Whole answer.")])])
    seen: list[TraceEvent] = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await fake_api(nursery, monkeypatch, script, max_retries=1, timeout_s=0.5)
            async with running_lobby(tmp_path, AGENTS) as lb:
                send_incoming(lb.ctl, "lobby:#general", "u1", "hello Ada")
                error = await wait_trace(lb.stream, of("Ada", "error"), "the failure", seen)
                await lb.host.run_until_idle()
                shown = format_event(error)
                assert shown is not None and "\n" not in shown
                assert shown.startswith(f"! Ada: anthropic: {line}")
                assert shown.endswith("(gave up after 2 attempts)")
                # nothing of the half reply is stored or published
                assert replies(lb.host, "Ada") == []
                stored = [m for m in lb.host.history("Ada") if m["role"] == "system"]
                assert any(
                    m["metadata"].get("kind") == "turn-failed"
                    and m["blocks"][0]["text"].startswith(f"turn failed: anthropic: {line}")
                    for m in stored
                )
                assert "Half an ans" not in str(lb.host.history("Ada"))
                assert publishes(lb.ctl) == []
                # the agent goes on with the next message
                send_incoming(lb.ctl, "lobby:#general", "u2", "still there?")
                await lb.ctl.wait_for(publish_received("Whole answer."), "the next answer")
                await wait_trace(lb.stream, of("Ada", "turn-end"), "the next turn", seen)
                await lb.host.run_until_idle()
                assert [m["blocks"] for m in replies(lb.host, "Ada")] == [
                    [text_block("Whole answer.")]
                ]
                assert len(script.requests) == 3
            nursery.cancel_scope.cancel()
