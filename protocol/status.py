"""The status file a running host writes (``<data_dir>/status.json``) and the health verdict
``mcplive status`` draws from it.

The host rewrites the file whenever what it says changes and at least every ``interval_s``
seconds, so a reader can tell a live host from a hung one: the file names the writer's pid and
when it was written. The verdict is an exit status a supervisor can act on:

=====  ==================================================================================
code   meaning
=====  ==================================================================================
0      a host runs and every server is ready (MCPL or MCP-only), no agent is paused
1      a host runs but is degraded: a server is not ready, an agent is paused, or it is
       stopping
3      no host runs on the data dir (nobody holds its lock)
4      the status is unknown: a host holds the lock but its file is missing, unreadable,
       another host's, or older than ``STALE_INTERVALS`` intervals
=====  ==================================================================================

Pure: time is a parameter (POSIX seconds), the file's text comes in as a string.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

FORMAT = 1
FILE_NAME = "status.json"
#: A file written longer ago than this many of its own intervals is stale.
STALE_INTERVALS = 3

HEALTHY = 0
DEGRADED = 1
NOT_RUNNING = 3
UNKNOWN = 4

#: Server states. A server with no status yet, or whose handshake has not finished, is
#: ``connecting``.
READY_STATES = frozenset({"ready", "mcp-only"})


class StatusFormatError(ValueError):
    """The status file is not one this version reads; ``str()`` is one line."""


@attrs.frozen(kw_only=True)
class Verdict:
    code: int
    problems: tuple[str, ...] = ()  # one line each, most important first

    @property
    def summary(self) -> str:
        if self.code == HEALTHY:
            return "ok"
        label = {DEGRADED: "degraded", NOT_RUNNING: "not running", UNKNOWN: "unknown"}[self.code]
        return f"{label}: " + "; ".join(self.problems) if self.problems else label


def server_state(connected: bool, ready: bool, mcp_only: bool) -> str:
    if ready:
        return "mcp-only" if mcp_only else "ready"
    return "connecting" if connected else "disconnected"


def agent_state(paused: Any, held: bool, turn_running: bool) -> str:
    if paused:
        return "paused"
    if held:
        return "held"
    return "turn" if turn_running else "idle"


def iso(at: float) -> str:
    """POSIX seconds as ISO-8601 UTC with milliseconds."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def seconds(text: Any) -> float | None:
    """ISO-8601 (as :func:`iso` writes it) back to POSIX seconds; None if it does not parse."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    return parsed.timestamp()


def parse(text: str) -> dict[str, Any]:
    """The status document in ``text``; :class:`StatusFormatError` if it is not one."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise StatusFormatError("the status file is not JSON (cut short while written?)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StatusFormatError(f"the status file is not format {FORMAT}")
    for key, kind in (("pid", int), ("servers", list), ("agents", list), ("running", bool)):
        if not isinstance(doc.get(key), kind):
            raise StatusFormatError(f"the status file has no valid {key!r}")
    interval = doc.get("interval_s")
    if not isinstance(interval, int | float) or not math.isfinite(interval) or interval <= 0:
        raise StatusFormatError("the status file has no valid 'interval_s'")
    if seconds(doc.get("written_at")) is None:
        raise StatusFormatError("the status file has no valid 'written_at'")
    return doc


def assess(
    doc: Mapping[str, Any] | None,
    holder: int | None,
    now: float,
    touched_at: float | None = None,
) -> Verdict:
    """The health of the host on a data dir: ``holder`` is the pid holding its lock (0: held,
    pid unknown; None: not held), ``doc`` the parsed status file (None: missing or unreadable),
    ``now`` the reader's time, ``touched_at`` the file's modification time (None: unknown).

    A host whose writes fail (a full disk) still touches the file at each heartbeat: old
    content in a file touched in time is a host that runs but cannot write (degraded, not
    hung)."""
    if holder is None:
        return Verdict(code=NOT_RUNNING, problems=("no host holds the data dir's lock",))
    if doc is None:
        return Verdict(code=UNKNOWN, problems=("the running host has written no status yet",))
    pid = doc.get("pid")
    if holder and pid != holder:
        return Verdict(
            code=UNKNOWN,
            problems=(f"the status file is from pid {pid}, but pid {holder} holds the lock",),
        )
    written = seconds(doc.get("written_at"))
    interval = float(doc.get("interval_s") or 0)
    age = now - written if written is not None else math.inf
    problems: list[str] = []
    if age > STALE_INTERVALS * interval:
        touched_age = now - touched_at if touched_at is not None else math.inf
        if touched_age > STALE_INTERVALS * interval:
            return Verdict(
                code=UNKNOWN,
                problems=(f"the status was written {describe_age(age)} ago (hung?)",),
            )
        problems.append(
            f"the status file could not be written for {describe_age(age)} (a full disk?); "
            "what follows is from then"
        )
    if not doc.get("running"):
        problems.append("the host is stopping")
    for server in _entries(doc.get("servers")):
        state = server.get("state")
        if state not in READY_STATES:
            error = server.get("last_error")
            problems.append(f"{server.get('id')} {state}" + (f" ({error})" if error else ""))
    for agent in _entries(doc.get("agents")):
        if agent.get("paused"):
            problems.append(f"{agent.get('name')} paused ({agent['paused']})")
    return Verdict(code=DEGRADED if problems else HEALTHY, problems=tuple(problems))


def describe_age(age: float) -> str:
    """A duration for people: ``42 s``, ``5 min``, ``3 h 12 min``, ``2 d 4 h``."""
    if not math.isfinite(age):
        return "an unknown time"
    s = max(0, int(age))
    if s < 120:
        return f"{s} s"
    m = s // 60
    if m < 120:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def _entries(value: Any) -> Sequence[Mapping[str, Any]]:
    if not isinstance(value, list):
        return ()
    return [v for v in value if isinstance(v, Mapping)]
