"""The ``mcplive`` command: its parser, ``run`` and ``rollback``; ``check`` and ``history`` live
in their own modules, the transcript in ``transcript``."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import trio

from .cli_check import cmd_check
from .cli_history import cmd_history
from .cli_status import add_parser as add_status_parser
from .config import ConfigErrors, load_config
from .errors import ConfigError
from .reload import ignore_sighup_until_ready, reload_on_sighup
from .transcript import print_transcript


def bundled_example() -> Path:
    return Path(str(resources.files("examples") / "lobby.toml"))


async def _run(config: Any, duration: float | None, out: Any) -> None:
    from .host import Host

    async with Host.open(config) as host:
        stream = host.trace()

        async def stop_on_signal(scope: trio.CancelScope) -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    print(f"· {signal.Signals(signum).name}: stopping", file=out, flush=True)
                    scope.cancel()
                    return

        async with trio.open_nursery() as nursery:
            await nursery.start(reload_on_sighup, host, config, out)
            nursery.start_soon(print_transcript, stream, out)
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
        ignore_sighup_until_ready()
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
    add_status_parser(sub)
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
