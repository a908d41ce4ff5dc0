"""The ``mcplive`` command: ``run``, ``check`` and ``history``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import trio

from .config import ConfigErrors, load_config
from .errors import ConfigError
from .trace import TraceEvent


def bundled_example() -> Path:
    return Path(str(resources.files("examples") / "lobby.toml"))


def _excerpt(text: Any, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_event(e: TraceEvent) -> str | None:
    """One transcript line for a trace event, or None for events the transcript leaves out."""
    d = e.data
    where = f"{e.server_id}" + (f" {e.channel_id}" if e.channel_id else "")
    k = e.kind
    if k == "host-started":
        servers = ", ".join(d.get("servers", []))
        agents = ", ".join(d.get("agents", []))
        return f"· host started: servers {servers}; agents {agents}; data in {d.get('data_dir')}"
    if k == "ready":
        mode = "MCP-only (tools only)" if d.get("mcp_only") else "MCPL"
        tools = ", ".join(t for t in d.get("tools", []) if t) or "no tools"
        return f"· {e.server_id} ready: {mode}; {tools}"
    if k == "mcp-only":
        return f"! {e.server_id} runs MCP-only: {d.get('reason')}"
    if k == "incoming":
        return f"{where} | {d.get('author')}: {_excerpt(d.get('text'))}"
    if k == "push":
        return f"{where} | (push) {_excerpt(d.get('text'))}"
    if k == "published":
        return f"{where} | {e.agent} → {_excerpt(d.get('text'))}"
    if k == "speech-held":
        return f"{e.agent} (not published: {d.get('reason')}): {_excerpt(d.get('text'))}"
    if k == "local":
        return f"operator → {e.agent}: {_excerpt(d.get('text'))}"
    if k == "tool-call":
        arguments = json.dumps(d.get("arguments"), ensure_ascii=False)
        return f"  {e.agent} calls {d.get('tool')} {arguments}"
    if k == "tool-result":
        text = " ".join(b.get("text", "") for b in d.get("content", []) if isinstance(b, Mapping))
        flag = " (error)" if d.get("is_error") else ""
        return f"  {d.get('tool')}{flag} → {_excerpt(text)}"
    if k == "error":
        return f"! {e.agent or e.server_id}: {d.get('error')}"
    if k == "disconnected":
        retry = d.get("retry_in_s")
        return f"! {e.server_id} disconnected ({d.get('reason')}); reconnecting in {retry}s"
    if k == "diagnostic":
        return f"? {e.server_id or e.agent}: {_excerpt(d.get('text'))}"
    if k == "channel-registered":
        return f"· {e.server_id} registered {e.channel_id} ({d.get('label') or '-'})"
    if k == "trace-dropped":
        return f"! transcript fell behind: {d.get('count')} events not shown"
    return None


async def _run(config: Any, duration: float | None, out: Any) -> None:
    from .host import Host

    async with Host.open(config) as host:
        stream = host.trace()

        async def show() -> None:
            async for event in stream:
                line = format_event(event)
                if line is not None:
                    print(line, file=out, flush=True)

        async def stop_on_signal(scope: trio.CancelScope) -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    print(f"· {signal.Signals(signum).name}: stopping", file=out, flush=True)
                    scope.cancel()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(show)
            nursery.start_soon(stop_on_signal, nursery.cancel_scope)
            if duration is not None:
                await trio.sleep(duration)
            else:
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()


def cmd_run(args: argparse.Namespace) -> int:
    config: Any = args.config
    if config is None:
        config = _bundled_config(Path(args.data_dir) if args.data_dir else Path("mcplive-data"))
        print(f"· no config given: running the bundled lobby example ({bundled_example()})")
    try:
        if not isinstance(config, dict):
            load_config(config)  # report problems before anything starts
        trio.run(_run, config, args.duration, sys.stdout)
    except ConfigErrors as exc:
        for p in exc.problems:
            print(f"mcplive: {p}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"mcplive: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("· stopped", file=sys.stderr)
    return 0


def _bundled_config(data_dir: Path) -> dict[str, Any]:
    import tomllib

    path = bundled_example()
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    base = path.parent
    for agent in raw.get("agents", []):
        model = agent.get("model", "")
        if model.startswith("scripted:"):
            agent["model"] = "scripted:" + str(base / model.removeprefix("scripted:"))
    for server in raw.get("servers", []):
        server.setdefault("env", {})["PYTHONPATH"] = str(base.parent)
    raw.setdefault("host", {})["data_dir"] = str(data_dir.resolve())
    return raw


def cmd_check(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except ConfigErrors as exc:
        for p in exc.problems:
            print(f"{args.config}: {p}")
        return 1
    from .host import make_model

    problems = []
    for a in cfg.agents:
        try:
            make_model(a)
        except ConfigError as exc:
            problems.append(f"agents[{a.name}].model: {exc}")
    for p in problems:
        print(f"{args.config}: {p}")
    if problems:
        return 1
    print(
        f"{args.config}: ok — {len(cfg.servers)} server(s), {len(cfg.agents)} agent(s); "
        f"data in {cfg.data_dir}"
    )
    for s in cfg.servers:
        how = " ".join(s.command) if s.command else s.url
        print(f"  server {s.id}: {how}")
    for a in cfg.agents:
        hears = ", ".join(a.servers) if a.servers is not None else "all servers"
        print(f"  agent {a.name}: {a.model}; hears {hears}")
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from store import Reader

    path = Path(args.data_dir) / "store.sqlite3"
    if not path.is_file():
        print(f"mcplive: no store at {path}; give --data-dir", file=sys.stderr)
        return 1
    reader = Reader(path)
    try:
        if args.search is not None:
            try:
                messages = reader.search(args.search, agent=args.agent, regex=args.regex)
            except Exception as exc:  # a bad regular expression
                print(f"mcplive: --search: {exc}", file=sys.stderr)
                return 2
        else:
            messages = reader.history(args.agent)
    finally:
        reader.close()
    for m in messages:
        if args.json:
            print(json.dumps(m, ensure_ascii=False, default=str))
        else:
            print(_history_line(m))
    return 0


def _history_line(m: Mapping[str, Any]) -> str:
    meta = m.get("metadata") or {}
    parts = []
    for b in m.get("blocks", []):
        t = b.get("type")
        if t == "text":
            parts.append(b.get("text", ""))
        elif t == "tool_use":
            parts.append(
                f"[calls {b.get('name')} {json.dumps(b.get('input'), ensure_ascii=False)}]"
            )
        elif t == "tool_result":
            inner = " ".join(
                x.get("text", "") for x in b.get("content", []) if isinstance(x, Mapping)
            )
            parts.append(f"[result{' (error)' if b.get('is_error') else ''}: {inner}]")
        else:
            parts.append(f"[{t}]")
    src = meta.get("inbound_source") or {}
    author = (meta.get("author") or {}).get("name")
    where = ""
    if src:
        where = f" {src.get('server')}" + (f" {src.get('channel')}" if src.get("channel") else "")
        where += f" {author}:" if author else ":"
    return f"{m['agent']} {m['role']}{where} " + " ".join(" ".join(parts).split())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcplive", description="An MCPL host for LLM agents.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the host (no CONFIG: the bundled lobby example)")
    run.add_argument("config", nargs="?")
    run.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    run.add_argument("--data-dir", help="(bundled example only) where to keep data")
    run.set_defaults(fn=cmd_run)
    check = sub.add_parser("check", help="validate a config file")
    check.add_argument("config")
    check.set_defaults(fn=cmd_check)
    hist = sub.add_parser("history", help="print stored messages")
    hist.add_argument("--data-dir", default="mcplive-data")
    hist.add_argument("--agent")
    hist.add_argument("--search", metavar="TEXT")
    hist.add_argument("--regex", action="store_true")
    hist.add_argument("--json", action="store_true")
    hist.set_defaults(fn=cmd_history)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
