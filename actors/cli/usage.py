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
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO, TypeVar

from actors.config import ConfigError, ConfigErrors, prices_of, read_config_source, store_of
from actors.models.usage import GROUPINGS, TOKENS, Row, rows_of
from protocol.prices import Price, prices
from store import Reader, StoreError, db_path

T = TypeVar("T")


class UsageError(Exception):
    """A problem with the command line or the config, said in one line."""


def parse_day(text: str) -> float:
    """The start (UTC) of the day ``YYYY-MM-DD``, in seconds since the epoch."""
    try:
        day = dt.date.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(f"--since: {text!r} is not a date (YYYY-MM-DD)") from None
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()


def _where_and_prices(args: argparse.Namespace) -> tuple[Path | str, dict[str, Price]]:
    """The store (the config's PostgreSQL DSN, else the SQLite file in the data dir:
    ``--data-dir``, else the config's, else ``./mcplive-data``) and the price table (the
    config's ``[prices]`` over the built-in one). Only ``[host] data_dir``, ``store``,
    ``store_env`` and ``[prices]`` are read from the config: reading the ledger needs no token or
    API key."""
    if args.config is None:
        return db_path(Path(args.data_dir or "mcplive-data").resolve()), prices()
    raw, base = read_config_source(args.config)
    problems: list[str] = []
    overrides = prices_of(raw.get("prices", {}), problems)
    host = raw.get("host", {})
    value = host.get("data_dir", "./mcplive-data") if isinstance(host, Mapping) else None
    if not isinstance(value, str) or not value:
        problems.append("host.data_dir: must be a path string")
    dsn = store_of(host.get("store"), host.get("store_env"), problems) if value else None
    if problems:
        raise ConfigErrors(problems)
    if dsn is not None:
        return dsn, prices(overrides)
    if args.data_dir:
        return db_path(Path(args.data_dir).resolve()), prices(overrides)
    return db_path((base / str(value)).resolve()), prices(overrides)


def read_store(where: Path | str, read: Callable[[Reader], T]) -> T:
    """``read`` over a read-only connection to the store at ``where`` (the SQLite file, or a
    PostgreSQL DSN); it works beside a running host and changes nothing. A missing or
    unreadable store is a ``UsageError``."""
    if isinstance(where, Path) and not where.is_file():
        raise UsageError(f"no store at {where}; give a CONFIG or --data-dir")
    try:
        with Reader(where, read_only=True) as reader:
            return read(reader)
    except StoreError as exc:
        raise UsageError(str(exc)) from None


def said_in_one_line(command: Callable[[], int]) -> int:
    """Run a reading command: a problem with its arguments, its config or the store is one line
    on standard error and exit status 2."""
    try:
        return command()
    except UsageError as exc:
        print(f"mcplive: {exc}", file=sys.stderr)
    except ConfigError as exc:
        problems = exc.problems if isinstance(exc, ConfigErrors) else [str(exc)]
        print(f"mcplive: {'; '.join(problems)}", file=sys.stderr)
    return 2


def cmd_usage(args: argparse.Namespace) -> int:
    return said_in_one_line(lambda: _usage(args))


def _usage(args: argparse.Namespace) -> int:
    since = None if args.since is None else parse_day(args.since)
    where, table = _where_and_prices(args)
    totals = read_store(where, lambda reader: reader.usage(since=since, agent=args.agent))
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
                *(f"{getattr(row, k):,}" for k in TOKENS),
                _money(row.cost),
            ]
        )
        total.calls += row.calls
        total.silent_turns += row.silent_turns
        for key in TOKENS:
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
            *(f"{getattr(total, k):,}" for k in TOKENS),
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
