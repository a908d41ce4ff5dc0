"""The test lobby: the bundled example's lobby (:mod:`examples.lobby.server`) with what a host's
tests need to drive it, each behind a command-line option (``python -m tests.lobby --help``).

It speaks as the example does: #general and #random where Alice and Bob say the example's
lines, the clock's chime, the photo Alice shares (with ``--ws --files``, served as
``/files/board.png``), the example's ``forecast`` and ``roll`` tools, and each post an agent
publishes echoed under the agent's name (:func:`examples.lobby.server.publish_author`). What it
adds for the tests: ids they can name (``--run-id``), a ``stall`` tool that never answers, the
context line, notebook and inference requests each behind a flag (``--context``, ``--notes``,
``--assist``), thread-targeted publishes and ``channels/open`` by address
(:mod:`tests.lobby.places`), fault modes (:mod:`tests.lobby.faults`), checks of what the host
sends (:mod:`tests.lobby.checks`) and, with ``--control-connect HOST:PORT``, a control link a
test drives it through (:mod:`tests.lobby.steering`); under a control link the people keep
quiet unless ``--script default`` is given.
"""

from __future__ import annotations

import functools
import itertools
import sys

import trio

from actors.serverkit import (
    BeforeInference,
    Injection,
    Lifecycle,
    MCPLServer,
    Publish,
    PublishRefused,
)
from actors.serverkit.files import Shelf
from actors.serverkit.run import listen
from actors.serverkit.transport import LineTransport
from examples.lobby.server import (
    CHIME,
    HOST_AUTHOR,
    PEOPLE,
    PHOTO_EVENT_ID,
    PHOTO_NAME,
    PHOTO_TEXT,
    SCRIPT_LINES,
    STATUS,
    forecast,
    publish_author,
    roll,
)
from tests.lobby import checks, faults
from tests.lobby.commands import file_reference
from tests.lobby.files import LobbyFiles
from tests.lobby.notes import Notebook
from tests.lobby.options import LobbyOptions, display_host, parse_args, split_host_port
from tests.lobby.places import Places, open_by_address
from tests.lobby.session import serve_controlled
from tests.lobby.words import LobbyFile, builtin_files, now_iso

__all__ = [
    "HOST_AUTHOR",
    "PEOPLE",
    "LobbyFile",
    "LobbyOptions",
    "build",
    "builtin_files",
    "main",
    "now_iso",
    "publish_author",
    "serve_ws",
]

#: the lobby's requests awaiting the host's answer at once (tests send thousands in a burst)
MAX_PENDING = 1024
CHAT_USES = (
    "channels.register",
    "channels.publish",
    "channels.incoming",
    "channels.lifecycle",
    "channels.streaming",
    "channels.typing",
)
CONTEXT_USES = (
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.beforeUser",
    "contextHooks.beforeInference.inject.afterUser",
    "inferenceLifecycle",
)


def log(text: str) -> None:
    """One line on stderr (stdout carries the protocol)."""
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


def build(
    options: LobbyOptions, places: Places | None = None, notebook: Notebook | None = None
) -> MCPLServer:
    """The lobby server the options describe, ready to run; ``places`` keeps the threads a
    publish may target (:mod:`tests.lobby.places`), ``notebook`` the notes of
    ``--notes`` (:mod:`tests.lobby.notes`)."""
    places = places or Places()
    server = MCPLServer(
        "lobby",
        request_timeout=options.request_timeout,
        default_feature_sets=False,
        max_pending=MAX_PENDING,
    )

    # -- feature sets: what a host may grant or deny, one concern each -----------------------
    server.feature_set(
        "lobby.chat", description="Chat in the lobby channels #general and #random.", uses=CHAT_USES
    )
    server.feature_set(
        "lobby.events",
        description="Ambient lobby events, such as the clock chiming.",
        uses=["pushEvents"],
    )
    if options.context:
        server.feature_set(
            "lobby.context",
            description="Lobby status (who is online, the current topic) before each inference.",
            uses=CONTEXT_USES,
        )
        # advertised (as every hook position is) for hosts configured to grant it
        server.advertise("contextHooks.beforeInference.inject.system")
    if options.assist:
        server.feature_set(
            "lobby.assist",
            description="The lobby asks the host's model for help, e.g. to summarize the chat.",
            uses=["inferenceRequest", "inferenceRequest.streaming", "modelInfo"],
        )

    # -- channels: agents hear what is said there, and what they publish is echoed back ------
    channels = {
        name: server.channel(f"lobby:#{name}", label=name, publish_target="root")
        for name in ("general", "random")
    }
    posts = itertools.count(1)

    @server.on_publish
    def post(publish: Publish) -> str:
        """An agent spoke: log it and echo it under the agent's name, in the place it asked
        for (or refuse it, posting nothing)."""
        channel = server.channels[publish.channel_id]
        why = places.refusal(channel.spec.publish_target, publish)
        if why is not None:
            raise PublishRefused(why)
        author = publish_author(publish.conversation_id)
        message_id = options.make_id("out-", next(posts))
        thread = publish.thread_id
        where = f" [{thread}]" if thread is not None else ""
        log(f"{channel.id.removeprefix('lobby:')}{where} <- {author['name']}: {publish.text}")
        if not options.no_echo:
            echo = functools.partial(
                channel.send,
                list(publish.content),
                author=author,
                message_id=message_id,
                thread_id=thread,
            )
            server.spawn(echo, "echo")
        return message_id

    server.answer_for("channels/open")(functools.partial(open_by_address, server))

    # -- tools --------------------------------------------------------------------------------
    server.tool()(forecast)  # the example's
    server.tool()(roll)

    @server.tool()
    async def stall() -> str:
        """Never answers (for testing deadlines)."""
        log("stall called: never answering")
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    if options.notes:
        (notebook or Notebook()).add_to(server)

    # -- context: a status line before every inference ----------------------------------------
    if options.context:

        @server.before_inference
        def status(ctx: BeforeInference) -> list[Injection]:
            log(f"context/beforeInference {ctx.inference_id}: {ctx.user_message!r}")
            return [Injection(content=STATUS, position="beforeUser", namespace="lobby")]

        @server.on_lifecycle
        def lifecycle(event: Lifecycle) -> None:
            log(f"inference/lifecycle {event.inference_id}: {event.phase}")

    # -- the scripted people, the clock and the photo ------------------------------------------
    messages, chimes = itertools.count(1), itertools.count(1)

    @server.on_ready
    async def script() -> None:
        """One tick per interval: Alice and Bob take turns (#general twice, then #random
        twice), the clock chimes every third tick, Alice shares a photo after the second;
        silent with ``--script none`` (the default under a control connection)."""
        if options.effective_script != "default":
            return
        for tick in itertools.count(1):
            await trio.sleep(options.interval)
            server.spawn(functools.partial(say, tick), f"tick {tick}")
            if tick == 2 and options.files and server.shelf.origin is not None:
                server.spawn(share_photo)

    async def say(tick: int) -> None:
        """What happens on one tick, in order: a person speaks, then the clock may chime."""
        person = PEOPLE[(tick - 1) % 2]
        channel = channels[("general", "random")[((tick - 1) // 2) % 2]]
        text, tags = SCRIPT_LINES[(tick - 1) % len(SCRIPT_LINES)]
        if server.is_granted("channels.incoming"):
            log(f"{channel.id.removeprefix('lobby:')} {person['name']}: {text}")
            message_id = options.make_id("m", next(messages))
            await channel.send(text, author=dict(person), message_id=message_id, tags=tags)
        if tick % 3 == 0 and server.is_granted("pushEvents"):
            n = next(chimes)
            origin = {"mcplChannelId": "lobby:#general"} if n % 2 == 0 else None
            log(f"push/event: {CHIME}")
            await server.push_event(CHIME, event_id=options.make_id("e", n), origin=origin)

    async def share_photo() -> None:
        """Half a tick after Bob's question, so the photo is the newest thing Ada sees."""
        await trio.sleep(options.interval / 2)
        if server.is_granted("pushEvents"):
            log(f"push/event {PHOTO_EVENT_ID}: {PHOTO_TEXT}")
            photo = file_reference(server.shelf.origin, PHOTO_NAME)
            content = [{"type": "text", "text": PHOTO_TEXT}, photo]
            await server.push_event(content, event_id=PHOTO_EVENT_ID)

    return server


async def serve_ws(
    host: str,
    port: int,
    options: LobbyOptions | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the lobby on a websocket until cancelled; ``task_status`` gets the bound port.

    Every connection is a session of its own: its own server, counters and control link. With
    ``options.files`` the port also answers ``GET /files/<name>``
    (:mod:`tests.lobby.files`)."""
    options = options or LobbyOptions()
    files = LobbyFiles() if options.files else None
    shelf = Shelf()

    async def session(transport: LineTransport) -> None:
        places, notebook = Places(), Notebook()
        server = build(options, places, notebook)
        server.shelf = shelf  # its origin: where the files are served
        faults.apply(server, options)
        if options.control_connect:
            await serve_controlled(
                server, options, places, notebook, transport=transport, files=files
            )
        else:
            checks.watch(server, context=options.context)
            await server.serve(transport)

    http = [files.answer] if files is not None else []
    async with trio.open_nursery() as nursery:
        url = await nursery.start(
            functools.partial(
                listen, host, port, session, token=options.token, shelf=shelf, http=http
            )
        )
        if files is not None:
            log(f"serving files at {shelf.origin}/files/: {', '.join(files.files)}")
        task_status.started(int(url.rstrip("/").rpartition(":")[2]))


async def serve(options: LobbyOptions) -> None:
    """Serve the lobby over stdio, or on ``--ws HOST:PORT`` until interrupted; with
    ``--control-connect`` a test drives it too (:mod:`tests.lobby.session`)."""
    if options.run_id:
        log(f"ids made up by this run start with {options.run_id}-")
    if options.ws:
        host, port = split_host_port(options.ws)
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_ws, host, port, options)
            print(f"LISTENING ws://{display_host(host)}:{bound}", flush=True)
            log(f"serving websockets on {host}:{bound}")
        return
    if options.token:
        log("--token only applies to --ws; ignored")
    if options.files:
        log("--files only applies to --ws; ignored")
    places, notebook = Places(), Notebook()
    server = build(options, places, notebook)
    faults.apply(server, options)
    if options.control_connect:
        await serve_controlled(server, options, places, notebook)
    else:
        checks.watch(server, context=options.context)
        await server.serve_stdio()


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the lobby; 130 when interrupted."""
    options = parse_args(argv)
    try:
        trio.run(serve, options)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
