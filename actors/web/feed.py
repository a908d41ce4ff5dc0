"""The console's live feed: the host's trace as the terminal transcript shows it, as JSON records.

One :class:`Feed` per console reads the trace through the transcript's own printer
(``actors.transcript.printer``: the level filter, the redaction of every configured credential,
the inert line of each kind, and the collapsing of repeated diagnostics), so the page shows what the
terminal shows, plus each event's data. Each record is::

    {"seq": 7, "ts": "2026-12-01T22:31:09.120Z", "kind": "incoming", "level": "info",
     "agent": null, "server_id": "lobby", "channel_id": "lobby:#general",
     "line": "lobby lobby:#general | alice: hi", "data": {...}}

Bounds and policies:

- the feed keeps the newest ``RECENT_CAP`` records for pages that open later (oldest forgotten);
- at most ``MAX_CLIENTS`` pages follow it at once (one more is refused);
- each page has a queue of ``CLIENT_CAP`` records; a page that falls behind loses the oldest
  records in its queue, and the next batch it gets opens with a ``feed-skipped`` record saying
  how many it lost;
- a record's data is cut to a placeholder past ``MAX_DATA_CHARS`` of JSON (the line remains);
- per agent the last ``USAGE_TURNS`` turns' usage and the last ``FOLDS`` folds of its context
  (each fold or merge of summaries), per server the last ``MISMATCHES`` declaration
  mismatches are kept for the agents and servers pages.
"""

from __future__ import annotations

import io
import json
from collections import deque
from typing import Any

import trio

from actors.trace import TraceEvent
from actors.transcript.printer import (
    TranscriptOptions,
    TranscriptPrinter,
    event_record,
    run_printer,
)
from protocol.display import json_safe

RECENT_CAP = 500
MAX_CLIENTS = 32
CLIENT_CAP = 1000
MAX_DATA_CHARS = 16_000
USAGE_TURNS = 20
MISMATCHES = 10
FOLDS = 10
MAX_KEYS = 256  # agents or servers told apart in the per-agent and per-server records


class TooManyClients(Exception):
    """The feed already has ``MAX_CLIENTS`` followers."""


class FeedClient:
    """One page following the feed: a bounded queue, oldest dropped first."""

    def __init__(self, feed: Feed, cap: int = CLIENT_CAP) -> None:
        self._feed = feed
        self.cap = cap
        self.queue: deque[dict[str, Any]] = deque()
        self.skipped = 0
        self._lot = trio.lowlevel.ParkingLot()
        self.closed = False

    def put(self, record: dict[str, Any]) -> None:
        if len(self.queue) >= self.cap:
            self.queue.popleft()
            self.skipped += 1
        self.queue.append(record)
        self._lot.unpark_all()

    async def next_batch(self) -> list[dict[str, Any]]:
        """The records queued since the last batch (waiting for one), a ``feed-skipped``
        record first when some were lost. An empty list: the feed ended."""
        while not self.queue and not self.closed:
            await self._lot.park()
        batch = list(self.queue)
        self.queue.clear()
        if self.skipped:
            n, self.skipped = self.skipped, 0
            batch.insert(0, skipped_record(n))
        return batch

    def end(self) -> None:
        self.closed = True
        self._lot.unpark_all()

    def close(self) -> None:
        self._feed.clients.discard(self)
        self.end()


def skipped_record(count: int) -> dict[str, Any]:
    return {
        "seq": None,
        "kind": "feed-skipped",
        "level": "warning",
        "agent": None,
        "server_id": None,
        "channel_id": None,
        "ts": None,
        "line": f"… {count:,} events skipped: this page fell behind the live feed",
        "data": {"count": count},
    }


class Feed:
    """The console's records of the trace (see the module docstring)."""

    def __init__(self, recent_cap: int = RECENT_CAP, client_cap: int = CLIENT_CAP) -> None:
        self.recent: deque[dict[str, Any]] = deque(maxlen=recent_cap)
        self.clients: set[FeedClient] = set()
        self.client_cap = client_cap
        self.seq = 0
        self.usage: dict[str, deque[dict[str, Any]]] = {}
        self.mismatches: dict[str, deque[dict[str, Any]]] = {}
        self.folds: dict[str, deque[dict[str, Any]]] = {}
        self.ended = False

    def subscribe(self) -> tuple[list[dict[str, Any]], FeedClient]:
        """The recent records and a client that gets every later one (nothing in between is
        missed: both are taken at once)."""
        if len(self.clients) >= MAX_CLIENTS:
            raise TooManyClients(f"at most {MAX_CLIENTS} pages may follow the feed at once")
        client = FeedClient(self, self.client_cap)
        if self.ended:
            client.end()
        else:
            self.clients.add(client)
        return list(self.recent), client

    def add(self, record: dict[str, Any]) -> None:
        self.seq += 1
        record["seq"] = self.seq
        self.recent.append(record)
        self._remember(record)
        for client in self.clients:
            client.put(record)

    def _remember(self, record: dict[str, Any]) -> None:
        kind, data = record["kind"], record["data"]
        if kind == "turn-usage" and record["agent"] is not None:
            _keep(self.usage, record["agent"], USAGE_TURNS, {"ts": record["ts"], **data})
        elif kind == "context-fold" and record["agent"] is not None:
            _keep(self.folds, record["agent"], FOLDS, {"ts": record["ts"], **data})
        elif kind == "declaration-mismatch" and record["server_id"] is not None:
            entry = {"ts": record["ts"], "text": data.get("text")}
            _keep(self.mismatches, record["server_id"], MISMATCHES, entry)

    async def run(self, stream: Any, options: TranscriptOptions) -> None:
        """Read ``stream`` (a trace receiver) until it ends; then every follower is told."""
        try:
            await run_printer(stream, FeedPrinter(self, options))
        finally:
            self.ended = True
            for client in list(self.clients):
                client.end()


def _keep(
    table: dict[str, deque[dict[str, Any]]], key: str, cap: int, entry: dict[str, Any]
) -> None:
    kept = table.get(key)
    if kept is None:
        if len(table) >= MAX_KEYS:
            return  # past the cap a new name's records are not kept
        kept = table[key] = deque(maxlen=cap)
    kept.append(entry)


class FeedPrinter(TranscriptPrinter):
    """The transcript's printer writing records to a :class:`Feed` instead of lines."""

    def __init__(self, feed: Feed, options: TranscriptOptions) -> None:
        super().__init__(io.StringIO(), _as_records(options))  # nothing is written to it
        self.feed = feed

    def _write(self, event: TraceEvent, level: int, line: str | None) -> None:
        redact = self.options.redactor.text
        data: Any = json_safe(event.data, redact)
        if len(json.dumps(data, ensure_ascii=False)) > MAX_DATA_CHARS:
            data = {"omitted": f"more than {MAX_DATA_CHARS:,} characters; see the line"}
        self.feed.add({**event_record(event, level, data), "line": line})


def _as_records(options: TranscriptOptions) -> TranscriptOptions:
    """The printer's options for records: every event at the level passes (``json``)."""
    return TranscriptOptions(level=options.level, json=True, redactor=options.redactor)
