"""What ``mcplive run`` needs of the console before the host starts: whether to serve it, where,
and with which token (read from its variable now, so a missing one is reported first)."""

from __future__ import annotations

import attrs

from actors.config import HostConfig


@attrs.frozen
class WebOptions:
    """Where ``mcplive run`` serves the console, and its access token (None: loopback only)."""

    address: str
    token: str | None
    token_env: str | None


def web_options(cfg: HostConfig, flag: bool) -> WebOptions | None:
    """The console ``run`` serves: on when the config sets ``[host] web`` or ``--web`` is
    given (at the configured address, else the default one); its token read now, so a token
    variable that is not set is reported before anything starts."""
    if cfg.web is None and not flag:
        return None
    from .auth import DEFAULT_WEB, console_token

    return WebOptions(cfg.web or DEFAULT_WEB, console_token(cfg.web_token_env), cfg.web_token_env)


def console_note(url: str, token_env: str | None) -> str:
    """The transcript line giving the console's address (never the token itself)."""
    if token_env is None:
        return f"console at {url}"
    return f"console at {url} (open it as {url}?token=<the value of ${token_env}>)"
