"""A toolkit for writing MCPL servers in Python.

::

    from actors.serverkit import MCPLServer, Publish

    server = MCPLServer("demo")
    room = server.channel("demo:room", label="#room", publish_target="root")

    @room.on_publish
    def heard(publish: Publish) -> None:
        publish.echo()      # show the agent's words in #room, as the message they became

    @server.tool()
    def shout(text: str) -> str:
        "The text, upper-cased."
        return text.upper()

    @server.on_granted("pushEvents")
    async def hello() -> None:
        # scoped to #room: the agent's answer is published there
        await server.push_event("hello from demo", origin={"mcplChannelId": room.id})

    server.run()            # stdio; server.run("websocket", port=8765) for a websocket

The server declares what it implements (tools, channels, hooks, inference) and the toolkit
builds the 0.5 manifest from that, answers the handshake, tracks what the host granted and
refuses, before anything is written, a send the host has not granted
(:class:`protocol.server_session.NotGranted`). The pure session lives in
:mod:`protocol.server_session`; the trio runtime of one connection in
:mod:`actors.serverkit.link`.

Handlers may await any call of the toolkit: each host request and notice is handled in a task
of its own while the connection reads on. Publishes into one channel are handled in the order
they arrived, lifecycle notices one at a time, and a publish is answered (delivered, under
:attr:`Publish.message_id`) just before its handler's first call to the host, since a host may
hold the echo of a post until the post is answered (:mod:`actors.serverkit.serving`).

Feature sets: the server declares ``<name>`` (push events, channels, tools), and when it uses
them ``<name>.context`` (context hooks, lifecycle) and ``<name>.inference`` (asking the host for
inference), so that a host denying one does not disable the others. More can be declared with
:meth:`MCPLServer.feature_set`.

The toolkit runs in a server author's process, which must not load the host.
May import: :mod:`protocol` and its own modules, nothing else of :mod:`actors` (not the kernel,
nor any host wing).
Never imported by: any module of the host side.

**Why not the MCP SDK.** The official ``mcp`` package (2.3) can carry extra methods
(``Server.add_request_handler``, ``send_raw_request``) and an ``experimental`` capability, but
building on it means fighting it: its runner owns ``initialize`` (not overridable) and the
read loop, every MCPL method needs a pydantic params model, it brings no websocket server
transport, and it adds a dozen runtime dependencies (pydantic, starlette, uvicorn, httpx2,
pyjwt...) to a host that needs none of them. MCPL's own needs -- both id spaces, serving the
host's requests while ours are pending, the grant gating every send -- are already met by the
sans-I/O :class:`protocol.jsonrpc.RpcSession` this toolkit reuses, which keeps the session
testable without I/O.
"""

from protocol.server_session import NotGranted

from .channels import Channel, OpenRequest, Publish, PublishRefused
from .context import (
    BeforeInference,
    CheckpointNotFound,
    InferenceResult,
    Injection,
    Lifecycle,
    Render,
    Rollback,
)
from .files import HttpAnswer, HttpRequest
from .link import NO_ANSWER, HostRequest
from .run import serve_websocket_each
from .server import MCPLServer, PushRefused, PushResult, manifest_revision, parse_address
from .tools import ToolError, ToolResult

__all__ = [
    "NO_ANSWER",
    "BeforeInference",
    "Channel",
    "CheckpointNotFound",
    "HostRequest",
    "HttpAnswer",
    "HttpRequest",
    "InferenceResult",
    "Injection",
    "Lifecycle",
    "MCPLServer",
    "NotGranted",
    "OpenRequest",
    "Publish",
    "PublishRefused",
    "PushRefused",
    "PushResult",
    "Render",
    "Rollback",
    "ToolError",
    "ToolResult",
    "manifest_revision",
    "parse_address",
    "serve_websocket_each",
]


def __dir__() -> list[str]:
    """The public API: what ``__all__`` names (the modules behind it are the toolkit's own)."""
    return sorted(__all__)
