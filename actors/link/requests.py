"""The server's requests that are not hot lanes: channel registration and listing, ``model/info``,
``inference/request`` and ``ping``; and the ``channels/changed`` notification.

The dispatcher (``actors.link.io``) admits each request in arrival order (``admission``). A
channel change (``channels/register``, ``channels/changed``, request or notification) is applied
by the dispatcher itself (``apply_change``), so it is in force before any later message is
checked; any other request runs in a handler task of the link's nursery (the dispatcher caps how
many). The answer, or the refusal (traced as ``refused``), goes back through the link's outbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from actors.context import ChannelLimit
from protocol import jsonrpc as rpc
from protocol.errors import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, RpcError
from protocol.inference import parse_inference_request
from protocol.lanes import ChannelDescriptor, ChannelsChanged, parse_descriptors, structure
from protocol.receipts import undeclared_channel_line
from protocol.routes import declared_target

from .handshake import note_refused_use
from .state import Link, LinkOwner, admit, as_rpc_error, refusal_reason


class ServerRequests:
    def __init__(self, owner: LinkOwner) -> None:
        self.owner = owner

    @staticmethod
    def admission(link: Link, method: str, params: Any = None) -> RpcError | None:
        """Whether the grant in force admits a call of ``method``: None, or the error refusing
        it."""
        if method == "ping":
            return None
        params = params if isinstance(params, Mapping) else {}
        try:
            admit(link, method, params.get("featureSet"))
        except RpcError as exc:
            return exc
        return None

    async def serve(
        self, link: Link, req: rpc.Request, slots: trio.Semaphore, refusal: RpcError | None
    ) -> None:
        """Answer an admitted request (or send ``refusal``) in a handler task."""
        try:
            await self._serve(link, req, refusal)
        finally:
            slots.release()

    async def apply_change(self, link: Link, item: rpc.Request | rpc.Notification) -> None:
        """Apply a channel change in the dispatcher, before anything that came after it is
        checked; a request is answered once it is applied (a notification's refusals are only
        traced)."""
        if isinstance(item, rpc.Request):
            await self._serve(link, item, self.admission(link, item.method, item.params))
            return
        try:
            refusal = self.admission(link, item.method)
            if refusal is not None:
                self.owner.diagnostic(f"{item.method} dropped: {refusal_reason(refusal)}")
                return
            await self.channels_changed(link, item.params)
        except RpcError as exc:
            self.owner.diagnostic(f"{item.method} notification refused: {exc}")
        finally:
            self.owner.work.dec()

    async def _serve(self, link: Link, req: rpc.Request, refusal: RpcError | None) -> None:
        try:
            if refusal is not None:
                await self.reply(link, req, error=refusal)
                return
            try:
                result = await self.answer(link, req)
            except Exception as exc:
                await self.reply(link, req, error=as_rpc_error(exc, req.method))
            else:
                await self.reply(link, req, result=result)
        finally:
            self.owner.work.dec()

    async def reply(
        self, link: Link, req: rpc.Request, *, result: Any = None, error: RpcError | None = None
    ) -> None:
        """Answer one of the server's requests; a link that already ended takes no answer."""
        try:
            if error is not None:
                line = link.session.send_error(req.id, error)
            else:
                line = link.session.send_response(req.id, result)
        except rpc.LocalProtocolError:
            return  # the session closed while we worked: the server will retry on a new link
        if error is not None:
            self.owner.refused(req.method, error, refusal_reason(error), request_id=req.id)
            note_refused_use(self.owner, link, req.method, error)
        await self.owner.send_lines(link, [line])

    async def answer(self, link: Link, req: rpc.Request) -> Any:
        """The result of an admitted request (or the error refusing it)."""
        method = req.method
        if method == "ping":
            return {}
        if method == "channels/register":
            return await self.register(link, req.params)
        if method == "channels/changed":
            return await self.channels_changed(link, req.params)
        if method == "channels/list":
            return await self.list_channels(link)
        if method == "model/info":
            info = self.owner.ctx.inference.model_info(self.owner.sid)
            if info is None:
                raise RpcError(code=INTERNAL_ERROR, message="no model serves this server")
            return info.to_wire()
        if method == "inference/request":
            return await self.inference(link, req)
        raise rpc.method_not_found(method)

    async def inference(self, link: Link, req: rpc.Request) -> Any:
        """A server-initiated inference (admitted by ``answer``): never while one of our hooks
        or renders awaits this server, within its budget, streamed when asked and granted."""
        owner = self.owner
        if link.hooks_in_flight:
            raise RpcError(
                code=INVALID_REQUEST,
                message="inference/request refused: a context/beforeInference or push/render "
                "call to this server is in flight, and neither may start inference",
            )
        request = parse_inference_request(req.params)
        streamed = request.stream and "inferenceRequest.streaming" in link.grant

        async def chunk(method: str, params: Mapping[str, object]) -> None:
            await owner.notify(link, method, params)

        result, model = await owner.ctx.inference.answer(
            owner.sid,
            req.id,
            request,
            now=trio.current_time(),
            chunks=chunk if streamed else None,
        )
        owner.trace(
            "inference-request",
            feature_set=request.feature_set,
            model=model,
            streamed=streamed,
            finish_reason=result["finishReason"],
            usage=result["usage"],
        )
        return result

    # channels/register, channels/changed, channels/list ----------------------------------------
    async def register(self, link: Link, params: Any) -> dict[str, Any]:
        results = [await self._add_channel(link, d) for d in parse_descriptors(params)]
        self._trace_refused("channels/register", results)
        self.owner.publish_status()  # once per request: the status lists the channels
        return {"results": results}

    async def _add_channel(self, link: Link, raw: Any) -> dict[str, Any]:
        owner = self.owner
        cid = raw.get("id") if isinstance(raw, Mapping) else None
        try:
            desc = structure(raw, ChannelDescriptor)
        except RpcError as exc:
            return {"id": cid, "accepted": False, "reason": exc.message}
        if not desc.id:
            return {"id": cid, "accepted": False, "reason": "empty channel id"}
        try:
            await owner.ctx.register_channel(owner.sid, desc, owner.cfg.request_timeout_s)
        except ChannelLimit as exc:
            return {"id": desc.id, "accepted": False, "reason": str(exc)}
        link.channels.add(desc.id)
        owner.trace("channel-registered", channel_id=desc.id, label=desc.label)
        self._tell_undeclared(link, desc)
        return {"id": desc.id, "accepted": True}

    def _tell_undeclared(self, link: Link, desc: ChannelDescriptor) -> None:
        """Tell the operator, once per channel of a link, that this channel declares no
        publish target and what that means for plain speech; told again only after the
        channel declared one (or was removed) in between."""
        told = link.undeclared_told
        if declared_target(desc.capabilities) is not None:
            told.discard(desc.id)
            return
        if desc.id in told:
            return
        told.add(desc.id)
        owner = self.owner
        publish = owner.ctx.config.publish_undeclared(owner.sid)
        owner.trace(
            "publish-undeclared",
            channel_id=desc.id,
            label=desc.label,
            publish_undeclared=publish,
            text=undeclared_channel_line(owner.sid, desc.id, desc.label, publish),
        )

    async def channels_changed(self, link: Link, params: Any) -> dict[str, Any]:
        owner = self.owner
        if not isinstance(params, Mapping):
            raise RpcError(code=INVALID_PARAMS, message="Invalid params: params must be an object")
        changed = structure({k: params[k] for k in ("removed",) if k in params}, ChannelsChanged)
        results: list[dict[str, Any]] = []
        for key in ("added", "updated"):
            if key in params:
                results.extend(
                    [await self._add_channel(link, d) for d in parse_descriptors(params, key)]
                )
        for cid in changed.removed:
            if cid in link.channels:
                link.channels.discard(cid)
                link.undeclared_told.discard(cid)
                await owner.ctx.unregister_channel(owner.sid, cid)
                owner.trace("channel-removed", channel_id=cid)
                results.append({"id": cid, "accepted": True})
            else:
                results.append({"id": cid, "accepted": False, "reason": "unknown_channel"})
        self._trace_refused("channels/changed", results)
        owner.publish_status()
        return {"results": results}

    def _trace_refused(self, method: str, results: list[dict[str, Any]]) -> None:
        for r in results:
            if not r.get("accepted"):
                cid = r.get("id")
                self.owner.refused(
                    method,
                    None,
                    str(r.get("reason")),
                    channel_id=cid if isinstance(cid, str) else None,
                )

    async def list_channels(self, link: Link) -> dict[str, Any]:
        """The link's registered channels as their snapshots describe them (no ask each)."""
        sid, directory = self.owner.sid, self.owner.ctx.channel_directory
        out = []
        for cid in sorted(link.channels):
            info = directory.get(sid, cid, False)
            if info is not None:
                out.append(dict(info.descriptor))
        return {"channels": out}
