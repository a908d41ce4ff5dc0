"""One controlled session of the lobby: the lobby's server, its host connection (stdio
or one websocket session) and the control link a test listens on (:mod:`tests.lobby.control`),
run together until the host connection ends; the last events still go out after it."""

from __future__ import annotations

import os
import sys

import trio

from actors.serverkit import MCPLServer
from actors.serverkit.transport import LineTransport, StdioTransport
from tests.lobby.files import LobbyFiles
from tests.lobby.link import _open_control
from tests.lobby.notes import Notebook
from tests.lobby.options import LobbyOptions
from tests.lobby.places import Places
from tests.lobby.steering import Hangable, KitControl


async def open_control(
    server: MCPLServer,
    options: LobbyOptions,
    transport: str,
    places: Places | None = None,
    notebook: Notebook | None = None,
) -> KitControl | None:
    """Connect to the control listener ``options.control_connect`` and say hello; None if
    unreachable."""
    link = await _open_control(options, "")
    if link is None:
        return None
    link.emit({"event": "hello", "pid": os.getpid(), "transport": transport})
    return KitControl(server, options, link, places, notebook)


async def serve_controlled(
    server: MCPLServer,
    options: LobbyOptions,
    places: Places | None = None,
    notebook: Notebook | None = None,
    *,
    transport: LineTransport | None = None,
    files: LobbyFiles | None = None,
) -> None:
    """Serve ``server`` with the control connection ``options.control_connect``: over stdio
    (until the host closes stdin), or on ``transport``, one websocket session (until it ends;
    the session hears of the HTTP requests ``files`` answers meanwhile)."""
    assert options.control_connect is not None
    control = await open_control(
        server, options, "stdio" if transport is None else "ws", places, notebook
    )
    if control is None:
        if transport is None:
            sys.exit(f"cannot reach the control listener at {options.control_connect}")
        await server.serve(transport)
        return
    if files is not None:
        files.listeners.add(control.emit)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(control.link.run_writer)
            nursery.start_soon(control.run_sender)
            commands = trio.CancelScope()

            async def read_commands() -> None:
                with commands:
                    await control.run()

            nursery.start_soon(read_commands)
            if transport is not None:
                await server.serve(transport)
            else:
                control.transport = Hangable(StdioTransport(), control.on_sent)
                await server.serve(control.transport)
                if control.transport.hung.is_set():
                    await trio.sleep_forever()
            commands.cancel()
            control.finish_sending()
            control.link.finish()  # the last events still go out
            nursery.cancel_scope.deadline = trio.current_time() + 1.0
    finally:
        if files is not None:
            files.listeners.discard(control.emit)
    await control.link.aclose()
