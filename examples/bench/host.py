"""What the benchmark's rows share: the bench server's command, its report lines, a host
config, scripted models, percentiles and the size of a store on disk."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from store import connect, db_path

SERVER = [sys.executable, "-m", "examples.bench.server"]

#: A model that never speaks.
SILENT = ""
#: A model that says the number of the newest message it was called with (``message <n>``, or
#: ``probe <n>`` for local input): its first streamed piece marks the moment of the call.
SAYS_INDEX = "[[rules]]\nwhen = '(?:message|probe) (\\d+)'\nsay = \"{1}\"\n"


def bench_fields(line: str) -> dict[str, str] | None:
    """The fields of a ``BENCH k=v ...`` line the bench server writes on stderr, or None."""
    if not line.startswith("BENCH "):
        return None
    return dict(part.split("=", 1) for part in line.split()[1:])


def reported(event: Any) -> list[dict[str, str]]:
    """The fields of the ``BENCH`` lines a trace event carries: a ``server-log`` line, or the
    stderr tail of a ``disconnected`` event (a server's last lines may be traced only after
    its link ended, so a finished server's report is looked for there too)."""
    if event.kind == "server-log":
        lines = [event.data.get("line", "")]
    elif event.kind == "disconnected":
        lines = list(event.data.get("stderr_tail") or ())
    else:
        return []
    return [fields for line in lines if (fields := bench_fields(str(line))) is not None]


def done_seconds(event: Any) -> float | None:
    """The ``seconds`` of a bench server's final report, if ``event`` carries it."""
    for fields in reported(event):
        if "seconds" in fields:
            return float(fields["seconds"])
    return None


def model(workdir: Path, name: str, rules: str) -> str:
    """The ``model`` setting of a scripted model with ``rules``, written in ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.toml"
    path.write_text(rules, encoding="utf-8")
    return f"scripted:{path}"


def agent(
    name: str, model_spec: str, servers: Sequence[str] | None = None, prose_mode: str = ""
) -> dict[str, Any]:
    cfg: dict[str, Any] = {"name": name, "model": model_spec, "context_tokens": 2000}
    if prose_mode:
        cfg["prose_mode"] = prose_mode
    if servers is not None:
        cfg["servers"] = list(servers)
    return cfg


def server(server_id: str, *args: str) -> dict[str, Any]:
    return {"id": server_id, "command": [*SERVER, *args]}


def config(
    data_dir: Path, servers: Sequence[dict[str, Any]], agents: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    return {"host": {"data_dir": str(data_dir)}, "servers": list(servers), "agents": list(agents)}


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def store_bytes(data_dir: Path) -> int:
    """The store's size on disk once its write-ahead log is folded in: the database file plus
    what is left of the log after a checkpoint."""
    path = db_path(data_dir)
    conn = connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
