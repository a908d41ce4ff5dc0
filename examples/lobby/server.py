"""The bundled lobby: a chat server written with the server toolkit (``actors.serverkit``).

This is the README's "Writing an MCPL server" continued: the same toolkit, used for a server
that does a little of everything an MCPL server may do. Read it top to bottom:

1. the lobby's people, and what they say;
2. the server and its feature sets: what a host may grant or deny, one concern each;
3. two channels, #general and #random, and what happens when an agent speaks in one;
4. two tools an agent may call: a weather forecast and a die;
5. a notebook whose notes are checkpoints the host may roll back to;
6. a status line put before each of the agents' inferences;
7. the script: the people talk, the clock chimes, Alice shares a photo;
8. running it.

``mcplive run`` with no config runs it as ``lobby.toml`` (beside this file) says, with two
agents on the scripted models of ``ada.toml`` and ``grace.toml``. In a clone, edit it and run
your copy with ``mcplive run examples/lobby/lobby.toml``. On its own, ``python server.py``
serves one host over stdio and ``python server.py --port 8765`` serves websockets on
``ws://127.0.0.1:8765/`` (``--host lobby`` listens on the address the name ``lobby`` has, as in
``examples/fleet/compose.yaml``).
"""

from __future__ import annotations

import argparse
import base64
import functools
import itertools
import random
import secrets
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

import trio

from actors.serverkit import (
    BeforeInference,
    CheckpointNotFound,
    Injection,
    Lifecycle,
    MCPLServer,
    Publish,
    Rollback,
    ToolError,
    ToolResult,
)


def log(text: str) -> None:
    """One line on stderr: over stdio, stdout carries the protocol."""
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


# -- 1. The people, and what they say --------------------------------------------------------------

PEOPLE = ({"id": "alice", "name": "Alice"}, {"id": "bob", "name": "Bob"})
#: What they say, in turn, one line a tick; a line that names an agent carries a mention tag.
SCRIPT_LINES: tuple[tuple[str, list[str]], ...] = (
    ("hello everyone! hi Ada!", ["chat:mention"]),
    ("Ada, what's the weather in Paris?", ["chat:mention"]),
    ("anyone here? Grace?", ["chat:mention"]),
    ("@Ada are you around?", ["chat:mention"]),
    ("I just rolled a 20!", []),
    ("brb, coffee", []),
    ("@Grace can you roll a die for me?", ["chat:mention"]),
)
INTERVAL = 2.0  # seconds from one line to the next
CHIME = "The lobby clock chimes."
STATUS = "Lobby status: Alice and Bob are online. Topic: board games."
#: The photo Alice shares: a small green PNG.
PHOTO = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAIAAACQkWg2AAAAFklEQVR42mPQqzUiCTGMahjVMHw1"
    "AAB63t0BySdljwAAAABJRU5ErkJggg=="
)
PHOTO_NAME = "board.png"
PHOTO_TEXT = "Alice shared a photo of the board game night."
#: The photo's event id is the same on every run: a host that stored it once skips it later
#: (and its transcript says so). Every other id the lobby makes up starts with this run's
#: tag, so that a second run's messages are new to a host that kept the first run's.
PHOTO_EVENT_ID = "share-board"
RUN = secrets.token_hex(3)


# -- 2. The server and its feature sets ------------------------------------------------------------
# A feature set is what a host grants or denies as one. Left to itself the toolkit declares
# "lobby" (events, channels, tools) and "lobby.context" (hooks); the lobby declares its own
# instead, one concern each, so that a host's config may keep the chat and silence the clock:
# `disabled_feature_sets = ["lobby.events"]`. Each names every capability it uses.

server = MCPLServer("lobby", default_feature_sets=False)
server.feature_set(
    "lobby.chat",
    description="Chat in the lobby channels #general and #random.",
    uses=[
        "channels.register",
        "channels.publish",
        "channels.incoming",
        "channels.lifecycle",
        "channels.streaming",
        "channels.typing",
    ],
)
server.feature_set(
    "lobby.events",
    description="Ambient lobby events, such as the clock chiming.",
    uses=["pushEvents"],
)
server.feature_set(
    "lobby.context",
    description="Lobby status (who is online, the current topic) before each inference.",
    uses=[
        "contextHooks.beforeInference.observe",
        "contextHooks.beforeInference.inject.beforeUser",
        "contextHooks.beforeInference.inject.afterUser",
        "inferenceLifecycle",
    ],
)
server.feature_set(
    "lobby.notes",
    description="A shared lobby notebook; every note is a checkpoint to roll back to.",
    uses=["tools"],
    rollback=True,
)

# -- 3. Channels -----------------------------------------------------------------------------------
# The agents hear what is said in a channel. What one of them publishes there, the lobby posts
# back under that agent's name, so that every agent hears what the others said. (mcplive wakes
# no agent for what it published itself, so two agents never answer each other in a loop.)
# publish_target="root": a channel without threads; the toolkit refuses, for the lobby, a
# publish that names a thread.

channels = {
    name: server.channel(f"lobby:#{name}", label=name, publish_target="root")
    for name in ("general", "random")
}
posts = itertools.count(1)


#: Who a post is shown as when the agent's name cannot be (see publish_author).
HOST_AUTHOR = {"id": "host", "name": "mcplive"}
AGENT_PREFIX = "agent:"  # mcplive's conversationId for an agent: "agent:<name>"
MAX_AGENT_NAME_CHARS = 64


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def publish_author(
    conversation_id: Any, people: Iterable[Mapping[str, str]] = PEOPLE
) -> dict[str, str]:
    """Who a post an agent published is shown as: the agent its ``conversationId`` names.

    mcplive sends ``"agent:<name>"`` with each agent's speech, which gives the author
    ``{"id": "agent:<name>", "name": "<name>"}``: one id per agent, and never a person's.
    Anything else (not a string, another form, a name that is empty, longer than
    ``MAX_AGENT_NAME_CHARS``, padded or unprintable, or that reads as one of ``people``'s
    names or ids once NFKC case-folded) is shown as ``HOST_AUTHOR``: the lobby cannot check
    what a host claims, so no claim makes a post read as a person's.
    """
    if not isinstance(conversation_id, str) or not conversation_id.startswith(AGENT_PREFIX):
        return dict(HOST_AUTHOR)
    name = conversation_id.removeprefix(AGENT_PREFIX)
    plain = 0 < len(name) <= MAX_AGENT_NAME_CHARS and name.isprintable() and name == name.strip()
    taken = {_fold(person[key]) for person in people for key in ("id", "name")}
    if not plain or _fold(name) in taken:
        return dict(HOST_AUTHOR)
    return {"id": conversation_id, "name": name}


@server.on_publish
def post(publish: Publish) -> str:
    """An agent spoke in one of the channels: log it, and post it back under the agent's name.
    The echo goes out once the handler has returned, under the id it returns: the host knows
    it for the agent's own words, so it wakes no one."""
    channel = server.channels[publish.channel_id]
    author = publish_author(publish.conversation_id)
    log(f"{channel.spec.label} <- {author['name']}: {publish.text}")
    publish.echo(author=author)
    return f"{RUN}-out-{next(posts)}"  # the id of the post that the publish became


# -- 4. Tools --------------------------------------------------------------------------------------
# A tool's input schema comes from its type hints, its description from its docstring; the
# agents see these as "lobby--forecast" and "lobby--roll". A ToolError is an error result the
# agent reads, not a crash.


@server.tool()
def forecast(city: str) -> str:
    """The weather forecast for a city."""
    if not city.strip():
        raise ToolError("forecast needs a city")
    return f"Forecast for {city}: sunny, 21°C"


@server.tool()
def roll(sides: int) -> str:
    """Roll a die with the given number of sides."""
    if not 1 <= sides <= 1_000_000:
        raise ToolError("roll needs sides: an integer from 1 to 1000000")
    return str(random.randint(1, sides))


# -- 5. A notebook the host can roll back ----------------------------------------------------------
# Each note makes a checkpoint, returned in the tool result's "state". When an operator rolls
# an agent back to an earlier moment (`mcplive rollback`), the host asks the lobby to go back to
# the checkpoint of that moment (state/rollback), so the notes agree with what the agent
# remembers. A server that must survive a restart keeps its checkpoints in a file (the host
# may start it anew to roll back); the lobby keeps them in memory.


class Notebook:
    """The notes as a tree of checkpoints: each knows its parent and the notes it holds."""

    def __init__(self) -> None:
        self.checkpoints: dict[str, tuple[str | None, tuple[str, ...]]] = {}
        self.current: str | None = None  # None: before the first note

    def notes(self) -> tuple[str, ...]:
        return self.checkpoints[self.current][1] if self.current is not None else ()


notebook = Notebook()


@server.tool()
async def note(text: str) -> ToolResult:  # async: it runs in trio, not in a worker thread
    """Add a note to the lobby notebook; returns the notebook."""
    if not text.strip():
        raise ToolError("note needs a text")
    parent, notes = notebook.current, (*notebook.notes(), text)
    checkpoint = f"cp-{len(notebook.checkpoints) + 1}"
    notebook.checkpoints[checkpoint] = (parent, notes)
    notebook.current = checkpoint
    log(f"notebook at {checkpoint}: {list(notes)}")
    state = {"checkpoint": checkpoint, "parent": parent, "data": {"notes": list(notes)}}
    return ToolResult(content=[{"type": "text", "text": "notes: " + "; ".join(notes)}], state=state)


@server.on_rollback
def rollback(request: Rollback) -> bool:
    """Go back to a checkpoint a note made (True: the notebook is at it now)."""
    if request.checkpoint not in notebook.checkpoints:
        raise CheckpointNotFound(request.checkpoint)
    notebook.current = request.checkpoint
    log(f"notebook rolled back to {request.checkpoint}: {list(notebook.notes())}")
    return True


# -- 6. Context before each inference --------------------------------------------------------------
# Before an agent's model runs, the host asks the lobby what to add to its context; the agent
# sees the status line above the newest message, marked "[context from lobby · lobby]". The
# lifecycle notices then say how each inference went (never what it said).


@server.before_inference
def status(ctx: BeforeInference) -> list[Injection]:
    log(f"context for {ctx.agent}: {STATUS}")
    return [Injection(content=STATUS, position="beforeUser", namespace="lobby")]


@server.on_lifecycle
def lifecycle(event: Lifecycle) -> None:
    log(f"inference {event.inference_id}: {event.phase}")


# -- 7. The script ---------------------------------------------------------------------------------
# Once a host has answered the handshake with its grant, one tick every INTERVAL seconds for as
# long as that host stays connected. Each tick runs as a task of its own (server.spawn), so a
# slow answer from the host never holds up the next tick. Every send is checked against the
# grant first: a host may have denied the chat or the events.

messages, chimes = itertools.count(1), itertools.count(1)


@server.on_ready
async def script() -> None:
    for tick in itertools.count(1):
        await trio.sleep(INTERVAL)
        server.spawn(functools.partial(say, tick), f"tick {tick}")
        if tick == 2:
            server.spawn(share_photo, "the photo")


async def say(tick: int) -> None:
    """One tick: Alice and Bob take turns, two lines in #general, then two in #random; every
    third tick the clock chimes after the line (every other chime belongs to #general)."""
    person = PEOPLE[(tick - 1) % 2]
    channel = channels[("general", "random")[(tick - 1) // 2 % 2]]
    text, tags = SCRIPT_LINES[(tick - 1) % len(SCRIPT_LINES)]
    if server.is_granted("channels.incoming"):
        log(f"{channel.spec.label} {person['name']}: {text}")
        await channel.send(
            text, author=dict(person), message_id=f"{RUN}-m{next(messages)}", tags=tags
        )
    if tick % 3 == 0 and server.is_granted("pushEvents"):
        n = next(chimes)
        origin = {"mcplChannelId": channels["general"].id} if n % 2 == 0 else None
        log(f"push: {CHIME}")
        # background news: an agent on the community gate reads it at its next turn
        await server.push_event(CHIME, event_id=f"{RUN}-e{n}", origin=origin, tags=["chat:ambient"])


async def share_photo() -> None:
    """Half a tick after Bob's question, so that the photo is the newest thing Ada sees.

    The photo goes as a bulk reference: a ``resource`` block with its size and digest, whose
    bytes the lobby serves at its own address; an agent fetches them when it wants them. A host
    fetches only from the address it dialled, so a stdio server (which has none) shares none."""
    await trio.sleep(INTERVAL / 2)
    if not server.is_granted("pushEvents"):
        return
    try:
        photo = server.reference(PHOTO, mime_type="image/png", name=PHOTO_NAME)
    except RuntimeError:
        log("no photo over stdio: a host fetches shared bytes only from a websocket server")
        return
    log(f"push {PHOTO_EVENT_ID}: {PHOTO_TEXT}")
    content = [{"type": "text", "text": PHOTO_TEXT}, photo]
    await server.push_event(content, event_id=PHOTO_EVENT_ID)


# -- 8. Running it ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The bundled lobby, an MCPL server.")
    parser.add_argument("--port", type=int, help="serve websockets on HOST:PORT (default: stdio)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="with --port, the address to listen on, by the name the hosts dial (the photo's "
        "address is on it too); default 127.0.0.1",
    )
    args = parser.parse_args(argv)
    log(f"ids made up by this run start with {RUN}-")
    if args.port is None:
        server.run()
    else:
        server.run("websocket", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
