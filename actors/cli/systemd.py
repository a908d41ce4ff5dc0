"""Telling systemd how ``mcplive run`` is doing (``sd_notify``), with the standard library only.

Under ``Type=notify`` systemd counts the service as started once it hears ``READY=1``, and
holds a ``systemctl reload`` until then: the host says it once it listens for SIGHUP, so a reload
right after a start is never lost nor fatal. Outside systemd (no ``NOTIFY_SOCKET``) nothing is
sent. A failure to send is ignored: telling systemd must never stop the host.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send ``state`` (``READY=1``, ``STATUS=…``, ``STOPPING=1``) to systemd's notify socket;
    True when it was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or address[0] not in "/@":
        return False
    if address[0] == "@":  # an abstract socket
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(state.encode("utf-8", "replace"))
        except OSError:
            return False
    return True
