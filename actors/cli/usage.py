"""``mcplive usage``: what the agents' model calls used and cost, from the store's usage ledger.

The ledger (one row per turn that called a model, see :class:`store.RecordUsage`) is read with a
read-only connection, as ``mcplive history`` reads, so it works beside a running host and never
changes the store. The store sums it by UTC day, agent, model and wake place; this command puts
those sums into the rows asked for (``--by``) and prices them (:mod:`protocol.prices`, with the
config's ``[prices]`` over the built-in table). A row with any model of unknown price has an
unknown cost: ``?`` in the table, ``null`` in ``--json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

import attrs

from actors.config import ConfigError, ConfigErrors, prices_of, read_config_source
from protocol.prices import Price, cost, price_of, prices
from store import Reader, StoreError, UsageTotal, db_path

#: What ``--by`` groups on; without it a row is one day, agent and model.
GROUPINGS = ("day", "agent", "model", "channel")
#: The token counts of a row, in ``--json`` order.
_TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


class UsageError(Exception):
    """A problem with the command line or the config, said in one line."""


@attrs.define
class Row:
    """One printed row: its group and its sums (``cost`` None when a price is unknown)."""

    day: str | None
    agent: str | None
    model: str | None
    channel: str | None = None
    calls: int = 0
    silent_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: Decimal | None = Decimal(0)

    def add(self, total: UsageTotal, price: Price | None) -> None:
        self.calls += total.calls
        self.silent_turns += total.silent_turns
        for key in _TOKENS:
            setattr(self, key, getattr(self, key) + getattr(total, key))
        spent = cost(
            price,
            input_tokens=total.input_tokens,
            output_tokens=total.output_tokens,
            cache_read_tokens=total.cache_read_tokens,
            cache_write_tokens=total.cache_write_tokens,
        )
        self.cost = None if spent is None or self.cost is None else self.cost + spent

    def as_json(self, by: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"day": self.day, "agent": self.agent, "model": self.model}
        if by == "channel":
            out["channel"] = self.channel
        out["calls"] = self.calls
        out["silent_turns"] = self.silent_turns
        for key in _TOKENS:
            out[key] = getattr(self, key)
        out["cost_usd"] = None if self.cost is None else float(round(self.cost, 6))
        return out


def _key(total: UsageTotal, by: str | None) -> tuple[str | None, ...]:
    """The row a sum belongs to: (day, agent, model, channel)."""
    if by is None:
        return (total.day, total.agent, total.model, None)
    if by == "day":
        return (total.day, None, None, None)
    if by == "agent":
        return (None, total.agent, None, None)
    if by == "model":
        return (None, None, total.model, None)
    place = None if total.channel is None else f"{total.server}/{total.channel}"
    return (None, None, None, place)


def rows_of(totals: Iterable[UsageTotal], by: str | None, table: Mapping[str, Price]) -> list[Row]:
    """The printed rows of the ledger's sums, grouped ``by`` (None: day, agent and model)."""
    rows: dict[tuple[str | None, ...], Row] = {}
    for total in totals:
        key = _key(total, by)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(day=key[0], agent=key[1], model=key[2], channel=key[3])
        row.add(total, price_of(total.model, table))
    return sorted(rows.values(), key=lambda r: tuple(v or "" for v in _key_of(r)))


def _key_of(row: Row) -> tuple[str | None, ...]:
    return (row.day, row.agent, row.model, row.channel)


def parse_day(text: str) -> float:
    """The start (UTC) of the day ``YYYY-MM-DD``, in seconds since the epoch."""
    try:
        day = dt.date.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since: {text!r} is not a date (YYYY-MM-DD)") from None
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def _where_and_prices(args: argparse.Namespace) -> tuple[Path, dict[str, Price]]:
    """The data dir (``--data-dir``, else the config's, else ``./mcplive-data``) and the price
    table (the config's ``[prices]`` over the built-in one). Only ``[host] data_dir`` and
    ``[prices]`` are read from the config: reading the ledger needs no token or API key."""
    if args.config is None:
        return Path(args.data_dir or "mcplive-data").resolve(), prices()
    raw, base = read_config_source(args.config)
    problems: list[str] = []
    overrides = prices_of(raw.get("prices", {}), problems)
    host = raw.get("host", {})
    value = host.get("data_dir", "./mcplive-data") if isinstance(host, Mapping) else None
    if not isinstance(value, str) or not value:
        problems.append("host.data_dir: must be a path string")
    if problems:
        raise ConfigErrors(problems)
    if args.data_dir:
        return Path(args.data_dir).resolve(), prices(overrides)
    return (base / str(value)).resolve(), prices(overrides)


def cmd_usage(args: argparse.Namespace) -> int:
    try:
        since = None if args.since is None else parse_day(args.since)
        data_dir, table = _where_and_prices(args)
    except UsageError as exc:
        print(f"mcplive: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        problems = exc.problems if isinstance(exc, ConfigErrors) else [str(exc)]
        print(f"mcplive: {'; '.join(problems)}", file=sys.stderr)
        return 2
    path = db_path(data_dir)
    if not path.is_file():
        print(f"mcplive: no store at {path}; give a CONFIG or --data-dir", file=sys.stderr)
        return 2
    try:
        with Reader(path, read_only=True) as reader:
            totals = reader.usage(since=since, agent=args.agent)
    except StoreError as exc:
        print(f"mcplive: {exc}", file=sys.stderr)
        return 2
    rows = rows_of(totals, args.by, table)
    if args.json:
        for row in rows:
            print(json.dumps(row.as_json(args.by)))
    else:
        print_table(rows, args.by, sys.stdout)
    return 0


def _money(value: Decimal | None) -> str:
    return "?" if value is None else f"${value:,.4f}"


def print_table(rows: list[Row], by: str | None, out: TextIO) -> None:
    """The rows as an aligned table, with a total line (``?`` for an unknown cost)."""
    groups = {"day": ["day"], "agent": ["agent"], "model": ["model"], "channel": ["channel"]}
    names = groups[by] if by is not None else ["day", "agent", "model"]
    header = [*names, "calls", "silent", "input", "output", "cache read", "cache write", "cost"]
    lines = [header]
    total = Row(day=None, agent=None, model=None)
    for row in rows:
        lines.append(
            [
                *(str(getattr(row, n) or "-") for n in names),
                f"{row.calls:,}",
                f"{row.silent_turns:,}",
                *(f"{getattr(row, k):,}" for k in _TOKENS),
                _money(row.cost),
            ]
        )
        total.calls += row.calls
        total.silent_turns += row.silent_turns
        for key in _TOKENS:
            setattr(total, key, getattr(total, key) + getattr(row, key))
        total.cost = None if row.cost is None or total.cost is None else total.cost + row.cost
    if not rows:
        out.write("no model calls recorded\n")
        return
    lines.append(
        [
            "total",
            *([""] * (len(names) - 1)),
            f"{total.calls:,}",
            f"{total.silent_turns:,}",
            *(f"{getattr(total, k):,}" for k in _TOKENS),
            _money(total.cost),
        ]
    )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        cells = [
            cell.ljust(w) if i < len(names) else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.write("  ".join(cells).rstrip() + "\n")


def add_parser(sub: Any) -> None:
    usage = sub.add_parser(
        "usage",
        help="print the tokens and cost of the agents' model calls, from the store's usage "
        "ledger (read-only; works beside a running host)",
    )
    usage.add_argument(
        "config",
        nargs="?",
        help="the host's config: its data dir and its [prices] (default: ./mcplive-data and "
        "the built-in prices)",
    )
    usage.add_argument("--data-dir", help="the data dir (default: the config's)")
    usage.add_argument("--agent", help="only this agent's calls")
    usage.add_argument("--since", metavar="YYYY-MM-DD", help="only calls from this day on (UTC)")
    usage.add_argument("--by", choices=GROUPINGS, help="one row per day, agent, model or channel")
    usage.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per row (cost_usd null when a price is unknown)",
    )
    usage.set_defaults(fn=cmd_usage)
