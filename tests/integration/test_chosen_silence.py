"""A model that ends its turn on purpose with no output has a silent turn in the usage ledger, not a
failed one; a turn that errors, or whose reply is cut short with nothing in it, is not silent.

A real Host (real store in a temp dir) and a toolkit chat server in this process; the agent's
model is the Anthropic or the OpenAI-compatible provider against its fake on loopback HTTP, or a
scripted model. One line of chatter per turn; the ledger is read with ``mcplive usage --json``
and row by row.

Real clock, generous deadlines, no timing asserts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from actors import Host
from actors.cli.command import main
from actors.models.anthropic import AnthropicModel
from actors.models.base import ModelRequest
from examples.bench import silence
from tests import fake_anthropic as fa
from tests import fake_openai as fo

pytestmark = pytest.mark.slow

DEADLINE_S = 120


def openai_none_content() -> fo.Raw:
    """A stream whose message has ``content: null`` and finishes with ``stop``."""
    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-fake"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 1}},
    ]
    return fo.Raw(lines=[f"data: {json.dumps(c)}" for c in chunks] + ["data: [DONE]"])


#: Per provider: the replies, one per turn, and what the ledger must say of each turn
#: (phase, silent).
CASES: dict[str, tuple[list[Any], list[tuple[str, bool]]]] = {
    "anthropic": (
        [
            fa.Reply(blocks=[]),  # end_turn, no content
            fa.Reply(blocks=[fa.text_block(" \n ")]),  # end_turn, only whitespace
            fa.Reply(blocks=[], stop_reason="max_tokens"),  # cut short: no choice of silence
            fa.HttpError(status=400, error_type="invalid_request_error", message="bad"),
            fa.Reply(blocks=[fa.text_block("Morning.")]),
        ],
        [
            ("completed", True),
            ("completed", True),
            ("completed", False),
            ("failed", False),
            ("completed", False),
        ],
    ),
    "openai": (
        [
            fo.Reply(text=""),  # stop, empty content
            openai_none_content(),  # stop, content null
            fo.Reply(text="", finish_reason="length"),  # cut short: no choice of silence
            fo.HttpError(status=400, error_type="invalid_request_error", message="bad"),
            fo.Reply(text="Morning."),
        ],
        [
            ("completed", True),
            ("completed", True),
            ("completed", False),
            ("failed", False),
            ("completed", False),
        ],
    ),
}


def usage_json(capsys: pytest.CaptureFixture[str], data_dir: Path) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["usage", "--data-dir", str(data_dir), "--by", "agent", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


async def chatter(work: Path, agent: dict[str, Any], lines: int) -> None:
    """``lines`` lines of chatter to a host whose one agent is ``agent``."""
    server = silence.ChatServer(volatile=False)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        cfg = {
            "host": {"data_dir": str(work / "data")},
            "servers": [{"id": "chatter", "url": url}],
            "agents": [{"name": "Ada", **agent}],
        }
        async with Host.open(cfg, status_file=False) as host:
            await server.accepted.wait()
            for n in range(lines):
                await server.room.send(f"line {n}", author={"id": "bob", "name": "bob"})
                await host.run_until_idle()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("provider", sorted(CASES))
async def test_a_reply_with_nothing_in_it_is_a_silent_turn_and_an_error_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], provider: str
) -> None:
    replies, expected = CASES[provider]
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            if provider == "anthropic":
                script: Any = fa.FakeScript(replies)
                api = await nursery.start(fa.serve_fake_anthropic, script)
                model = "anthropic:claude-fake"
            else:
                script = fo.FakeScript(replies)
                api = await nursery.start(fo.serve_fake_openai, script)
                model = "openai:gpt-fake"
            await chatter(tmp_path, {"model": model, "base_url": api}, len(replies))
            nursery.cancel_scope.cancel()
    assert script.remaining == 0
    rows = silence.ledger(tmp_path / "data", "Ada")
    assert [(r.phase, r.silent) for r in rows] == expected
    [total] = usage_json(capsys, tmp_path / "data")
    assert total["silent_turns"] == 2
    assert total["calls"] == 4  # the failed turn's call returned no reply


async def test_a_scripted_model_that_says_nothing_has_silent_turns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "ada.toml"
    rules.write_text('[[rules]]\nwhen = "line 1$"\nsay = "One."\n', encoding="utf-8")
    with trio.fail_after(DEADLINE_S):
        await chatter(tmp_path, {"model": f"scripted:{rules}"}, 3)
    rows = silence.ledger(tmp_path / "data", "Ada")
    assert [(r.phase, r.silent) for r in rows] == [
        ("completed", True),
        ("completed", False),
        ("completed", True),
    ]
    [total] = usage_json(capsys, tmp_path / "data")
    assert (total["silent_turns"], total["calls"]) == (2, 3)


async def test_whitespace_alone_is_no_reply_but_whitespace_beside_text_is_kept(
    nursery: trio.Nursery,
) -> None:
    script = fa.FakeScript(
        [
            fa.Reply(blocks=[fa.text_block("\n"), fa.text_block("  ")]),
            fa.Reply(blocks=[fa.text_block("One."), fa.text_block("\n\n"), fa.text_block("Two.")]),
        ]
    )
    api = await nursery.start(fa.serve_fake_anthropic, script)
    model = AnthropicModel("claude-fake", api_key="k", base_url=api)
    request = ModelRequest(agent="Ada", system="", messages=[])
    with trio.fail_after(DEADLINE_S):
        nothing = await model.complete(request)
        something = await model.complete(request)
    assert (nothing.blocks, nothing.stop_reason) == ((), "end_turn")
    assert something.text == "One.\n\nTwo."
