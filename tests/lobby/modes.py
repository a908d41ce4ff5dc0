"""How :mod:`tests.lobby.server` answers some host requests, switched by control commands
(:mod:`tests.lobby.steering`): ``open_mode`` (``channels/open`` answered or never),
``fsu_mode`` (``featureSets/update`` answered, refused with -32601, or never answered) and
``manifest`` (a new manifest served from now on, announced with ``mcpl/manifestChanged``),
``manifest_answers`` (``held``: answers to ``mcpl/manifest`` wait until the mode is ``at-once``
again) and ``publish_echo_thread`` (how a publish result echoes its ``threadId``, acknowledged
with a ``publish_echo_thread`` event; :mod:`tests.lobby.places`).

Each mode is an answer override (:meth:`actors.serverkit.MCPLServer.answer_for`) that falls
back to the override the lobby had before (its command-line fault mode) or to the toolkit.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import trio

from actors.serverkit import NO_ANSWER, HostRequest, MCPLServer
from actors.serverkit.host import maybe_await
from protocol.errors import METHOD_NOT_FOUND, RpcError
from tests.lobby.options import LobbyOptions
from tests.lobby.places import Places, open_by_address
from tests.lobby.words import OPEN_MODES, dumps

FSU_MODES = ("request", "notification-only", "never")
MANIFEST_ANSWER_MODES = ("held", "at-once")
#: what a changed manifest announces as its revision: a placeholder no host may trust
PLACEHOLDER_REVISION = "sha256:" + "A" * 43


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


class KitModes:
    """The modes, and the overrides that follow them."""

    def __init__(
        self,
        server: MCPLServer,
        options: LobbyOptions,
        emit: Callable[[dict[str, Any]], None],
        send_line: Callable[[str], None],
        places: Places,
    ) -> None:
        self.server = server
        self.emit = emit
        self.send_line = send_line
        self.places = places
        self.threads = places.threads
        self.open_mode = options.open_mode
        self.fsu_mode: str | None = None  # None: as the command line (or the toolkit) says
        self.manifest: dict[str, Any] | None = None
        self.manifest_gate: trio.Event | None = None  # set: held answers go out
        before = dict(server.answer_overrides)
        # the open mode starts as the command line's, so it replaces that override
        opener = functools.partial(open_by_address, server)
        server.answer_for("channels/open")(self._fallback(self._open, opener))
        server.answer_for("featureSets/update")(
            self._fallback(self._fsu, before.get("featureSets/update"))
        )
        server.answer_for("mcpl/manifest")(
            self._fallback(self._manifest, before.get("mcpl/manifest"))
        )
        publish = self._fallback(lambda request: None, before.get("channels/publish"))

        async def echoed(request: HostRequest) -> Any:
            result = await publish(request)
            if not isinstance(result, dict):
                return result
            if result.get("delivered") is False:
                _log(f"channels/publish refused, nothing posted: {result.get('reason')}")
            return places.echoed(result)

        server.answer_for("channels/publish")(echoed)

    def note_thread(self, channel_id: Any, thread: Any) -> None:
        """A thread of a channel exists from now on (a publish may target it)."""
        self.places.note_thread(channel_id, thread)

    def _fallback(
        self, mine: Callable[[HostRequest], Any], previous: Callable[[HostRequest], Any] | None
    ) -> Callable[[HostRequest], Any]:
        """``mine``, which returns None to leave the answer to ``previous`` or the toolkit."""

        async def answer(request: HostRequest) -> Any:
            result = await maybe_await(mine(request))
            if result is not None:
                return result
            if previous is not None:
                return await maybe_await(previous(request))
            if request.default is not None:
                return request.default
            link = self.server.link
            if link is None:
                return NO_ANSWER
            return await self.server.host_call(link, request.method, request.params)

        return answer

    # -- the overrides -----------------------------------------------------------------------
    def _open(self, request: HostRequest) -> Any:
        if self.open_mode == "never":
            _log(f"not answering channels/open (open mode never): {dict(request.params)}")
            # the decision is the handler's, made after the request was received
            self.emit({"event": "open_withheld", "id": request.id})
            return NO_ANSWER
        return None

    def _fsu(self, request: HostRequest) -> Any:
        if self.fsu_mode == "notification-only":
            _log("featureSets/update request refused (fsu mode notification-only)")
            raise RpcError(code=METHOD_NOT_FOUND, message="Method not found: featureSets/update")
        if self.fsu_mode == "never":
            _log("not answering featureSets/update (fsu mode never)")
            return NO_ANSWER
        if self.fsu_mode == "request":
            return request.default
        return None

    def _manifest(self, request: HostRequest) -> Any:
        if self.manifest_gate is None:
            return self.manifest
        return self._held_manifest(self.manifest_gate)

    async def _held_manifest(self, gate: trio.Event) -> Any:
        _log("holding the answer to mcpl/manifest (manifest answers held)")
        await gate.wait()
        return self.manifest

    # -- the commands ------------------------------------------------------------------------
    def open_mode_command(self, cmd: dict[str, Any]) -> None:
        mode = cmd["mode"]
        if mode not in OPEN_MODES:
            raise ValueError(f"mode must be one of {OPEN_MODES}")
        self.open_mode = mode
        _log(f"channels/open mode: {mode}")
        self.emit({"event": "open_mode", "mode": mode})

    def publish_echo_thread_command(self, cmd: dict[str, Any]) -> None:
        self.places.set_echo_mode(cmd["mode"])
        _log(f"publish results: threadId echo {cmd['mode']}")
        self.emit({"event": "publish_echo_thread", "mode": cmd["mode"]})

    def fsu_mode_command(self, cmd: dict[str, Any]) -> None:
        mode = cmd["mode"]
        if mode not in FSU_MODES:
            raise ValueError(f"mode must be one of {FSU_MODES}")
        self.fsu_mode = mode
        _log(f"featureSets/update mode: {mode}")

    def manifest_answers_command(self, cmd: dict[str, Any]) -> None:
        mode = cmd["mode"]
        if mode not in MANIFEST_ANSWER_MODES:
            raise ValueError(f"mode must be one of {MANIFEST_ANSWER_MODES}")
        if mode == "held":
            self.manifest_gate = self.manifest_gate or trio.Event()
        elif self.manifest_gate is not None:
            self.manifest_gate.set()  # the held answers go out
            self.manifest_gate = None
        _log(f"mcpl/manifest answers: {mode}")

    def manifest_command(self, cmd: dict[str, Any]) -> None:
        manifest, domains = cmd["manifest"], cmd.get("domains", ["capabilities"])
        if not isinstance(manifest, dict):
            raise TypeError("manifest must be an object")
        if not isinstance(domains, list):
            raise TypeError("domains must be a list")
        self.manifest = manifest
        params = {"revision": PLACEHOLDER_REVISION, "domains": domains}
        self.send_line(
            dumps({"jsonrpc": "2.0", "method": "mcpl/manifestChanged", "params": params})
        )
