"""The certificate bundle is never read on the host's loop: a model call (OpenAI-compatible or
Anthropic) and a reference fetch client use the TLS context built once, in a worker thread.
Reading the bundle takes tens of milliseconds, during which no agent or server moves."""

from __future__ import annotations

import ssl
import threading
from typing import Any

import pytest
import trio

from actors.models.anthropic import AnthropicModel
from actors.models.openai import OpenAIModel
from actors.models.tls import tls_context
from actors.references.fetcher import make_client
from tests import fake_anthropic, fake_openai
from tests.model_requests import request_for, user

TIMEOUT = 30


@pytest.fixture
def bundle_reads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each read of a certificate bundle: whether it ran in the trio thread."""
    reads: list[bool] = []
    trio_thread = threading.get_ident()
    original = ssl.SSLContext.load_verify_locations

    def recording(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        reads.append(threading.get_ident() == trio_thread)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", recording)
    monkeypatch.setattr("actors.models.tls._context", None)  # built afresh for this test
    return reads


async def test_openai_calls_read_no_bundle_on_the_loop(
    nursery: trio.Nursery, bundle_reads: list[bool]
) -> None:
    script = fake_openai.FakeScript([fake_openai.Reply(text="one"), fake_openai.Reply(text="two")])
    base_url = await nursery.start(fake_openai.serve_fake_openai, script)
    model = OpenAIModel("gpt-test", api_key="k", base_url=base_url)
    with trio.fail_after(TIMEOUT):
        for _ in range(2):
            await model.complete(request_for([user("hi")]))
    assert bundle_reads == [False]  # built once, in a worker thread


async def test_anthropic_calls_read_no_bundle_on_the_loop(
    nursery: trio.Nursery, bundle_reads: list[bool]
) -> None:
    block = fake_anthropic.text_block("hello")
    script = fake_anthropic.FakeScript(
        [fake_anthropic.Reply(blocks=[block]), fake_anthropic.Reply(blocks=[block])]
    )
    base_url = await nursery.start(fake_anthropic.serve_fake_anthropic, script)
    model = AnthropicModel("claude-test", api_key="k", base_url=base_url)
    with trio.fail_after(TIMEOUT):
        for _ in range(2):
            await model.complete(request_for([user("hi")]))
    assert bundle_reads == [False]


async def test_a_fetch_client_on_the_shared_context_reads_no_bundle(
    bundle_reads: list[bool],
) -> None:
    shared = await tls_context()
    async with make_client(shared):
        pass
    assert bundle_reads == [False]
