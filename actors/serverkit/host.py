"""How the server toolkit answers the host: tools, channels, hooks, rollback.

:func:`answer_call` maps one host request to the author's handler and the handler's return
value to the wire result; :func:`handle_notice` does the same for notifications. A method the
server has no handler for is refused with ``-32601``, never left unanswered.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import trio

from protocol.errors import INVALID_PARAMS, UNKNOWN_FEATURE_SET, RpcError

from .channels import (
    Channel,
    Confirmation,
    OpenHandler,
    OpenRequest,
    Publish,
    PublishHandler,
    PublishRefused,
    content_of,
    unknown_channel,
)
from .context import (
    BeforeInference,
    CheckpointNotFound,
    Lifecycle,
    Render,
    Rollback,
    checkpoint_not_found,
    injections_of,
)
from .link import ServerLink, no_handler
from .tools import Tool
from .transport import warn

__all__ = ["Served", "answer_call", "handle_notice"]


class Served(Protocol):
    """What answering the host reads of a server (an :class:`~actors.serverkit.MCPLServer`)."""

    tools: dict[str, Tool]
    channels: dict[str, Channel]
    default_publish_handler: PublishHandler | None
    open_handler: OpenHandler | None
    close_handler: OpenHandler | None
    before_inference_hook: Callable[[BeforeInference], Any] | None
    lifecycle_hook: Callable[[Lifecycle], Any] | None
    rollback_handler: Callable[[Rollback], Any] | None
    render_handler: Callable[[Render], Any] | None

    @property
    def thread_limiter(self) -> trio.CapacityLimiter: ...

    @property
    def context_feature_set(self) -> str: ...

    @property
    def feature_set_names(self) -> frozenset[str]: ...


async def maybe_await(value: Any) -> Any:
    """``value``, awaited when a handler returned an awaitable."""
    if inspect.isawaitable(value):
        return await value
    return value


async def answer_call(
    server: Served, link: ServerLink, method: str, params: Mapping[str, Any]
) -> Any:
    """The result of one host request (raises :class:`protocol.errors.RpcError` to refuse)."""
    if method == "tools/list":
        return {"tools": [t.to_wire() for t in server.tools.values()]}
    if method == "tools/call":
        name = params.get("name")
        tool = server.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise RpcError(code=INVALID_PARAMS, message=f"Unknown tool: {name!r}")
        return await tool.call(params.get("arguments"), server.thread_limiter)
    if method == "channels/publish":
        return await _publish(server, link, params)
    if method == "channels/list":
        return {"channels": [c.spec.to_wire() for c in server.channels.values()]}
    if method in ("channels/open", "channels/close"):
        return await _open_close(server, method, params)
    if method == "context/beforeInference" and server.before_inference_hook is not None:
        ctx = BeforeInference.from_params(params)
        value = await maybe_await(server.before_inference_hook(ctx))
        return {"featureSet": server.context_feature_set, "contextInjections": injections_of(value)}
    if method == "state/rollback" and server.rollback_handler is not None:
        return await _rollback(server, Rollback.from_params(params))
    if method == "push/render" and server.render_handler is not None:
        value = await maybe_await(server.render_handler(Render.from_params(params)))
        return {"content": [] if value is None else content_of(value)}
    raise no_handler(method)


async def handle_notice(
    server: Served, link: ServerLink, method: str, params: Mapping[str, Any]
) -> None:
    """Handle one host notification (an unknown one is ignored)."""
    if method == "channels/publish":
        try:
            await _publish(server, link, params, notification=True)
        except (RpcError, PublishRefused) as exc:
            warn(f"channels/publish notification dropped: {exc}")
    elif method == "inference/lifecycle" and server.lifecycle_hook is not None:
        event = Lifecycle.from_params(params)
        if event is None:
            warn("malformed inference/lifecycle ignored")
            return
        await maybe_await(server.lifecycle_hook(event))


async def _publish(
    server: Served, link: ServerLink, params: Mapping[str, Any], *, notification: bool = False
) -> dict[str, Any]:
    try:
        publish = Publish.from_params(params, notification=notification)
    except PublishRefused as exc:
        return {"delivered": False, "reason": str(exc)}
    channel = server.channels.get(publish.channel_id)
    if channel is None:
        raise unknown_channel(publish.channel_id)
    target = channel.spec.publish_target
    if publish.thread_id is not None and target != "exact":
        # a root channel has no threads; an undeclared one promises no place
        return {"delivered": False, "reason": f"channel {channel.id!r} has no threads"}
    handler = channel.publish_handler or server.default_publish_handler
    if handler is None:
        return {"delivered": False, "reason": f"channel {channel.id!r} does not take publishes"}
    # the id is made when the publish arrives (Publish.message_id), so that its echo can carry
    # it; it is the answer should the handler call the host before it is done (the host may
    # hold the echo of the post until the post is answered)
    confirmation = Confirmation(channel, publish.message_id)
    publish = attrs.evolve(publish, confirmation=confirmation)
    out: dict[str, Any] = {"delivered": True, "messageId": publish.message_id}
    if publish.targeted:
        out["threadId"] = publish.thread_id
    link.answer_on_first_call(dict(out))
    message_id: str | None = None
    try:
        value = await maybe_await(handler(publish))
        message_id = value if isinstance(value, str) and value else publish.message_id
    except PublishRefused as exc:
        return {"delivered": False, "reason": str(exc) or "refused"}
    finally:
        if message_id is not None and link.answered_early():
            message_id = publish.message_id  # the id the host was told: the echo carries it
        confirmation.settle(message_id)  # its echoes go out now (none if it was refused)
    out["messageId"] = message_id
    return out


async def _open_close(server: Served, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    cid = params.get("channelId")
    channel = server.channels.get(cid) if isinstance(cid, str) else None
    if channel is None:
        raise unknown_channel(cid)
    request = OpenRequest(channel_id=channel.id, params=params)
    if method == "channels/open":
        out: dict[str, Any] = {"channel": channel.spec.to_wire()}
        if server.open_handler is not None:
            history = await maybe_await(server.open_handler(request))
            if isinstance(history, list):
                out["history"] = history
        return out
    if server.close_handler is not None:
        await maybe_await(server.close_handler(request))
    return {"closed": True}


async def _rollback(server: Served, request: Rollback) -> dict[str, Any]:
    if request.feature_set not in server.feature_set_names:
        raise RpcError(code=UNKNOWN_FEATURE_SET, data={"featureSet": request.feature_set})
    assert server.rollback_handler is not None
    try:
        value = await maybe_await(server.rollback_handler(request))
    except CheckpointNotFound:
        raise checkpoint_not_found(request.checkpoint) from None
    if value is False:
        return {"checkpoint": request.checkpoint, "success": False, "reason": "not rolled back"}
    checkpoint = value if isinstance(value, str) else request.checkpoint
    return {"checkpoint": checkpoint, "success": True}
