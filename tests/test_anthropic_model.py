"""AnthropicModel against the fake Messages API over real loopback HTTP, plus pure-function tests.

The network tests use the real clock with small backoff values and assert the order of what
happened, never how long it took. One test drives the backoff sleeps with a trio MockClock.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
import re
from collections.abc import Mapping
from typing import Any

import anthropic
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.kernel import backoff_delay
from actors.models.anthropic import (
    MISSING_RESULT,
    NOTICE_PREFIX,
    START_PLACEHOLDER,
    AnthropicModel,
    to_messages_api,
)
from actors.models.base import (
    ModelAuthError,
    ModelError,
    ModelReply,
    ModelRetry,
    ToolSpec,
)
from tests.fake_anthropic import (
    Disconnect,
    FakeScript,
    Garbled,
    HttpError,
    Reply,
    Stall,
    StreamError,
    serve_fake_anthropic,
    text_block,
    tool_use_block,
)
from tests.model_requests import Deltas, request_for, user

KEY = "sk-test-key"
EPH = {"type": "ephemeral"}
TIMEOUT = 30


@pytest.fixture
async def fake(nursery: trio.Nursery) -> tuple[FakeScript, str]:
    script = FakeScript()
    base_url = await nursery.start(serve_fake_anthropic, script)
    return script, base_url


def make_model(base_url: str, notices: list[str] | None = None, **kw: Any) -> AnthropicModel:
    options: dict[str, Any] = {
        "api_key": KEY,
        "base_url": base_url,
        "backoff_base_s": 0.002,
        "backoff_cap_s": 0.02,
        "notice": notices.append if notices is not None else None,
    }
    options.update(kw)
    return AnthropicModel("claude-test", **options)


def sent_key(headers: Mapping[str, str]) -> str | None:
    """The API key as the SDK sent it: ``x-api-key``, or ``Authorization: Bearer`` (SDK 2.x)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


NOTICE_RE = re.compile(r"anthropic: (?P<what>.+), retry (?P<n>\d+)/(?P<of>\d+) in [0-9.e-]+s")


# --- streaming -----------------------------------------------------------------------------------


async def test_text_streams_deltas_in_order(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    text = "Hello, streaming world! Several pieces arrive."
    script.add(Reply(blocks=[text_block(text)], chunk_size=5, input_tokens=21, output_tokens=9))
    tools = [ToolSpec(name="get_time", description="Current time", input_schema={"type": "object"})]
    deltas = Deltas()
    model = make_model(base_url)
    assert model.name == "anthropic:claude-test"
    with trio.fail_after(TIMEOUT):
        reply = await model.complete(request_for([user("hi")], tools=tools, max_tokens=77), deltas)

    assert deltas.items == [text[i : i + 5] for i in range(0, len(text), 5)]
    assert "".join(deltas.items) == reply.text == text
    assert reply == ModelReply(
        blocks=({"type": "text", "text": text},),
        stop_reason="end_turn",
        model="claude-fake",
        usage={"input_tokens": 21, "output_tokens": 9},
    )
    [sent] = script.requests
    assert sent.method == "POST" and sent.path == "/v1/messages"
    assert sent_key(sent.headers) == KEY
    assert sent.body["stream"] is True
    assert sent.body["model"] == "claude-test"
    assert sent.body["max_tokens"] == 77
    # the system text is marked (and with it the tools before it), and so is the last block
    assert sent.body["system"] == [{"type": "text", "text": "You are terse.", "cache_control": EPH}]
    assert sent.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPH}]}
    ]
    assert sent.body["tools"] == [
        {"name": "get_time", "description": "Current time", "input_schema": {"type": "object"}}
    ]


async def test_tool_round_then_final_text(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    tool_input = {"tz": "Europe/Paris", "nested": {"list": [1, 2, 3], "flag": True}}
    script.add(
        Reply(
            blocks=[
                text_block("Let me check."),
                tool_use_block("toolu_01", "get_time", tool_input),
            ],
            stop_reason="tool_use",
            chunk_size=3,
        ),
        Reply(blocks=[text_block("It is noon.")]),
    )
    model = make_model(base_url)
    history: list[dict[str, Any]] = [user("What time is it?")]
    with trio.fail_after(TIMEOUT):
        first = await model.complete(request_for(history))
        assert first.stop_reason == "tool_use"
        assert first.blocks == (
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_time", "input": tool_input},
        )
        history.append({"role": "assistant", "blocks": list(first.blocks)})
        history.append(
            {
                "role": "tool",
                "blocks": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": [{"type": "text", "text": "12:00"}],
                        "is_error": False,
                    }
                ],
            }
        )
        second = await model.complete(request_for(history))
    assert second.text == "It is noon."
    assert second.tool_uses == ()

    assert len(script.requests) == 2
    # the second request marks where the first one ended (to read it) and its own end
    assert script.requests[1].body["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What time is it?", "cache_control": EPH}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_time", "input": tool_input},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": "12:00"}],
                    "is_error": False,
                    "cache_control": EPH,
                }
            ],
        },
    ]


async def test_non_streaming_json_reply_is_served_too(fake: tuple[FakeScript, str]) -> None:
    # The fake also answers plain (non-streaming) requests, for clients that need them.
    script, base_url = fake
    script.add(Reply(blocks=[text_block("plain")]))
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=base_url, max_retries=0)
    try:
        with trio.fail_after(TIMEOUT):
            message = await client.messages.create(
                model="claude-test",
                max_tokens=10,
                messages=[{"role": "user", "content": "hi"}],
            )
    finally:
        await client.close()
    assert [b.type for b in message.content] == ["text"]
    assert script.requests[0].body.get("stream") in (None, False)


# --- retries -------------------------------------------------------------------------------------


async def test_overloaded_twice_then_success(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    overloaded = HttpError(status=529, error_type="overloaded_error", message="Overloaded")
    script.add(overloaded, overloaded, Reply(blocks=[text_block("finally")]))
    notices: list[str] = []
    model = make_model(base_url, notices, rng=random.Random(7))
    with trio.fail_after(TIMEOUT):
        reply = await model.complete(request_for([user("hi")]))
    assert reply.text == "finally"
    assert len(script.requests) == 3
    twin = random.Random(7)
    expected = []
    for n in (1, 2):
        delay = backoff_delay(n, 0.002, 0.02, twin)
        expected.append(f"anthropic: overloaded (529), retry {n}/4 in {delay:.2g}s")
    assert notices == expected


async def test_persistent_500_gives_up_after_max_retries(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    for _ in range(5):
        script.add(HttpError(status=500, error_type="api_error", message="Internal server error"))
    notices: list[str] = []
    model = make_model(base_url, notices, max_retries=3)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await model.complete(request_for([user("hi")]))
    message = str(info.value)
    assert "\n" not in message
    assert "500" in message and "Internal server error" in message
    assert "4 attempts" in message
    assert len(script.requests) == 4
    assert [NOTICE_RE.fullmatch(n) is not None for n in notices] == [True] * 3
    assert [n.split(", retry ")[1].split(" in ")[0] for n in notices] == ["1/3", "2/3", "3/3"]
    assert all(n.startswith("anthropic: server error (500)") for n in notices)


async def test_401_fails_without_retry(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(
        HttpError(status=401, error_type="authentication_error", message="invalid x-api-key"),
        Reply(blocks=[text_block("never sent")]),
    )
    notices: list[str] = []
    model = make_model(base_url, notices)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await model.complete(request_for([user("hi")]))
    assert str(info.value) == "anthropic: HTTP 401 authentication_error: invalid x-api-key"
    assert len(script.requests) == 1
    assert notices == []
    assert script.remaining == 1


@pytest.mark.parametrize(
    ("status", "error_type", "problem"),
    [
        (401, "authentication_error", "refused the credential"),
        (403, "permission_error", "denied the credential permission"),
    ],
)
async def test_a_refused_credential_is_an_auth_error(
    fake: tuple[FakeScript, str], status: int, error_type: str, problem: str
) -> None:
    script, base_url = fake
    script.add(HttpError(status=status, error_type=error_type, message="no"))
    with trio.fail_after(TIMEOUT), pytest.raises(ModelAuthError) as info:
        await make_model(base_url).complete(request_for([user("hi")]))
    assert str(info.value) == f"anthropic: HTTP {status} {error_type}: no"
    assert (info.value.provider, info.value.problem) == ("anthropic", problem)
    assert info.value.credential == "the key passed in"
    assert len(script.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type"), [(400, "invalid_request_error"), (404, "not_found_error")]
)
async def test_other_client_errors_are_no_auth_errors(
    fake: tuple[FakeScript, str], status: int, error_type: str
) -> None:
    script, base_url = fake
    script.add(HttpError(status=status, error_type=error_type, message="nope"))
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await make_model(base_url).complete(request_for([user("hi")]))
    assert not isinstance(info.value, ModelAuthError)


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(400, "invalid_request_error"), (403, "permission_error"), (404, "not_found_error")],
)
async def test_client_errors_fail_without_retry(
    fake: tuple[FakeScript, str], status: int, error_type: str
) -> None:
    script, base_url = fake
    script.add(HttpError(status=status, error_type=error_type, message="nope"))
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError, match=f"HTTP {status} {error_type}"):
        await make_model(base_url).complete(request_for([user("hi")]))
    assert len(script.requests) == 1


async def test_each_retry_reaches_the_request_before_its_wait(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    script.add(
        HttpError(status=529, error_type="overloaded_error", message="Overloaded"),
        Reply(blocks=[text_block("ok")]),
    )
    retries: list[ModelRetry] = []
    notices: list[str] = []

    def on_retry(retry: ModelRetry) -> None:
        # told before the retry is sent: only the first attempt has reached the server
        assert len(script.requests) == 1
        retries.append(retry)

    model = make_model(base_url, notices, rng=random.Random(5))
    with trio.fail_after(TIMEOUT):
        reply = await model.complete(request_for([user("hi")], on_retry=on_retry))
    assert reply.text == "ok"
    wait = backoff_delay(1, 0.002, 0.02, random.Random(5))
    assert retries == [
        ModelRetry(
            provider="anthropic", failure="overloaded (529)", attempt=1, retries=4, wait_s=wait
        )
    ]
    assert (
        notices == [retries[0].line] == [f"anthropic: overloaded (529), retry 1/4 in {wait:.2g}s"]
    )


async def test_usage_carries_the_cache_counts_when_reported(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    script.add(
        Reply(
            blocks=[text_block("cached")],
            input_tokens=12,
            output_tokens=5,
            cache_read_input_tokens=1000,
            cache_creation_input_tokens=40,
        )
    )
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url).complete(request_for([user("hi")]))
    assert reply.usage == {
        "input_tokens": 12,
        "output_tokens": 5,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 40,
    }


async def test_429_retry_after_is_honoured(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(
        HttpError(
            status=429,
            error_type="rate_limit_error",
            message="slow down",
            headers={"retry-after": "0.05"},
        ),
        Reply(blocks=[text_block("ok")]),
    )
    notices: list[str] = []
    model = make_model(base_url, notices, backoff_cap_s=1.0)
    with trio.fail_after(TIMEOUT):
        reply = await model.complete(request_for([user("hi")]))
    assert reply.text == "ok"
    assert notices == ["anthropic: rate limited (429), retry 1/4 in 0.05s"]


async def test_mid_stream_error_is_retried(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(
        StreamError(error_type="overloaded_error", prefix_blocks=[text_block("Partial")]),
        Reply(blocks=[text_block("Whole answer")]),
    )
    events: list[str] = []
    model = make_model(base_url, notices=None, notice=lambda n: events.append(f"notice:{n}"))

    async def on_delta(text: str) -> None:
        events.append(f"delta:{text}")

    with trio.fail_after(TIMEOUT):
        reply = await model.complete(request_for([user("hi")]), on_delta)
    assert reply.text == "Whole answer"
    assert len(script.requests) == 2
    notice_at = next(i for i, e in enumerate(events) if e.startswith("notice:"))
    assert "".join(e[6:] for e in events[:notice_at]) == "Partial"
    assert events[notice_at].startswith(
        "notice:anthropic: overloaded (mid-stream overloaded_error), retry 1/4 in "
    )
    assert "".join(e[6:] for e in events[notice_at + 1 :]) == "Whole answer"


async def test_mid_stream_error_that_persists_gives_up(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    for _ in range(3):
        script.add(StreamError(error_type="api_error", message="Internal error"))
    model = make_model(base_url, max_retries=2)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await model.complete(request_for([user("hi")]))
    assert str(info.value) == (
        "anthropic: mid-stream api_error: Internal error (gave up after 3 attempts)"
    )
    assert len(script.requests) == 3


async def test_mid_stream_permanent_error_is_not_retried(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(StreamError(error_type="invalid_request_error", message="bad"))
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError, match="mid-stream invalid_request"):
        await make_model(base_url).complete(request_for([user("hi")]))
    assert len(script.requests) == 1


async def test_dropped_connection_mid_stream_is_retried(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(Disconnect(prefix_blocks=[text_block("cut")]), Reply(blocks=[text_block("done")]))
    notices: list[str] = []
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url, notices).complete(request_for([user("hi")]))
    assert reply.text == "done"
    assert len(notices) == 1 and notices[0].startswith("anthropic: connection error, retry 1/4")


async def test_connection_refused_gives_up() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nothing listens on this port now
    notices: list[str] = []
    model = make_model(f"http://127.0.0.1:{port}", notices, max_retries=1)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await model.complete(request_for([user("hi")]))
    assert str(info.value).startswith("anthropic: connection error")
    assert "(gave up after 2 attempts)" in str(info.value)
    assert len(notices) == 1


async def test_500_then_success(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(HttpError(status=500, message="boom"), Reply(blocks=[text_block("fine")]))
    notices: list[str] = []
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url, notices).complete(request_for([user("hi")]))
    assert reply.text == "fine"
    assert len(script.requests) == 2
    assert len(notices) == 1 and notices[0].startswith("anthropic: server error (500), retry 1/4")


async def test_a_500_with_a_body_nested_too_deeply_is_retried(
    fake: tuple[FakeScript, str],
) -> None:
    script, base_url = fake
    deep = "[" * 100_000 + "]" * 100_000
    script.add(HttpError(status=500, raw_body=deep), Reply(blocks=[text_block("fine")]))
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url).complete(request_for([user("hi")]))
    assert reply.text == "fine"
    assert len(script.requests) == 2


GARBLED = [
    Garbled(prefix_blocks=[text_block("Half an ans")]),  # an event that is not JSON
    Garbled(  # JSON, but a delta naming no block
        data=json.dumps({"type": "content_block_delta", "delta": {"type": "text_delta"}})
    ),
    Garbled(event="message_start", data=json.dumps({"type": "message_start"})),  # no message
    Garbled(data="[" * 100_000 + "]" * 100_000),  # nested past what the parser can follow
]


@pytest.mark.parametrize("garbled", GARBLED)
async def test_a_malformed_stream_fails_the_call_in_one_line(
    fake: tuple[FakeScript, str], garbled: Garbled
) -> None:
    script, base_url = fake
    script.add(garbled, garbled)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await make_model(base_url, max_retries=1).complete(request_for([user("hi")]))
    message = str(info.value)
    assert message.startswith("anthropic: malformed stream event: ")
    assert message.endswith("(gave up after 2 attempts)") and "\n" not in message
    assert len(script.requests) == 2


async def test_a_malformed_stream_is_retried(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    script.add(GARBLED[0], Reply(blocks=[text_block("whole")]))
    notices: list[str] = []
    with trio.fail_after(TIMEOUT):
        reply = await make_model(base_url, notices).complete(request_for([user("hi")]))
    assert reply.text == "whole"
    assert len(notices) == 1 and notices[0].startswith("anthropic: malformed stream, retry 1/4")


@pytest.mark.parametrize(
    "stall", [Stall(), Stall(head=True, prefix_blocks=[text_block("I was say")])]
)
async def test_a_model_that_never_answers_is_bounded(
    fake: tuple[FakeScript, str], stall: Stall
) -> None:
    # each attempt is bounded: a server that says nothing (or stops mid-stream) fails it
    script, base_url = fake
    script.add(stall, stall)
    model = make_model(base_url, max_retries=1, timeout_s=0.2)
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError) as info:
        await model.complete(request_for([user("hi")]))
    assert str(info.value) == (
        "anthropic: no complete reply within 0.2s (gave up after 2 attempts)"
    )
    assert len(script.requests) == 2


def test_the_attempt_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        AnthropicModel("claude-test", timeout_s=0)


async def test_exhausted_script_fails_fast(fake: tuple[FakeScript, str]) -> None:
    script, base_url = fake
    with trio.fail_after(TIMEOUT), pytest.raises(ModelError, match="script exhausted"):
        await make_model(base_url).complete(request_for([user("hi")]))
    assert len(script.requests) == 1


async def test_backoff_sleeps_follow_the_trio_clock(
    fake: tuple[FakeScript, str], mock_clock: trio.testing.MockClock
) -> None:
    # Default backoff (1 s base): the sleeps pass in virtual time, exactly as scheduled.
    # The clock jumps only once every task has waited 0.5 s of real time, which loopback I/O
    # never needs; virtual time then moves only by the backoff sleeps.
    mock_clock.autojump_threshold = 0.5
    script, base_url = fake
    overloaded = HttpError(status=529, error_type="overloaded_error", message="Overloaded")
    script.add(overloaded, overloaded, Reply(blocks=[text_block("ok")]))
    model = AnthropicModel("claude-test", api_key=KEY, base_url=base_url, rng=random.Random(3))
    twin = random.Random(3)
    planned = sum(backoff_delay(n, 1.0, 30.0, twin) for n in (1, 2))
    start = trio.current_time()
    with trio.fail_after(120):
        reply = await model.complete(request_for([user("hi")]))
    assert reply.text == "ok"
    assert trio.current_time() - start == pytest.approx(planned)


# --- the key -------------------------------------------------------------------------------------


async def test_missing_key_is_a_model_error(
    fake: tuple[FakeScript, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, base_url = fake
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    model = AnthropicModel("claude-test", base_url=base_url)
    with pytest.raises(ModelAuthError) as info:
        await model.complete(request_for([user("hi")]))
    assert str(info.value) == "ANTHROPIC_API_KEY is not set"
    assert (info.value.problem, info.value.credential) == ("has no credential", "ANTHROPIC_API_KEY")
    assert script.requests == []


async def test_key_comes_from_the_environment(
    fake: tuple[FakeScript, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, base_url = fake
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    script.add(Reply(blocks=[text_block("ok")]))
    with trio.fail_after(TIMEOUT):
        await AnthropicModel("claude-test", base_url=base_url).complete(request_for([user("x")]))
    assert sent_key(script.requests[0].headers) == "sk-from-env"


# --- the fake itself -----------------------------------------------------------------------------


async def test_fake_request_log_keeps_the_newest(nursery: trio.Nursery) -> None:
    script = FakeScript(log_limit=2)
    base_url = await nursery.start(serve_fake_anthropic, script)
    model = make_model(base_url)
    for word in ("one", "two", "three"):
        script.add(Reply(blocks=[text_block(word)]))
        with trio.fail_after(TIMEOUT):
            await model.complete(request_for([user(word)]))
    assert [r.body["messages"][0]["content"][0]["text"] for r in script.requests] == [
        "two",
        "three",
    ]
    assert script.dropped_requests == 1


# --- backoff_delay -------------------------------------------------------------------------------


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@settings(deadline=None)
@given(
    attempt=st.integers(1, 200),
    base=st.floats(0.001, 10.0),
    cap=st.floats(0.001, 120.0),
    seed=st.integers(0, 2**32),
)
def test_backoff_delay_is_capped_and_jittered_within_bounds(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    delay = backoff_delay(attempt, base, cap, random.Random(seed))
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 64))
    assert ceiling / 2 <= delay <= ceiling <= cap


@settings(deadline=None)
@given(
    attempt=st.integers(1, 30),
    base=st.floats(0.001, 10.0),
    r=st.floats(0.0, 1.0, exclude_max=True),
)
def test_backoff_delay_doubles_per_attempt_below_the_cap(
    attempt: int, base: float, r: float
) -> None:
    cap = float("inf")
    now = backoff_delay(attempt, base, cap, FixedRandom(r))
    after = backoff_delay(attempt + 1, base, cap, FixedRandom(r))
    assert after == pytest.approx(2 * now)
    assert now == pytest.approx(base * 2 ** (attempt - 1) * (0.5 + r / 2))


def test_backoff_delay_jitter_varies() -> None:
    rng = random.Random(1)
    assert len({backoff_delay(3, 1.0, 30.0, rng) for _ in range(20)}) > 1
    with pytest.raises(ValueError):
        backoff_delay(0, 1.0, 30.0, rng)


# --- to_messages_api: examples -------------------------------------------------------------------

PNG = base64.b64encode(b"\x89PNG fake").decode()


def test_conversion_examples() -> None:
    stored: list[dict[str, Any]] = [
        {"role": "assistant", "blocks": [{"type": "text", "text": "Hello, I am ready."}]},
        {"role": "system", "blocks": [{"type": "text", "text": "server time joined"}]},
        {
            "role": "user",
            "blocks": [
                {"type": "text", "text": "   "},
                {"type": "image", "data": PNG, "mimeType": "image/png"},
                {"type": "image", "uri": "file:///tmp/x.png", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "mem://notes", "text": "..."}},
                {"type": "resource_link", "uri": "mem://other", "name": "other"},
            ],
        },
        {"role": "user", "blocks": [{"type": "text", "text": "and?"}]},
        {
            "role": "assistant",
            "blocks": [
                {"type": "text", "text": ""},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}},
                {"type": "tool_use", "id": "t2", "name": "read", "input": {"p": 2}},
            ],
        },
        {"role": "system", "blocks": [{"type": "text", "text": "tool list changed"}]},
        {
            "role": "tool",
            "blocks": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "one"},
                        {"type": "image", "data": PNG, "mimeType": "image/png"},
                    ],
                    "is_error": False,
                },
                {"type": "tool_result", "tool_use_id": "zz", "content": [], "is_error": True},
            ],
        },
        {"role": "assistant", "blocks": [{"type": "text", "text": "Done.  \n"}]},
    ]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    assert to_messages_api(stored) == [
        {"role": "user", "content": [{"type": "text", "text": START_PLACEHOLDER}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello, I am ready."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": NOTICE_PREFIX + "server time joined"},
                image,
                {"type": "text", "text": "[resource: file:///tmp/x.png]"},
                {"type": "text", "text": "[resource: mem://notes]"},
                {"type": "text", "text": "[resource: mem://other]"},
                {"type": "text", "text": "and?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "read", "input": {"p": 1}},
                {"type": "tool_use", "id": "t2", "name": "read", "input": {"p": 2}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "one"}, image],
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": MISSING_RESULT}],
                    "is_error": True,
                },
                {"type": "text", "text": NOTICE_PREFIX + "tool list changed"},
                {"type": "text", "text": "[result of tool call zz (error)]\n(no output)"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Done."}]},
    ]


def test_conversion_of_nothing_is_one_user_placeholder() -> None:
    assert to_messages_api([]) == [
        {"role": "user", "content": [{"type": "text", "text": START_PLACEHOLDER}]}
    ]


# --- to_messages_api: properties -----------------------------------------------------------------

TEXTS = st.one_of(st.sampled_from(["", " ", "\n\t", "hi", "two words ", "  pad  "]), st.text())
ROLES = st.sampled_from(["user", "assistant", "tool", "system"])


def _text_strategy() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda t: {"type": "text", "text": t}, TEXTS)


def _media_strategy() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(
            lambda m: {"type": "image", "data": PNG, "mimeType": m},
            st.sampled_from(["image/png", "image/webp", "image/svg+xml"]),
        ),
        st.just({"type": "image", "uri": "file:///i.png", "mimeType": "image/png"}),
        st.just({"type": "audio", "data": "AAAA", "mimeType": "audio/wav"}),
        st.just({"type": "resource", "resource": {"uri": "mem://r", "text": "x"}}),
        st.just({"type": "resource_link", "uri": "mem://l"}),
        st.just({"type": "mystery"}),
    )


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Stored messages in any role order; tool results often answer the last tool calls."""
    messages: list[dict[str, Any]] = []
    issued = 0
    recent: list[str] = []
    for role in draw(st.lists(ROLES, max_size=10)):
        blocks: list[dict[str, Any]] = []
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.sampled_from(["text", "text", "media", "tool_use", "tool_result"]))
            if kind == "text":
                blocks.append(draw(_text_strategy()))
            elif kind == "media":
                blocks.append(draw(_media_strategy()))
            elif kind == "tool_use":
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": f"t{issued}",
                        "name": draw(st.sampled_from(["read", "write"])),
                        "input": {"n": issued},
                    }
                )
                issued += 1
            else:
                if bool(recent) and draw(st.booleans()):
                    target = draw(st.sampled_from(recent))
                else:
                    target = f"t{draw(st.integers(0, issued + 2))}"
                content = draw(st.lists(st.one_of(_text_strategy(), _media_strategy()), max_size=3))
                blocks.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": target,
                        "content": content,
                        "is_error": draw(st.booleans()),
                    }
                )
        if role == "assistant":
            recent = [b["id"] for b in blocks if b["type"] == "tool_use"]
        messages.append({"role": role, "blocks": blocks})
    return messages


def _texts_in(block: Mapping[str, Any]) -> list[str]:
    if block["type"] == "text":
        return [block["text"]]
    if block["type"] == "tool_result":
        return [t for b in block["content"] for t in _texts_in(b)]
    return []


def assert_valid_for_the_api(turns: list[dict[str, Any]]) -> None:
    assert turns, "never empty"
    assert turns[0]["role"] == "user"
    for a, b in itertools.pairwise(turns):
        assert {a["role"], b["role"]} == {"user", "assistant"}, "roles alternate"
    for i, turn in enumerate(turns):
        content = turn["content"]
        assert content, "no empty turn"
        for block in content:
            for text in _texts_in(block):
                assert text.strip(), "no empty text"
            if block["type"] == "tool_result":
                assert block["content"], "no empty tool result"
        types = [b["type"] for b in content]
        if turn["role"] == "assistant":
            assert set(types) <= {"text", "tool_use"}
            asked = [b["id"] for b in content if b["type"] == "tool_use"]
            if asked:
                assert i + 1 < len(turns), "every tool_use is answered"
                answered = {
                    b["tool_use_id"] for b in turns[i + 1]["content"] if b["type"] == "tool_result"
                }
                assert set(asked) <= answered
        else:
            assert "tool_use" not in types
            n_results = types.count("tool_result")
            assert types[:n_results] == ["tool_result"] * n_results, "results come first"
            ids = [b["tool_use_id"] for b in content if b["type"] == "tool_result"]
            assert len(ids) == len(set(ids))
            if ids:
                assert i > 0
                previous = {b["id"] for b in turns[i - 1]["content"] if b["type"] == "tool_use"}
                assert set(ids) <= previous
    if turns[-1]["role"] == "assistant" and turns[-1]["content"][-1]["type"] == "text":
        text = turns[-1]["content"][-1]["text"]
        assert text == text.rstrip()


@settings(max_examples=300, deadline=None)
@given(conversations())
def test_to_messages_api_output_is_valid_and_keeps_pairs(messages: list[dict[str, Any]]) -> None:
    turns = to_messages_api(messages)
    assert_valid_for_the_api(turns)

    out_results: dict[str, list[dict[str, Any]]] = {}
    for turn in turns:
        for block in turn["content"]:
            if block["type"] == "tool_result":
                out_results.setdefault(block["tool_use_id"], []).append(block)

    # A result that answered a call of the latest assistant message before it stays a result.
    last_asked: list[str] = []
    seen_since: set[str] = set()
    for message in messages:
        if message["role"] == "assistant":
            last_asked = [b["id"] for b in message["blocks"] if b["type"] == "tool_use"]
            seen_since = set()
            continue
        for block in message["blocks"]:
            if block["type"] != "tool_result":
                continue
            tid = block["tool_use_id"]
            if tid in last_asked and tid not in seen_since:
                seen_since.add(tid)
                [kept] = out_results[tid]
                assert kept["is_error"] == block["is_error"]
                texts = [b["text"] for b in block["content"] if b["type"] == "text"]
                kept_texts = [b["text"] for b in kept["content"] if b["type"] == "text"]
                remaining = iter(kept_texts)  # input texts, in order, among placeholders
                assert all(any(k == t for k in remaining) for t in texts if t.strip())

    # No text is lost (a final assistant turn may lose trailing whitespace).
    all_text = [t for turn in turns for b in turn["content"] for t in _texts_in(b)]
    for message in messages:
        if message["role"] not in ("user", "assistant"):
            continue
        for block in message["blocks"]:
            if block["type"] == "text" and block["text"].strip():
                assert any(block["text"].rstrip() in t for t in all_text)
