"""``mcplive status``: what the host running on a data dir is doing, and a health check.

It never takes the data dir's lock: it asks the lock who holds it (``actors.datadir.holder``)
and reads the status file the host keeps (``actors.status``). The exit status is the verdict of
``protocol.status.assess`` (0 ok, 1 degraded, 3 not running, 4 unknown), or 2 for a bad argument
or config.

With a CONFIG whose ``[host]`` names a PostgreSQL store, it also reads the fleet from that
database (read-only, with short timeouts: :mod:`actors.fleet.view`): each host's last heartbeat
and each lease's holder. The verdict stays about this data dir's host: a fleet that cannot be
read is one line (``fleet: not read: …``, or ``fleet.error`` in the JSON) and never changes the
exit status. An embedded (SQLite) store has no fleet: nothing is read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actors.config import ConfigErrors, read_config_source, store_of
from actors.datadir import holder
from actors.fleet import view as fleet_view
from actors.transcript.printer import local_stamp
from protocol import status as fmt

#: Server states whose stderr tail ``status`` leaves out.
HEALTHY_STATES = frozenset({"ready", "mcp-only"})


def data_dir_of(args: argparse.Namespace) -> Path:
    """The data dir to look at: ``--data-dir``, else the config's ``data_dir`` (relative to the
    config's folder, as the host resolves it), else ``./mcplive-data``. Only the config's
    ``[host]`` table is read: a status check needs no server token or model key."""
    if args.data_dir and args.config:
        raise ConfigErrors(["give a CONFIG or --data-dir, not both"])
    if args.data_dir:
        return Path(args.data_dir).resolve()
    if not args.config:
        return Path("mcplive-data").resolve()
    raw, base = read_config_source(args.config)
    host = raw.get("host", {})
    value = host.get("data_dir", "./mcplive-data") if isinstance(host, Mapping) else None
    if not isinstance(value, str) or not value:
        raise ConfigErrors([f"{args.config}: host.data_dir must be a path string"])
    return (base / value).resolve()


def fleet_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The fleet on the config's PostgreSQL store (:func:`actors.fleet.view.read`), or None when
    there is no config or its store is the embedded one. A store the config names wrongly (say
    an unset ``store_env``) is the fleet's error line, not a failure of the command."""
    if not args.config:
        return None
    try:
        raw, _base = read_config_source(args.config)
    except ConfigErrors:
        return None  # data_dir_of said so already
    host = raw.get("host", {})
    if not isinstance(host, Mapping) or (host.get("store") is None and not host.get("store_env")):
        return None
    problems: list[str] = []
    dsn = store_of(host.get("store"), host.get("store_env"), problems)
    if dsn is None:
        return {"store": None, "error": "; ".join(problems) or "no store"}
    return fleet_view.read(dsn)


def read_status(data_dir: Path) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """(the parsed status file or None, its raw text or None, why it could not be read)."""
    path = data_dir / fmt.FILE_NAME
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None, None, None
    except OSError as exc:
        return None, None, f"{path}: {exc.strerror or exc}"
    try:
        return fmt.parse(text), text, None
    except fmt.StatusFormatError as exc:
        return None, text, f"{path}: {exc}"


def cmd_status(args: argparse.Namespace) -> int:
    try:
        data_dir = data_dir_of(args)
    except ConfigErrors as exc:
        for problem in exc.problems:
            print(f"mcplive: {problem}", file=sys.stderr)
        return 2
    pid = holder(data_dir)
    doc, text, unreadable = read_status(data_dir)
    now = time.time()
    try:
        touched_at: float | None = (data_dir / fmt.FILE_NAME).stat().st_mtime
    except OSError:
        touched_at = None
    verdict = fmt.assess(doc, pid, now, touched_at)
    if unreadable and verdict.code == fmt.UNKNOWN:
        verdict = fmt.Verdict(code=fmt.UNKNOWN, problems=(unreadable,))
    fleet = fleet_of(args)
    if args.json:
        if fleet is not None:
            body = (
                dict(doc)
                if doc is not None
                else {"running": pid is not None, "health": verdict.summary}
            )
            print(json.dumps({**body, "fleet": fleet}, ensure_ascii=False, indent=1))
        elif text is not None and doc is not None:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        else:
            print(json.dumps({"running": pid is not None, "health": verdict.summary}))
        return verdict.code
    lines = summary(data_dir, pid, doc, verdict, now)
    if fleet is not None:  # before the verdict, the report's last line
        lines[-1:-1] = fleet_view.lines(fleet)
    for line in lines:
        print(line)
    return verdict.code


def summary(
    data_dir: Path, pid: int | None, doc: Mapping[str, Any] | None, verdict: Any, now: float
) -> list[str]:
    """The readable report: one line for the host, one per server and agent, the verdict."""
    if pid is None:
        lines = [f"no host running on {data_dir}"]
        if doc is not None:
            lines.append(
                f"  last status: pid {doc.get('pid')}, written {local_time(doc.get('written_at'))}"
                + (" (it was stopping)" if not doc.get("running") else "")
            )
        lines.append(f"health: {verdict.summary}")
        return lines
    if doc is None:
        return [f"a host runs on {data_dir} (pid {pid or '?'})", f"health: {verdict.summary}"]
    started = fmt.seconds(doc.get("started_at"))
    written = fmt.seconds(doc.get("written_at"))
    up = fmt.describe_age(now - started) if started is not None else "?"
    age = fmt.describe_age(now - written) if written is not None else "?"
    lines = [
        f"mcplive {doc.get('mcplive')} running on {data_dir}"
        + (f" as host {doc['host_id']}" if doc.get("host_id") else "")
        + f": pid {doc.get('pid')}, up {up} "
        f"(status written {age} ago)",
        *([f"store: {doc['store']}"] if doc.get("store") else []),
        "servers:",
    ]
    for s in doc.get("servers") or ():
        if not isinstance(s, Mapping):
            continue
        grant = ", ".join(s.get("grant") or ())
        lines.append(
            f"  {s.get('id')}: {s.get('state')}; {s.get('tools')} tools; "
            f"reconnects {s.get('reconnects')}; " + (f"grants {grant}" if grant else "no grant")
        )
        if s.get("channel_count"):
            lines.append("    " + channels_line(s))
        if s.get("last_error"):
            lines.append(f"    last error: {s['last_error']}")
        if s.get("state") not in HEALTHY_STATES:  # a healthy server's stderr is its own chatter
            for line in s.get("stderr_tail") or ():
                lines.append(f"    stderr: {line}")
    lines.append("agents:")
    for a in doc.get("agents") or ():
        if not isinstance(a, Mapping):
            continue
        state = a.get("state")
        if a.get("paused"):
            state = f"paused ({a['paused']})"
        last = a.get("last_turn_at")
        turn = f"last turn {local_time(last)} ({a.get('last_outcome')})" if last else "no turn yet"
        lines.append(
            f"  {a.get('name')}: {state}; {a.get('turns')} turns, {turn}; {a.get('queued')} queued"
        )
        today = today_line(a.get("today"))
        if today:
            lines.append(f"    {today}")
    host_today = today_line(doc.get("today"))
    if host_today and any(
        isinstance(u, Mapping) and u.get("limit") is not None
        for u in (doc["today"].get("tokens"), doc["today"].get("usd"))
    ):
        lines.append(f"all agents: {host_today}")
    lines.append(f"health: {verdict.summary}")
    return lines


def today_line(today: Any) -> str | None:
    """``today (2026-12-06): 1,234 tokens, $0.02; budget 2,000 tokens (766 left)``, from a
    status file's ``today`` entry (None when it has none)."""
    if not isinstance(today, Mapping):
        return None
    tokens, usd = today.get("tokens"), today.get("usd")
    if not isinstance(tokens, Mapping) or not isinstance(usd, Mapping):
        return None
    line = f"today ({today.get('day')}): {_amount('tokens', tokens.get('used'))}, "
    line += _amount("usd", usd.get("used"))
    budgets = [
        f"{_amount(unit, u.get('limit'))} ({_amount(unit, u.get('left'))} left)"
        for unit, u in (("tokens", tokens), ("usd", usd))
        if u.get("limit") is not None
    ]
    return line + ("; budget " + ", ".join(budgets) if budgets else "")


def _amount(unit: str, value: Any) -> str:
    if not isinstance(value, int | float):
        return "?"
    return f"${value:,.2f}" if unit == "usd" else f"{value:,.0f} tokens"


def local_time(value: Any) -> str:
    """A time the status file holds (ISO 8601 in UTC) as the transcript prints times: the local
    date and time (``2026-12-01 22:31:09``); a value that does not parse, as it is."""
    at = fmt.seconds(value)
    return str(value) if at is None else local_stamp(at)


#: Channels named on a server's summary line (the file lists more).
SHOWN_CHANNELS = 8


def channels_line(server: Mapping[str, Any]) -> str:
    """``channels (N): #a, #b (closed for Grace), c (prose held), … and K more``."""
    listed = [c for c in server.get("channels") or () if isinstance(c, Mapping)]
    count = server.get("channel_count") or len(listed)
    named = []
    for c in listed[:SHOWN_CHANNELS]:
        notes = []
        if not c.get("registered", True):
            notes.append("unregistered")
        if c.get("place") == "held":
            notes.append("prose held")
        if c.get("closed_for"):
            notes.append("closed for " + ", ".join(c["closed_for"]))
        name = c.get("label") or c.get("id")
        named.append(f"{name} ({'; '.join(notes)})" if notes else str(name))
    more = count - len(named)
    return f"channels ({count}): " + ", ".join(named) + (f", … and {more} more" if more else "")


def add_parser(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="report what the host running on a data dir is doing; the exit status is a "
        "health check (0 ok, 1 degraded, 3 not running, 4 unknown or stale)",
    )
    status.add_argument(
        "config",
        nargs="?",
        help="the running host's config (only its [host] table is read: data_dir, and a "
        "PostgreSQL store for the fleet); default ./mcplive-data",
    )
    status.add_argument("--data-dir", help="the running host's data dir, instead of a CONFIG")
    status.add_argument(
        "--json",
        action="store_true",
        help="print the host's status file as it is (JSON), with a 'fleet' object on a "
        "PostgreSQL store",
    )
    status.set_defaults(fn=cmd_status)
