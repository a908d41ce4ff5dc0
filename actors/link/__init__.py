"""One link to an MCPL server: the ConnectionActor and everything it delegates to.

Owns the transport (a stdio subprocess or a websocket), the handshake and the grant, the hot
inbound lanes (``push/event``, ``channels/incoming``), the server's other requests, the writer and
reader of the wire, reconnection with backoff, and ``calls`` (a request to a server under a
deadline, from any task).

May import: the root of :mod:`actors` below Host (kernel, context, config, messages, ...),
:mod:`protocol`, :mod:`store`.
Never imported by: :mod:`actors.models`, :mod:`actors.references`, :mod:`actors.transcript`,
the root modules, or :mod:`actors.serverkit`.
"""

from __future__ import annotations

from typing import Any

from actors.version import moved_attribute


def __getattr__(name: str) -> Any:
    return moved_attribute(__name__, name)  # a name of the module this wing was before 0.2.0
