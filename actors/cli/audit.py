"""``mcplive audit``: the operator's actions, from the store's audit record.

The record (one row per pause, resume, reconnect, resend, dismiss, abort or rollback, and per
agent a config reload resumed; see :class:`store.RecordAudit`) is read with a read-only
connection, as ``mcplive usage`` reads the ledger, so it works beside a running host and never
changes the store. Each line: the local time, where the action came from, the action, its target,
whether it changed anything, and how it went.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actors.config import ConfigErrors, read_config_source
from actors.transcript.printer import local_stamp, utc_stamp
from protocol.display import printable
from store import AuditEntry, db_path

from .usage import parse_day, read_store, said_in_one_line

#: The newest actions printed unless ``--limit`` says otherwise.
DEFAULT_LIMIT = 100


def _data_dir(args: argparse.Namespace) -> Path:
    """``--data-dir``, else the config's ``[host] data_dir``, else ``./mcplive-data``. Only that
    key is read from the config: reading the record needs no token or API key."""
    if args.data_dir:
        return Path(args.data_dir).resolve()
    if args.config is None:
        return Path("mcplive-data").resolve()
    raw, base = read_config_source(args.config)
    host = raw.get("host", {})
    value = host.get("data_dir", "./mcplive-data") if isinstance(host, Mapping) else None
    if not isinstance(value, str) or not value:
        raise ConfigErrors(["host.data_dir: must be a path string"])
    return (base / value).resolve()


def line_of(entry: AuditEntry) -> str:
    """One printed line of the record."""
    outcome = "changed" if entry.changed else "no change"
    detail = f": {entry.detail}" if entry.detail else ""
    text = f"{entry.source}  {entry.action} {entry.target}  ({outcome}){detail}"
    return f"{local_stamp(entry.at)}  {printable(text)}"


def json_of(entry: AuditEntry) -> dict[str, Any]:
    """One ``--json`` object of the record: ``ts`` in UTC, then the row's fields."""
    return {"ts": utc_stamp(entry.at), **entry.as_json()}


def cmd_audit(args: argparse.Namespace) -> int:
    return said_in_one_line(lambda: _audit(args))


def _audit(args: argparse.Namespace) -> int:
    since = None if args.since is None else parse_day(args.since)
    entries = read_store(db_path(_data_dir(args)), lambda r: r.audit(since=since, limit=args.limit))
    for entry in entries:
        print(json.dumps(json_of(entry)) if args.json else line_of(entry))
    if not entries and not args.json:
        print("no operator actions recorded")
    return 0


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def add_parser(sub: Any) -> None:
    audit = sub.add_parser(
        "audit",
        help="print the operator's actions (pause, resume, reconnect, drafts, …) from the "
        "store's audit record (read-only; works beside a running host)",
    )
    audit.add_argument(
        "config", nargs="?", help="the host's config, for its data dir (default: ./mcplive-data)"
    )
    audit.add_argument("--data-dir", help="the data dir (default: the config's)")
    audit.add_argument("--since", metavar="YYYY-MM-DD", help="only actions from this day on (UTC)")
    audit.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"the newest N actions (default {DEFAULT_LIMIT})",
    )
    audit.add_argument("--json", action="store_true", help="one JSON object per action")
    audit.set_defaults(fn=cmd_audit)
