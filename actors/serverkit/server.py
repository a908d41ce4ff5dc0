"""The toolkit's server object, :class:`MCPLServer`: what a server declares, and its calls to
the host.

Authors import it from :mod:`actors.serverkit`."""

from __future__ import annotations

import datetime as dt
import itertools
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import trio

from protocol.errors import CAPABILITY_DENIED, RpcError
from protocol.manifest import manifest_digest
from protocol.mcpl import VOCABULARY
from protocol.server_forms import inference_params, push_params
from protocol.server_session import Grant, NotGranted
from protocol.uri import EndpointUri, parse_endpoint

from . import host as serverkit_host
from .channels import (
    Channel,
)
from .context import (
    InferenceResult,
)
from .declare import Declarations
from .link import LinkLost, RequestTimeout, ServerLink
from .run import ServeMixin
from .transport import warn

#: How often a refused-while-not-ready (-32002) or lost send is tried, and the first pause.
ATTEMPTS = 6
FIRST_PAUSE_S = 0.25


def manifest_revision(manifest: Mapping[str, Any]) -> str:
    """The canonical ``revision`` of a manifest (RFC-003): ``sha256:`` and 43 base64url
    characters. Raises :class:`protocol.manifest.ManifestError` for a manifest that has none."""
    return manifest_digest(manifest)


def parse_address(address: str) -> EndpointUri:
    """Read the address hosts dial for this server: ``ws://``, ``wss://`` or ``mcpl://``
    (RFC-004: canonical form and the ``wss://`` it resolves to). Raises
    :class:`protocol.uri.McplUriError` for one a host would refuse."""
    return parse_endpoint(address)


class PushRefused(Exception):
    """The host refused a push or message with an error (a policy refusal, not a lost send)."""

    def __init__(self, method: str, error: RpcError) -> None:
        super().__init__(f"{method} refused by the host: {error}")
        self.error = error


class PushResult(dict[str, Any]):
    """The host's ``push/event`` result, with the ``eventId`` the push was sent under."""

    @property
    def event_id(self) -> str:
        """The idempotency key the push (and every retry) carried."""
        return str(self["eventId"])

    @property
    def accepted(self) -> bool:
        """Whether the host accepted the event."""
        return self.get("accepted") is True


class MCPLServer(Declarations, ServeMixin):
    """An MCPL server: declare tools, channels and hooks, then :meth:`run` it."""

    def __init__(
        self,
        name: str,
        *,
        version: str = "0.1.0",
        push_events: bool = True,
        inference: bool = False,
        request_timeout: float = 30.0,
        max_pending: int = 64,
        default_feature_sets: bool = True,
    ) -> None:
        """``name`` is the server's name in the manifest and its main feature set's name;
        ``version`` goes in ``serverInfo``. ``push_events`` declares ``pushEvents`` (for
        :meth:`push_event`); ``inference=True`` declares ``inferenceRequest`` and
        ``modelInfo`` (for :meth:`infer` and :meth:`model_info`). ``request_timeout`` bounds
        each wait for the host's answer to one of this server's requests (a push is retried
        after it).

        ``max_pending`` caps this server's own requests awaiting the host's answer on one
        connection (a further one waits for a slot); raise it for a server that pipelines
        many requests without waiting.

        ``default_feature_sets=False``: declare no feature set of the toolkit's own
        (``<name>``, ``<name>.context``, ``<name>.inference``); the manifest holds only those
        declared with :meth:`feature_set`, which then name every capability the server uses,
        and pushes and inference requests go out under the first set that uses theirs."""
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}")
        Declarations.__init__(
            self,
            name,
            version=version,
            push_events=push_events,
            inference=inference,
            default_feature_sets=default_feature_sets,
        )
        ServeMixin.__init__(self)
        self.request_timeout = request_timeout
        self.max_pending = max_pending
        self._event_numbers = itertools.count(1)
        self._run_tag = secrets.token_hex(4)

    # -- grants ------------------------------------------------------------------------------
    @property
    def grant(self) -> Grant:
        """What the connected host granted (nothing while no host is connected)."""
        return self._link.grant if self._link is not None else Grant()

    def is_granted(self, capability: str) -> bool:
        """Whether ``capability`` is granted now, with the feature set that uses it enabled;
        given a declared feature set's name instead, whether the host enabled that set."""
        return self._allowed(self.grant, capability)

    def _allowed(self, grant: Grant, name: str) -> bool:
        if name not in VOCABULARY and name in self.feature_set_names:
            return name in grant.enabled_sets
        fs = self._set_for(name)
        return grant.allows(name) and (fs is None or fs in grant.enabled_sets)

    async def granted(self, capability: str) -> None:
        """Wait until a host has granted ``capability`` (see :meth:`is_granted`)."""
        while not self.is_granted(capability):
            await self.grant_event.wait()

    def grant_changed(self, link: ServerLink, before: Grant, after: Grant) -> None:
        """Called by a link when the host's grant changed: wake waiters, register channels,
        start ``on_ready`` (on the first grant) and ``on_granted`` hooks."""
        self._wake()
        if link is not self._link:
            return
        if (
            after.allows("channels.register")
            and not before.allows("channels.register")
            and self.channels
        ):
            link.spawn(
                lambda: self._register(link, list(self.channels.values())), "channels/register"
            )
        if after.received and not before.received:
            for ready in self._on_ready:
                link.spawn(ready, getattr(ready, "__name__", "on_ready"))
        for capability, fn in self._on_granted:
            if self._allowed(after, capability) and not self._allowed(before, capability):
                link.spawn(fn, getattr(fn, "__name__", capability))

    # -- host calls (the link's Dispatch) -----------------------------------------------------
    async def host_call(self, link: ServerLink, method: str, params: Mapping[str, Any]) -> Any:
        """Answer one host request."""
        return await serverkit_host.answer_call(self, link, method, params)

    async def host_notice(self, link: ServerLink, method: str, params: Mapping[str, Any]) -> None:
        """Handle one host notification."""
        await serverkit_host.handle_notice(self, link, method, params)

    # -- sending -----------------------------------------------------------------------------
    def now_iso(self) -> str:
        """The current UTC time as ISO 8601."""
        return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")

    def _current(self, method: str) -> ServerLink:
        link = self._link
        if link is None:
            raise NotGranted(f"{method}: no host is connected")
        return link

    async def call(
        self, method: str, params: Mapping[str, Any], *, timeout: float | None = None
    ) -> Any:
        """Send a request to the host and return its result, trying again when the host is not
        ready yet (-32002 for a send our grant allows), times out, or reconnects.

        Raises :class:`protocol.server_session.NotGranted` (nothing sent) and
        :class:`PushRefused` for the host's other errors.
        """
        pause = FIRST_PAUSE_S
        for attempt in range(ATTEMPTS):
            link = self._current(method)
            try:
                return await link.request(method, params, timeout=timeout)
            except RpcError as err:
                if err.code != CAPABILITY_DENIED or attempt == ATTEMPTS - 1:
                    raise PushRefused(method, err) from None
            except (RequestTimeout, LinkLost) as exc:
                if attempt == ATTEMPTS - 1:
                    raise
                warn(f"{method}: {exc}; trying again")
                if isinstance(exc, LinkLost):
                    await self._regranted(method, params, link)
                    continue
            await trio.sleep(pause)
            pause = min(pause * 2, 5.0)
        raise AssertionError("unreachable")

    async def send_line(self, line: str) -> None:
        """Write ``line`` to the host as it is, past the session: nothing checks, numbers or
        tracks it (for testing a host against malformed or unexpected input). Raises
        :class:`protocol.server_session.NotGranted` when no host is connected."""
        await self._current("a raw line").send_line(line)

    def spawn(self, fn: Callable[[], Awaitable[Any]], name: str = "") -> bool:
        """Run the async ``fn()`` beside the current host connection (e.g. a handler's follow-up
        message, sent without holding up the handler's answer); it is cancelled when that connection
        ends and its failure is logged, never raised. Its calls to the host are not the
        handler's: a publish handler that spawns its echo still decides its answer by what it
        returns. Returns False, running nothing, when no host is connected."""
        link = self._link
        if link is None:
            return False
        link.spawn(fn, name)
        return True

    async def _regranted(self, method: str, params: Mapping[str, Any], lost: ServerLink) -> None:
        """Wait (at most the request timeout) for a new host connection that grants what
        ``method`` needs; raise :class:`protocol.server_session.NotGranted` if none does."""
        with trio.move_on_after(self.request_timeout):
            while True:
                link = self._link
                if link is not None and link is not lost:
                    try:
                        link.session.check(method, params)
                    except NotGranted:
                        pass
                    else:
                        return
                await self.grant_event.wait()
        raise NotGranted(f"{method}: the host connection closed and no host granted it again")

    async def push_event(
        self,
        content: str | Sequence[Mapping[str, Any]],
        *,
        event_id: str | None = None,
        feature_set: str | None = None,
        tags: Iterable[str] = (),
        origin: Mapping[str, Any] | None = None,
        coalesce: Mapping[str, Any] | None = None,
        timestamp: str | None = None,
    ) -> PushResult:
        """Push an event to the host (``push/event``) and return its result.

        The event gets an ``eventId`` (made up unless given) that every retry reuses, so the
        host stores it once. ``origin`` is free-form provenance the host keeps but never
        trusts; two members are read: ``author`` (``{"id", "name"}`` or a bare name: who the
        agent is told the event is from) and ``mcplChannelId`` (a channel of this server the
        event belongs to). At most 32 levels of nesting are accepted.

        ``origin={"mcplChannelId": channel.id}`` scopes the push to that channel: an agent's
        answer to it is published there. An unscoped push has no channel, so the answer goes
        nowhere (mcplive keeps it as a draft). A push scoped to one of this server's channels
        waits (at most the request timeout) until the host has taken the channel's
        registration, as :meth:`Channel.send <actors.serverkit.Channel.send>` does.

        Raises :class:`protocol.server_session.NotGranted`, before anything is written, when
        the host has not granted ``pushEvents`` or the feature set.
        """
        params = push_params(
            content,
            feature_set=feature_set or self._set_for("pushEvents") or self.name,
            event_id=event_id or f"{self.name}-{self._run_tag}-{next(self._event_numbers)}",
            timestamp=timestamp or self.now_iso(),
            tags=tags,
            origin=origin,
            coalesce=coalesce,
        )
        link = self._current("push/event")
        link.session.check("push/event", params)
        scope = origin.get("mcplChannelId") if origin is not None else None
        if isinstance(scope, str) and scope in self.channels:
            await self._registration(link, scope)
        result = await self.call("push/event", params)
        out = PushResult(result if isinstance(result, Mapping) else {})
        out["eventId"] = params["eventId"]
        return out

    async def send_incoming(self, channel: Channel, message: Mapping[str, Any]) -> dict[str, Any]:
        """Deliver one ``channels/incoming`` message (used by :meth:`Channel.send`)."""
        link = self._current("channels/incoming")
        link.session.check("channels/incoming", {})
        await self._registration(link, channel.id)
        if channel.id not in self.accepted_channels(link):
            raise NotGranted(f"channels/incoming: the host has not accepted channel {channel.id!r}")
        result = await self.call("channels/incoming", {"messages": [dict(message)]})
        entries = result.get("results") if isinstance(result, Mapping) else None
        for entry in entries or ():
            if isinstance(entry, Mapping) and entry.get("messageId") == message["messageId"]:
                return dict(entry)
        return {"messageId": message["messageId"], "accepted": False, "reason": "no result"}

    async def _registration(self, link: ServerLink, channel_id: str) -> None:
        """Wait (at most the request timeout) while the registration of ``channel_id`` with
        the host of ``link`` may still be in flight."""
        if link.grant.allows("channels.register") and channel_id not in self.accepted_channels(
            link
        ):
            with trio.move_on_after(self.request_timeout):
                await self.registered.wait()

    async def channels_changed(
        self,
        *,
        added: Sequence[Channel] = (),
        updated: Sequence[Channel] = (),
        removed: Sequence[Channel] = (),
    ) -> None:
        """Tell the host about changed channels (``channels/changed``, request form)."""
        for ch in removed:
            self.channels.pop(ch.id, None)
        for ch in added:
            self.channels[ch.id] = ch
        link = self._link
        if link is None or not link.grant.allows("channels.register"):
            return  # registered afresh when a host grants it
        params: dict[str, Any] = {}
        if added:
            params["added"] = [c.spec.to_wire() for c in added]
        if updated:
            params["updated"] = [c.spec.to_wire() for c in updated]
        if removed:
            params["removed"] = [c.id for c in removed]
        result = await self.call("channels/changed", params)
        self._note_results(link, result, [*added, *updated])
        for ch in removed:
            self.accepted_channels(link).discard(ch.id)

    async def _register(self, link: ServerLink, channels: list[Channel]) -> None:
        registered = self.registered
        try:
            params = {"channels": [c.spec.to_wire() for c in channels]}
            result = await self.call("channels/register", params)
            self._note_results(link, result, channels)
        finally:
            registered.set()

    async def infer(
        self,
        messages: str | Sequence[Mapping[str, Any]],
        *,
        feature_set: str | None = None,
        conversation_id: str | None = None,
        stream: bool = False,
        on_chunk: Callable[[str], None] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> InferenceResult:
        """Ask the host for an inference (``inference/request``); with ``stream=True`` each
        ``inference/chunk`` delta goes to ``on_chunk`` in order before the result returns."""
        params = inference_params(
            messages,
            feature_set=feature_set or self.inference_feature_set,
            conversation_id=conversation_id,
            stream=stream,
            max_tokens=max_tokens,
            temperature=temperature,
        )
        chunks: dict[int, str] = {}

        def chunk(p: Mapping[str, Any]) -> None:
            index, delta = p.get("index"), p.get("delta")
            if type(index) is int and isinstance(delta, str) and index not in chunks:
                chunks[index] = delta
                if on_chunk is not None:
                    on_chunk(delta)

        link = self._current("inference/request")
        result = await link.request("inference/request", params, on_chunk=chunk if stream else None)
        return InferenceResult.from_result(result, [chunks[i] for i in sorted(chunks)])

    async def tools_changed(self) -> None:
        """Tell the host the tool list changed (after registering a tool while running); the
        host lists the tools again."""
        link = self._link
        if link is not None:
            await link.notify("notifications/tools/list_changed", {})

    async def model_info(self) -> dict[str, Any]:
        """The host's model (``model/info``: ``id``, ``vendor``, ``contextWindow``,
        ``capabilities``); needs ``MCPLServer(..., inference=True)`` and the host's grant."""
        result = await self._current("model/info").request("model/info", {})
        return dict(result) if isinstance(result, Mapping) else {}

    async def manifest_changed(self) -> bool:
        """Put the current declarations in force and, when the manifest differs, tell the host
        (``mcpl/manifestChanged``); the host then fetches it and sends a new grant.

        A host ignores the notice until its own handshake is done, so it is sent again (a few
        times, further apart each time) until the host fetches the manifest. Returns whether
        it did.
        """
        link = self._link
        manifest = self.manifest()
        self.current_manifest = manifest
        if link is None:
            return False
        line = link.session.replace_manifest(manifest, self.feature_sets())
        if line is None:
            return False
        pause = FIRST_PAUSE_S
        for _ in range(ATTEMPTS):
            fetched = link.manifest_fetched
            await link.send_line(line)
            with trio.move_on_after(pause):
                await fetched.wait()
                return True
            pause *= 2
        return False
