"""The Anthropic provider's per-agent settings against the fake Messages API on loopback HTTP:
the endpoint's credential (only the one the config names; none for an endpoint without
``api_key_env``) and the sampling settings in the request body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import trio

from actors.models.base import ModelAuthError, ModelRequest
from actors.models.providers import model_from_spec
from tests.fake_anthropic import FakeScript, HttpError, Reply, serve_fake_anthropic, text_block

REAL_KEY = "sk-ant-real-key-never-for-others"
TIMEOUT = 30


@pytest.fixture
async def fake(nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch) -> tuple[FakeScript, str]:
    monkeypatch.setenv("ANTHROPIC_API_KEY", REAL_KEY)
    monkeypatch.setenv("PROXY_KEY", "sk-proxy")
    script = FakeScript()
    base_url = await nursery.start(serve_fake_anthropic, script)
    return script, base_url


def request(**kw: Any) -> ModelRequest:
    messages = [{"role": "user", "blocks": [{"type": "text", "text": "hi"}]}]
    return ModelRequest(agent="a", system="", messages=messages, **kw)


def credentials(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k in ("x-api-key", "authorization")}


async def test_a_configured_endpoint_without_api_key_env_gets_no_key(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    script.add(Reply(blocks=[text_block("ok")]), HttpError(status=401, message="who?"))
    model = model_from_spec("anthropic:claude-test", base_url=base_url)
    with trio.fail_after(TIMEOUT):
        assert (await model.complete(request())).text == "ok"
        with pytest.raises(ModelAuthError) as info:
            await model.complete(request())
    for sent in script.requests:
        assert credentials(sent.headers) == {}
        assert REAL_KEY not in repr(sent)
    assert info.value.credential.startswith("none is configured")


async def test_api_key_env_names_the_key_the_endpoint_gets(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    script.add(Reply(blocks=[text_block("ok")]))
    model = model_from_spec("anthropic:claude-test", base_url=base_url, api_key_env="PROXY_KEY")
    with trio.fail_after(TIMEOUT):
        await model.complete(request())
    [sent] = script.requests
    # x-api-key, or Authorization: Bearer (SDK 2.x)
    assert list(credentials(sent.headers).values()) in (["sk-proxy"], ["Bearer sk-proxy"])
    assert REAL_KEY not in repr(sent)


async def test_max_tokens_and_temperature_are_sent(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(Reply(blocks=[text_block("ok")]), Reply(blocks=[text_block("ok")]))
    model = model_from_spec("anthropic:claude-test", base_url=base_url, api_key_env="PROXY_KEY")
    with trio.fail_after(TIMEOUT):
        await model.complete(request(max_tokens=777, temperature=0.25))
        await model.complete(request())
    first, second = (r.body for r in script.requests)
    assert (first["max_tokens"], first["temperature"]) == (777, 0.25)
    assert second["max_tokens"] == 1024 and "temperature" not in second


async def test_custom_headers_from_the_environment_go_only_to_anthropics_endpoint(
    fake: tuple[FakeScript, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ANTHROPIC_CUSTOM_HEADERS`` (added by the SDK to every request) belongs with the default
    endpoint: a configured ``base_url`` gets none of it, with or without a key; the endpoint
    ``ANTHROPIC_BASE_URL`` names (paired with the default key) does."""
    script, base_url = fake
    monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Gateway-Auth: gw-secret\nX-Team: core")
    for _ in range(3):
        script.add(Reply(blocks=[text_block("ok")]))
    with trio.fail_after(TIMEOUT):
        await model_from_spec("anthropic:claude-test", base_url=base_url).complete(request())
        configured = model_from_spec(
            "anthropic:claude-test", base_url=base_url, api_key_env="PROXY_KEY"
        )
        await configured.complete(request())
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
        await model_from_spec("anthropic:claude-test").complete(request())
    *configured_requests, default = script.requests
    for sent in configured_requests:
        assert "x-gateway-auth" not in sent.headers and "x-team" not in sent.headers
        assert "gw-secret" not in repr(sent)
    assert default.headers["x-gateway-auth"] == "gw-secret"
    assert default.headers["x-team"] == "core"
