"""The lobby's command line (``python -m tests.lobby --help``) and the options it
gives, usable in-process too."""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass, field

from tests.lobby.words import MODES, OPEN_MODES, REGISTER_CHUNK

RUN_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: easy to read back
RUN_ID_CHARS = 4


def new_run_id() -> str:
    """A short random tag for this process's ids (messages, events, posts)."""
    return "".join(random.SystemRandom().choice(RUN_ID_ALPHABET) for _ in range(RUN_ID_CHARS))


@dataclass
class LobbyOptions:
    """Everything the command line can set; also usable in-process with :func:`serve_ws`."""

    ws: str | None = None
    token: str | None = None
    feature_sets_form: str = "object"
    mcp_only: bool = False
    stray_stdout: bool = False
    fsu_mode: str = "request"
    publish_mode: str = "request"
    open_mode: str = "answer"
    no_echo: bool = False
    script: str | None = None  # None: "default", or "none" when control_connect is set
    interval: float = 3.0
    control_connect: str | None = None
    request_timeout: float = 30.0
    context: bool = False  # lobby.context: context hooks and inference lifecycle
    assist: bool = False  # lobby.assist: inference/request and model/info
    notes: bool = False  # lobby.notes: the note tool, checkpoints and state/rollback
    files: bool = False  # --ws only: plain HTTP GET /files/<name> on the websocket port
    channels: int = 0  # extra channels lobby:#c1 ... registered once ready
    # The prefix of the ids the lobby makes up (``k3xq-m1``, ``k3xq-e1``, ``k3xq-out-1``): a new
    # one per process, so a second run's messages are new to a host that kept the first run's;
    # "" gives the bare form (``m1``).
    run_id: str = field(default_factory=new_run_id)

    def make_id(self, kind: str, n: int) -> str:
        return f"{self.run_id}-{kind}{n}" if self.run_id else f"{kind}{n}"

    @property
    def effective_script(self) -> str:
        if self.script is not None:
            return self.script
        return "none" if self.control_connect else "default"


def split_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def _host_port_arg(text: str) -> str:
    try:
        split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.lobby",
        description="A chat lobby MCPL server (stdio by default). channels/publish honours an "
        "RFC-011 threadId exactly or refuses it ({delivered: false, reason}); streamed "
        "channels/outgoing/* and channels/typing notifications are checked. RFC-006: coalesce "
        "members are sent only where the host's initialize advertised eventCoalescing; "
        "push/render is checked and answered as the render_mode control command says "
        "(default: a text summarizing the notices).",
    )
    p.add_argument("--ws", metavar="HOST:PORT", type=_host_port_arg, help="serve websockets")
    p.add_argument("--token", metavar="T", help="websocket clients must send 'Bearer T'")
    p.add_argument(
        "--feature-sets-form",
        choices=("object", "array"),
        default="object",
        help="'array' sends the 0.4 array form with version 0.4",
    )
    p.add_argument("--mcp-only", action="store_true", help="advertise no MCPL at all")
    p.add_argument(
        "--stray-stdout",
        action="store_true",
        help="print a non-JSON line on stdout after initialized (stdio only)",
    )
    p.add_argument(
        "--fsu-mode",
        choices=MODES,
        default="request",
        help="featureSets/update: answer the request (request), refuse the request form with "
        "-32601 and take the notification (notification-only), or never answer (never)",
    )
    p.add_argument(
        "--publish-mode",
        choices=MODES,
        default="request",
        help="channels/publish, with the same three behaviours as --fsu-mode",
    )
    p.add_argument(
        "--open-mode",
        choices=OPEN_MODES,
        default="answer",
        help="channels/open: answer it (answer) or log it and never answer (never)",
    )
    p.add_argument("--no-echo", action="store_true", help="do not echo published messages")
    p.add_argument(
        "--script",
        choices=("default", "none"),
        default=None,
        help="scripted people (default: 'default', or 'none' with --control-connect)",
    )
    p.add_argument(
        "--interval", type=_positive_float, default=3.0, help="seconds between script ticks"
    )
    p.add_argument(
        "--control-connect",
        metavar="HOST:PORT",
        type=_host_port_arg,
        help="connect to a test control socket (JSON lines)",
    )
    p.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=30.0,
        help="seconds to wait for the host's answer to one of our requests",
    )
    p.add_argument(
        "--context",
        action="store_true",
        help="feature set lobby.context: answer context/beforeInference with a lobby status "
        "line (beforeUser) and take inference/lifecycle notifications",
    )
    p.add_argument(
        "--assist",
        action="store_true",
        help="feature set lobby.assist: inference/request (streaming too) and model/info, "
        "sent on control commands",
    )
    p.add_argument(
        "--notes",
        action="store_true",
        help="feature set lobby.notes (rollback): a 'note' tool whose results carry "
        "checkpoints, and state/rollback",
    )
    p.add_argument(
        "--files",
        action="store_true",
        help="with --ws: also answer plain HTTP 'GET /files/<name>' on the websocket port "
        "(board.png, notes.txt), for references shared by push events",
    )
    p.add_argument(
        "--channels",
        type=int,
        default=0,
        metavar="N",
        help="also register N more channels (lobby:#c1 ... lobby:#cN, label cN) once ready, "
        f"in channels/register requests of at most {REGISTER_CHUNK}; the 'channels' control "
        "event reports how many the host accepted and why it refused the others",
    )
    p.add_argument(
        "--run-id",
        metavar="TAG",
        help="prefix of the ids the lobby makes up (TAG-m1, TAG-e1, TAG-out-1); default: a "
        "random tag per process, so every run's messages are new; '' for the bare form (m1)",
    )
    return p


def parse_args(argv: list[str] | None = None) -> LobbyOptions:
    ns = build_parser().parse_args(argv)
    return LobbyOptions(
        ws=ns.ws,
        token=ns.token,
        feature_sets_form=ns.feature_sets_form,
        mcp_only=ns.mcp_only,
        stray_stdout=ns.stray_stdout,
        fsu_mode=ns.fsu_mode,
        publish_mode=ns.publish_mode,
        open_mode=ns.open_mode,
        no_echo=ns.no_echo,
        script=ns.script,
        interval=ns.interval,
        control_connect=ns.control_connect,
        request_timeout=ns.request_timeout,
        context=ns.context,
        assist=ns.assist,
        notes=ns.notes,
        files=ns.files,
        channels=ns.channels,
        run_id=new_run_id() if ns.run_id is None else ns.run_id,
    )


def display_host(host: str) -> str:
    """How a client dials a listener bound to ``host`` (as in the LISTENING line)."""
    if host in ("0.0.0.0", "", "localhost"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
