"""Printing the transcript: level filter, redaction, repeat collapsing, and the two forms of
output (a timestamped line, styled on a terminal; or one JSON object per line).

For each trace event, in order:

1. below the chosen level: nothing;
2. configured secrets are replaced (``protocol.redact``) in the event, before anything is cut
   to length, so no part of a secret is printed;
3. the line (``transcript.format_event``) is made one inert line (``protocol.display``); an
   event without one is left out of the plain transcript (``--json`` still prints it);
4. repeats are collapsed (``protocol.repeats``), except the conversation itself and the
   agents' turns (:data:`NEVER_COLLAPSED`): per source and shape, a few lines per window, then
   one ``collapsed`` line with the count when the window ends (a timer task, or the next
   occurrence, or the end of the transcript, whichever comes first); its sample is the first
   line shown, or for events with no line (``--json`` and the console count them too) their
   kind in words (``gate decision events``), never their data;
5. the line is written with its local time (``2026-12-01 22:31:09``), or the event as JSON
   (``ts`` in UTC).

Lines are written whole and flushed, so a pipe or journal sees each as it happens.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import IO, Any

import attrs
import trio
from trio_util import AsyncValue

from actors.trace import TraceEvent, source_of
from protocol.display import json_line, json_safe, printable
from protocol.redact import NO_REDACTION, Redactor
from protocol.repeats import OTHER_SOURCES, RepeatCollapser, Summary, mask

from .lines import DEBUG, ERROR, INFO, WARNING, format_event, level_name, level_of

#: Kinds never collapsed: the conversation itself and the agents' own work.
NEVER_COLLAPSED = frozenset(
    {
        "incoming",
        "push",
        "published",
        "local",
        "local-reply",
        "speech-held",
        "tool-call",
        "tool-result",
        "tokens",
        "turn-start",
        "turn-end",
        "turn-usage",
        "agent-paused",
        "agent-resumed",
        "budget-paused",
        "budget-warning",
        "budget-unpriced",
        "config-reloaded",
        "operator-action",
        "rolled-back",
        "asleep",
        "awake",
        "host-started",
        "host-stopping",
        "note",
        "collapsed",
    }
)
CONTEXT_LINES_CAP = 1024  # (server, agent) pairs whose last context line is remembered

STYLES = {DEBUG: "dim", INFO: "", WARNING: "yellow", ERROR: "bold red"}


@attrs.frozen(kw_only=True)
class TranscriptOptions:
    level: int = INFO
    json: bool = False
    redactor: Redactor = NO_REDACTION
    styled: bool = False  # rich styles by level (for a terminal)
    ascii_json: bool = False  # escape every non-ASCII character (an output that is not UTF-8)


def local_stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def utc_stamp(ts: float) -> str:
    stamp = datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _source_fields(source: Hashable) -> dict[str, Any]:
    if source is OTHER_SOURCES:
        return {"data": {"other_sources": True}}
    if isinstance(source, tuple) and source[0] == "server":
        return {"server_id": source[1], "data": {}}
    if isinstance(source, tuple) and source[0] == "agent":
        return {"agent": source[1], "data": {}}
    return {"data": {}}


def summary_event(summary: Summary, ts: float) -> TraceEvent:
    """The ``collapsed`` event reporting a summary of held-back lines."""
    fields = _source_fields(summary.source)
    data = {
        **fields.pop("data"),
        "count": summary.count,
        "seconds": max(1, round(summary.seconds)),
        "sample": summary.sample,
        "other_shapes": summary.other_shapes,
        "level": level_name(summary.level),
    }
    return TraceEvent(kind="collapsed", data=data, ts=ts, **fields)


def event_record(event: TraceEvent, level: int, data: Any) -> dict[str, Any]:
    """A trace event as one JSON record (``--json`` and the console's feed)."""
    return {
        "ts": utc_stamp(event.ts),
        "kind": event.kind,
        "level": level_name(level),
        "agent": event.agent,
        "server_id": event.server_id,
        "channel_id": event.channel_id,
        "data": data,
    }


class TranscriptPrinter:
    """Writes the transcript of one host run to ``out`` (see the module docstring)."""

    def __init__(
        self,
        out: IO[str],
        options: TranscriptOptions,
        *,
        collapser: RepeatCollapser | None = None,
        wall: Any = time.time,
    ) -> None:
        self.out = out
        self.options = options
        self.collapser = collapser if collapser is not None else RepeatCollapser()
        self._wall = wall
        self._context: dict[tuple[str | None, str | None], str] = {}
        self._streams = StreamLines()
        self._console: Any = None
        if options.styled and not options.json:
            from rich.console import Console  # only on a terminal

            # the caller saw a terminal; rich still honours NO_COLOR and TERM=dumb
            self._console = Console(
                file=out,
                force_terminal=True,
                markup=False,
                highlight=False,
                emoji=False,
                soft_wrap=True,
            )

    def handle(self, event: TraceEvent, now: float) -> None:
        """Print what ``event`` calls for; ``now`` is the host clock (for collapsing).

        In the plain transcript, an agent's streamed text (``tokens``) is printed a whole line
        at a time: held until a line ends, the agent does something else, or the output
        ends."""
        if level_of(event) < self.options.level:
            return
        if not self.options.json:
            if event.kind == "tokens":
                for line in self._streams.add(event):
                    self._handle(line, now)
                return
            if event.agent is not None:
                for line in self._streams.end(event.agent):
                    self._handle(line, now)
        self._handle(event, now)

    def _handle(self, event: TraceEvent, now: float) -> None:
        level = level_of(event)
        redactor = self.options.redactor
        if redactor:
            event = _redacted(event, redactor)
        line = format_event(event)
        if line is not None:
            line = _inert(redactor.text(line))
        elif not self.options.json:
            return
        if line is not None and event.kind == "context-injected" and self._repeated(event, line):
            return
        if event.kind not in NEVER_COLLAPSED:
            basis = line if line is not None else f"{event.kind} {_data_line(event)}"
            # the summary's sample is a line a reader knows: an event without one (shown only
            # as JSON) is named in words, not by its data
            sample = line if line is not None else _unlined(event.kind)
            verdict = self.collapser.observe(
                source_of(event), (event.kind, mask(basis)), now, sample=sample, level=level
            )
            for summary in verdict.due:
                self._summary(summary)
            if not verdict.show:
                return
        self._write(event, level, line)

    def note(self, text: str, now: float) -> None:
        """A line of the command's own (e.g. that it is stopping), at info level."""
        self.handle(TraceEvent(kind="note", data={"text": text}, ts=self._wall()), now)

    def next_due(self) -> float | None:
        """When the next collapsed window ends (host clock), None if none is open."""
        return self.collapser.next_due()

    def flush(self, now: float) -> None:
        """Print the summaries of the windows that have ended."""
        for summary in self.collapser.flush(now):
            self._summary(summary)

    def close(self, now: float) -> None:
        """Print the streamed text still held and every count still held back (the transcript
        ends)."""
        for line in self._streams.end_all():
            self._handle(line, now)
        for summary in self.collapser.close(now):
            self._summary(summary)

    def _repeated(self, event: TraceEvent, line: str) -> bool:
        """The same context line before every turn is shown once, until it changes."""
        key = (event.server_id, event.agent)
        if self._context.get(key) == line or len(self._context) >= CONTEXT_LINES_CAP:
            return True
        self._context[key] = line
        return False

    def _summary(self, summary: Summary) -> None:
        event = summary_event(summary, self._wall())
        line = format_event(event)
        self._write(event, summary.level, None if line is None else _inert(line))

    def _write(self, event: TraceEvent, level: int, line: str | None) -> None:
        if self.options.json:
            record = event_record(event, level, event.data)
            text = json_line(
                json_safe(record, self.options.redactor.text), ascii_only=self.options.ascii_json
            )
        else:
            assert line is not None
            if self._console is not None:
                from rich.text import Text

                self._console.print(
                    Text.assemble((local_stamp(event.ts), "dim"), " ", (line, STYLES[level]))
                )
                return
            text = f"{local_stamp(event.ts)} {line}"
        self.out.write(text + "\n")
        self.out.flush()


#: The most streamed text held for one agent without a line end: past it, what is held is
#: printed as a line of its own.
STREAM_LINE_CHARS = 4096


@attrs.define
class _Held:
    first: TraceEvent  # the event of the held text's first piece (its time, agent and place)
    text: str


class StreamLines:
    """An agent's streamed pieces (``tokens`` events) joined into whole lines: one ``tokens``
    event per line, when the line ends (or :meth:`end` says the agent's stream did)."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}

    def add(self, event: TraceEvent) -> list[TraceEvent]:
        """The lines ``event``'s piece completes (streamed text elsewhere ends the held line)."""
        agent = str(event.agent)
        piece = str(event.data.get("delta") or "")
        held = self._held.get(agent)
        out: list[TraceEvent] = []
        if held is not None and _place(held.first) != _place(event):
            out += self.end(agent)
            held = None
        if held is None:
            held = self._held[agent] = _Held(first=event, text="")
        held.text += piece
        *done, rest = held.text.split("\n")
        for line in done:
            out += _line(held.first, line)
            held.first = event
        held.text = rest
        if len(held.text) >= STREAM_LINE_CHARS:
            out += _line(held.first, held.text)
            held.text = ""
        return out

    def end(self, agent: str) -> list[TraceEvent]:
        """What is held of ``agent``'s stream, as a line (its turn went on to something else)."""
        held = self._held.pop(agent, None)
        return [] if held is None else _line(held.first, held.text)

    def end_all(self) -> list[TraceEvent]:
        return [line for agent in list(self._held) for line in self.end(agent)]


def _place(event: TraceEvent) -> tuple[str | None, str | None]:
    return event.server_id, event.channel_id


def _line(first: TraceEvent, text: str) -> list[TraceEvent]:
    """The ``tokens`` event of one whole streamed line (none for a blank one)."""
    if not text.strip():
        return []
    return [attrs.evolve(first, data={**first.data, "delta": text})]


def _inert(text: str) -> str:
    """A formatted line made inert (see ``protocol.display.printable``); a line break that
    ``format_event`` put there itself (an indented continuation, such as a server's last stderr
    lines under its disconnection) is kept, each of its lines made inert on its own."""
    return "\n".join([printable(part) for part in text.split("\n")])


def _redacted(event: TraceEvent, redactor: Redactor) -> TraceEvent:
    def text(value: str | None) -> str | None:
        return None if value is None else redactor.text(value)

    return attrs.evolve(
        event,
        agent=text(event.agent),
        server_id=text(event.server_id),
        channel_id=text(event.channel_id),
        data=redactor.value(event.data),
    )


def _unlined(kind: str) -> str:
    """A kind of event the plain transcript shows no line for, in words: ``gate-decision``
    reads ``gate decision events``."""
    return f"{printable(kind.replace('-', ' '))} events"


def _data_line(event: TraceEvent) -> str:
    return json_line(json_safe(event.data))[:800]


#: Events handled in a row before the printer lets other tasks run (a whole buffer's worth).
BATCH = 4096


async def run_printer(stream: Any, printer: TranscriptPrinter) -> None:
    """Print ``stream`` until it ends, then every count still held back; meanwhile a timer
    prints each collapsed window's summary when the window ends.

    A stream with ``receive_nowait`` (a trace receiver) is drained greedily, up to
    :data:`BATCH` events between checkpoints: handling an event the collapse holds back costs
    little, and a printer that took one event per scheduler round would lag behind a flood
    with a quiet server's lines waiting behind it."""
    due: AsyncValue[float | None] = AsyncValue(None)

    async def summaries() -> None:
        while True:
            when = await due.wait_value(lambda v: v is not None)
            assert when is not None
            await trio.sleep_until(when)
            printer.flush(trio.current_time())
            due.value = printer.next_due()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(summaries)
        if hasattr(stream, "receive_nowait"):
            await _drain(stream, printer, due)
        else:
            async for event in stream:
                printer.handle(event, trio.current_time())
                due.value = printer.next_due()
        printer.close(trio.current_time())
        nursery.cancel_scope.cancel()


async def _drain(stream: Any, printer: TranscriptPrinter, due: AsyncValue[float | None]) -> None:
    handled = 0
    while True:
        try:
            event = stream.receive_nowait()
        except trio.WouldBlock:
            due.value = printer.next_due()
            handled = 0
            try:
                event = await stream.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return
        printer.handle(event, trio.current_time())
        handled += 1
        if handled >= BATCH:
            due.value = printer.next_due()
            handled = 0
            await trio.lowlevel.checkpoint()


async def print_transcript(stream: Any, out: Any, options: Any = None) -> None:
    """Print a line for every event of ``stream`` that has one, until the stream ends
    (``options``: a :class:`TranscriptOptions`; default: info and up, plain text)."""
    printer = TranscriptPrinter(out, options if options is not None else TranscriptOptions())
    await run_printer(stream, printer)
