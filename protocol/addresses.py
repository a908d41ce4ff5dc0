"""The operator console's address: ``[host] web`` as ``HOST:PORT``, and whether it is loopback.

Pure: the config checks it at load (``host.web``), and the console parses it when it starts.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

#: The address ``mcplive run --web`` serves the console on when the config names none.
DEFAULT_WEB = "127.0.0.1:7340"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class WebAddressError(ValueError):
    """An address the console cannot listen on, as one line."""


def parse_web_address(value: object) -> tuple[str, int]:
    """``"HOST:PORT"`` (an IPv6 host in brackets) → (host, port); port 0 picks a free one.
    Raises :class:`WebAddressError` saying what is wrong."""
    if not isinstance(value, str) or not value:
        raise WebAddressError("must be an address string such as '127.0.0.1:7340'")
    parts = urlsplit(f"//{value}")
    try:
        port = parts.port
    except ValueError:
        raise WebAddressError(f"{value!r} has no valid port (0-65535)") from None
    host = parts.hostname
    if port is None or not host or parts.path or parts.query or parts.username:
        raise WebAddressError(f"{value!r} is not HOST:PORT, e.g. '127.0.0.1:7340'")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) can only be reached from this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address_problem(web: object, token_env: object) -> str | None:
    """Why ``[host] web`` / ``web_token_env`` cannot be used, as one line; None when they can."""
    if token_env is not None and not (isinstance(token_env, str) and token_env.isidentifier()):
        return "host.web_token_env: must be the name of an environment variable"
    if web is None:
        return None
    try:
        host, _ = parse_web_address(web)
    except WebAddressError as exc:
        return f"host.web: {exc}"
    if token_env is None and not is_loopback(host):
        return (
            f"host.web: {web!r} is not a loopback address; serve the console on 127.0.0.1, or "
            "set host.web_token_env to the variable holding its access token"
        )
    return None
