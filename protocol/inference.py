"""Server-initiated inference: ``inference/request`` and ``inference/chunk`` (SPEC §11).

Params are checked here and become an :class:`InferenceRequest`; the result and chunk
params are built here. :class:`RequestBudget` limits how many requests a route may make per
window of time; the caller passes the time in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from protocol.errors import INVALID_PARAMS, RpcError

MAX_MESSAGES: Final = 256
MAX_CONTENT_CHARS: Final = 200_000
MAX_TOKENS_CEILING: Final = 32_000
ROLES: Final = ("user", "assistant", "system")
FINISH_REASONS: Final = ("end_turn", "max_tokens", "stop_sequence")

_KNOWN_PREFERENCES: Final = frozenset({"maxTokens", "temperature"})


@attrs.frozen
class InferenceRequest:
    """A checked ``inference/request``.

    ``system`` holds the joined ``system`` messages; ``messages`` the rest as
    ``(role, content)``, starting with ``user``. ``hints`` holds the advisory preference
    members (``model``, ``modelTier``, ``costTier``, …).
    """

    feature_set: str
    conversation_id: str | None
    stream: bool
    system: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None
    temperature: float | None
    hints: Mapping[str, Any]


def _invalid(what: str) -> RpcError:
    return RpcError(code=INVALID_PARAMS, message=f"Invalid params: {what}")


def _read_message(index: int, raw: Any) -> tuple[str, str]:
    where = f"messages[{index}]"
    if not isinstance(raw, Mapping):
        raise _invalid(f"{where} must be an object with role and content")
    role = raw.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise _invalid(f"{where}.role must be one of {', '.join(ROLES)}")
    content = raw.get("content")
    if not isinstance(content, str):
        raise _invalid(f"{where}.content must be a string")
    if len(content) > MAX_CONTENT_CHARS:
        raise _invalid(f"{where}.content is over {MAX_CONTENT_CHARS} characters")
    return role, content


def _read_max_tokens(value: Any) -> int | None:
    if value is None:
        return None
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 1 <= value <= MAX_TOKENS_CEILING
    ):
        raise _invalid(f"preferences.maxTokens must be an integer from 1 to {MAX_TOKENS_CEILING}")
    return value


def _read_temperature(value: Any) -> float | None:
    if value is None:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0 <= value <= 2
    ):
        raise _invalid("preferences.temperature must be a number from 0 to 2")
    return float(value)


def parse_inference_request(params: Any) -> InferenceRequest:
    """Check ``inference/request`` params; ``RpcError(-32602)`` names the bad member.

    An optional member sent as JSON null counts as absent. Non-empty ``system`` messages
    are joined with a blank line between them.
    """
    if not isinstance(params, Mapping):
        raise _invalid("params must be an object")
    feature_set = params.get("featureSet")
    if not isinstance(feature_set, str) or not feature_set:
        raise _invalid("featureSet must be a non-empty string")
    conversation_id = params.get("conversationId")
    if conversation_id is not None and not isinstance(conversation_id, str):
        raise _invalid("conversationId must be a string")
    stream = params.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("stream must be a boolean")
    raw_messages = params.get("messages")
    if not isinstance(raw_messages, list):
        raise _invalid("messages must be an array")
    if not raw_messages:
        raise _invalid("messages must not be empty")
    if len(raw_messages) > MAX_MESSAGES:
        raise _invalid(f"messages has more than {MAX_MESSAGES} entries")
    read = [_read_message(i, m) for i, m in enumerate(raw_messages)]
    preferences = params.get("preferences")
    if preferences is None:
        preferences = {}
    elif not isinstance(preferences, Mapping):
        raise _invalid("preferences must be an object")
    max_tokens = _read_max_tokens(preferences.get("maxTokens"))
    temperature = _read_temperature(preferences.get("temperature"))
    system = "\n\n".join(content for role, content in read if role == "system" and content)
    messages = tuple((role, content) for role, content in read if role != "system")
    if not messages:
        raise _invalid("messages must hold a user message, not only system messages")
    if messages[0][0] != "user":
        raise _invalid("messages must start with a user message")
    hints = {k: v for k, v in preferences.items() if k not in _KNOWN_PREFERENCES}
    return InferenceRequest(
        feature_set=feature_set,
        conversation_id=conversation_id,
        stream=bool(stream),
        system=system,
        messages=messages,
        max_tokens=max_tokens,
        temperature=temperature,
        hints=MappingProxyType(hints),
    )


def finish_reason(stop_reason: str) -> str:
    """The wire ``finishReason`` for a model's stop reason; anything unknown is ``end_turn``."""
    if stop_reason in ("max_tokens", "stop_sequence"):
        return stop_reason
    return "end_turn"


def inference_result(
    *, content: str, model: str, finish_reason: str, input_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """The ``inference/request`` result; ``model`` is the model actually used."""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"unknown finish reason {finish_reason!r}")
    return {
        "content": content,
        "model": model,
        "finishReason": finish_reason,
        "usage": {"inputTokens": input_tokens, "outputTokens": output_tokens},
    }


def chunk_params(request_id: int | str, index: int, delta: str) -> dict[str, Any]:
    """``inference/chunk`` params; ``request_id`` echoes the request's JSON-RPC id."""
    return {"requestId": request_id, "index": index, "delta": delta}


class RequestBudget:
    """At most ``per_hour`` grants in any ``window`` seconds (a sliding window).

    Only the grants still inside the window are kept, so the record never holds more than
    ``per_hour`` entries. Time only moves forward: a ``now`` earlier than the last one seen
    is taken as the last one.
    """

    __slots__ = ("_expiries", "_last", "_per_hour", "_window")

    def __init__(self, per_hour: int, window: float = 3600.0) -> None:
        if per_hour < 0:
            raise ValueError("per_hour must not be negative")
        if not (window > 0 and math.isfinite(window)):
            raise ValueError("window must be a positive number of seconds")
        self._per_hour = per_hour
        self._window = float(window)
        self._expiries: deque[float] = deque(maxlen=per_hour)  # when each grant leaves
        self._last = -math.inf

    @property
    def per_hour(self) -> int:
        return self._per_hour

    @property
    def window(self) -> float:
        return self._window

    @property
    def recorded(self) -> int:
        """How many grants are on record (at most ``per_hour``)."""
        return len(self._expiries)

    def take(self, now: float) -> float | None:
        """None when a request is granted (and recorded); otherwise the seconds to wait.

        The wait is the time until the oldest grant leaves the window: taking again at
        ``now + wait`` succeeds. With ``per_hour == 0`` the wait is infinite.
        """
        if not math.isfinite(now):
            raise ValueError("now must be a finite number")
        now = max(now, self._last)
        self._last = now
        if self._per_hour == 0:
            return math.inf
        expiries = self._expiries
        while expiries and expiries[0] <= now:
            expiries.popleft()
        if len(expiries) < self._per_hour:
            expiries.append(now + self._window)
            return None
        oldest = expiries[0]
        wait = oldest - now
        while now + wait < oldest:  # rounding must not leave the caller one step short
            wait = math.nextafter(wait, math.inf)
        return wait
