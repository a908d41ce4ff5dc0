"""A streamed chat completion, sans I/O: server-sent events in, one reply out.

:class:`EventDecoder` turns the bytes of a ``text/event-stream`` body into the ``data`` of each
event (``receive_data(bytes)`` in, a list of strings out, after h11's shape): lines end in LF,
CRLF or CR; ``data:`` lines of one event are joined with LF; comments (``:`` lines) and other
fields are skipped; an event is dispatched at its blank line. A line longer than ``max_line``
characters is a :class:`MalformedStream`, so memory stays bounded whatever the server sends.

:class:`ChunkAssembler` takes each event's data: a ``chat.completion.chunk`` JSON object, the
``[DONE]`` marker, or an ``{"error": ...}`` object some servers send mid-stream. It joins the text
deltas (``content``, and ``refusal`` when the model declines) and the tool calls (by their
``index``: the first piece brings ``id`` and ``function.name``, later ones append to
``function.arguments``), keeps the ``finish_reason`` and the usage of the final chunk, and builds
the :class:`~actors.models.base.ModelReply`:

* ``finish_reason`` → stop reason: ``stop`` → ``end_turn``, ``length`` → ``max_tokens``,
  ``tool_calls`` (and the older ``function_call``) → ``tool_use``, ``content_filter`` →
  ``refusal``; a reply with tool calls is ``tool_use`` and one with refusal text is ``refusal``
  whatever the server says; none or another value → ``end_turn``.
* usage: ``prompt_tokens`` less ``prompt_tokens_details.cached_tokens`` → ``input_tokens``, the
  cached tokens → ``cache_read_input_tokens``, ``completion_tokens`` → ``output_tokens``.

Anything that is not the interface's shape (data that is not JSON, a tool call with no name,
arguments that are not a JSON object, more than ``MAX_TOOL_CALLS`` calls or ``MAX_REPLY_CHARS``
characters) is a :class:`MalformedStream` naming what was wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from protocol.jsonrpc import decode

from .base import Block, ModelReply

__all__ = ["ChunkAssembler", "EventDecoder", "MalformedStream", "StreamError", "stop_reason"]

DONE = "[DONE]"
MAX_LINE = 1 << 20
MAX_TOOL_CALLS = 128
MAX_REPLY_CHARS = 4 << 20

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


class MalformedStream(Exception):
    """The stream is not a chat-completions stream; the message says what was wrong."""


class StreamError(Exception):
    """The server reported an error inside a 200 stream (``{"error": {...}}``)."""

    def __init__(self, message: str, code: object) -> None:
        super().__init__(message)
        self.code = code


def stop_reason(finish_reason: object) -> str:
    """The stop reason (the Messages API's names) for a ``finish_reason``."""
    if isinstance(finish_reason, str):
        return _STOP_REASONS.get(finish_reason, "end_turn")
    return "end_turn"


class EventDecoder:
    def __init__(self, *, max_line: int = MAX_LINE) -> None:
        self._max_line = max_line
        # the line in progress, in pieces (joined once it ends: no copy per chunk), and its size
        self._buffer: list[str] = []
        self._buffered = 0
        # the data lines of the event in progress, and the length of their join (the lines and
        # the LFs between them: empty ``data:`` lines count too, so no event grows unbounded)
        self._data: list[str] = []
        self._data_size = 0
        self._cr = False  # the last chunk ended in CR: an LF starting the next one is its pair
        self._pending = b""  # an incomplete UTF-8 sequence at the end of the last chunk

    def receive_data(self, data: bytes) -> list[str]:
        """The ``data`` of each event that ``data`` completes, in order."""
        raw = self._pending + data
        cut = _utf8_boundary(raw)
        self._pending = raw[cut:]
        text = raw[:cut].decode("utf-8", "replace")
        if self._cr and text.startswith("\n"):
            text = text[1:]
        self._cr = text.endswith("\r")
        events: list[str] = []
        lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines[:-1]:
            if self._buffer:
                line = "".join([*self._buffer, line])
                self._buffer, self._buffered = [], 0
            self._line(line, events)
        if lines[-1]:
            self._buffer.append(lines[-1])
            self._buffered += len(lines[-1])
        if self._buffered > self._max_line:
            raise MalformedStream(f"an event line longer than {self._max_line} characters")
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if len(line) > self._max_line:
            raise MalformedStream(f"an event line longer than {self._max_line} characters")
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data, self._data_size = [], 0
            return
        name, _, value = line.partition(":")
        if name == "data":
            value = value[1:] if value.startswith(" ") else value
            self._data_size += len(value) + (1 if self._data else 0)  # the join's length
            self._data.append(value)
            if self._data_size > self._max_line:
                raise MalformedStream(f"an event longer than {self._max_line} characters")


def _utf8_boundary(raw: bytes) -> int:
    """Where the last complete UTF-8 sequence of ``raw`` ends."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte < 0x80:
            return len(raw)
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(raw) if back >= need else len(raw) - back
    return len(raw)


@attrs.define
class _Call:
    id: str = ""
    name: str = ""
    #: the arguments' pieces as they streamed in, joined once the reply is complete
    pieces: list[str] = attrs.field(factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.pieces)


class ChunkAssembler:
    def __init__(self) -> None:
        self.done = False
        self.finish_reason: str | None = None
        self.model = ""
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: dict[int, _Call] = {}
        self._size = 0
        self._usage: dict[str, int] = {}

    def feed(self, data: str) -> str:
        """Take one event's data; returns the text it adds to the reply (possibly empty)."""
        if self.done:
            raise MalformedStream("data after [DONE]")
        if data.strip() == DONE:
            self.done = True
            return ""
        try:
            chunk = decode(data)
        except ValueError as exc:
            raise MalformedStream(f"an event that is not JSON ({exc})") from None
        if not isinstance(chunk, Mapping):
            raise MalformedStream("an event that is not a JSON object")
        error = chunk.get("error")
        if error is not None:
            detail = error if isinstance(error, Mapping) else {"message": error}
            raise StreamError(str(detail.get("message") or detail), detail.get("code"))
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), Mapping):
            self._take_usage(chunk["usage"])
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise MalformedStream("choices is not a list")
        added = ""
        for choice in choices:
            if not isinstance(choice, Mapping) or choice.get("index", 0) != 0:
                continue  # one completion is asked for; others are not this reply's
            added += self._choice(choice)
        return added

    def _choice(self, choice: Mapping[str, Any]) -> str:
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        if not isinstance(delta, Mapping):
            raise MalformedStream("a delta that is not a JSON object")
        added = ""
        for key, into in (("content", self._text), ("refusal", self._refusal)):
            piece = delta.get(key)
            if isinstance(piece, str) and piece:
                self._grow(len(piece))
                into.append(piece)
                added += piece
        calls = delta.get("tool_calls") or []
        if not isinstance(calls, list):
            raise MalformedStream("tool_calls is not a list")
        for piece in calls:
            self._call(piece)
        return added

    def _call(self, piece: Any) -> None:
        if not isinstance(piece, Mapping):
            raise MalformedStream("a tool call delta that is not a JSON object")
        index = piece.get("index", len(self._calls))
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise MalformedStream(f"a tool call index that is not a count: {index!r}")
        call = self._calls.get(index)
        if call is None:
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise MalformedStream(f"more than {MAX_TOOL_CALLS} tool calls in one reply")
            call = self._calls[index] = _Call()
        if isinstance(piece.get("id"), str) and piece["id"]:
            call.id = piece["id"]
        function = piece.get("function") or {}
        if not isinstance(function, Mapping):
            raise MalformedStream("a tool call function that is not a JSON object")
        if isinstance(function.get("name"), str) and function["name"]:
            call.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            self._grow(len(arguments))
            call.pieces.append(arguments)
        elif isinstance(arguments, Mapping):  # a few servers send the object itself
            call.pieces.append(json.dumps(arguments))

    def _grow(self, n: int) -> None:
        self._size += n
        if self._size > MAX_REPLY_CHARS:
            raise MalformedStream(f"a reply longer than {MAX_REPLY_CHARS} characters")

    def _take_usage(self, usage: Mapping[str, Any]) -> None:
        prompt = _count(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
        cached = min(cached, prompt)
        self._usage = {
            "input_tokens": prompt - cached,
            "output_tokens": _count(usage.get("completion_tokens")),
        }
        if cached:
            self._usage["cache_read_input_tokens"] = cached

    def reply(self) -> ModelReply:
        blocks: list[Block] = []
        text = "".join(self._text) + "".join(self._refusal)
        if text.strip():
            blocks.append({"type": "text", "text": text})
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.name:
                raise MalformedStream(f"tool call {index} has no function name")
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id or f"call_{index}",
                    "name": call.name,
                    "input": _arguments(call),
                }
            )
        reason = stop_reason(self.finish_reason)
        if self._calls:
            reason = "tool_use"  # some servers finish a tool round with "stop"
        elif "".join(self._refusal).strip():
            reason = "refusal"
        return ModelReply(
            blocks=tuple(blocks),
            stop_reason=reason,
            model=self.model,
            usage={"input_tokens": 0, "output_tokens": 0, **self._usage},
        )


def _count(value: object) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok and isinstance(value, int) else 0


def _arguments(call: _Call) -> dict[str, Any]:
    text = call.arguments
    if not text.strip():
        return {}
    try:
        value = decode(text)
    except ValueError as exc:
        raise MalformedStream(f"tool call {call.name} has malformed arguments ({exc})") from None
    if not isinstance(value, dict):
        raise MalformedStream(f"tool call {call.name} arguments are not a JSON object")
    return value
