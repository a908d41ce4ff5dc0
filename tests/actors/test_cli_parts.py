"""Pieces of the ``mcplive`` command that need no process: the parser's help, ``--since``,
``--channel``, and ``history`` reading in pages."""

from __future__ import annotations

import argparse
import datetime as dt
import io
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.cli.command import _config_given_after_web, _dash_values, build_parser, web_address
from actors.cli.history import (
    PAGE,
    KnownChannel,
    Printer,
    Selection,
    parse_since,
    print_window,
    resolve_channel,
)
from store import Reader
from tests.cli_helpers import make_store, stored

NOW = 1_800_000_000.0
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_subcommand_and_flag_has_help() -> None:
    parser = build_parser()
    subcommands = _subparsers(parser)
    assert {"run", "check", "history", "rollback"} <= set(subcommands)
    sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helped = {choice.dest for choice in sub_action._choices_actions if choice.help}
    assert helped == set(subcommands)
    missing = [
        f"{name or 'mcplive'} {'/'.join(action.option_strings) or action.dest}"
        for name, p in [("", parser), *subcommands.items()]
        for action in p._actions
        if not isinstance(action, argparse._SubParsersAction)
        and not (action.help and action.help != argparse.SUPPRESS)
    ]
    assert missing == []


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"mcplive {version('mcplive')}\n"


# -- --since ----------------------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(UNITS))), min_size=1))
def test_a_duration_counts_back_from_now(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    assert parse_since(text, now=NOW) == NOW - sum(n * UNITS[unit] for n, unit in parts)


@given(
    st.datetimes(
        min_value=dt.datetime(1971, 1, 2),
        max_value=dt.datetime(9000, 1, 1),
        timezones=st.timezones(),
    )
)
def test_an_iso_time_with_an_offset_is_that_moment(when: dt.datetime) -> None:
    if when.utcoffset() is None:  # a zone that does not say (and fold-ambiguous times)
        return
    text = when.isoformat()
    assert parse_since(text, now=NOW) == dt.datetime.fromisoformat(text).timestamp()


def test_an_iso_time_without_an_offset_is_local_time() -> None:
    assert parse_since("2026-05-01T14:30", now=NOW) == dt.datetime(2026, 5, 1, 14, 30).timestamp()
    assert parse_since("2026-05-01", now=NOW) == dt.datetime(2026, 5, 1).timestamp()
    assert (
        parse_since("2026-05-01T14:30Z", now=NOW)
        == dt.datetime(2026, 5, 1, 14, 30, tzinfo=dt.UTC).timestamp()
    )


@pytest.mark.parametrize("text", ["", "2", "h", "2x", "-2h", "2h 30m", "yesterday", "2026-13-01"])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is neither an ISO date/time"):
        parse_since(text, now=NOW)


# -- --channel --------------------------------------------------------------------------------


@given(
    server=st.text(st.characters(blacklist_characters="/ "), min_size=1, max_size=8),
    channel=st.text(min_size=1, max_size=12),
    label=st.none() | st.text(min_size=1, max_size=8),
)
def test_a_channel_is_named_by_id_label_or_server_and_either(
    server: str, channel: str, label: str | None
) -> None:
    known = [KnownChannel(server, channel, label), KnownChannel(f"{server}x", "other", None)]
    wanted = frozenset({(server, channel)})
    names = [channel, f"{server}/{channel}", f"{server} {channel}"]
    if label is not None:
        names += [label, f"#{label.removeprefix('#')}", f"{server}/{label}"]
    for name in names:
        assert wanted <= resolve_channel(name, known), name
    assert (f"{server}x", "other") not in resolve_channel(f"{server}/{channel}", known)
    message = {"metadata": {"server_id": server, "channel_id": channel}}
    assert Selection(channels=wanted).wants(message)
    assert not Selection(channels=wanted).wants({"metadata": {"server_id": server}})  # unscoped


def test_the_id_without_its_servers_prefix_names_the_channel() -> None:
    known = [KnownChannel("lobby", "lobby:#general", None), KnownChannel("x", "x:#general", "g")]
    assert resolve_channel("#general", known) == {("lobby", "lobby:#general"), ("x", "x:#general")}
    assert resolve_channel("lobby/#general", known) == {("lobby", "lobby:#general")}
    assert resolve_channel("#g", known) == {("x", "x:#general")}
    assert resolve_channel("other/#general", known) == frozenset()


# -- reading in pages -------------------------------------------------------------------------


class CountingReader(Reader):
    """A reader that remembers the most rows one read handed over."""

    largest = 0

    def rows(self, **kwargs: Any) -> Any:
        page = super().rows(**kwargs)
        self.largest = max(self.largest, len(page), kwargs.get("limit", 0))
        return page


@pytest.mark.parametrize(
    "selection",
    [
        Selection(),
        Selection(channels=frozenset({("lobby", "lobby:#general")})),
        Selection(agent="Ada", matches=str.isascii),
    ],
)
@pytest.mark.parametrize("limit", [None, 5, PAGE + 3])
def test_history_reads_at_most_a_page_at_a_time(
    tmp_path: Path, selection: Selection, limit: int | None
) -> None:
    count = 3 * PAGE + 7
    path = make_store(
        tmp_path / "data",
        [
            stored(f"m{i:05}", f"text {i}", server="lobby", channel=f"lobby:#{i % 3}")
            if i % 2
            else stored(f"m{i:05}", f"text {i}", server="lobby", channel="lobby:#general")
            for i in range(count)
        ],
    )
    out = io.StringIO()
    with CountingReader(path, read_only=True) as reader:
        last = print_window(reader, selection, limit, Printer(out, as_json=False))
        assert reader.largest <= PAGE
        everything = [r.message for r in reader.rows(limit=count)]
    wanted = [m["id"] for m in everything if selection.wants(m)]
    if limit is not None:
        wanted = wanted[-limit:]
    assert [line.split(" ")[2] for line in out.getvalue().splitlines()] == wanted
    assert last >= count  # follow goes on from the newest message


class HandedOver(Reader):
    """A reader that remembers every row its ``rows`` handed over."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed: list[str] = []

    def rows(self, **kwargs: Any) -> Any:
        page = super().rows(**kwargs)
        self.handed.extend(r.message["blocks"][0]["text"] for r in page)
        return page


@pytest.mark.parametrize("limit", [None, 3])
@pytest.mark.parametrize("needle", ["TEXT 1", "t 2", "7"])
def test_history_search_is_filtered_by_the_store(
    tmp_path: Path, limit: int | None, needle: str
) -> None:
    texts = [f"text {i}" for i in range(2 * PAGE + 7)]
    path = make_store(tmp_path / "data", [stored(f"m{i:05}", t) for i, t in enumerate(texts)])
    out = io.StringIO()
    with HandedOver(path, read_only=True) as reader:
        print_window(reader, Selection(contains=needle), limit, Printer(out, as_json=False))
    wanted = [f"m{i:05}" for i, t in enumerate(texts) if needle.lower() in t]
    if limit is not None:
        wanted = wanted[-limit:]
    assert [line.split(" ")[2] for line in out.getvalue().splitlines()] == wanted
    assert all(needle.lower() in text for text in reader.handed)  # nothing else was decoded


@given(st.text(min_size=1).filter(lambda t: not t.startswith("--") and "\x00" not in t))
def test_a_search_text_is_read_as_given_even_after_a_dash(text: str) -> None:
    argv = ["history", "--search", text, "--limit", "3"]
    args = build_parser().parse_args(_dash_values(argv))
    assert (args.search, args.limit) == (text, 3)


@given(st.lists(st.sampled_from(["history", "--json", "-v", "--limit", "3", "x", "-y"])))
def test_argv_without_a_text_option_is_unchanged(argv: list[str]) -> None:
    assert _dash_values(argv) == argv


def test_a_search_with_no_text_is_still_an_error() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(_dash_values(["history", "--search", "--json"]))


# -- run --web ADDR ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "web", "config"),
    [
        (["run", "--web", "host.toml"], "", "host.toml"),  # the config, after a bare --web
        (["run", "--web", ":0", "host.toml"], ":0", "host.toml"),
        (["run", "host.toml", "--web"], "", "host.toml"),
        (["run", "--web"], "", None),
        (["run", "host.toml"], None, "host.toml"),
    ],
)
def test_web_takes_an_address_and_leaves_the_config_alone(
    argv: list[str], web: str | None, config: str | None
) -> None:
    args = build_parser().parse_args(argv)
    _config_given_after_web(args)
    assert (args.web, args.config) == (web, config)


@pytest.mark.parametrize(
    ("value", "address"),
    [(":0", "127.0.0.1:0"), ("8765", "127.0.0.1:8765"), ("[::1]:80", "[::1]:80"),
     ("localhost:7", "localhost:7")],
)  # fmt: skip
def test_a_web_address_may_leave_out_its_host(value: str, address: str) -> None:
    assert web_address(value) == address
