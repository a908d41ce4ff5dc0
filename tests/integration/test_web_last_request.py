""" "What did the model see?": the console's ``/api/agents/NAME/request`` shows an agent's newest
model request as its provider sent it, with the input tokens the provider counted for it,
for the scripted model and for the Anthropic and OpenAI-compatible providers against their
fakes on loopback HTTP.

A real Host (real store in a temp dir), woken by a local message; real HTTP to the console.
Real clock, generous deadlines, order-only assertions.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors import Host
from actors.web.console import open_console
from tests import fake_anthropic as fa
from tests import fake_openai as fo
from tests.helpers import drain_ready

pytestmark = pytest.mark.slow

QUESTION = "What is the tallest mountain on Mars?"
ANSWER = "Olympus Mons."


@asynccontextmanager
async def model_for(provider: str, tmp_path: Path) -> AsyncIterator[str]:
    if provider == "scripted":
        rules = tmp_path / "ada.toml"
        rules.write_text(f'[[rules]]\nwhen = "Mars"\nsay = "{ANSWER}"\n', encoding="utf-8")
        yield f"scripted:{rules}"
        return
    async with trio.open_nursery() as nursery:
        if provider == "anthropic":
            api = await nursery.start(
                fa.serve_fake_anthropic, fa.FakeScript([fa.Reply(blocks=[fa.text_block(ANSWER)])])
            )
            yield f"anthropic:claude-fake@{api}"
        else:
            api = await nursery.start(fo.serve_fake_openai, fo.FakeScript([fo.Reply(text=ANSWER)]))
            yield f"openai:gpt-fake@{api}"
        nursery.cancel_scope.cancel()


def agent_entry(spec: str) -> dict[str, Any]:
    model, _, base_url = spec.partition("@")
    entry: dict[str, Any] = {"name": "Ada", "model": model, "system_prompt": "You are Ada."}
    if base_url:
        entry["base_url"] = base_url
    return entry


@pytest.mark.parametrize("provider", ["scripted", "anthropic", "openai"])
async def test_the_console_shows_the_request_as_the_model_saw_it(
    tmp_path: Path, provider: str
) -> None:
    with trio.fail_after(120):
        async with model_for(provider, tmp_path) as spec:
            cfg = {"host": {"data_dir": str(tmp_path / "data")}, "agents": [agent_entry(spec)]}
            async with (
                Host.open(cfg, status_file=False) as host,
                open_console(host, "127.0.0.1:0", None) as console,
                httpx.AsyncClient(base_url=console.url) as http,
            ):
                before = (await http.get("/api/agents/Ada/request")).json()
                stream = host.trace(kinds={"turn-usage"})
                await host.post_local("Ada", QUESTION)
                await host.run_until_idle()
                [used] = await drain_ready(stream)
                shown = (await http.get("/api/agents/Ada/request")).json()
                missing = await http.get("/api/agents/Nobody/request")
    assert before == {"agent": "Ada", "request": None}
    assert missing.status_code == 404
    seen = shown["request"]
    body = json.loads(seen["body"])
    assert seen["truncated"] is False and seen["bytes"] == len(seen["body"].encode())
    assert (seen["turn"], seen["round"], seen["context_budget"]) == (0, 0, 60_000)
    counted = sum(used.data[k] for k in ("input_tokens", "cache_read_input_tokens"))
    counted += used.data["cache_creation_input_tokens"]
    assert seen["input_tokens"] == counted > 0
    text = json.dumps(body["messages"])
    assert QUESTION in text and ANSWER not in text  # what it read, not what it said
    if provider == "anthropic":
        assert seen["model"] == "anthropic:claude-fake" and body["model"] == "claude-fake"
        assert "You are Ada." in json.dumps(body["system"])
    elif provider == "openai":
        assert body["model"] == "gpt-fake" and body["stream"] is True
        assert body["messages"][0]["role"] == "system"
        assert "You are Ada." in body["messages"][0]["content"]
    else:
        assert body["system"] == "You are Ada."
