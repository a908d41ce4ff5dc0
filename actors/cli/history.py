"""``mcplive history``: print stored messages from the store in a data dir, read-only.

A summary of an agent's older context (:mod:`actors.agent.folding`) is shown under the line its
agent
sees, with the first and last ids of the messages it covers (``--json`` gives them all, in
``metadata.summarizes``).

The store is opened with a read-only connection (``Reader(path, read_only=True)``), so history
works beside a running host, on a read-only copy, and never changes a byte of the store.

Memory is bounded by a page of ``PAGE`` messages whatever the size of the store: the newest N
(``--limit``) are found by reading newest first page by page, then printed oldest first page by
page. The one set that grows with the output is the ids set aside by rollbacks in the printed
range (each rollback sets aside a bounded number). ``--follow`` then reads what is stored after
the last printed message every ``FOLLOW_INTERVAL_S`` seconds until it is interrupted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs

from actors.config import MODEL_KEY_VARIABLES, ConfigError, ConfigErrors, host_redactor, load_config
from actors.transcript.printer import utc_stamp
from actors.transcript.stored import history_line
from protocol.display import one_line, well_formed
from protocol.redact import NO_REDACTION, Redactor
from store import Reader, StoredRow, body_text, db_path, text_matcher

#: Messages read from the store at a time.
PAGE = 256
#: How often ``--follow`` looks for new messages, in seconds.
FOLLOW_INTERVAL_S = 0.5
#: The ``kind`` of the system message a rollback stores; its ``set_aside`` lists the ids it set
#: aside (``actors.agent.actor.live_messages`` leaves them out of the agent's context).
ROLLBACK_KIND = "rollback"

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([smhdw]))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_since(text: str, *, now: float) -> float:
    """The time (seconds since the epoch) ``--since`` means: an ISO date or date-time (local time
    unless it carries an offset or ``Z``), or a duration back from ``now`` such as ``90s``,
    ``15m``, ``2h``, ``1d``, ``1w`` or ``1h30m``. Raises ``ValueError`` for anything else."""
    value = text.strip()
    if _DURATION.fullmatch(value):
        return now - sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(value))
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO date/time (2026-05-01, 2026-05-01T14:30) nor a "
            "duration (30s, 15m, 2h, 1d, 1w)"
        ) from None
    return when.timestamp()  # a naive value is local time


@attrs.frozen(kw_only=True)
class Selection:
    """Which stored messages to print: the store filters by agent, time and text (``contains``,
    through its text index); the channels (``(server, channel id)`` pairs) and a regular
    expression (``matches``) are read from each message."""

    agent: str | None = None
    since: float | None = None
    contains: str | None = None
    channels: frozenset[tuple[str, str]] | None = None
    matches: Callable[[str], bool] | None = None

    def wants(self, message: Mapping[str, Any]) -> bool:
        if self.channels is not None and channel_of(message) not in self.channels:
            return False
        if self.matches is not None:
            return self.matches(body_text(message))
        return True

    def walk(self, reader: Reader, **where: Any) -> Iterator[StoredRow]:
        """The messages the store's filters let through (``where``: more of
        :meth:`~store.reader.Reader.walk`'s arguments), a page at a time."""
        return reader.walk(
            agent=self.agent, since=self.since, contains=self.contains, page=PAGE, **where
        )

    @property
    def filters_rows(self) -> bool:
        """Whether some messages the store hands over are left out here."""
        return self.channels is not None or self.matches is not None


def channel_of(message: Mapping[str, Any]) -> tuple[str, str] | None:
    """The ``(server, channel id)`` a message came in on, or None (not from a channel)."""
    meta = message.get("metadata") or {}
    server, cid = meta.get("server_id"), meta.get("channel_id")
    if isinstance(server, str) and isinstance(cid, str):
        return server, cid
    return None


def _label_of(message: Mapping[str, Any]) -> str | None:
    """The channel's label as a stored message names it, or None."""
    source = (message.get("metadata") or {}).get("inbound_source")
    label = source.get("label") if isinstance(source, Mapping) else None
    return label if isinstance(label, str) and label else None


@attrs.frozen
class KnownChannel:
    """A channel messages came in on: its server, its id and its label (None: none stored)."""

    server: str
    cid: str
    label: str | None

    def names(self) -> set[str]:
        """What ``--channel`` may call it without its server: its id, the id without the
        server's ``SERVER:`` prefix, its label, and the label as ``#label``."""
        names = {self.cid}
        prefix, sep, rest = self.cid.partition(":")
        if sep and rest and prefix == self.server:
            names.add(rest)
        if self.label is not None:
            names.update({self.label, "#" + self.label.removeprefix("#")})
        return names

    def shown(self) -> str:
        """How the error line lists it: as ``--channel`` takes it, with its label."""
        label = f" ({self.label})" if self.label is not None and self.label != self.cid else ""
        return f"{self.server}/{self.cid}{label}"


def known_channels(reader: Reader) -> list[KnownChannel]:
    """Every channel a stored message came in on (with the newest label stored for it), in the
    order they first appear."""
    found: dict[tuple[str, str], KnownChannel] = {}
    for row in reader.walk(roles=("user",), page=PAGE):
        where = channel_of(row.message)
        if where is None:
            continue
        label = _label_of(row.message)
        if where not in found or label is not None:
            found[where] = KnownChannel(where[0], where[1], label)
    report_skipped(reader)
    return list(found.values())


def resolve_channel(text: str, known: Iterable[KnownChannel]) -> frozenset[tuple[str, str]]:
    """The ``(server, channel id)`` pairs ``--channel TEXT`` names: a channel id, a label
    (``general`` or ``#general``), the id without its ``SERVER:`` prefix, or any of these after
    ``SERVER/`` (or ``SERVER `` as the transcript prints it). Empty: it names none of ``known``."""
    found: set[tuple[str, str]] = set()
    for channel in known:
        names = channel.names()
        for sep in ("/", " "):
            server, has_sep, rest = text.partition(sep)
            if has_sep and server == channel.server and rest in names:
                found.add((channel.server, channel.cid))
        if text in names:
            found.add((channel.server, channel.cid))
    return frozenset(found)


def cmd_history(args: argparse.Namespace) -> int:
    try:
        path, redactor = _where_and_secrets(args)
    except ConfigError as exc:
        for problem in exc.problems if isinstance(exc, ConfigErrors) else [str(exc)]:
            print(f"mcplive: {problem}", file=sys.stderr)
        return 2
    if isinstance(path, Path) and not path.is_file():
        print(f"mcplive: no store at {path}; give --data-dir", file=sys.stderr)
        return 1
    try:
        since = None if args.since is None else parse_since(args.since, now=time.time())
    except ValueError as exc:
        print(f"mcplive: --since: {exc}", file=sys.stderr)
        return 2
    matches = None
    contains = None
    if args.search is not None and args.regex:
        try:
            matches = text_matcher(args.search, regex=True)
        except re.error as exc:
            print(f"mcplive: --search: not a regular expression ({exc})", file=sys.stderr)
            return 2
    elif args.search is not None:
        contains = args.search
    selection = Selection(agent=args.agent, since=since, contains=contains, matches=matches)
    with Reader(path, read_only=True) as reader:
        if args.agent is not None:
            known = reader.agents()
            if args.agent not in known:
                listed = ", ".join(known) if known else "none yet"
                print(
                    f"mcplive: --agent {args.agent}: no messages stored for that agent in "
                    f"{path}; agents with stored messages: {listed}",
                    file=sys.stderr,
                )
                return 2
        if args.channel is not None:
            known_ones = known_channels(reader)
            channels = resolve_channel(args.channel, known_ones)
            if not channels:
                listed = ", ".join(c.shown() for c in known_ones) or "none yet"
                print(
                    f"mcplive: --channel {args.channel}: no messages stored from that channel in "
                    f"{path}; give a channel id, a label (#general) or SERVER/CHANNEL; channels "
                    f"with stored messages: {listed}",
                    file=sys.stderr,
                )
                return 2
            selection = attrs.evolve(selection, channels=channels)
        printer = Printer(sys.stdout, as_json=args.json, redactor=redactor)
        last = print_window(reader, selection, args.limit, printer)
        report_skipped(reader)
        if args.follow:
            try:
                follow(reader, selection, last, printer)
            except KeyboardInterrupt:
                pass
    return 0


def _where_and_secrets(args: argparse.Namespace) -> tuple[Path | str, Redactor]:
    """The store to read (the SQLite file in the data dir, or the config's PostgreSQL DSN) and
    the redactor of what is printed: the configured credentials with ``--config``, else the
    model API keys in the environment."""
    if args.config is None:
        keys = [os.environ.get(name) for name in MODEL_KEY_VARIABLES]
        return db_path(Path(args.data_dir or "mcplive-data")), Redactor(keys)
    data_dir = Path(args.data_dir) if args.data_dir else None
    cfg = load_config(args.config, data_dir=data_dir)
    return cfg.store_location, host_redactor(cfg)


class Printer:
    """Writes each message as it is printed (flushed, so a pipe or ``--follow`` sees it), with
    every configured credential replaced (``redactor``)."""

    def __init__(self, out: TextIO, *, as_json: bool, redactor: Redactor = NO_REDACTION) -> None:
        self.out = out
        self.as_json = as_json
        self.redactor = redactor

    def print(self, row: StoredRow, set_aside: bool) -> None:
        if self.as_json:
            # when it was stored, as ``run --json`` gives times; then the stored message
            stamped = {"ts": utc_stamp(row.created_at), **row.message}
            line = json.dumps(self.redactor.value(stamped), ensure_ascii=False, default=str)
        else:
            line = history_line(row.message, created_at=row.created_at, set_aside=set_aside)
            line = self.redactor.text(line)
        # whatever a record holds, the line can be written as UTF-8 (in JSON text a raw U+FFFD
        # stands where a lone surrogate was; the JSON stays valid)
        self.out.write(well_formed(line) + "\n")
        self.out.flush()


def print_window(reader: Reader, selection: Selection, limit: int | None, printer: Printer) -> int:
    """Print the selected messages (the newest ``limit`` of them, or all) oldest first; the seq
    to follow on from (the newest message's seq when none were selected)."""
    newest = reader.last_message_seq()
    if limit == 0:
        return int(newest)
    after = 0 if limit is None else _start_of_newest(reader, selection, limit)
    set_aside = _set_aside(reader, selection.agent, after)
    last = after
    for row in _rows(reader, selection, after):
        last = row.seq
        if selection.wants(row.message):
            printer.print(row, row.message["id"] in set_aside)
    return max(last, int(newest))


def follow(
    reader: Reader,
    selection: Selection,
    after: int,
    printer: Printer,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print messages stored after seq ``after`` as they come, forever (a ``KeyboardInterrupt``
    ends it). A rollback stored meanwhile is printed as the system message it is."""
    while True:
        for row in _rows(reader, selection, after):
            after = row.seq
            if selection.wants(row.message):
                printer.print(row, False)
        sleep(FOLLOW_INTERVAL_S)


def _rows(reader: Reader, selection: Selection, after: int) -> Iterator[StoredRow]:
    """Every message stored after seq ``after`` the store's filters let through, page by page
    (what a page skipped reported before its rows)."""
    for row in selection.walk(reader, after_seq=after):
        report_skipped(reader)
        yield row
    report_skipped(reader)


def report_skipped(reader: Reader, err: TextIO | None = None) -> None:
    """One line on stderr for each stored record the reader skipped since the last call (a
    record that does not decode is left out, never an end to the output)."""
    out = sys.stderr if err is None else err
    for skipped in reader.take_skipped():
        what = f"{skipped.what} {skipped.key!r}" if skipped.key else "records"
        where = f" (seq {skipped.seq})" if skipped.seq is not None else ""
        out.write(
            f"mcplive: history: skipped stored {what}{where}: {one_line(skipped.reason, 300)}\n"
        )
        out.flush()


def _start_of_newest(reader: Reader, selection: Selection, limit: int) -> int:
    """The seq just before the oldest of the newest ``limit`` selected messages (0: there are
    no more than ``limit``)."""
    if not selection.filters_rows:
        page = reader.rows(
            agent=selection.agent,
            since=selection.since,
            contains=selection.contains,
            newest_first=True,
            offset=limit - 1,
            limit=1,
        )
        return page[0].seq - 1 if page else 0
    found = 0
    for row in selection.walk(reader, newest_first=True):
        if selection.wants(row.message):
            found += 1
            if found == limit:
                return int(row.seq) - 1
    return 0


def _set_aside(reader: Reader, agent: str | None, after: int) -> set[str]:
    """The ids set aside by the rollbacks stored after seq ``after`` (a rollback only sets aside
    messages older than itself, so older rollbacks cannot touch what is printed)."""
    ids: set[str] = set()
    for row in reader.walk(agent=agent, after_seq=after, roles=("system",), page=PAGE):
        meta = row.message.get("metadata") or {}
        if meta.get("kind") == ROLLBACK_KIND:
            ids.update(i for i in meta.get("set_aside", ()) if isinstance(i, str))
    return ids
