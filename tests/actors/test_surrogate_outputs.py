"""Whatever string a server sent (a lone surrogate included) reaches every output without
raising: the transcript (text and ``--json``), ``mcplive history`` (text and ``--json``), the log
records and the model's request body; each is written through a strict UTF-8 encoder."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.cli.history import Printer
from actors.cli.logs import RedactingFilter
from actors.models.anthropic import to_messages_api
from actors.trace import TraceEvent
from actors.transcript.printer import TranscriptOptions, TranscriptPrinter
from protocol.redact import NO_REDACTION, Redactor
from store import StoredRow

surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
# (st.text never draws a surrogate: the characters are joined instead)
texts = st.lists(st.one_of(st.characters(codec=None), surrogates), max_size=40).map("".join)


def strict() -> io.TextIOWrapper:
    """A text stream that raises on anything UTF-8 cannot hold, as a strict stdout would."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", newline="\n")


def events(s: str) -> list[TraceEvent]:
    where: dict[str, Any] = {"server_id": s, "channel_id": s}
    return [
        TraceEvent(kind="incoming", **where, data={"message_id": s, "author": s, "text": s}),
        TraceEvent(kind="push", **where, data={"event_id": s, "text": s}),
        TraceEvent(kind="diagnostic", server_id=s, data={"text": s}),
        TraceEvent(kind="refused", **where, data={"method": s, "code": -32602, "reason": s}),
        TraceEvent(kind="channel-registered", **where, data={"label": s}),
        TraceEvent(kind="server-log", server_id=s, data={"line": s}),
        TraceEvent(kind="tool-call", agent=s, data={"tool": s, "arguments": {s: [s]}}),
        TraceEvent(kind="tool-result", agent=s, data={"tool": s, "content": [{"text": s}]}),
        TraceEvent(kind="speech", agent=s, **where, data={"text": s, s: s}),
    ]


@given(texts, st.booleans(), st.sampled_from([NO_REDACTION, Redactor(["secret-1234"])]))
def test_the_transcript_prints_any_server_text(s: str, as_json: bool, redactor: Redactor) -> None:
    out = strict()
    printer = TranscriptPrinter(out, TranscriptOptions(level=0, json=as_json, redactor=redactor))
    for event in events(s):
        printer.handle(event, 0.0)
    printer.close(0.0)
    out.flush()
    if as_json:
        text = out.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]
        for line in text.splitlines():
            json.loads(line)


def stored(s: str) -> dict[str, Any]:
    return {
        "id": "m1",
        "agent": "Ada",
        "role": "user",
        "blocks": [
            {"type": "text", "text": s},
            {"type": "tool_use", "id": "t1", "name": s, "input": {s: s}},
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": s}]},
        ],
        "metadata": {
            "author": {"id": s, "name": s},
            "inbound_source": {"server": s, "channel": s},
            s: s,
        },
    }


@given(texts, st.booleans())
def test_history_prints_any_stored_text(s: str, as_json: bool) -> None:
    out = strict()
    Printer(out, as_json=as_json).print(StoredRow(seq=1, created_at=1e9, message=stored(s)), False)
    out.flush()
    text = out.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]
    if as_json:
        assert json.loads(text)["id"] == "m1"


class _Strict(logging.StreamHandler):  # type: ignore[type-arg]
    def handleError(self, record: logging.LogRecord) -> None:
        raise  # what emit caught


@given(texts, st.sampled_from([NO_REDACTION, Redactor(["secret-1234"])]))
def test_a_log_record_with_any_server_text_is_written(s: str, redactor: Redactor) -> None:
    out = strict()
    handler = _Strict(out)
    handler.addFilter(RedactingFilter(redactor))
    logger = logging.Logger("mcplive.test-surrogates")
    logger.addHandler(handler)
    logger.warning("server said %s", s)
    try:
        raise ValueError(s)
    except ValueError:
        logger.exception("failed on %r", s)
    out.flush()


@given(texts)
def test_the_model_request_body_is_valid_utf8(s: str) -> None:
    messages = [
        {"role": "user", "blocks": [{"type": "text", "text": s}]},
        {
            "role": "assistant",
            "blocks": [{"type": "tool_use", "id": "t1", "name": "x", "input": {s: s}}],
        },
        {
            "role": "tool",
            "blocks": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": s}],
                }
            ],
        },
        {"role": "system", "blocks": [{"type": "text", "text": s}]},
    ]
    body = json.dumps({"messages": to_messages_api(messages)}, ensure_ascii=False)
    body.encode("utf-8")  # strict: what the HTTP client does with the body
