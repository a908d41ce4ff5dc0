"""Channels of the server toolkit: descriptors, what the host publishes, what a server sends.

A channel is declared once (:meth:`actors.serverkit.MCPLServer.channel`) and registered with
every host that grants ``channels.register``. Its descriptor carries the RFC-011 publish
target: ``"root"`` (the channel has no threads: a publish naming a thread is refused, one naming
the root or none lands in the channel) or ``"exact"`` (a thread id lands in that thread or is
refused by the handler); ``None`` declares nothing, and a publish naming a thread there is
refused, since the toolkit cannot promise where it would land.

What an agent says arrives as a :class:`Publish`: the publishing agent's ``conversationId``
(``"agent:<name>"``, read back as :attr:`Publish.agent`), the place (:attr:`Publish.thread_id`,
with :attr:`Publish.targeted` telling ``null`` from absent) and the content. The publish is
confirmed with a message id (the handler's own, or :attr:`Publish.message_id`, made up before
the handler runs); :meth:`Publish.echo` posts the agent's words back into the channel as that
message, so the host knows them for its own and they wake no one.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol

import attrs

from protocol.errors import INVALID_PARAMS, UNKNOWN_CHANNEL, RpcError
from protocol.server_forms import content_of, incoming_message

from .transport import warn

__all__ = [
    "Channel",
    "ChannelSpec",
    "Confirmation",
    "OpenRequest",
    "Publish",
    "PublishRefused",
    "content_of",
]

PUBLISH_TARGETS: Final = ("root", "exact")
#: The tag of an echo: the host's own words, posted back (a host never wakes anyone for it).
FROM_SELF: Final = "chat:from-self"
_ABSENT: Final = object()


class PublishRefused(Exception):
    """Raised by a publish handler: nothing was posted; the host gets ``delivered: false``."""


def _text(content: Sequence[Mapping[str, Any]]) -> str:
    return "".join(
        b["text"] for b in content if b.get("type") == "text" and isinstance(b.get("text"), str)
    )


@attrs.frozen(kw_only=True)
class ChannelSpec:
    """A channel descriptor (SPEC §14.2 plus ``initiallyOpen`` and RFC-011's publish target)."""

    id: str
    label: str
    type: str = "chat"
    direction: str = "bidirectional"
    initially_open: bool = True
    publish_target: str | None = None
    address: str | None = None
    metadata: Mapping[str, Any] | None = None

    def __attrs_post_init__(self) -> None:
        if not self.id:
            raise ValueError("a channel needs a non-empty id")
        if self.publish_target not in (None, *PUBLISH_TARGETS):
            raise ValueError(
                f"publish_target must be 'root', 'exact' or None, not {self.publish_target!r}"
            )
        if self.direction not in ("inbound", "outbound", "bidirectional"):
            raise ValueError(
                f"direction must be inbound, outbound or bidirectional, not {self.direction!r}"
            )

    def to_wire(self) -> dict[str, Any]:
        """The descriptor as ``channels/register`` carries it."""
        out: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "label": self.label,
            "direction": self.direction,
        }
        if not self.initially_open:
            out["initiallyOpen"] = False
        if self.publish_target is not None:
            out["capabilities"] = {"publish": {"target": self.publish_target}}
        if self.address is not None:
            out["address"] = self.address
        if self.metadata is not None:
            out["metadata"] = dict(self.metadata)
        return out


@attrs.frozen(kw_only=True)
class Publish:
    """What an agent published into one of our channels; :attr:`message_id` is the id it is
    confirmed under unless its handler returns another before calling the host."""

    channel_id: str
    conversation_id: str | None
    content: tuple[Mapping[str, Any], ...]
    thread_id: str | None = None
    targeted: bool = False
    #: the host sent it as a notification: no answer goes back, so a refusal is not seen
    notification: bool = False
    params: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    #: the id the publish is confirmed with unless the handler returns one of its own (made
    #: when it arrives, unique across the server's runs; the early answer sent before the
    #: handler's first call to the host names it, and so does :meth:`echo`)
    message_id: str = attrs.field(factory=lambda: new_message_id("pub"))
    _confirmation: Confirmation | None = attrs.field(
        default=None, repr=False, eq=False, alias="confirmation"
    )

    @property
    def agent(self) -> str | None:
        """The publishing agent's name, from a ``conversationId`` of ``"agent:<name>"``."""
        cid = self.conversation_id
        return cid.removeprefix("agent:") if cid and cid.startswith("agent:") else None

    @property
    def author(self) -> dict[str, str]:
        """The agent as a message's author: ``{"id": conversation_id, "name": agent}``
        (``"agent"`` stands in for what the host did not send)."""
        cid = self.conversation_id or "agent"
        return {"id": cid, "name": self.agent or cid}

    @property
    def text(self) -> str:
        """The text blocks joined."""
        return _text(self.content)

    def echo(
        self,
        content: str | Sequence[Mapping[str, Any]] | None = None,
        *,
        author: str | Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        """Post the agent's words back into the channel, as the message this publish was
        confirmed as: the way to show other readers of the channel what the agent said.

        The echo carries the id the publish was confirmed with (the handler's own id, or
        :attr:`message_id` when the handler returns nothing), the agent as its author
        (:attr:`author`, unless ``author`` is given), the publish's thread and the tag
        ``chat:from-self`` (with any ``tags`` given), so the host recognises its own words and
        never wakes an agent with them. ``content`` defaults to what the agent published.

        It never waits: called in the publish handler (sync or async; no ``await``), the echo
        goes out once the handler has returned and the publish is confirmed; called later, at
        once. It is sent beside the host connection, like :meth:`MCPLServer.spawn
        <actors.serverkit.MCPLServer.spawn>`, and its failure is logged, never raised. A
        publish the handler refused (:class:`PublishRefused`) is echoed nowhere.
        """
        if self._confirmation is None:
            raise RuntimeError("echo() needs a publish handed to a handler by the toolkit")
        self._confirmation.echo(
            {
                "content": list(self.content) if content is None else content,
                "author": self.author if author is None else author,
                "thread_id": self.thread_id,
                "tags": (FROM_SELF, *tags),
                "metadata": metadata,
            }
        )

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, notification: bool = False) -> Publish:
        """Read ``channels/publish`` params (``notification``: sent as a notification);
        ``-32602`` for malformed ones."""
        cid = params.get("channelId")
        if not isinstance(cid, str):
            raise RpcError(code=INVALID_PARAMS, message="channelId must be a string")
        content = params.get("content")
        if not isinstance(content, list) or not all(isinstance(b, Mapping) for b in content):
            raise RpcError(code=INVALID_PARAMS, message="content must be an array of blocks")
        conv = params.get("conversationId")
        thread = params.get("threadId", _ABSENT)
        targeted = thread is not _ABSENT
        if targeted and not (thread is None or (isinstance(thread, str) and thread)):
            raise PublishRefused("threadId must be a non-empty string or null")
        return cls(
            channel_id=cid,
            conversation_id=conv if isinstance(conv, str) else None,
            content=tuple(content),
            thread_id=thread if isinstance(thread, str) else None,
            targeted=targeted,
            notification=notification,
            params=params,
        )


@attrs.define(eq=False)
class Confirmation:
    """Where one publish stands, for its echo: its channel and the id made up for it; once the
    handler has returned, the id it was confirmed with (``None``: refused). Echoes asked for
    before then wait here, and go out in order once it is confirmed."""

    channel: Channel
    made_id: str
    confirmed: str | None = None
    settled: bool = False
    waiting: list[dict[str, Any]] = attrs.field(factory=list)

    def echo(self, message: dict[str, Any]) -> None:
        """Send ``message`` (:meth:`Channel.send`'s arguments) as the publish's echo once the
        publish is confirmed."""
        if not self.settled:
            self.waiting.append(message)
        else:
            self._send([message])

    def settle(self, message_id: str | None) -> None:
        """The handler returned: the publish is confirmed as ``message_id`` (``None``:
        refused, so what waits is dropped); send what waits."""
        self.settled, self.confirmed = True, message_id
        waiting, self.waiting = self.waiting, []
        if waiting:
            self._send(waiting)

    def _send(self, messages: list[dict[str, Any]]) -> None:
        message_id = self.confirmed
        if message_id is None:
            warn(f"no echo in {self.channel.id!r}: the publish was refused, nothing was posted")
            return
        channel = self.channel

        async def send() -> None:
            for message in messages:
                entry = await channel.send(message_id=message_id, **message)
                if entry.get("accepted") is False:
                    warn(f"echo {message_id} not accepted: {entry.get('reason', 'no reason')}")

        if not channel._server.spawn(send, f"echo of {message_id}"):
            warn(f"no echo of {message_id}: no host is connected")


@attrs.frozen(kw_only=True)
class OpenRequest:
    """The host opening (``channels/open``) or closing (``channels/close``) a channel."""

    channel_id: str
    params: Mapping[str, Any] = attrs.field(factory=dict, repr=False)


PublishHandler = Callable[[Publish], Awaitable[Any] | Any]
OpenHandler = Callable[[OpenRequest], Awaitable[Any] | Any]

_message_numbers = itertools.count(1)
#: Tells this process's ids from those of the server's earlier runs, which the host still holds.
_RUN = secrets.token_hex(4)


def new_message_id(prefix: str) -> str:
    """A message id unique across the server's runs: the host drops a message whose id it
    has already stored from this server, so a restarted server must not count from 1 again."""
    return f"{prefix}-{_RUN}-{next(_message_numbers)}"


class ChannelOwner(Protocol):
    """What a channel asks of the server it belongs to (an
    :class:`~actors.serverkit.MCPLServer`)."""

    def now_iso(self) -> str: ...

    async def send_incoming(
        self, channel: Channel, message: Mapping[str, Any]
    ) -> dict[str, Any]: ...

    def spawn(self, fn: Callable[[], Awaitable[Any]], name: str = "") -> bool: ...

    async def channels_changed(
        self,
        *,
        added: Sequence[Channel] = (),
        updated: Sequence[Channel] = (),
        removed: Sequence[Channel] = (),
    ) -> None: ...


class Channel:
    """A declared channel: send messages into it, update it, handle what agents publish."""

    def __init__(self, server: ChannelOwner, spec: ChannelSpec) -> None:
        self._server = server
        self.spec = spec
        self.publish_handler: PublishHandler | None = None

    @property
    def id(self) -> str:
        """The channel id."""
        return self.spec.id

    def on_publish(self, fn: PublishHandler) -> PublishHandler:
        """Decorator: ``fn(publish)`` handles what agents publish here (sync or async).

        Return nothing (delivered as :attr:`Publish.message_id`), a message id string, or raise
        :class:`PublishRefused` to refuse with nothing posted. Decide before the first call to
        the host: the publish is answered (delivered, as :attr:`Publish.message_id`) just before
        the handler's first call to the host goes out, since a host may hold the echo of a post
        until the post is answered. Publishes into one channel are handled in the order they
        arrived, each once the one before is answered. To show the agent's words in the
        channel, call :meth:`Publish.echo`: never :meth:`send` them under a new id, which the
        host would take for someone else's message.
        """
        self.publish_handler = fn
        return fn

    async def send(
        self,
        content: str | Sequence[Mapping[str, Any]],
        *,
        author: str | Mapping[str, Any],
        message_id: str | None = None,
        thread_id: str | None = None,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        event_id: str | None = None,
        coalesce: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Deliver one message from ``author`` into this channel (``channels/incoming``).

        ``author`` (required: every message names who wrote it) is a display name, used as
        its id too, or ``{"id", "name"}`` (an id the server keeps for the person). An agent's
        words are echoed with :meth:`Publish.echo`, not sent with this.

        ``message_id`` left out, a new id unique across runs is made up. The host stores a
        message once per id: an id it already holds from this server is answered as accepted
        and not stored again (so a retry is safe, and a server that sets its own ids must keep
        them unique across restarts).

        Returns the host's result entry for it (``{"messageId", "accepted", ...}``). Raises
        :class:`protocol.server_session.NotGranted` before sending anything when the host has
        not granted ``channels.incoming`` or has not accepted this channel.
        """
        if thread_id is not None and self.spec.publish_target == "root":
            raise ValueError(f"channel {self.id!r} is a root channel: its messages carry no thread")
        message = incoming_message(
            content,
            channel_id=self.id,
            message_id=message_id or new_message_id("msg"),
            author=author,
            timestamp=self._server.now_iso(),
            thread_id=thread_id,
            tags=tags,
            metadata=metadata,
            event_id=event_id or (new_message_id("evt") if coalesce is not None else None),
            coalesce=coalesce,
        )
        return await self._server.send_incoming(self, message)

    async def update(self, **changes: Any) -> None:
        """Change the descriptor and tell the host (``channels/changed`` with ``updated``).

        The keys are :class:`ChannelSpec`'s fields but ``id``: ``label``, ``type``,
        ``direction``, ``initially_open``, ``publish_target``, ``address`` and ``metadata``
        (free-form, kept by the host with the channel); any other key raises TypeError. The
        same as ``server.channels_changed(updated=[channel])`` after changing ``spec``."""
        self.spec = attrs.evolve(self.spec, **changes)
        await self._server.channels_changed(updated=[self])

    async def remove(self) -> None:
        """Withdraw the channel (``channels/changed`` with ``removed``)."""
        await self._server.channels_changed(removed=[self])


def unknown_channel(channel_id: object) -> RpcError:
    """The refusal of a channel this server never declared."""
    return RpcError(code=UNKNOWN_CHANNEL, message="Unknown channel", data={"channelId": channel_id})
