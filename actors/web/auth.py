"""Who may use the operator console: its address, its access token and the checks on each request.

The rules, in order:

- The console listens on a loopback address unless the config names a token variable
  (``[host] web_token_env``): an address anyone on the network could reach needs a token.
- With a token, every request carries it: ``Authorization: Bearer TOKEN``, or the cookie the
  console sets when a page is first opened as ``/?token=TOKEN`` (so a browser can use it). The
  comparison takes the same time whatever the guess.
- Actions (``POST``) need more than a page view, so that another web page open in the same
  browser cannot make them: the bearer header (which a cross-site page cannot send without a
  preflight this console never grants), or the per-run *action key* the console writes into the
  page it serves, sent back as the ``X-Mcplive-Action`` header (a page of another origin cannot
  read it). Without a token that key is all an action needs, on loopback only.
- A request naming an ``Origin`` other than the console's own is refused, and on loopback the
  ``Host`` header must name a loopback address (a foreign name pointed at 127.0.0.1 is refused).
- The one exception: the console's icon (``GET /favicon.ico``, :data:`PUBLIC_PATHS`) is the
  same picture for everyone and tells nothing of the host, so it needs no token (a browser asks
  for it without the cookie's page, and a refusal would only fill its log).
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from actors.errors import ConfigError
from protocol.addresses import (
    DEFAULT_WEB,
    LOOPBACK_NAMES,
    WebAddressError,
    address_problem,
    is_loopback,
    parse_web_address,
)

#: The cookie holding the token in a browser.
COOKIE = "mcplive_console"
#: The header carrying the per-run action key.
ACTION_HEADER = "x-mcplive-action"
#: What anyone may read without a token (``GET`` or ``HEAD`` only): the console's icon.
PUBLIC_PATHS = frozenset({"/favicon.ico"})


def is_public(method: str, path: str) -> bool:
    """Whether a request needs no token: a read of one of the :data:`PUBLIC_PATHS`."""
    return method in ("GET", "HEAD") and path in PUBLIC_PATHS


def console_token(token_env: str | None, environ: Any = None) -> str | None:
    """The access token named by ``web_token_env`` (None: none configured). A variable that is
    unset or empty is a ``ConfigError``: the console would otherwise be open."""
    if token_env is None:
        return None
    value = (os.environ if environ is None else environ).get(token_env)
    if not value:
        raise ConfigError(
            f"host.web_token_env: {token_env} is not set (or empty); set it to the console's "
            "access token, or remove web_token_env"
        )
    return str(value)


@attrs.frozen(kw_only=True)
class Guard:
    """The checks of one running console (see the module docstring)."""

    token: str | None  # None: no token configured (then the console is on loopback)
    loopback: bool
    action_key: str = attrs.field(factory=lambda: secrets.token_urlsafe(24))

    def refusal(
        self, headers: Mapping[str, str], cookies: Mapping[str, str], *, action: bool
    ) -> int | None:
        """None when the request may go on; else the HTTP status refusing it: 403 for a foreign
        origin or host name, 401 for a missing or wrong token (or action key)."""
        if not self._same_origin(headers):
            return 403
        if self.token is not None and self._bearer_ok(headers):
            return None
        signed_in = self.token is None or _same(cookies.get(COOKIE), self.token)
        if not signed_in:
            return 401
        if action and not _same(headers.get(ACTION_HEADER), self.action_key):
            return 401
        return None

    def token_ok(self, offered: str | None) -> bool:
        return self.token is not None and _same(offered, self.token)

    def _bearer_ok(self, headers: Mapping[str, str]) -> bool:
        scheme, _, value = (headers.get("authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and self.token_ok(value.strip())

    def _same_origin(self, headers: Mapping[str, str]) -> bool:
        host = headers.get("host") or ""
        if self.loopback:
            name = urlsplit(f"//{host}").hostname or ""
            if not is_loopback(name):
                return False  # a foreign name resolved to this machine
        origin = headers.get("origin")
        if origin is None:
            return True  # not sent by a browser on another page's behalf
        return urlsplit(origin).netloc.lower() == host.lower()


def _same(offered: str | None, expected: str) -> bool:
    if offered is None:
        return False
    return hmac.compare_digest(offered.encode("utf-8"), expected.encode("utf-8"))


__all__ = [
    "ACTION_HEADER",
    "COOKIE",
    "DEFAULT_WEB",
    "LOOPBACK_NAMES",
    "PUBLIC_PATHS",
    "Guard",
    "WebAddressError",
    "address_problem",
    "console_token",
    "is_loopback",
    "is_public",
    "parse_web_address",
]
