"""The lobby's fault modes: how it misbehaves on purpose, so a host's tests can watch the host
cope. An ordinary server needs none of this; :mod:`tests.lobby.server` is the lobby itself.

Each mode replaces one of the toolkit's own answers through
:meth:`actors.serverkit.MCPLServer.answer_for` (answer, refuse, or leave unanswered with
``NO_ANSWER``) or writes a line past the session with
:meth:`actors.serverkit.MCPLServer.send_line`:

* ``--fsu-mode notification-only``: ``featureSets/update`` requests are refused with -32601
  (the host falls back to the notification form); ``never``: they are never answered, though
  their grant is taken.
* ``--publish-mode notification-only`` / ``never``: the same for ``channels/publish``; with
  ``never`` a publish notification is dropped too.
* ``--open-mode never``: ``channels/open`` is never answered.
* ``--stray-stdout`` (stdio): a line that is not JSON goes out once the host's grant arrived.
* ``--mcp-only``: no MCPL at all: ``initialize`` advertises tools only, every MCPL request is
  refused with -32601, and right after ``notifications/initialized`` the lobby registers its
  channels all the same (a server that does not wait for a grant it will never get).
* ``--feature-sets-form array``: the manifest is shown in the 0.4 form (``featureSets`` an
  array of named sets, ``version`` 0.4, no ``revision``) in ``initialize`` and
  ``mcpl/manifest``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from actors.serverkit import NO_ANSWER, HostRequest, MCPLServer, Publish, PublishRefused
from protocol.errors import METHOD_NOT_FOUND, RpcError
from tests.lobby.options import LobbyOptions
from tests.lobby.words import MCPL_METHODS

STRAY_LINE = "[lobby] client initialized"
#: the MCPL requests a host may send (an ``--mcp-only`` lobby refuses each)
MCPL_REQUESTS = sorted(
    MCPL_METHODS
    - {"inference/lifecycle", "inference/chunk", "channels/typing"}
    - {"channels/outgoing/chunk", "channels/outgoing/complete"}
)


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


def refuse_or_withhold(server: MCPLServer, method: str, mode: str) -> None:
    """Make ``method`` refused with -32601 (``notification-only``) or never answered
    (``never``); ``request`` leaves the toolkit's answer alone."""
    if mode == "request":
        return

    @server.answer_for(method)
    def answer(request: HostRequest) -> object:
        if mode == "never":
            _log(f"not answering {method} (mode never)")
            return NO_ANSWER
        _log(f"{method} request refused (mode notification-only)")
        raise RpcError(code=METHOD_NOT_FOUND, message=f"Method not found: {method}")


def legacy_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A 0.5 manifest in the 0.4 form."""
    out = {k: v for k, v in manifest.items() if k != "revision"}
    out["version"] = "0.4"
    out["featureSets"] = [{"name": n, **d} for n, d in manifest["featureSets"].items()]
    return out


def show_legacy_manifest(server: MCPLServer) -> None:
    """Answer ``initialize`` and ``mcpl/manifest`` with the manifest in the 0.4 form."""

    @server.answer_for("initialize")
    def initialize(request: HostRequest) -> dict[str, Any]:
        result = dict(request.default)
        caps = dict(result["capabilities"])
        caps["experimental"] = {"mcpl": legacy_manifest(caps["experimental"]["mcpl"])}
        return {**result, "capabilities": caps}

    @server.answer_for("mcpl/manifest")
    def manifest(request: HostRequest) -> dict[str, Any]:
        return legacy_manifest(request.default)


def refuse_mcpl(server: MCPLServer) -> None:
    """Refuse every MCPL request with -32601 (the ``--mcp-only`` answers)."""
    for method in MCPL_REQUESTS:
        refuse_or_withhold(server, method, "notification-only")


def mcp_only(server: MCPLServer) -> None:
    """Advertise no MCPL, refuse its requests, and register the channels unasked once the host
    said it is initialized."""

    @server.answer_for("initialize")
    def initialize(request: HostRequest) -> dict[str, Any]:
        return {**request.default, "capabilities": {"tools": {}}}

    refuse_mcpl(server)

    @server.on_line
    def initialized(line: str) -> None:
        if '"notifications/initialized"' in line and is_initialized(line):
            server.spawn(register, "channels/register")

    async def register() -> None:
        link = server.link
        if link is not None:
            channels = [c.spec.to_wire() for c in server.channels.values()]
            await link.start_request("channels/register", {"channels": channels}, check=False)


def is_initialized(line: str) -> bool:
    """Whether a host line is the ``notifications/initialized`` notification."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(message, dict)
        and message.get("method") == "notifications/initialized"
        and "id" not in message
    )


def apply(server: MCPLServer, options: LobbyOptions) -> None:
    """Switch on the fault modes ``options`` asks for."""
    if options.mcp_only:
        mcp_only(server)
    refuse_or_withhold(server, "featureSets/update", options.fsu_mode)
    refuse_or_withhold(server, "channels/publish", options.publish_mode)
    if options.publish_mode == "never" and server.default_publish_handler is not None:

        def ignore(publish: Publish) -> None:
            _log(f"ignoring channels/publish (--publish-mode never): {publish.text!r}")
            raise PublishRefused("publish mode never")

        server.on_publish(ignore)
    if options.open_mode == "never":

        @server.answer_for("channels/open")
        def unanswered(request: HostRequest) -> object:
            _log(f"not answering channels/open (open mode never): {dict(request.params)}")
            return NO_ANSWER

    if options.feature_sets_form == "array":
        show_legacy_manifest(server)
    if options.stray_stdout:
        if options.ws:
            _log("--stray-stdout only applies to stdio")
            return

        @server.on_ready
        async def stray() -> None:
            await server.send_line(STRAY_LINE)
