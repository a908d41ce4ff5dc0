"""The wire of the small stdio test servers: one JSON-RPC message per line on stdout and stdin,
standard library only. ``json.dumps`` escapes what is not ASCII, so a lone surrogate a server
sends goes out as its escape (``"\\ud800"``), as a connector relaying a broken client may."""

from __future__ import annotations

import json
import sys
from typing import Any


def send(message: dict[str, Any]) -> None:
    """Write one message (``jsonrpc`` added) and flush it."""
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def receive() -> dict[str, Any] | None:
    """The next message the host sent, or None once it closed stdin."""
    line = sys.stdin.readline()
    if not line:
        return None
    message = json.loads(line)
    assert isinstance(message, dict)
    return message
