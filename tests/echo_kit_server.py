"""A toolkit server that echoes every publish with ``Publish.echo`` (stdio).

``python -m tests.echo_kit_server``: one channel, ``echo:room`` (``#room``, publish target
``root``); once granted ``pushEvents`` it pushes ``hello from echo`` scoped to it, and each
publish there is echoed. ``--own-ids`` confirms each publish under an id of the handler's own
(``own-<n>``) instead of the one the toolkit made up.
"""

from __future__ import annotations

import itertools
import sys

from actors.serverkit import MCPLServer, Publish

server = MCPLServer("echo")
room = server.channel("echo:room", label="#room", publish_target="root")
OWN_IDS = "--own-ids" in sys.argv
_own = itertools.count(1)


@room.on_publish
async def heard(publish: Publish) -> str | None:
    publish.echo()
    return f"own-{next(_own)}" if OWN_IDS else None


@server.on_granted("pushEvents")
async def hello() -> None:
    await server.push_event("hello from echo", origin={"mcplChannelId": room.id})


if __name__ == "__main__":
    server.run()
