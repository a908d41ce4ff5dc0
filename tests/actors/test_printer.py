"""The printed transcript: levels, timestamps, JSON lines, redaction, styles and collapsed
repeats (on a mock clock, over the real trace bus)."""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import time
from typing import Any

import pytest
import trio
import trio.testing

from actors.cli.logs import RedactingFilter
from actors.config import host_redactor, host_secrets
from actors.trace import TraceBus, TraceEvent
from actors.transcript.lines import DEBUG, ERROR, INFO, LEVELS, WARNING, format_event, level_of
from actors.transcript.printer import TranscriptOptions, TranscriptPrinter, run_printer
from protocol.redact import REDACTED, Redactor
from protocol.repeats import RepeatCollapser
from tests.helpers import STAMP

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
KEYS = ["ts", "kind", "level", "agent", "server_id", "channel_id", "data"]


def chat(n: int, server: str = "lobby", text: str | None = None) -> TraceEvent:
    return TraceEvent(
        kind="incoming",
        server_id=server,
        channel_id="lobby:#general",
        data={"message_id": f"m{n}", "author": "alice", "text": text or f"hello {n}"},
    )


def garbage(n: int) -> TraceEvent:
    return TraceEvent(
        kind="diagnostic", server_id="flood", data={"text": f"not JSON, skipped: 'junk {n}'"}
    )


def printed(events: list[TraceEvent], **options: Any) -> list[str]:
    out = io.StringIO()
    printer = TranscriptPrinter(out, TranscriptOptions(**options))
    for e in events:
        printer.handle(e, 0.0)
    printer.close(0.0)
    return out.getvalue().splitlines()


# -- timestamps and levels --------------------------------------------------------------------


def test_every_line_starts_with_the_local_time_of_its_event() -> None:
    event = TraceEvent(kind="ready", server_id="lobby", data={"tools": ["roll"]}, ts=1e9)
    (line,) = printed([event])
    expected = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1e9))
    assert line == f"{expected} · lobby ready: MCPL; roll"
    assert STAMP.match(line)


@pytest.mark.parametrize(
    "level,kinds",
    [
        (DEBUG, ["server-log", "incoming", "diagnostic", "error"]),
        (INFO, ["incoming", "diagnostic", "error"]),
        (WARNING, ["diagnostic", "error"]),
        (ERROR, ["error"]),
    ],
)
def test_a_level_shows_its_kinds_and_the_more_severe_ones(level: int, kinds: list[str]) -> None:
    events = [
        TraceEvent(kind="server-log", server_id="lobby", data={"line": "[lobby] hi"}),
        chat(1),
        TraceEvent(kind="diagnostic", server_id="lobby", data={"text": "odd"}),
        TraceEvent(kind="error", agent="Ada", data={"error": "boom"}),
    ]
    human = printed(events, level=level)
    assert len(human) == len(kinds)
    as_json = [json.loads(line) for line in printed(events, level=level, json=True)]
    assert [r["kind"] for r in as_json] == kinds


def test_levels_follow_the_table_and_default_to_info() -> None:
    assert LEVELS["server-log"] == DEBUG and LEVELS["tokens"] == DEBUG
    assert level_of(chat(1)) == INFO
    assert level_of(TraceEvent(kind="some-new-kind")) == INFO
    assert level_of(TraceEvent(kind="diagnostic")) == WARNING
    assert level_of(TraceEvent(kind="error")) == ERROR


def test_an_operators_action_is_one_info_line_never_collapsed() -> None:
    def acted(n: int, **data: Any) -> TraceEvent:
        fields = {"action": "pause", "target": "Ada", "source": "console 127.0.0.1"}
        return TraceEvent(
            kind="operator-action", agent="Ada", data={**fields, "changed": True, **data}
        )

    events = [acted(n) for n in range(20)]
    events.append(acted(0, action="reconnect", target="lobby", detail="dialling now"))
    events.append(acted(0, action="resume", source="SIGHUP", changed=False, detail="not paused"))
    lines = [line.split(" ", 2)[2] for line in printed(events)]
    assert lines[:20] == ["· operator (console 127.0.0.1): paused Ada"] * 20
    assert lines[20:] == [
        "· operator (console 127.0.0.1): reconnected lobby: dialling now",
        "· operator (SIGHUP): resumed Ada: not paused (nothing changed)",
    ]
    assert {level_of(e) for e in events} == {INFO}


def test_a_reconnect_the_operator_asked_for_is_no_failure() -> None:
    data = {"reason": "the operator asked for a reconnect", "attempt": 1, "stderr_tail": []}
    asked = TraceEvent(
        kind="disconnected", server_id="lobby", data={**data, "retry_in_s": 0.0, "requested": True}
    )
    assert level_of(asked) == INFO
    assert format_event(asked) == "· lobby link closed as the operator asked; reconnecting now"
    crash = {**data, "reason": "exit 3", "retry_in_s": 2.7, "stderr_tail": ["boom"]}
    crashed = TraceEvent(kind="disconnected", server_id="lobby", data=crash)
    assert level_of(crashed) == WARNING
    assert format_event(crashed) == (
        "! lobby disconnected (exit 3); reconnecting in 2.7s (attempt 1)\n    | boom"
    )


# -- JSON -------------------------------------------------------------------------------------


def test_json_lines_have_stable_keys_and_parse_whatever_a_server_sent() -> None:
    nasty = "lone \ud800 surrogate, [bold]markup[/bold], \x1b[31mred\u2028split"
    events = [
        chat(1, text=nasty),
        TraceEvent(kind="typing", agent="Ada", data={"typing": True}),  # no human line
        TraceEvent(
            kind="tool-result",
            agent="Ada",
            data={"tool": "t", "content": [{"type": "text", "text": nasty}], "x": float("nan")},
        ),
        TraceEvent(kind="weird", data={"set": {1}, "bytes": b"\x00", 7: object()}),
    ]
    lines = printed(events, json=True, level=DEBUG)
    assert len(lines) == 4
    records = [json.loads(line) for line in lines]
    for record in records:
        assert list(record) == KEYS
        assert ISO_UTC.match(record["ts"])
    assert records[0]["level"] == "info" and records[1]["level"] == "debug"
    assert records[0]["data"]["text"] == nasty.replace("\ud800", "\ufffd")
    assert records[0]["channel_id"] == "lobby:#general" and records[0]["agent"] is None
    assert records[2]["data"]["x"] == "nan"
    assert records[3]["data"] == {"set": [1], "bytes": "<1 bytes>", "7": records[3]["data"]["7"]}
    ascii_lines = printed(events, json=True, level=DEBUG, ascii_json=True)
    assert all(line.isascii() for line in ascii_lines)
    assert [json.loads(line) for line in ascii_lines] == records


def test_the_ts_is_the_events_emission_time_in_utc() -> None:
    (line,) = printed([TraceEvent(kind="host-stopping", ts=1_700_000_000.25)], json=True)
    assert json.loads(line)["ts"] == "2023-11-14T22:13:20.250Z"


# -- inert text and styles --------------------------------------------------------------------


def test_server_text_stays_one_inert_line() -> None:
    (line,) = printed([chat(1, text="hi\n2026-01-01 00:00:00 · fake line \x1b[2J")])
    assert "\n" not in line and "\x1b" not in line
    assert line.endswith("hi 2026-01-01 00:00:00 · fake line \\x1b[2J")


def test_on_a_terminal_lines_are_styled_by_level_and_markup_prints_literally() -> None:
    out = io.StringIO()
    printer = TranscriptPrinter(out, TranscriptOptions(styled=True))
    printer.handle(chat(1, text="[bold]not bold[/bold] [red]x"), 0)
    printer.handle(TraceEvent(kind="error", agent="Ada", data={"error": "[link]boom"}), 0)
    text = out.getvalue()
    assert "[bold]not bold[/bold] [red]x" in text
    assert "[link]boom" in text
    assert "\x1b[" in text  # styled: the error line in bold red, the timestamp dim
    assert "\x1b[1;31m" in text


# -- redaction --------------------------------------------------------------------------------

SECRET = "tok-5ecret-123456"


def test_configured_secrets_never_reach_a_line_even_when_a_text_is_clipped() -> None:
    long = "x" * 230 + SECRET  # the excerpt would cut the secret in the middle
    events = [
        chat(1, text=f"my token is {SECRET}"),
        chat(2, text=long),
        TraceEvent(kind="server-log", server_id="lobby", data={"line": f"auth {SECRET}"}),
        TraceEvent(kind="diagnostic", server_id=SECRET, data={"text": SECRET}),
    ]
    redactor = Redactor([SECRET])
    for as_json in (False, True):
        lines = printed(events, redactor=redactor, json=as_json, level=DEBUG)
        joined = "\n".join(lines)
        assert "5ecret" not in joined
        assert REDACTED in joined
    human = printed(events, redactor=redactor, level=DEBUG)
    assert human[0].endswith(f"alice: my token is {REDACTED}")
    assert "x" * 200 in human[1] and "tok-5" not in human[1]


def test_log_records_are_redacted_in_messages_and_tracebacks() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(Redactor([SECRET])))
    logger = logging.getLogger("mcplive.test-redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("refused with %s", {"Authorization": f"Bearer {SECRET}"})
        try:
            raise RuntimeError(f"server said {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert SECRET not in text and text.count(REDACTED) == 2
    assert "RuntimeError" in text


def test_the_hosts_secrets_are_its_server_tokens_and_model_keys(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.config import load_config

    monkeypatch.setenv("B_TOKEN_FOR_TEST", "server-b-token")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-abcdef")  # a model without its key is refused
    cfg = load_config(
        {
            "host": {"data_dir": str(tmp_path)},
            "servers": [
                {"id": "a", "command": ["x"], "token": "server-a-token"},
                {"id": "b", "command": ["x"], "token_env": "B_TOKEN_FOR_TEST"},
                {"id": "c", "command": ["x"]},
            ],
            "agents": [{"name": "Ada", "model": "anthropic:claude-x"}],
        }
    )
    env = {"ANTHROPIC_API_KEY": "sk-ant-abcdef", "UNRELATED": "not-a-secret"}
    assert sorted(host_secrets(cfg, env)) == ["server-a-token", "server-b-token", "sk-ant-abcdef"]
    assert host_redactor(cfg, env).text("key sk-ant-abcdef") == f"key {REDACTED}"


# -- collapsing repeats, over the bus and the printer task, on a mock clock -----------------


async def test_a_flood_prints_a_few_lines_and_a_summary_and_every_healthy_line(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = TraceBus()
    recv = bus.subscribe_nowait()
    out = io.StringIO()
    printer = TranscriptPrinter(out, TranscriptOptions())
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_printer, recv, printer)
            for n in range(22_000):
                bus.emit("diagnostic", server_id="flood", data={"text": f"not JSON: '{n}'"})
                if n % 1000 == 0:
                    bus.emit(**_kw(chat(n // 1000)))
                    await trio.testing.wait_all_tasks_blocked()
            await trio.testing.wait_all_tasks_blocked()
            before_window_end = out.getvalue().splitlines()
            await trio.sleep(10)  # the window ends: the timer prints the summary
            await trio.testing.wait_all_tasks_blocked()
            after = out.getvalue().splitlines()
            bus.close()
    lines = [STAMP.sub("", line) for line in after]
    assert all(STAMP.match(line) for line in after)
    chats = [line for line in lines if "| alice:" in line]
    assert chats == [f"lobby lobby:#general | alice: hello {n}" for n in range(22)]
    flood = [line for line in lines if line.startswith("? flood")]
    assert flood == ["? flood: not JSON: '0'", "? flood: not JSON: '1'", "? flood: not JSON: '2'"]
    summaries = [line for line in lines if line.startswith("…")]
    assert summaries == [
        "… 21,997 more like this from flood in the last 10 s (? flood: not JSON: '0')"
    ]
    assert not any(line.startswith("…") for line in before_window_end)
    assert len(lines) == 22 + 3 + 1


async def test_a_flood_the_buffer_cannot_hold_is_counted_and_collapsed_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    bus = TraceBus()
    recv = bus.subscribe_nowait()
    out = io.StringIO()
    printer = TranscriptPrinter(out, TranscriptOptions())
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_printer, recv, printer)
            await trio.testing.wait_all_tasks_blocked()
            for burst in range(3):  # each burst overflows the buffer while the printer waits
                for n in range(5_000):
                    bus.emit(**_kw(garbage(n)))
                    if n % 500 == 0:
                        bus.emit(**_kw(chat(burst * 10 + n // 500)))
                await trio.testing.wait_all_tasks_blocked()
            bus.close()
    lines = [STAMP.sub("", line) for line in out.getvalue().splitlines()]
    assert [line for line in lines if "| alice:" in line] == [
        f"lobby lobby:#general | alice: hello {n}" for n in range(30)
    ]
    dropped = [line for line in lines if "fell behind" in line]
    assert dropped and all("events from flood not shown" in line for line in dropped)
    assert len(dropped) <= 3
    summaries = [line for line in lines if line.startswith("…")]
    # at the end of the transcript every count still open is printed
    assert any("more like this from flood" in line for line in summaries)
    assert len(lines) <= 30 + 3 + 3 + 2


def _kw(event: TraceEvent) -> dict[str, Any]:
    return {
        "kind": event.kind,
        "agent": event.agent,
        "server_id": event.server_id,
        "channel_id": event.channel_id,
        "data": event.data,
    }


def test_collapsing_keeps_sources_and_shapes_apart() -> None:
    out = io.StringIO()
    printer = TranscriptPrinter(
        out, TranscriptOptions(), collapser=RepeatCollapser(window_s=10, burst=1)
    )
    for n in range(3):
        printer.handle(garbage(n), 0)
        printer.handle(TraceEvent(kind="diagnostic", server_id="lobby", data={"text": "x"}), 0)
        printer.handle(TraceEvent(kind="diagnostic", server_id="flood", data={"text": "y"}), 0)
        printer.handle(chat(n), 0)
    printer.flush(10)
    lines = [STAMP.sub("", line) for line in out.getvalue().splitlines()]
    assert lines == [
        "? flood: not JSON, skipped: 'junk 0'",
        "? lobby: x",
        "? flood: y",
        "lobby lobby:#general | alice: hello 0",
        "lobby lobby:#general | alice: hello 1",
        "lobby lobby:#general | alice: hello 2",
        "… 2 more like this from flood in the last 10 s (? flood: not JSON, skipped: 'junk 0')",
        "… 2 more like this from lobby in the last 10 s (? lobby: x)",
        "… 2 more like this from flood in the last 10 s (? flood: y)",
    ]


def test_a_collapsed_model_error_is_the_agents_not_the_waking_servers() -> None:
    out = io.StringIO()
    printer = TranscriptPrinter(
        out, TranscriptOptions(), collapser=RepeatCollapser(window_s=10, burst=1)
    )
    for _ in range(3):
        for kind, data in (
            ("error", {"error": "anthropic: overloaded (529)", "where": "model"}),
            ("model-retry", {"line": "anthropic: overloaded (529), retry 1/4 in 2 s"}),
        ):
            # the turn's events carry the place of the message that woke Ada
            printer.handle(TraceEvent(kind=kind, agent="Ada", server_id="lobby", data=data), 0)
    printer.flush(10)
    summaries = [line for line in out.getvalue().splitlines() if "more like this" in line]
    assert len(summaries) == 2
    assert all("more like this from Ada in" in line for line in summaries), summaries


def test_every_turns_usage_and_an_agents_pause_and_resume_are_shown() -> None:
    usage = {"input_tokens": 10, "output_tokens": 2, "phase": "completed"}
    events = [
        TraceEvent(kind=k, agent="Ada", server_id="lobby", channel_id="lobby:#general", data=d)
        for _ in range(5)
        for k, d in (
            ("turn-usage", usage),
            ("agent-paused", {"reason": "refused", "remedy": "resume"}),
            ("agent-resumed", {"waiting": 1}),
        )
    ]
    lines = [STAMP.sub("", line) for line in printed(events)]
    assert lines.count("· Ada: turn used 10 in, 2 out tokens") == 5
    assert lines.count("· Ada resumed (1 waiting wakes)") == 5
    assert len(lines) == 15 and not any(line.startswith("…") for line in lines)


def test_a_summary_of_events_without_a_line_names_them_in_words() -> None:
    """The console and ``--json`` count events the plain transcript has no line for; their
    summary's sample is their kind in words, never their data as JSON."""
    out = io.StringIO()
    printer = TranscriptPrinter(out, TranscriptOptions(json=True))
    for n in range(5):
        event = TraceEvent(kind="gate-decision", server_id="flood", data={"wake": False, "n": n})
        printer.handle(event, 0)
    printer.close(4)
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert summary["kind"] == "collapsed"
    assert summary["data"]["sample"] == "gate decision events"
    line = format_event(TraceEvent(kind="collapsed", server_id="flood", data=summary["data"]))
    assert line == "… 2 more like this from flood in the last 4 s (gate decision events)"


def test_a_summary_is_a_json_event_too() -> None:
    out = io.StringIO()
    printer = TranscriptPrinter(out, TranscriptOptions(json=True))
    for n in range(5):
        printer.handle(garbage(n), 0)
    printer.close(4)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["kind"] for r in records] == ["diagnostic"] * 3 + ["collapsed"]
    summary = records[-1]
    assert summary["server_id"] == "flood" and summary["level"] == "warning"
    assert summary["data"]["count"] == 2 and summary["data"]["seconds"] == 4
    assert format_event(TraceEvent(kind="collapsed", server_id="flood", data=summary["data"]))


# -- the run command's flags and logging -------------------------------------------------------


@pytest.fixture
def restore_logging() -> Any:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in OWN})
    try:
        yield
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)


OWN = ("mcplive", "store", "httpx")


@pytest.mark.parametrize(
    "argv,level",
    [
        ([], "info"),
        (["-v"], "debug"),
        (["--verbose"], "debug"),
        (["-q"], "warning"),
        (["--log-level", "ERROR"], "error"),
        (["--log-level", "debug"], "debug"),
    ],
)
def test_run_takes_one_level_flag(argv: list[str], level: str) -> None:
    from actors.cli.command import build_parser

    args = build_parser().parse_args(["run", *argv])
    assert (args.log_level or "info") == level
    assert args.json is False


@pytest.mark.parametrize(
    "argv", [["-v", "-q"], ["-q", "--log-level", "info"], ["--log-level", "x"]]
)
def test_conflicting_or_unknown_levels_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from actors.cli.command import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["run", *argv])
    assert exit_.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_every_run_flag_has_help() -> None:
    from actors.cli.command import build_parser

    subcommands = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    run = subcommands.choices["run"]
    for action in run._actions:
        assert action.help, action.option_strings or action.dest


def test_the_log_level_applies_to_mcplives_loggers_and_records_are_stamped(
    restore_logging: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from actors.cli.logs import setup_logging

    setup_logging(DEBUG, Redactor([SECRET]))
    assert logging.getLogger("mcplive.connection").isEnabledFor(DEBUG)
    assert logging.getLogger("store.writer").isEnabledFor(DEBUG)
    assert not logging.getLogger("httpx").isEnabledFor(INFO)  # other libraries stay quiet
    logging.getLogger("mcplive.connection").debug("sent %s", SECRET)
    err = capsys.readouterr().err
    assert STAMP.match(err) and f"DEBUG mcplive.connection: sent {REDACTED}" in err
    setup_logging(ERROR)
    assert not logging.getLogger("mcplive.connection").isEnabledFor(WARNING)
    assert (
        len([h for h in logging.getLogger().handlers if type(h).__name__ == "StderrHandler"]) == 1
    )


async def test_print_transcript_takes_any_async_stream_and_prints_the_last_counts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from actors.transcript.printer import print_transcript

    async def stream() -> Any:
        for n in range(6):
            yield garbage(n)
            await trio.sleep(1)
        yield chat(1)

    out = io.StringIO()
    with trio.fail_after(60):
        await print_transcript(stream(), out)
    lines = [STAMP.sub("", line) for line in out.getvalue().splitlines()]
    assert lines[3:] == [
        "lobby lobby:#general | alice: hello 1",
        "… 3 more like this from flood in the last 6 s (? flood: not JSON, skipped: 'junk 0')",
    ]


def test_the_budgets_warning_and_pause_are_one_line_each() -> None:
    events = [
        TraceEvent(kind="budget-warning", agent="Ada", data={"used": 1700, "budget": 2000}),
        TraceEvent(
            kind="budget-paused",
            agent="Ada",
            data={"used": 2100, "budget": 2000, "resumes_at": "2026-12-07T00:00:00.000+00:00"},
        ),
    ]
    lines = [STAMP.sub("", line) for line in printed(events, level=WARNING)]
    assert lines == [
        "? Ada: 1,700 of its 2,000 daily tokens used (80 %)",
        "! Ada paused: daily token budget reached (2,100 of 2,000); no turns until "
        "2026-12-07T00:00:00.000+00:00 (or resume it: raise the budget and SIGHUP, or the console)",
    ]


# -- streamed text ----------------------------------------------------------------------------


def tokens(delta: str, agent: str = "Ada", channel: str = "lobby:#general") -> TraceEvent:
    return TraceEvent(
        kind="tokens", agent=agent, server_id="lobby", channel_id=channel, data={"delta": delta}
    )


def test_streamed_text_is_printed_a_whole_line_at_a_time() -> None:
    words = ["Hi ", "there! ", "Ada ", "here.\nSecond ", "line", "\n", "\n", "and the ", "rest"]
    events = [
        *[tokens(w) for w in words[:4]],
        tokens("Grace says hi", agent="Grace"),
        *[tokens(w) for w in words[4:]],
        TraceEvent(kind="published", agent="Ada", server_id="lobby", channel_id="lobby:#general",
                   data={"text": "Hi there! Ada here. Second line and the rest"}),
    ]  # fmt: skip
    lines = [STAMP.sub("", line) for line in printed(events, level=DEBUG)]
    assert lines == [
        "  Ada streams: Hi there! Ada here.",
        "  Ada streams: Second line",
        "  Ada streams: and the rest",  # the turn went on: what was held is printed first
        "lobby lobby:#general | Ada → Hi there! Ada here. Second line and the rest",
        "  Grace streams: Grace says hi",  # held until the output ends
    ]


def test_streamed_text_in_another_channel_ends_the_held_line() -> None:
    events = [tokens("to general "), tokens("to random", channel="lobby:#random")]
    lines = [STAMP.sub("", line) for line in printed(events, level=DEBUG)]
    assert lines == ["  Ada streams: to general", "  Ada streams: to random"]


def test_streamed_json_stays_one_event_per_piece() -> None:
    lines = printed([tokens("Hi "), tokens("there")], level=DEBUG, json=True)
    assert [json.loads(line)["data"]["delta"] for line in lines] == ["Hi ", "there"]


def test_a_secret_split_across_pieces_is_redacted_in_the_whole_line() -> None:
    redactor = Redactor(["sk-secret-123456"])
    events = [tokens("the key is sk-sec"), tokens("ret-123456 ok\n")]
    lines = printed(events, level=DEBUG, redactor=redactor)
    assert [STAMP.sub("", line) for line in lines] == [f"  Ada streams: the key is {REDACTED} ok"]
