"""OpenAIModel against the fake chat-completions server over real loopback HTTP.

The network tests use the real clock with small backoff values and assert the order of what
happened, never how long it took. One test drives the backoff sleeps with a trio MockClock.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

from actors.kernel import backoff_delay
from actors.models.base import (
    ModelAuthError,
    ModelError,
    ModelRetry,
    ToolSpec,
    Usage,
)
from actors.models.openai import OpenAIModel
from tests.fake_openai import (
    Cut,
    FakeScript,
    HttpError,
    Raw,
    Reply,
    Silent,
    ToolCall,
    serve_fake_openai,
)
from tests.model_requests import Deltas, request_for, user

KEY = "sk-test-key"
TIMEOUT = 30
PNG = "iVBORw0KGgo="


@pytest.fixture
async def fake(nursery: trio.Nursery) -> tuple[FakeScript, str]:
    script = FakeScript()
    base_url = await nursery.start(serve_fake_openai, script)
    return script, base_url


def make_model(base_url: str, notices: list[str] | None = None, **kw: Any) -> OpenAIModel:
    options: dict[str, Any] = {
        "api_key": KEY,
        "base_url": base_url,
        "backoff_base_s": 0.002,
        "backoff_cap_s": 0.02,
        "notice": notices.append if notices is not None else None,
    }
    options.update(kw)
    return OpenAIModel("gpt-test", **options)


FORECAST = ToolSpec(
    name="lobby--forecast",
    description="The weather",
    input_schema={"properties": {"city": {"type": "string"}}, "required": ["city"]},
)


# --- streaming, tools, images --------------------------------------------------------------------


async def test_text_streams_deltas_and_usage(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    text = "Hello, streaming world! Several pieces arrive."
    script.add(Reply(text=text, chunk_size=5, prompt_tokens=1200, completion_tokens=9))
    deltas = Deltas()
    model = make_model(base_url)
    assert model.name == "openai:gpt-test"
    with trio.fail_after(TIMEOUT):
        reply = await model.complete(
            request_for([user("hi")], tools=[FORECAST], max_tokens=321, temperature=0.4), deltas
        )
    assert "".join(deltas.items) == text and len(deltas.items) > 1
    assert reply.blocks == ({"type": "text", "text": text},)
    assert (reply.stop_reason, reply.model) == ("end_turn", "gpt-fake")
    assert Usage.of(reply.usage) == Usage(input_tokens=1200, output_tokens=9)
    [sent] = script.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    body = sent.body
    assert body["model"] == "gpt-test" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["temperature"]) == (321, 0.4)
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lobby--forecast",
                "description": "The weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]


async def test_no_temperature_is_sent_when_none_is_set(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(Reply(text="ok"))
    with trio.fail_after(TIMEOUT):
        await make_model(base_url).complete(request_for([user("hi")]))
    body = script.requests[0].body
    assert "temperature" not in body and body["max_tokens"] == 1024
    assert "tools" not in body


async def test_a_tool_round_trip(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(
        Reply(
            tool_calls=[ToolCall(id="call_1", name="lobby--forecast", arguments={"city": "Lima"})]
        ),
        Reply(text="Sunny in Lima."),
    )
    model = make_model(base_url)
    history: list[dict[str, Any]] = [user("weather in Lima?")]
    with trio.fail_after(TIMEOUT):
        first = await model.complete(request_for(history, tools=[FORECAST]))
        assert first.stop_reason == "tool_use"
        assert first.tool_uses == (
            {
                "type": "tool_use",
                "id": "call_1",
                "name": "lobby--forecast",
                "input": {"city": "Lima"},
            },
        )
        history.append({"role": "assistant", "blocks": list(first.blocks)})
        result = {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny, 24C"}
        history.append({"role": "tool", "blocks": [result]})
        second = await model.complete(request_for(history, tools=[FORECAST]))
    assert second.text == "Sunny in Lima." and second.stop_reason == "end_turn"
    sent = script.requests[1].body["messages"]
    assert sent[1:] == [
        {"role": "user", "content": "weather in Lima?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lobby--forecast", "arguments": '{"city": "Lima"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24C"},
    ]


async def test_parallel_tool_calls_are_kept_in_order(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    calls = [
        ToolCall(id="call_a", name="lobby--forecast", arguments={"city": "Lima"}),
        ToolCall(id="call_b", name="lobby--forecast", arguments={"city": "Oslo"}),
    ]
    script.add(Reply(text="Looking both up.", tool_calls=calls, chunk_size=3), Reply(text="done"))
    model = make_model(base_url)
    deltas = Deltas()
    with trio.fail_after(TIMEOUT):
        reply = await model.complete(request_for([user("Lima and Oslo?")]), deltas)
    assert "".join(deltas.items) == "Looking both up."
    assert reply.stop_reason == "tool_use"
    assert [b["type"] for b in reply.blocks] == ["text", "tool_use", "tool_use"]
    assert [(u["id"], u["input"]) for u in reply.tool_uses] == [
        ("call_a", {"city": "Lima"}),
        ("call_b", {"city": "Oslo"}),
    ]
    # the answers go back as one tool message per call, in call order, whatever order they
    # were stored in
    history = [
        user("Lima and Oslo?"),
        {"role": "assistant", "blocks": list(reply.blocks)},
        {
            "role": "tool",
            "blocks": [
                {"type": "tool_result", "tool_use_id": "call_b", "content": "snow"},
                {"type": "tool_result", "tool_use_id": "call_a", "content": "sun"},
            ],
        },
    ]
    with trio.fail_after(TIMEOUT):
        await model.complete(request_for(history))
    sent = script.requests[1].body["messages"]
    assert sent[2]["content"] == "Looking both up."
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["call_a", "call_b"]
    assert sent[3:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "sun"},
        {"role": "tool", "tool_call_id": "call_b", "content": "snow"},
    ]


async def test_images_go_as_data_urls_where_the_interface_takes_them(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    script.add(Reply(text="A cat."))
    image = {"type": "image", "data": PNG, "mimeType": "image/png"}
    history = [
        {"role": "user", "blocks": [{"type": "text", "text": "what is this?"}, image]},
        {
            "role": "assistant",
            "blocks": [{"type": "tool_use", "id": "c1", "name": "snap", "input": {}}],
        },
        {
            "role": "tool",
            "blocks": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c1",
                    "content": [{"type": "text", "text": "a photo"}, image],
                }
            ],
        },
    ]
    with trio.fail_after(TIMEOUT):
        await make_model(base_url).complete(request_for(history))
    sent = script.requests[0].body["messages"]
    data_url = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    assert sent[1] == {
        "role": "user",
        "content": [{"type": "text", "text": "what is this?"}, data_url],
    }
    # a tool message holds text; the image it returned follows in a user message
    assert sent[3] == {"role": "tool", "tool_call_id": "c1", "content": "a photo"}
    assert sent[4] == {
        "role": "user",
        "content": [{"type": "text", "text": "[images returned by tool call c1]"}, data_url],
    }


async def test_cached_prompt_tokens_are_a_cache_read(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(Reply(text="ok", prompt_tokens=2000, cached_tokens=1536, completion_tokens=5))
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url).complete(request_for([user("hi")]))
    assert Usage.of(reply.usage) == Usage(
        input_tokens=464, output_tokens=5, cache_read_input_tokens=1536
    )


# --- outcomes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "stop_reason", "text"),
    [
        (Reply(text="cut", finish_reason="length"), "max_tokens", "cut"),
        (Reply(text="", finish_reason="content_filter"), "refusal", ""),
        (Reply(refusal="I can't help with that."), "refusal", "I can't help with that."),
        (Reply(text="", finish_reason="stop"), "end_turn", ""),
    ],
)
async def test_stop_reasons_are_outcomes(
    fake: tuple[FakeScript, str], reply: Reply, stop_reason: str, text: str
) -> None:
    script, base_url = fake
    script.add(reply)
    with trio.fail_after(TIMEOUT):
        got = await make_model(base_url).complete(request_for([user("hi")]))
    assert (got.stop_reason, got.text) == (stop_reason, text)
    if not text:
        assert got.blocks == ()  # an empty completion: nothing to store, no crash


# --- failures ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "problem"),
    [(401, "refused the credential"), (403, "denied the credential permission")],
)
async def test_a_refused_key_is_an_auth_error_at_once(
    fake: tuple[FakeScript, str], status: int, problem: str
) -> None:
    script, base_url = fake
    script.add(
        HttpError(
            status=status, message="Incorrect API key provided", error_type="invalid_request_error"
        )
    )
    with trio.fail_after(TIMEOUT), pytest.raises(ModelAuthError) as info:
        await make_model(base_url).complete(request_for([user("hi")]))
    assert str(info.value) == (
        f"openai: HTTP {status} invalid_request_error: Incorrect API key provided"
    )
    assert (info.value.provider, info.value.problem) == ("openai", problem)
    assert len(script.requests) == 1


async def test_a_rate_limit_waits_as_long_as_retry_after_says(
    fake: tuple[FakeScript, str], mock_clock: trio.testing.MockClock
) -> None:
    # virtual time moves only by the provider's sleeps (see the Anthropic provider's test)
    mock_clock.autojump_threshold = 0.5
    script, base_url = fake
    limited = HttpError(
        status=429, message="slow down", error_type="requests", headers={"retry-after": "7"}
    )
    script.add(limited, Reply(text="ok"))
    retries: list[ModelRetry] = []
    model = OpenAIModel(
        "gpt-test", api_key=KEY, base_url=base_url, backoff_cap_s=30.0, rng=random.Random(5)
    )
    start = trio.current_time()
    with trio.fail_after(120):
        reply = await model.complete(request_for([user("hi")], on_retry=retries.append))
    assert reply.text == "ok"
    assert len(script.requests) == 2
    [retry] = retries
    assert (retry.failure, retry.attempt, retry.wait_s) == ("rate limited (429)", 1, 7.0)
    assert trio.current_time() - start == pytest.approx(7.0)


async def test_a_server_error_then_success(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(HttpError(status=500), Reply(text="made it"))
    notices: list[str] = []
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url, notices).complete(request_for([user("hi")]))
    assert reply.text == "made it"
    assert len(script.requests) == 2
    assert len(notices) == 1 and notices[0].startswith("openai: server error (500), retry 1/4 in ")


async def test_server_errors_give_up_after_the_retries(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(*[HttpError(status=503, message="busy")] * 3)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await make_model(base_url, max_retries=2).complete(request_for([user("hi")]))
    assert str(info.value) == "openai: HTTP 503 server_error: busy (gave up after 3 attempts)"
    assert len(script.requests) == 3


async def test_a_bad_request_is_not_retried(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(HttpError(status=400, message="bad tool schema", error_type="invalid_request_error"))
    with (
        trio.fail_after(TIMEOUT),
        pytest.raises(ModelError, match="HTTP 400 invalid_request_error"),
    ):
        await make_model(base_url).complete(request_for([user("hi")]))
    assert len(script.requests) == 1


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (['data: {"choices": [{"index": 0, "delta": {"content": "hal', "data: [DONE]"], "not JSON"),
        (["data: [1, 2]", "data: [DONE]"], "not a JSON object"),
        (
            [
                'data: {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c",'
                ' "function": {"name": "t", "arguments": "{\\"a\\": "}}]}}]}',
                'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}',
                "data: [DONE]",
            ],
            "malformed arguments",
        ),
    ],
)
async def test_a_malformed_stream_fails_at_once_with_nothing_returned(
    fake: tuple[FakeScript, str], lines: list[str], why: str
) -> None:
    script, base_url = fake
    script.add(Raw(lines=lines))
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await make_model(base_url).complete(request_for([user("hi")]))
    assert str(info.value).startswith("openai: malformed stream: ")
    assert why in str(info.value)
    assert len(script.requests) == 1


#: JSON nested past what the parser can follow (it recurses once per level)
DEEP = "[" * 100_000 + "]" * 100_000


async def test_a_stream_event_nested_too_deeply_is_malformed(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    script.add(Raw(lines=[f"data: {DEEP}", "data: [DONE]"]))
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await make_model(base_url).complete(request_for([user("hi")]))
    assert str(info.value).startswith("openai: malformed stream: ")
    assert "nested too deeply" in str(info.value) and "\n" not in str(info.value)


async def test_a_server_error_with_a_body_nested_too_deeply_is_retried(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    script.add(HttpError(status=500, raw_body=DEEP), Reply(text="made it"))
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url).complete(request_for([user("hi")]))
    assert reply.text == "made it"
    assert len(script.requests) == 2


async def test_a_stream_cut_short_is_retried(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(Cut(reply=Reply(text="partial words here"), events=3), Reply(text="whole"))
    deltas = Deltas()
    notices: list[str] = []
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url, notices).complete(request_for([user("hi")]), deltas)
    assert reply.text == "whole"
    assert "".join(deltas.items) == "partial whole"  # the retry streams from the start again
    assert len(notices) == 1 and "connection error" in notices[0]


async def test_a_stream_that_ends_without_done_or_finish_is_retried(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    piece = 'data: {"choices": [{"index": 0, "delta": {"content": "half"}}]}'
    script.add(Raw(lines=[piece]), Reply(text="whole"))
    notices: list[str] = []
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url, notices).complete(request_for([user("hi")]))
    assert reply.text == "whole"
    assert len(notices) == 1 and "stream cut short" in notices[0]


async def test_a_mid_stream_error_is_retried_when_transient(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(
        Raw(lines=['data: {"error": {"message": "overloaded", "code": 502}}']),
        Raw(lines=['data: {"error": {"message": "no such model", "code": 404}}']),
    )
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await make_model(base_url).complete(request_for([user("hi")]))
    assert str(info.value) == "openai: mid-stream error: no such model"
    assert len(script.requests) == 2


async def test_a_model_that_never_answers_is_bounded(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(Silent(), Silent())
    notices: list[str] = []
    model = make_model(base_url, notices, idle_timeout_s=0.2, max_retries=1)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await model.complete(request_for([user("hi")]))
    assert str(info.value) == "openai: no answer within 0.2s (gave up after 2 attempts)"
    assert len(script.requests) == 2
    assert len(notices) == 1 and notices[0].startswith("openai: no answer, retry 1/1")


async def test_a_trickle_is_bounded_by_the_attempt_deadline(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(Silent())
    model = make_model(base_url, attempt_timeout_s=0.2, max_retries=0)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError, match="no complete answer within"):
        await model.complete(request_for([user("hi")]))


# --- the key -------------------------------------------------------------------------------------


async def test_the_key_comes_from_its_variable(
    fake: tuple[FakeScript, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, base_url = fake
    monkeypatch.setenv("MY_ROUTER_KEY", "sk-router")
    script.add(Reply(text="ok"))
    model = OpenAIModel("gpt-test", base_url=base_url, key_variable="MY_ROUTER_KEY")
    with trio.fail_after(TIMEOUT):
        await model.complete(request_for([user("hi")]))
    assert script.requests[0].headers["authorization"] == "Bearer sk-router"


async def test_a_missing_key_is_an_auth_error_without_a_call(
    fake: tuple[FakeScript, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, base_url = fake
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelAuthError) as info:
        await OpenAIModel("gpt-test", base_url=base_url).complete(request_for([user("hi")]))
    assert str(info.value) == "OPENAI_API_KEY is not set"
    assert (info.value.problem, info.value.credential) == ("has no credential", "OPENAI_API_KEY")
    assert script.requests == []


async def test_a_keyless_endpoint_gets_no_authorization(
    fake: tuple[FakeScript, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, base_url = fake
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-secret")
    script.add(Reply(text="ok"), HttpError(status=401, message="key needed"))
    model = OpenAIModel("llama3", base_url=base_url, key_variable=None)
    with trio.fail_after(TIMEOUT):
        await model.complete(request_for([user("hi")]))
        with pytest.raises(ModelAuthError) as info:
            await model.complete(request_for([user("hi")]))
    for sent in script.requests:
        assert "authorization" not in sent.headers
        assert "sk-real-secret" not in repr(sent)
    assert info.value.credential.startswith("none is configured")


def test_openais_own_endpoint_gets_max_completion_tokens() -> None:
    request = request_for([user("hi")], max_tokens=50)
    assert OpenAIModel("o4").body(request)["max_completion_tokens"] == 50
    assert "max_tokens" not in OpenAIModel("o4").body(request)
    local = OpenAIModel("llama3", base_url="http://127.0.0.1:11434/v1/")
    assert local.base_url == "http://127.0.0.1:11434/v1"
    assert local.body(request)["max_tokens"] == 50


async def test_the_wait_before_a_retry_is_the_backoff_when_no_retry_after(
    fake: tuple[FakeScript, str], mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.5
    script, base_url = fake
    script.add(HttpError(status=502), HttpError(status=502), Reply(text="ok"))
    model = OpenAIModel("gpt-test", api_key=KEY, base_url=base_url, rng=random.Random(3))
    twin = random.Random(3)
    planned = sum(backoff_delay(n, 1.0, 30.0, twin) for n in (1, 2))
    start = trio.current_time()
    with trio.fail_after(120):
        await model.complete(request_for([user("hi")]))
    assert trio.current_time() - start == pytest.approx(planned)
