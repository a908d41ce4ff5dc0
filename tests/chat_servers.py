"""Two small MCPL chat servers for integration tests, run in-process over websockets, written
with the server toolkit (:mod:`actors.serverkit`).

Each server listens on 127.0.0.1 (``serve_websocket`` in the test's nursery); the host dials its
``url``. The test scripts exactly what the server sends and every call waits for the host's
answer, so a test needs no sleeps::

    discord, zulip = DiscordServer(), ZulipServer()
    async with running_chat(tmp_path, discord, zulip) as host:
        await discord.say("discord:g1:general", "d1", "hello")      # answered once stored
        await discord.push("e1", "tick")                               # unscoped push
        await discord.rename("discord:g1:general", "#lobby (Guild One)")
        stored = stored_by_message(host, "Ada")["d1"]

What a server does on its own is the toolkit's: it answers ``initialize`` (a 0.5 manifest whose
feature set, named after the server id, uses every channel capability and ``pushEvents``),
``ping`` and ``featureSets/update``, and once the host grants ``channels.register`` registers its
channels; :attr:`ChatServer.ready` is set once the host accepted them all. ``channels/publish``
is answered with a fresh message id (by :meth:`ChatServer.answer`, which a test's subclass may
override to hold or change an answer); any other host request is the toolkit's to answer.
Whatever the test sends goes out as given (the toolkit still refuses, with ``NotGranted``, a
send the host has not granted).

Every host request and notification past the handshake is kept in :attr:`ChatServer.received`;
every request the server made, with the host's whole answer, in :attr:`ChatServer.answers`.

Every channel declares where a post lands (RFC-011 ``capabilities.publish.target``): Discord's
``root``, Zulip's ``exact``; a publish naming a place gets it echoed as ``threadId``.

* :class:`DiscordServer` (server id ``discord``): two guilds sharing a channel name
  (``discord:g1:general`` ``#general (Guild One)``, ``discord:g2:general``
  ``#general (Guild Two)``), a room ``discord:g1:room`` (``#room (Guild One)``) and a DM
  ``discord:dm:42`` (``@alice``); a reply names its parent with ``replyTo``.
* :class:`ZulipServer` (server id ``zulip``): streams as channels (``zulip:s:design``
  ``#design``, ``zulip:s:general`` ``#general``), topics as threads (``threadId`` = the topic name,
  e.g. ``ideas / v2``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import trio

from actors import Host
from actors.serverkit import MCPLServer
from actors.serverkit.link import LinkLost, ServerLink
from actors.serverkit.transport import LineTransport
from protocol.errors import RpcError
from protocol.server_session import Grant

#: A body: one text, or blocks (a string among them is a text block).
Content = str | Sequence[Mapping[str, Any] | str]


class HostRefused(AssertionError):
    """The host answered one of our requests with an error, or refused an item in it."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def text_content(content: Content) -> list[dict[str, Any]]:
    """``content`` as a list of blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [{"type": "text", "text": b} if isinstance(b, str) else dict(b) for b in content]


def descriptor(
    channel_id: str, label: str, kind: str = "chat", place: str | None = None
) -> dict[str, Any]:
    """A channel descriptor; ``place`` is its RFC-011 ``capabilities.publish.target``."""
    out: dict[str, Any] = {
        "id": channel_id,
        "type": kind,
        "label": label,
        "direction": "bidirectional",
    }
    if place is not None:
        out["capabilities"] = {"publish": {"target": place}}
    return out


def _spec_fields(desc: Mapping[str, Any]) -> dict[str, Any]:
    """A descriptor as the toolkit's channel declaration takes it."""
    caps = desc.get("capabilities")
    publish = caps.get("publish") if isinstance(caps, Mapping) else None
    return {
        "label": desc.get("label"),
        "type": desc.get("type", "chat"),
        "direction": desc.get("direction", "bidirectional"),
        "initially_open": desc.get("initiallyOpen", True) is not False,
        "publish_target": publish.get("target") if isinstance(publish, Mapping) else None,
    }


class _Kit(MCPLServer):
    """The toolkit server under a :class:`ChatServer`: it notes what the host asks and hands
    each request to :meth:`ChatServer.answer`."""

    def __init__(self, chat: ChatServer) -> None:
        super().__init__(chat.server_id, version="0")
        self.chat = chat

    async def host_call(self, link: ServerLink, method: str, params: Mapping[str, Any]) -> Any:
        self.chat.received.append({"method": method, "params": dict(params)})
        return await self.chat.answer(method, params)

    async def host_notice(self, link: ServerLink, method: str, params: Mapping[str, Any]) -> None:
        self.chat.received.append({"method": method, "params": dict(params)})
        await super().host_notice(link, method, params)

    async def serve(self, transport: LineTransport) -> None:
        await super().serve(self.chat.wrap(transport))

    def grant_changed(self, link: ServerLink, before: Grant, after: Grant) -> None:
        super().grant_changed(link, before, after)
        if link is self.link:
            self.chat.on_grant(after)

    async def toolkit_answer(self, method: str, params: Mapping[str, Any]) -> Any:
        """The toolkit's own answer to a host request."""
        link = self.link
        assert link is not None, "no host is connected"
        return await super().host_call(link, method, params)


class ChatServer:
    """One MCPL server over a websocket it serves itself; one connection at a time."""

    def __init__(
        self,
        server_id: str,
        channels: Sequence[Mapping[str, Any]],
        *,
        author: Mapping[str, str] | None = None,
    ) -> None:
        self.server_id = server_id
        self.kit = _Kit(self)
        #: the feature set pushes name: the toolkit's own, named after the server
        self.feature_set = server_id
        self.channels: dict[str, dict[str, Any]] = {}
        for c in channels:
            self._declare(c)
        self.author = dict(author or {"id": "u1", "name": "someone"})
        self.url = ""
        self.ready = trio.Event()
        self.received: list[dict[str, Any]] = []
        self.answers: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self._published = itertools.count(1)
        self.kit.on_granted("channels.register")(self._when_registered)

    def _declare(self, desc: Mapping[str, Any]) -> None:
        """Keep ``desc`` (and declare it to the toolkit, which registers it on every connection
        that grants ``channels.register``)."""
        cid = desc["id"]
        self.channels[cid] = dict(desc)
        fields = _spec_fields(desc)
        try:
            if cid in self.kit.channels:
                kept = self.kit.channels[cid]
                kept.spec = attrs.evolve(kept.spec, **fields)
            else:
                self.kit.channel(cid, **fields)
        except (ValueError, TypeError):
            pass  # a descriptor the toolkit would not declare: sent as given, not re-registered

    async def _when_registered(self) -> None:
        """Once the toolkit's registration is answered: ready if every channel was accepted."""
        if not self.kit.channels:
            return  # nothing declared, nothing registered for us
        await self.kit.registered.wait()
        link = self.kit.link
        accepted = self.kit.accepted_channels(link) if link is not None else set()
        refused = sorted(set(self.kit.channels) - accepted)
        if refused:
            raise HostRefused(f"channels/register refused: {refused}")
        self.ready.set()

    # -- the websocket ---------------------------------------------------------------------------
    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 (any free port); ``nursery.start(server.serve)`` returns the url."""
        async with trio.open_nursery() as nursery:
            self.url = await nursery.start(
                functools.partial(self.kit.serve_websocket, "127.0.0.1", 0)
            )
            task_status.started(self.url)

    def server_config(self, **keys: Any) -> dict[str, Any]:
        """This server's entry in the host's ``servers``."""
        return {"id": self.server_id, "url": self.url, **keys}

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` for as long as the current connection lives."""
        link = self.kit.link
        assert link is not None, "the host has not connected"
        link.spawn(lambda: fn(*args), getattr(fn, "__name__", ""))

    # -- answering the host ----------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """The manifest the server announces."""
        return self.kit.manifest()

    async def answer(self, method: str, params: Mapping[str, Any]) -> Any:
        """The result of one host request (raise :class:`protocol.errors.RpcError` to refuse
        it): ``channels/publish`` is delivered under a fresh message id, anything else is the
        toolkit's to answer. A subclass may override it to hold or change an answer."""
        if method == "channels/publish":
            result = {
                "delivered": True,
                "messageId": f"{self.server_id}-pub-{next(self._published)}",
            }
            if "threadId" in params:  # RFC-011: the place is echoed
                result["threadId"] = params["threadId"]
            return result
        return await self.kit.toolkit_answer(method, params)

    def on_sent(self, request: Mapping[str, Any]) -> None:
        """Called with each request of ours once it is on its way (before its answer)."""

    def on_grant(self, grant: Grant) -> None:
        """Called once the host's grant changed (its ``featureSets/update`` is answered)."""

    def wrap(self, transport: LineTransport) -> LineTransport:
        """The transport a new connection is served on (a subclass may stand in front)."""
        return transport

    # -- requests to the host --------------------------------------------------------------------
    async def _link(self) -> ServerLink:
        while (link := self.kit.link) is None:
            await self.kit.grant_event.wait()
        return link

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request and return the host's whole answer (``result`` or ``error``)."""
        link = await self._link()
        try:
            pending = await link.start_request(method, params)
        except LinkLost as exc:
            raise HostRefused(f"the host closed the link before {method}") from exc
        msg = {"jsonrpc": "2.0", "id": pending.id, "method": method, "params": dict(params)}
        self.on_sent(msg)
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": pending.id}
        try:
            answer["result"] = await pending.wait()
        except RpcError as err:
            answer["error"] = err.to_wire()
        except LinkLost as exc:
            raise HostRefused(f"the host closed the link before answering {method}") from exc
        self.answers.append((msg, answer))
        return answer

    async def call(self, method: str, params: Mapping[str, Any]) -> Any:
        """:meth:`request`, raising :class:`HostRefused` on an error answer; the ``result``."""
        answer = await self.request(method, params)
        if "error" in answer:
            raise HostRefused(f"{method} refused: {answer['error']}")
        return answer["result"]

    async def register(self, *descriptors: Mapping[str, Any]) -> None:
        for d in descriptors:
            self._declare(d)
        result = await self.call("channels/register", {"channels": [dict(d) for d in descriptors]})
        refused = [r for r in result["results"] if not r.get("accepted")]
        if refused:
            raise HostRefused(f"channels/register refused: {refused}")

    async def rename(self, channel_id: str, label: str) -> None:
        """``channels/changed`` with the channel's descriptor ``updated`` to ``label``."""
        updated = {**self.channels[channel_id], "label": label}
        self._declare(updated)
        result = await self.call("channels/changed", {"updated": [updated]})
        refused = [r for r in result["results"] if not r.get("accepted")]
        if refused:
            raise HostRefused(f"channels/changed refused: {refused}")

    def message(
        self,
        channel_id: str,
        message_id: str,
        content: Content,
        *,
        author: Mapping[str, str] | None = None,
        thread_id: str | None = None,
        reply_to: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        tags: Sequence[Any] | None = None,
    ) -> dict[str, Any]:
        """One ``channels/incoming`` message as this server shapes it."""
        msg: dict[str, Any] = {
            "channelId": channel_id,
            "messageId": message_id,
            "author": dict(author or self.author),
            "timestamp": now_iso(),
            "content": text_content(content),
        }
        if thread_id is not None:
            msg["threadId"] = thread_id
        if reply_to is not None:
            msg["replyTo"] = reply_to
        if metadata is not None:
            msg["metadata"] = dict(metadata)
        if tags is not None:
            msg["tags"] = list(tags)
        return msg

    async def incoming(self, *messages: Mapping[str, Any]) -> list[dict[str, Any]]:
        """One ``channels/incoming`` request; raises unless the host accepted every message.
        Returns the host's per-message results (the host answers once they are stored)."""
        result = await self.call("channels/incoming", {"messages": [dict(m) for m in messages]})
        results: list[dict[str, Any]] = result["results"]
        if not all(r.get("accepted") for r in results) or len(results) != len(messages):
            raise HostRefused(f"channels/incoming not all accepted: {results}")
        return results

    async def say(
        self, channel_id: str, message_id: str, content: Content, **fields: Any
    ) -> dict[str, Any]:
        """One message in one request (see :meth:`message`); returns the message sent."""
        msg = self.message(channel_id, message_id, content, **fields)
        await self.incoming(msg)
        return msg

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Send one notification to the host."""
        link = await self._link()
        await link.notify(method, params)

    async def push(
        self,
        event_id: str,
        content: Content,
        *,
        origin: Mapping[str, Any] | None = None,
        tags: Sequence[Any] | None = None,
    ) -> dict[str, Any]:
        """One ``push/event`` (``origin`` may scope it: ``mcplChannelId``, ``threadId``);
        raises unless accepted. Returns the params sent."""
        params: dict[str, Any] = {
            "featureSet": self.feature_set,
            "eventId": event_id,
            "timestamp": now_iso(),
            "payload": {"content": text_content(content)},
            "tags": list(tags or ()),
        }
        if origin is not None:
            params["origin"] = dict(origin)
        result = await self.call("push/event", params)
        if result.get("accepted") is not True:
            raise HostRefused(f"push/event {event_id} not accepted: {result}")
        return params

    def published(self) -> list[dict[str, Any]]:
        """The params of every ``channels/publish`` the host sent, oldest first."""
        return [m["params"] for m in self.received if m.get("method") == "channels/publish"]


class DiscordServer(ChatServer):
    """Guilds sharing a channel name, a room, and DMs (server id ``discord``)."""

    GENERAL_1 = "discord:g1:general"
    GENERAL_2 = "discord:g2:general"
    ROOM = "discord:g1:room"
    DM = "discord:dm:42"

    def __init__(self, server_id: str = "discord") -> None:
        super().__init__(
            server_id,
            [
                descriptor(self.GENERAL_1, "#general (Guild One)", "text", "root"),
                descriptor(self.GENERAL_2, "#general (Guild Two)", "text", "root"),
                descriptor(self.ROOM, "#room (Guild One)", "text", "root"),
                descriptor(self.DM, "@alice", "dm", "root"),
            ],
            author={"id": "42", "name": "alice"},
        )


class ZulipServer(ChatServer):
    """Streams as channels, topics as threads (server id ``zulip``)."""

    DESIGN = "zulip:s:design"
    GENERAL = "zulip:s:general"

    def __init__(self, server_id: str = "zulip") -> None:
        super().__init__(
            server_id,
            [
                descriptor(self.DESIGN, "#design", "stream", "exact"),
                descriptor(self.GENERAL, "#general", "chat", "exact"),
            ],
            author={"id": "7", "name": "bea"},
        )

    async def post(
        self, stream: str, topic: str, message_id: str, content: Content
    ) -> dict[str, Any]:
        """A stream message under ``topic`` (the thread)."""
        return await self.say(stream, message_id, content, thread_id=topic)


def host_config(
    tmp_path: Path, servers: Sequence[ChatServer], agents: Sequence[str] = ("Ada",)
) -> dict[str, Any]:
    """A host config dialling ``servers``; each agent runs a scripted model that never speaks."""
    entries = []
    for name in agents:
        rules = tmp_path / f"{name.lower()}-silent.toml"
        rules.write_text("", encoding="utf-8")
        entries.append({"name": name, "model": f"scripted:{rules}"})
    return {
        "host": {"data_dir": str(tmp_path / "data")},
        "servers": [s.server_config() for s in servers],
        "agents": entries,
    }


@asynccontextmanager
async def running_chat(
    tmp_path: Path, *servers: ChatServer, agents: Sequence[str] = ("Ada",)
) -> AsyncIterator[Host]:
    """Serve ``servers``, open a host dialling them, and yield it once every server's channels
    are registered. On exit the host has settled (``run_until_idle``) and is closed.

    A single failure comes out as itself, not inside the servers' nursery's exception group,
    so a failing test shows the real exception first."""
    try:
        async with trio.open_nursery() as nursery:
            for server in servers:
                await nursery.start(server.serve)
            async with Host.open(host_config(tmp_path, servers, agents)) as host:
                for server in servers:
                    await server.ready.wait()
                yield host
                await host.run_until_idle()
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1 and not isinstance(leaves[0], trio.Cancelled):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def stored_channel_items(host: Host, agent: str = "Ada") -> list[dict[str, Any]]:
    """The agent's stored items from MCPL servers (either lane), oldest first."""
    return [
        m
        for m in host.ctx.store.reader.history(agent)
        if "inbound_source" in (m.get("metadata") or {})
    ]


def stored_by_message(host: Host, agent: str = "Ada") -> dict[str, dict[str, Any]]:
    """The agent's stored channel messages by their ``messageId`` (push events by ``eventId``)."""
    out: dict[str, dict[str, Any]] = {}
    for m in stored_channel_items(host, agent):
        meta = m["metadata"]
        key = meta.get("message_id") or meta.get("event_id")
        assert key not in out, f"{key} stored twice"
        out[key] = m
    return out
