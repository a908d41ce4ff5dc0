"""A relay between two channels: what an agent says in one is shown there and passed on to
the other, so the agents of one room hear what is said in the other.

    [[servers]]
    id = "relay"
    command = ["python", "relay.py"]

Each publish is echoed in its own channel (:meth:`~actors.serverkit.Publish.echo`, as the
message the publish became) and sent into the other channel as a new message by the same
agent, marked with where it came from.
"""

from __future__ import annotations

import functools

from actors.serverkit import Channel, MCPLServer, Publish

server = MCPLServer("relay")
front = server.channel("relay:front", label="#front", publish_target="root")
kitchen = server.channel("relay:kitchen", label="#kitchen", publish_target="root")
OTHER = {front.id: kitchen, kitchen.id: front}


def relay(here: Channel, publish: Publish) -> None:
    """Echo ``publish`` in ``here``; pass it on to the other channel."""
    publish.echo()
    there = OTHER[here.id]
    text = f"[from {here.spec.label}] {publish.text}"
    metadata = {"relayedFrom": here.id, "relayedMessage": publish.message_id}
    send = functools.partial(there.send, text, author=publish.author, metadata=metadata)
    server.spawn(send, f"relay to {there.id}")


front.on_publish(functools.partial(relay, front))
kitchen.on_publish(functools.partial(relay, kitchen))


if __name__ == "__main__":
    server.run()
