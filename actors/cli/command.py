"""The ``mcplive`` command: its parser, ``run`` and ``rollback``; ``check``, ``history`` and
``usage`` live in their own modules, the transcript in ``transcript``."""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import trio

from actors.config import ConfigErrors, HostConfig, data_dir_problem, load_config
from actors.datadir import holder
from actors.errors import ConfigError
from actors.reload import reload_on_sighup
from actors.transcript.lines import LEVEL_NAMES
from actors.transcript.printer import TranscriptOptions, TranscriptPrinter, run_printer
from actors.version import installed_version
from actors.web.auth import console_token
from actors.web.run import WebOptions, console_note, web_options
from protocol.addresses import WebAddressError, is_loopback, parse_web_address

from .audit import add_parser as add_audit_parser
from .check import cmd_check
from .errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    failure_lines,
    is_broken_pipe,
    quiet_after_broken_pipe,
)
from .history import cmd_history
from .logs import redact_logs, setup_logging
from .migrate import add_parser as add_migrate_parser
from .status import add_parser as add_status_parser
from .systemd import notify
from .usage import add_parser as add_usage_parser

#: The folder holding this ``actors`` package (a clone's root, or site-packages).
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def bundled_example() -> Path:
    """The bundled lobby's config: the copy a wheel installs inside this package
    (``actors/cli/lobby``), else the source tree's (``examples/lobby``: a clone, or an editable
    install), which is where a newcomer edits it."""
    installed = Path(str(resources.files("actors.cli"))) / "lobby" / "lobby.toml"
    if installed.is_file():
        return installed
    return _SOURCE_ROOT / "examples" / "lobby" / "lobby.toml"


async def _run(
    config: Any,
    duration: float | None,
    out: Any,
    options: TranscriptOptions | None = None,
    notes: Sequence[str] = (),
    reload_from: Callable[[], HostConfig] | None = None,
    web: WebOptions | None = None,
    web_flag: str | None = None,
) -> None:
    """Run the host and print its transcript to ``out`` until ``duration`` is over or a signal
    comes; then print what the host said while it stopped. With ``web``, the operator console
    is served meanwhile (``web_flag``: the address as ``--web`` gave it, if it did)."""
    from actors.host import Host

    options = options if options is not None else TranscriptOptions()
    # Ctrl-C and SIGTERM are taken from the start, so one that comes while the host starts (or
    # right after the first line) stops it cleanly; once the host stops, a second one is a
    # KeyboardInterrupt again, which ends a stop that hangs.
    receiving = contextlib.ExitStack()
    signals = receiving.enter_context(trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM))
    try:
        async with Host.open(config) as host, contextlib.AsyncExitStack() as stack:
            stack.callback(receiving.close)  # before the console and the host stop
            stream = host.ctx.trace.subscribe_nowait(replay=True)  # from the start, drained whole
            redactor = host.ctx.redactor
            redact_logs(redactor)
            printer = TranscriptPrinter(out, attrs.evolve(options, redactor=redactor))
            for note in notes:
                printer.note(note, trio.current_time())
            if web is not None:
                from actors.web.console import open_console

                # what the host said so far first: its ``host started`` line, which names the
                # data dir, stays the first line of a config's transcript
                _print_so_far(stream, printer)

                serving = open_console(host, web.address, web.token, level=options.level)
                try:
                    console = await stack.enter_async_context(serving)
                except BaseException as exc:
                    if _address_in_use(exc):
                        raise ConfigError(in_use_line(web, web_flag, config.web)) from None
                    raise
                printer.note(console_note(console.url, web.token_env), trio.current_time())

            async def stop_on_signal(scope: trio.CancelScope) -> None:
                async for signum in signals:
                    notify("STOPPING=1")
                    printer.note(f"{signal.Signals(signum).name}: stopping", trio.current_time())
                    scope.cancel()
                    return

            async with trio.open_nursery() as nursery:
                await nursery.start(reload_on_sighup, host, reload_from)
                notify("READY=1\nSTATUS=running")  # a reload from here on is handled
                nursery.start_soon(run_printer, stream, printer)
                nursery.start_soon(stop_on_signal, nursery.cancel_scope)
                if duration is not None:
                    await trio.sleep(duration)
                else:
                    await trio.sleep_forever()
                nursery.cancel_scope.cancel()
    finally:
        receiving.close()
    await run_printer(stream, printer)  # the events of the host's stopping, then the end


def _print_so_far(stream: Any, printer: TranscriptPrinter) -> None:
    """Print the events ``stream`` holds now, without waiting (``run_printer`` goes on from
    there)."""
    while True:
        try:
            event = stream.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return
        printer.handle(event, trio.current_time())


def _config_problems(exc: ConfigError) -> int:
    """Print each configuration problem on its own line; the exit status for them."""
    problems = exc.problems if isinstance(exc, ConfigErrors) else [str(exc)]
    for problem in problems:
        print(f"mcplive: {problem}", file=sys.stderr)
    return 2


def cmd_run(args: argparse.Namespace) -> int:
    level = LEVEL_NAMES[args.log_level or "info"]
    setup_logging(level)
    options = TranscriptOptions(
        level=level,
        json=args.json,
        styled=not args.json and _is_terminal(sys.stdout),
        ascii_json=args.json and not _speaks_utf8(sys.stdout),
    )
    if not args.json:
        _tolerate_unencodable(sys.stdout)
    try:
        _config_given_after_web(args)
        cfg = _host_config(args)  # report problems before anything starts
        notes = _notes(args, cfg)
        reload_from = None if args.config is None else (lambda: _host_config(args))
        web = _web(cfg, args.web)
        _run_while_read(cfg, args.duration, options, notes, reload_from, web, args.web)
    except ConfigError as exc:
        return _config_problems(exc)
    except KeyboardInterrupt:
        print("· stopped", file=sys.stderr)
    return 0


#: ``--web`` without an address: the config's ``[host] web``, else the default one.
WEB_DEFAULT = ""


def _config_given_after_web(args: argparse.Namespace) -> None:
    """``mcplive run --web my.toml``: the optional address took the config's path. A value that
    is no address but names a config (a ``.toml`` or an existing file), with no config given,
    is the config, and the console gets the default address."""
    value = args.web
    if not value or args.config is not None or _looks_like_address(value):
        return
    if value.endswith(".toml") or Path(value).is_file():
        args.config, args.web = value, WEB_DEFAULT


def _looks_like_address(value: str) -> bool:
    return value.isdigit() or (":" in value and not value.endswith(".toml"))


def web_address(value: str) -> str:
    """The console address ``--web VALUE`` names: ``HOST:PORT``, ``:PORT`` or ``PORT`` (on
    127.0.0.1). Raises ``ConfigError`` with one line for anything else."""
    address = f"127.0.0.1:{value}" if value.isdigit() else value
    if address.startswith(":"):
        address = "127.0.0.1" + address
    try:
        parse_web_address(address)
    except WebAddressError as exc:
        raise ConfigError(f"--web {value}: {exc} (or :PORT on 127.0.0.1)") from None
    return address


def _web(cfg: HostConfig, value: str | None) -> WebOptions | None:
    """The console ``run`` serves: ``--web ADDR`` at that address (with the config's token
    variable), a bare ``--web`` or ``[host] web`` as the config says, else none."""
    if not value:
        return web_options(cfg, value is not None)
    address = web_address(value)
    host, _ = parse_web_address(address)
    if cfg.web_token_env is None and not is_loopback(host):
        raise ConfigError(
            f"--web {value}: not a loopback address; serve the console on 127.0.0.1, or set "
            "host.web_token_env to the variable holding its access token"
        )
    return WebOptions(address, console_token(cfg.web_token_env), cfg.web_token_env)


def _notes(args: argparse.Namespace, cfg: HostConfig) -> list[str]:
    """The lines ``run`` prints before the host's own: without a config, which one runs and
    where its data is kept (else the host's first line, ``host started``, says where)."""
    if args.config is None:
        return [
            f"no config given: running the bundled lobby example ({bundled_example()}); "
            f"data in {cfg.data_dir}"
        ]
    return []


def _address_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` (or a failure in its group) is a listening socket's address in use."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_address_in_use(e) for e in exc.exceptions)
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def in_use_line(web: WebOptions, flag: str | None, configured: str | None) -> str:
    """The one line for a console address something else already listens on: named as the
    operator gave it (``--web ADDR``, ``[host] web``, or the default of a bare ``--web``)."""
    if flag:
        where = f"--web {flag}"
    elif configured:
        where = "host.web"
    else:
        where = "--web (its default address)"
    return (
        f"{where}: {web.address} is in use (another mcplive, or another program, listens "
        "there); give a free one with --web HOST:PORT (--web :0 picks a free port), or stop "
        "what listens there"
    )


def _host_config(args: argparse.Namespace) -> HostConfig:
    """The config ``args`` name (the bundled example without one), with ``--data-dir`` applied,
    and a data dir the host can use (else a ``ConfigError`` saying why not)."""
    data_dir = Path(args.data_dir) if args.data_dir else None
    if args.config is None:
        cfg = load_config(_bundled_config(data_dir or Path("mcplive-data")))
    else:
        cfg = load_config(args.config, data_dir=data_dir)
    problem = data_dir_problem(cfg.data_dir)
    if problem is not None:
        raise ConfigError(problem)
    return cfg


def _run_while_read(
    config: Any,
    duration: float | None,
    options: TranscriptOptions,
    notes: Sequence[str],
    reload_from: Callable[[], HostConfig] | None = None,
    web: WebOptions | None = None,
    web_flag: str | None = None,
) -> None:
    """Run the host until it is told to stop, or until whoever reads the transcript stops
    reading (``mcplive run | head``): then the host stops cleanly, with one line saying why."""
    try:
        trio.run(_run, config, duration, sys.stdout, options, notes, reload_from, web, web_flag)
    except* BrokenPipeError:
        # nothing more can be written there; later writes (at exit) go nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        print("mcplive: the transcript's reader went away; the host stopped", file=sys.stderr)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _speaks_utf8(stream: Any) -> bool:
    return str(getattr(stream, "encoding", "") or "").lower().replace("-", "") == "utf8"


def _tolerate_unencodable(stream: Any) -> None:
    """Characters the output's encoding lacks become ``?``, not an error."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None and not _speaks_utf8(stream):
        reconfigure(errors="replace")


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
        # the example's websocket lobby listens on a port that is free right now
        if "url" in server:
            server["url"] = server["url"].replace(EXAMPLE_PORT, port)
        command = [arg.replace(EXAMPLE_PORT, port) for arg in server.get("command", [])]
        # its script, named from the config's folder, as a path that holds from anywhere
        server["command"] = [str(base / arg) if (base / arg).is_file() else arg for arg in command]
        if base.is_relative_to(_SOURCE_ROOT / "examples"):
            # a source tree's lobby imports the toolkit of the mcplive that runs it
            server.setdefault("env", {})["PYTHONPATH"] = str(_SOURCE_ROOT)
    raw.setdefault("host", {})["data_dir"] = str(data_dir.resolve())
    return raw


EXAMPLE_PORT = "8765"  # the port written in the bundled example's config


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cmd_rollback(args: argparse.Namespace) -> int:
    try:
        cfg = _host_config(args)
    except ConfigError as exc:
        return _config_problems(exc)
    pid = holder(cfg.data_dir)
    if pid is not None:
        print(
            f"mcplive: rollback: a host is running on data_dir {cfg.data_dir} "
            f"(pid {pid or 'unknown'}); stop it first (rollback starts the host itself)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    from .rollback import roll_back

    return trio.run(roll_back, cfg, args.agent, args.to)


DATA_DIR_HELP = (
    "where the data is kept, for a config that sets no host.data_dir (or the bundled example); "
    "a config that sets it too is an error"
)


def _count(text: str) -> int:
    """A whole number of at least 0 (an argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


#: Options whose value is text that may start with a dash (``--search -sign``): argparse would
#: take such a value for an option of its own. A value starting with two dashes is still read
#: as an option (``--search --json`` forgot the text); write it ``--search=--text``.
TEXT_OPTIONS = frozenset({"--search"})


def _dash_values(argv: list[str]) -> list[str]:
    """``argv`` with each text option's value that starts with ``-`` joined to its option
    (``--search=-sign``), the form argparse reads as a value."""
    out: list[str] = []
    values = iter(argv)
    for arg in values:
        if arg in TEXT_OPTIONS:
            value = next(values, None)
            if value is not None and value.startswith("-") and not value.startswith("--"):
                out.append(f"{arg}={value}")
                continue
            out.extend([arg] if value is None else [arg, value])
        else:
            out.append(arg)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcplive", description="An MCPL host for LLM agents.")
    p.add_argument(
        "--version",
        action="version",
        version=f"mcplive {installed_version() or 'unknown (not installed)'}",
        help="print the version",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run the host (no CONFIG: the bundled lobby example)")
    run.add_argument("config", nargs="?", help="the TOML config (default: the bundled example)")
    run.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    run.add_argument("--data-dir", help=DATA_DIR_HELP)
    run.add_argument(
        "--json",
        action="store_true",
        help="print one trace event per line as JSON (keys ts, kind, level, agent, server_id, "
        "channel_id, data) instead of the transcript",
    )
    run.add_argument(
        "--web",
        nargs="?",
        const=WEB_DEFAULT,
        metavar="ADDR",
        help="serve the operator console at ADDR: HOST:PORT, or :PORT on 127.0.0.1 (:0 picks a "
        "free port); without ADDR at [host] web, else 127.0.0.1:7340",
    )
    levels = run.add_mutually_exclusive_group()
    levels.add_argument(
        "-v",
        "--verbose",
        dest="log_level",
        action="store_const",
        const="debug",
        help="show debug lines too: servers' stderr, streamed model text, connection attempts",
    )
    levels.add_argument(
        "-q",
        "--quiet",
        dest="log_level",
        action="store_const",
        const="warning",
        help="show only warnings and errors",
    )
    levels.add_argument(
        "--log-level",
        choices=list(LEVEL_NAMES),
        type=str.lower,
        help="show this level and above (default: info); also the level of mcplive's log "
        "records on stderr",
    )
    run.set_defaults(fn=cmd_run)
    check = sub.add_parser("check", help="validate a config file")
    check.add_argument("config", help="the TOML config to check")
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
    hist = sub.add_parser(
        "history",
        help="print stored messages, oldest first (read-only; works beside a running host)",
    )
    hist.add_argument(
        "--data-dir",
        help="the data dir (default: the config's, else ./mcplive-data)",
    )
    hist.add_argument(
        "--config",
        metavar="FILE",
        help="the host's config: its data dir, and the server tokens and key variables whose "
        "values are shown as «redacted» (model API keys in the environment always are)",
    )
    hist.add_argument("--agent", help="only this agent's messages")
    hist.add_argument("--search", metavar="TEXT", help="only messages whose text contains TEXT")
    hist.add_argument("--regex", action="store_true", help="TEXT is a regular expression")
    hist.add_argument("--json", action="store_true", help="one stored message per line, as JSON")
    hist.add_argument("--limit", type=_count, metavar="N", help="only the newest N messages")
    hist.add_argument(
        "--since",
        metavar="WHEN",
        help="only messages stored from WHEN on: an ISO date or date-time (local time unless "
        "it has an offset) or a duration back from now (30s, 15m, 2h, 1d, 1w, 1h30m)",
    )
    hist.add_argument(
        "--channel",
        metavar="CHANNEL",
        help="only messages that came in on CHANNEL: a channel id, or SERVER/CHANNEL",
    )
    hist.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="then print new messages as they are stored, until Ctrl-C",
    )
    hist.set_defaults(fn=cmd_history)
    add_usage_parser(sub)
    add_audit_parser(sub)
    back = sub.add_parser(
        "rollback",
        help="set aside an agent's messages after one message and roll servers' state back",
    )
    back.add_argument("agent", help="the agent whose context is rolled back")
    back.add_argument("--to", required=True, metavar="MESSAGE_ID", help="the last message to keep")
    back.add_argument("--config", help="the host's config (default: the bundled example)")
    back.add_argument("--data-dir", help=DATA_DIR_HELP)
    back.set_defaults(fn=cmd_rollback)
    add_migrate_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(_dash_values(list(sys.argv[1:] if argv is None else argv)))
    setup_logging(logging.WARNING)  # ``run`` sets its own level
    try:
        status = int(args.fn(args))
        sys.stdout.flush()  # here, so that a reader gone away is seen here
        return status
    except BaseException as exc:
        if is_broken_pipe(exc):
            quiet_after_broken_pipe()
            return EXIT_FAILED
        if isinstance(exc, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        found = failure_lines(exc)
        if found is None:
            raise
        lines, status = found
        for line in lines:
            print(f"mcplive: {line}", file=sys.stderr)
        return status
