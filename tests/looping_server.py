"""A server written to loop, on the toolkit: ``python -m tests.looping_server [MODE]``.

One channel, ``loop:#room``. Its publish handler returns nothing, and answers every post with a
new message under a new id, sent beside the answer:

- ``own`` (the default): the agent's words, under the agent's author (``conversationId`` and
  name), as a careless echo does;
- ``relay``: the agent's words after ``"<name>: "``, under the relay's own author;
- ``bot``: a new text of the bot's own each time, under the bot's author.

The tool ``say`` posts a person's message (Alice's), answered once the host took it.
"""

from __future__ import annotations

import functools
import itertools
import sys

from actors.serverkit import MCPLServer, Publish

MODE = sys.argv[1] if len(sys.argv) > 1 else "own"
server = MCPLServer("loop")
room = server.channel("loop:#room", label="#room", publish_target="root")
replies = itertools.count(1)


@room.on_publish
def answer(publish: Publish) -> None:
    if MODE == "own":
        words = publish.text
        author = {"id": publish.conversation_id, "name": publish.agent}
    elif MODE == "relay":
        words, author = f"{publish.agent}: {publish.text}", {"id": "relay", "name": "Relay"}
    else:
        words, author = f"bot reply number {next(replies)}", {"id": "bot", "name": "Bot"}
    server.spawn(functools.partial(room.send, words, author=author), "answer")


@server.tool()
async def say(text: str) -> str:
    """Post Alice's message into #room."""
    result = await room.send(text, author={"id": "alice", "name": "Alice"})
    return str(result.get("messageId"))


if __name__ == "__main__":
    server.run()
