"""The host's status file, ``<data_dir>/status.json``, for ``mcplive status`` and supervisors.

A :class:`StatusWriter` builds a snapshot of every server's and agent's published status
(``ctx.statuses``, ``ctx.agent_statuses``: snapshots their actors replace, read here without an
ask) every second, and writes it when it differs from the last one written or when
``WRITE_EVERY_S`` seconds have passed (the heartbeat a reader checks for staleness). A write
goes to a temporary file that is flushed to disk and renamed over the old one, so a reader never
sees half a file. Configured credentials never reach the file: every string in it goes through a
:class:`protocol.redact.Redactor` built from them.

When the host stops, one last snapshot says ``"running": false``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio
from trio_util import AsyncValue

from protocol import status as fmt
from protocol.display import one_line
from protocol.redact import Redactor
from protocol.vitals import per_minute
from store.dbapi import describe

from .config import HostConfig, ServerConfig, host_redactor
from .messages import ChannelInfo
from .version import installed_version

#: How often (wall clock) the snapshot is compared with the one last written.
CHECK_EVERY_S = 1.0
#: The heartbeat: the longest wall-clock time between two writes (the file's ``interval_s``).
WRITE_EVERY_S = 5.0
#: How long the last write of a stopping host may take.
FINAL_WRITE_S = 5.0
#: Caps on what one entry carries (the sources are bounded; these bound the file too).
MAX_TAIL_LINES = 20
MAX_DISCONNECTS = 20
MAX_LINE_CHARS = 500
MAX_NAMES = 200
#: Channels listed per server (the first by id; ``channel_count`` says how many there are).
MAX_CHANNELS = 50


def _clip(text: Any) -> str | None:
    return None if text is None else one_line(str(text), MAX_LINE_CHARS)


def channel_entry(info: ChannelInfo) -> dict[str, Any]:
    """One channel as the file lists it: where prose goes (``"held"``: the server declared no
    publish target), and the agents for whom it is closed."""
    return {
        "id": _clip(info.channel_id),
        "label": _clip(info.label),
        "registered": info.registered,
        "place": info.place or "held",
        "closed_for": sorted(a for a, is_open in info.open_for.items() if not is_open)[:MAX_NAMES],
    }


def vitals_entry(v: Any, now: float | None, *, minutes: int = 1) -> dict[str, Any]:
    """What the file and the console say of a server's ``ServerVitals`` (``actors.link.vitals``):
    when it connected (None: not ready now), its disconnects, its messages in and out in each of
    the last ``minutes`` whole minutes before ``now`` (trio's clock; None: not counted), its
    request latency and its stderr lines with their times. Times are ISO-8601 UTC."""
    traffic: dict[str, Any] = {"minutes": minutes, "in": None, "out": None}
    if now is not None:
        got_in, got_out = per_minute(tuple(getattr(v, "traffic", ())), now, minutes)
        traffic.update({"in": list(got_in), "out": list(got_out)})
    since = getattr(v, "connected_since", None)
    return {
        "connected_since": fmt.iso(since) if since is not None else None,
        "connects": int(getattr(v, "connects", 0) or 0),
        "disconnects": [
            {"at": fmt.iso(d.at), "reason": _clip(d.reason), "ready_for_s": d.ready_for_s}
            for d in tuple(getattr(v, "disconnects", ()))[-MAX_DISCONNECTS:]
        ],
        "per_minute": traffic,
        "latency": dict(getattr(v, "latency", None) or {}),
        "stderr": [
            {"at": fmt.iso(at), "line": _clip(line)}
            for at, line in tuple(getattr(v, "stderr", ()))[-MAX_TAIL_LINES:]
        ],
    }


def server_entry(
    cfg: ServerConfig,
    st: Any,
    channels: tuple[list[ChannelInfo], int] = ([], 0),
    vitals: Any = None,
    now: float | None = None,
) -> dict[str, Any]:
    """One server's part of the file, from its published ``ConnStatus`` (None: not yet
    published), its ``channels`` (the first ones by id, and how many it has) and its
    ``ServerVitals`` (None: none yet; see :func:`vitals_entry`, at ``now``). Read
    defensively: a field an older snapshot lacks counts as unset."""
    listed, count = channels
    connects = int(getattr(st, "connects", 0) or 0)
    enabled = getattr(st, "feature_sets", None) or {}
    return {
        "id": cfg.id,
        "state": fmt.server_state(
            bool(getattr(st, "connected", False)),
            bool(getattr(st, "ready", False)),
            bool(getattr(st, "mcp_only", False)),
        )
        if st is not None
        else "connecting",  # its first link is still being set up
        "grant": sorted(getattr(st, "grant", None) or ())[:MAX_NAMES],
        "feature_sets": sorted(enabled)[:MAX_NAMES],
        "tools": len(getattr(st, "tools", None) or ()),
        "connects": connects,
        "reconnects": max(0, connects - 1),
        "last_error": _clip(getattr(st, "last_error", None)),
        "stderr_tail": [
            _clip(line) for line in tuple(getattr(st, "stderr_tail", None) or ())[-MAX_TAIL_LINES:]
        ],
        "channel_count": count,
        "channels": [channel_entry(info) for info in listed[:MAX_CHANNELS]],
        "vitals": vitals_entry(vitals, now) if vitals is not None else None,
    }


def agent_entry(name: str, st: Any) -> dict[str, Any]:
    """One agent's part of the file, from its published ``AgentStatus`` (None: not yet
    published); unknown fields count as unset."""
    paused = _clip(getattr(st, "paused", None))
    held = bool(getattr(st, "held", False))
    running = bool(getattr(st, "turn_running", False))
    last = getattr(st, "last_turn_at", None)
    usage = getattr(st, "usage", None) or {}
    return {
        "name": name,
        "state": fmt.agent_state(paused, held, running) if st is not None else "starting",
        "paused": paused,
        "held": held,
        "turn_running": running,
        "queued": int(getattr(st, "queued", 0) or 0),
        "turns": int(getattr(st, "turns", 0) or 0),
        "wakes": int(getattr(st, "wakes", 0) or 0),
        "model_errors": int(getattr(st, "model_errors", 0) or 0),
        "last_turn_at": fmt.iso(last) if isinstance(last, int | float) else None,
        "last_outcome": _clip(getattr(st, "last_outcome", None)),
        "usage": {str(k): v for k, v in usage.items() if isinstance(v, int)},
        "today": dict(getattr(st, "today", None) or {}),
    }


def snapshot(
    config: HostConfig,
    statuses: Mapping[str, Any],
    agent_statuses: Mapping[str, Any],
    *,
    pid: int,
    started_at: float,
    running: bool,
    redactor: Redactor,
    channels: Callable[[str], tuple[list[ChannelInfo], int]] | None = None,
    loop: Mapping[str, Any] | None = None,
    day: Any = None,
    vitals: Callable[[str], Any] | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The file's content less ``written_at`` (which the writer adds): every configured server
    (with its channels, from ``channels(server_id)``) and agent, in configuration order,
    redacted."""
    listed = channels or (lambda _sid: ([], 0))
    vital = vitals or (lambda _sid: None)
    doc = {
        "format": fmt.FORMAT,
        "mcplive": installed_version() or "0",
        "pid": pid,
        "host_id": config.host_id,
        "store": describe(config.store_location),
        "started_at": fmt.iso(started_at),
        "interval_s": WRITE_EVERY_S,
        "running": running,
        "data_dir": str(config.data_dir),
        "servers": [
            server_entry(s, statuses.get(s.id), listed(s.id), vital(s.id), now)
            for s in config.servers
        ],
        "agents": [agent_entry(a.name, agent_statuses.get(a.name)) for a in config.agents],
    }
    if loop is not None:
        doc["loop"] = dict(loop)
    if day is not None:
        doc["today"] = day.snapshot(time.time())
    result: dict[str, Any] = redactor.value(doc)
    return result


def _trio_now() -> float | None:
    """Trio's clock, when called on a trio loop (the host's); None elsewhere."""
    try:
        return trio.current_time()
    except RuntimeError:
        return None


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` whole: a temporary file beside it, flushed to disk, then
    renamed over it (blocking: call it from a worker thread)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(temporary, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


class StatusWriter:
    """Keeps ``<data_dir>/status.json`` current while the host runs (see the module).

    The pace is wall-clock time, kept by a thread of its own that asks the host's trio loop for
    each snapshot (so a hung loop stops the heartbeat, and the file goes stale as it should).
    A timer on the host's clock would do the same in production, but a host run on a test's
    ``MockClock`` would then never be idle past the next tick: every leap to a far deadline
    would stop at each one.
    """

    def __init__(
        self,
        ctx: Any,
        *,
        wall_clock: Callable[[], float] = time.time,
        check_every: float = CHECK_EVERY_S,
    ) -> None:
        self.ctx = ctx
        self.path = Path(ctx.config.data_dir) / fmt.FILE_NAME
        self.clock = wall_clock
        self.check_every = check_every
        self.started_at = wall_clock()
        self.pid = os.getpid()
        self.redactor = host_redactor(ctx.config)
        self._failing = False
        #: The document last written (None before the first): each write replaces it.
        self.written: AsyncValue[dict[str, Any] | None] = AsyncValue(None)

    def body(self, *, running: bool = True) -> dict[str, Any]:
        ctx = self.ctx
        return snapshot(
            ctx.config,
            ctx.statuses,
            ctx.agent_statuses,
            pid=self.pid,
            started_at=self.started_at,
            running=running,
            redactor=self.redactor,
            channels=self._channels,
            loop=watch.summary() if (watch := getattr(ctx, "loop_watch", None)) else None,
            day=getattr(ctx, "day", None),
            vitals=self._vitals,
            now=_trio_now(),
        )

    def _vitals(self, server_id: str) -> Any:
        live = getattr(self.ctx, "vitals", {}).get(server_id)
        return live.snapshot() if live is not None else None

    def _channels(self, server_id: str) -> tuple[list[ChannelInfo], int]:
        directory = getattr(self.ctx, "channel_directory", None)
        if directory is None:
            return [], 0
        return directory.first(server_id, self.ctx.config, MAX_CHANNELS)

    async def run(self) -> None:
        """Write until cancelled, then write the last snapshot (``"running": false``)."""
        stop = threading.Event()
        thread = threading.Thread(
            target=self._loop,
            args=(trio.lowlevel.current_trio_token(), stop),
            name="mcplive-status",
            daemon=True,
        )
        thread.start()
        try:
            await trio.sleep_forever()
        finally:
            stop.set()
            final = self.body(running=False)
            # One uninterruptible thread call, bounded by the join's own timeout and one write
            # (a trio deadline here would fire at once on an autojumping test clock).
            with trio.CancelScope(shield=True):
                doc, error = await trio.to_thread.run_sync(self._last_write, thread, final)
            self._written(doc, error)

    def _loop(self, token: trio.lowlevel.TrioToken, stop: threading.Event) -> None:
        last: dict[str, Any] | None = None
        last_at = -float("inf")
        while not stop.is_set():
            try:
                body = trio.from_thread.run_sync(self.body, trio_token=token)
            except (trio.RunFinishedError, trio.Cancelled):
                return
            now = self.clock()
            if stop.is_set():
                return  # the final write is the host's
            if body != last or now - last_at >= WRITE_EVERY_S:
                doc, error = self._write(body, now)
                if error is None:
                    last, last_at = body, now
                try:
                    trio.from_thread.run_sync(self._written, doc, error, trio_token=token)
                except (trio.RunFinishedError, trio.Cancelled):
                    return
            stop.wait(self.check_every)

    def _last_write(
        self, thread: threading.Thread, body: dict[str, Any]
    ) -> tuple[dict[str, Any], str | None]:
        thread.join(FINAL_WRITE_S)  # its write in progress, if any, goes first
        return self._write(body, self.clock())

    def _write(self, body: dict[str, Any], now: float) -> tuple[dict[str, Any], str | None]:
        """Write one snapshot (blocking): the document, and None or why it failed."""
        doc = {**body, "written_at": fmt.iso(now)}
        data = json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8", "replace") + b"\n"
        try:
            write_atomic(self.path, data)
        except OSError as exc:
            # the heartbeat goes on where the content cannot: a touch needs no free space
            with contextlib.suppress(OSError):
                os.utime(self.path)
            return doc, exc.strerror or str(exc)
        return doc, None

    def _written(self, doc: dict[str, Any], error: str | None) -> None:
        """On the host's loop, after each write. A failure is one transcript line per streak of
        failures, not one a second."""
        if error is None:
            self.written.value = doc
        elif not self._failing:
            self.ctx.trace.emit("status-unwritten", data={"path": str(self.path), "error": error})
        self._failing = error is not None
