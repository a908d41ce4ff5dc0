"""The ``mcplive`` command: ``run``, ``check`` and ``history``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
import tempfile
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
        outcome = d.get("outcome")
        note = "" if outcome in (None, "delivered") else f" ({outcome}: {d.get('reason')})"
        return f"{where} | {e.agent} → {_excerpt(d.get('text'))}{note}"
    if k == "speech-held":
        draft = f" [{d['draft']}]" if d.get("draft") else ""
        return f"{e.agent} (kept as a draft{draft}: {d.get('reason')}): {_excerpt(d.get('text'))}"
    if k == "asleep":
        return f"· {e.agent} sleeps for {d.get('seconds')}s"
    if k == "awake":
        return f"· {e.agent} wakes: {d.get('reason')}"
    if k == "gate-batch":
        return f"· {e.agent}: {d.get('count')} events batched by gate policy {d.get('policy')}"
    if k == "local":
        return f"operator → {e.agent}: {_excerpt(d.get('text'))}"
    if k == "tool-call":
        arguments = json.dumps(d.get("arguments"), ensure_ascii=False)
        return f"  {e.agent} calls {d.get('tool')} {arguments}"
    if k == "tool-result":
        text = " ".join(b.get("text", "") for b in d.get("content", []) if isinstance(b, Mapping))
        flag = " (error)" if d.get("is_error") else ""
        return f"  {d.get('tool')}{flag} → {_excerpt(text)}"
    if k == "context-injected":
        parts = "; ".join(f"{i['position']}: {i['text']}" for i in d.get("injections", []))
        return f"  {e.server_id} adds context for {e.agent} ({_excerpt(parts)})"
    if k == "injection-dropped":
        return f"! {e.server_id}: an injection for {e.agent} dropped: {d.get('reason')}"
    if k == "hook-failed":
        return f"? {e.server_id}: context hook for {e.agent} skipped: {d.get('error')}"
    if k == "turn-aborted":
        return f"! {e.agent}: turn aborted"
    if k == "inference-request":
        return f"· {e.server_id} asked {d.get('model')} for an inference ({d.get('feature_set')})"
    if k == "rolled-back":
        return f"· {e.agent}: rolled back to {d.get('to')}"
    if k == "error":
        return f"! {e.agent or e.server_id}: {d.get('error')}"
    if k == "disconnected":
        retry = d.get("retry_in_s")
        return f"! {e.server_id} disconnected ({d.get('reason')}); reconnecting in {retry}s"
    if k == "diagnostic":
        return f"? {e.server_id or e.agent}: {_excerpt(d.get('text'))}"
    if k == "channel-registered":
        return f"· {e.server_id} registered {e.channel_id} ({d.get('label') or '-'})"
    if k == "coalesce-audit":
        scope = where if e.server_id else "coalescer"
        bits = [f"key {d['key']}"] if d.get("key") else []
        if d.get("event_ids"):
            bits.append("event " + ", ".join(str(i) for i in d["event_ids"]))
        if d.get("batch"):
            bits.append(f"batch {d['batch']}")
        detail = f" ({'; '.join(bits)})" if bits else ""
        return f"· {scope}: {d.get('reason')}{detail}"
    if k == "trace-dropped":
        return f"! transcript fell behind: {d.get('count')} events not shown"
    return None


async def _run(config: Any, duration: float | None, out: Any) -> None:
    from .host import Host

    async with Host.open(config) as host:
        stream = host.trace()

        async def show() -> None:
            last_context: dict[tuple[str | None, str | None], str] = {}  # one per server, agent
            async for event in stream:
                line = format_event(event)
                if event.kind == "context-injected" and line is not None:
                    # the same status line before every turn is shown once, until it changes
                    key = (event.server_id, event.agent)
                    if last_context.get(key) == line or len(last_context) >= 1024:
                        continue
                    last_context[key] = line
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


def _config_problems(exc: ConfigError) -> int:
    """Print each configuration problem on its own line; the exit status for them."""
    problems = exc.problems if isinstance(exc, ConfigErrors) else [str(exc)]
    for problem in problems:
        print(f"mcplive: {problem}", file=sys.stderr)
    return 2


def cmd_run(args: argparse.Namespace) -> int:
    config: Any = args.config
    if config is None:
        config = _bundled_config(Path(args.data_dir) if args.data_dir else Path("mcplive-data"))
        print(f"· no config given: running the bundled lobby example ({bundled_example()})")
    try:
        if not isinstance(config, dict):
            load_config(config)  # report problems before anything starts
        trio.run(_run, config, args.duration, sys.stdout)
    except ConfigError as exc:
        return _config_problems(exc)
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
    port = str(_free_port())
    for server in raw.get("servers", []):
        server.setdefault("env", {})["PYTHONPATH"] = str(base.parent)
        # the example's websocket lobby listens on a port that is free right now
        if "url" in server:
            server["url"] = server["url"].replace(EXAMPLE_PORT, port)
        server["command"] = [arg.replace(EXAMPLE_PORT, port) for arg in server.get("command", [])]
    raw.setdefault("host", {})["data_dir"] = str(data_dir.resolve())
    return raw


EXAMPLE_PORT = "8765"  # the port written in the bundled example's config


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    manifests: dict[str, Path] = {}
    ids = {s.id for s in cfg.servers}
    for item in args.manifest:
        sid, sep, path = item.partition("=")
        if not sep or sid not in ids:
            problems.append(f"--manifest {item}: give SERVER=FILE with a configured server id")
        else:
            manifests[sid] = Path(path)
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
    status = 0
    for sid, path in manifests.items():
        server = next(s for s in cfg.servers if s.id == sid)
        status |= _report_manifest_file(server, path)
    if args.connect:
        status |= trio.run(_report_connect, cfg)
    return status


def _print_policy(sid: str, source: str, policy: Mapping[str, Any]) -> None:
    print(f"  server {sid} ({source}):")
    print(f"    granted: {', '.join(policy.get('granted', [])) or 'nothing'}")
    if policy.get("denied"):
        print(f"    advertised but not granted: {', '.join(policy['denied'])}")
    for name, state in policy.get("feature_sets", {}).items():
        print(f"    feature set {name}: {state}")


def _report_manifest_file(server: Any, path: Path) -> int:
    from protocol import mcpl
    from protocol.manifest import ManifestError, manifest_digest

    from .connection import policy_report

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"  server {server.id}: cannot read {path}: {exc}")
        return 1
    # Either an initialize result ({capabilities: {experimental: {mcpl}}}) or a bare manifest.
    caps = doc.get("capabilities") if isinstance(doc, dict) and "capabilities" in doc else {}
    manifest = (caps.get("experimental") or {}).get("mcpl") if caps else doc
    if not isinstance(manifest, dict):
        print(f"  server {server.id}: {path} holds no MCPL manifest: it would run MCP-only")
        return 0
    advertised = mcpl.advertised_paths(manifest, caps)
    grant = server.grant_for(advertised)
    declared = mcpl.declared_feature_sets(manifest)
    state = server.feature_sets_for(declared.sets, grant)
    try:
        digest = manifest_digest(manifest)
    except ManifestError as exc:
        digest = f"refused ({exc.code})"
    _print_policy(
        server.id, f"manifest {path}, digest {digest}", policy_report(advertised, grant, state)
    )
    return 0


async def _report_connect(cfg: Any) -> int:
    """Connect to every server (no agent runs), report what the handshake decided."""
    import attrs

    from .host import Host

    pending = {s.id for s in cfg.servers}
    deadline = max((s.request_timeout_s for s in cfg.servers), default=10) + 10
    status = 0
    with tempfile.TemporaryDirectory() as scratch:  # a check leaves the real store alone
        quiet = attrs.evolve(cfg, agents=(), data_dir=Path(scratch))
        status = await _await_reports(Host, quiet, pending, deadline)
    for sid in sorted(pending):
        status = 1
        print(f"  server {sid} (live): no answer within {deadline:g}s")
    return status


async def _await_reports(host_cls: Any, quiet: Any, pending: set[str], deadline: float) -> int:
    status = 0
    async with host_cls.open(quiet) as host:
        with trio.move_on_after(deadline):
            async for event in host.trace():
                sid = event.server_id
                if sid is None or sid not in pending:
                    continue
                if event.kind == "ready":
                    pending.discard(sid)
                    if event.data.get("mcp_only"):
                        tools = ", ".join(event.data.get("tools", [])) or "no tools"
                        print(f"  server {sid} (live): MCP-only; {tools}")
                    else:
                        _print_policy(sid, "live", event.data.get("policy", {}))
                elif event.kind == "disconnected":
                    pending.discard(sid)
                    status = 1
                    print(f"  server {sid} (live): could not connect: {event.data.get('reason')}")
                if not pending:
                    break
    return status


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


def cmd_rollback(args: argparse.Namespace) -> int:
    config: Any = args.config
    if config is None:
        config = _bundled_config(Path(args.data_dir) if args.data_dir else Path("mcplive-data"))
    try:
        cfg = load_config(config)
        return trio.run(_rollback, cfg, args.agent, args.to)
    except ConfigError as exc:
        return _config_problems(exc)


async def _rollback(cfg: Any, agent: str, to: str) -> int:
    """Start the host, wait for the servers whose state the agent checkpointed, roll back."""
    from .host import Host

    if agent not in {a.name for a in cfg.agents}:
        print(f"mcplive: no agent named {agent!r} in the config", file=sys.stderr)
        return 2
    async with Host.open(cfg) as host:
        needed = {
            c.get("server")
            for m in host.history(agent)
            for c in (m.get("metadata") or {}).get("checkpoints", ())
        }
        pending = {s.id for s in cfg.servers if s.id in needed}
        deadline = max((s.request_timeout_s for s in cfg.servers), default=10) + 10
        if pending:
            with trio.move_on_after(deadline):
                async for event in host.trace(kinds={"ready", "disconnected"}):
                    pending.discard(event.server_id)
                    if not pending:
                        break
        try:
            report = await host.rollback(agent, to)
        except Exception as exc:
            print(f"mcplive: rollback refused: {exc}", file=sys.stderr)
            return 1
    print(f"· {agent}: rolled back to {to}; {report['set_aside']} later messages set aside")
    status = 0
    for entry in report["state"]:
        where = f"{entry['server']} / {entry['feature_set']}"
        if "error" in entry or not entry.get("success"):
            status = 1
            why = entry.get("error") or entry.get("reason") or "the server reported no success"
            print(f"  {where}: not rolled back to {entry['requested']}: {why}")
        elif entry.get("rolled_forward"):
            print(f"  {where}: rolled forward to {entry['checkpoint']} from {entry['requested']}")
        else:
            print(f"  {where}: back at {entry['checkpoint']}")
    return status


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
    check.add_argument(
        "--manifest",
        action="append",
        default=[],
        metavar="SERVER=FILE",
        help="report what SERVER would be granted, given its manifest (or initialize result)",
    )
    check.add_argument(
        "--connect", action="store_true", help="connect to each server and report its grant"
    )
    check.set_defaults(fn=cmd_check)
    hist = sub.add_parser("history", help="print stored messages")
    hist.add_argument("--data-dir", default="mcplive-data")
    hist.add_argument("--agent")
    hist.add_argument("--search", metavar="TEXT")
    hist.add_argument("--regex", action="store_true")
    hist.add_argument("--json", action="store_true")
    hist.set_defaults(fn=cmd_history)
    back = sub.add_parser(
        "rollback",
        help="set aside an agent's messages after one message and roll servers' state back",
    )
    back.add_argument("agent")
    back.add_argument("--to", required=True, metavar="MESSAGE_ID")
    back.add_argument("--config", help="the host's config (default: the bundled example)")
    back.add_argument("--data-dir", help="(bundled example only) where the data is")
    back.set_defaults(fn=cmd_rollback)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
