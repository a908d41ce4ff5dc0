"""The server side of an MCPL link, without I/O.

Theory of operation: the transport hands every received line (stdio) or text frame (websocket)
to :meth:`ServerSession.receive_line`, which returns events. The session answers the
handshake by itself -- ``initialize`` (the manifest under ``experimental.mcpl``), ``ping``,
``mcpl/manifest``, ``featureSets/update`` (tracking the grant and answering a degradation
receipt) and the methods 0.5 removed -- and hands those answers back as :class:`Outgoing`
events, in the order they must be written. Everything else the host asks becomes a
:class:`HostCall` the caller answers with :meth:`answer` or :meth:`answer_error`.

To send, :meth:`request` and :meth:`notify` return the line to write. Both refuse, with
:class:`NotGranted` and before anything is encoded, a message the host has not granted: the
capability each server→host method needs (``push/event`` needs ``pushEvents``, and so on), and
for ``push/event`` and ``inference/request`` the feature set they name, which must be declared,
list that capability in its ``uses`` and be enabled under the current grant.

Both peers number their requests from 1; :class:`protocol.jsonrpc.RpcSession` keeps the two id
spaces apart (a message is classified by its members, never by its id), so an answer to one of
our requests is an :class:`Answered`/:class:`Failed` event naming our id and method, and a
host request with the same number is a separate :class:`HostCall`.

The grant is whatever the newest ``featureSets/update`` *request* said
(``effectiveCapabilities``; absent means nothing). Before the first one nothing is granted. A
notification of the update narrows only (its ``disabled`` list), as SPEC §6.7 says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from protocol import jsonrpc
from protocol.coalesce import Advertisement
from protocol.errors import INVALID_PARAMS, INVALID_REQUEST, LocalProtocolError, RpcError
from protocol.grants import (
    INBOUND_CAPABILITY,
    REMOVED_METHODS,
    derive_feature_sets,
    matches_any,
)
from protocol.mcpl import VOCABULARY, FeatureSet
from protocol.server_manifest import FeatureSetDecl, changed_domains, initialize_result

__all__ = [
    "Answered",
    "Failed",
    "Grant",
    "GrantChanged",
    "HostCall",
    "HostNotice",
    "Initialized",
    "Lost",
    "ManifestServed",
    "NotGranted",
    "Outgoing",
    "ServerSession",
    "Skipped",
]

#: Server→host methods and the capability each needs (the host's own table, read the other way).
OUTBOUND_CAPABILITY: Final[Mapping[str, str]] = INBOUND_CAPABILITY
#: How many answers one :class:`Grant` remembers (past that, it matches afresh each time).
ALLOWS_MEMO: Final = 256
#: Methods whose params name the feature set they act for (SPEC §6.5).
FEATURE_SET_METHODS: Final = frozenset({"push/event", "inference/request"})


class NotGranted(LocalProtocolError):
    """A send the host has not granted; nothing was written."""


# -- events -----------------------------------------------------------------------------------


@attrs.frozen
class Outgoing:
    """A line the session wrote by itself (a handshake answer, a refusal): write it now."""

    line: str


@attrs.frozen
class HostCall:
    """A request from the host for the server to answer.

    ``default`` is the answer the session would have written itself, for a method it was told
    to hand over (``ServerSession(defer=...)``); None for every other request.
    """

    id: jsonrpc.Id
    method: str
    params: Mapping[str, Any]
    default: Any = None


@attrs.frozen
class HostNotice:
    """A notification from the host."""

    method: str
    params: Mapping[str, Any]


@attrs.frozen
class Answered:
    """The host's result for one of our requests."""

    id: jsonrpc.Id
    method: str
    result: Any


@attrs.frozen
class Failed:
    """The host's error for one of our requests."""

    id: jsonrpc.Id
    method: str
    error: RpcError


@attrs.frozen
class Lost:
    """One of our requests will get no answer (its deadline passed or the link ended)."""

    id: jsonrpc.Id
    method: str
    reason: str


@attrs.frozen
class Initialized:
    """``notifications/initialized`` arrived; the host may now send its policy."""


@attrs.frozen
class GrantChanged:
    """The host's grant changed (a ``featureSets/update``)."""

    grant: Grant


@attrs.frozen
class ManifestServed:
    """The host fetched the manifest (``mcpl/manifest``), e.g. after ``manifestChanged``."""


@attrs.frozen
class Skipped:
    """Something the host sent was refused or skipped (its answer, if any, is an Outgoing)."""

    text: str


Event = (
    Outgoing
    | HostCall
    | HostNotice
    | Answered
    | Failed
    | Lost
    | Initialized
    | GrantChanged
    | ManifestServed
    | Skipped
)


# -- the grant --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Grant:
    """What the host granted: capability paths and the feature sets it enabled.

    ``received`` is False until the host's first policy arrived (then nothing is granted).
    """

    capabilities: frozenset[str] = frozenset()
    enabled_sets: frozenset[str] = frozenset()
    received: bool = False
    #: answers of :meth:`allows` so far (a sender asks the same few paths on every send);
    #: bounded by the paths asked about, which are the vocabulary's
    _allowed: dict[str, bool] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def allows(self, capability: str) -> bool:
        """Whether ``capability`` is granted (the host may send patterns; they are matched)."""
        known = self._allowed.get(capability)
        if known is None:
            known = matches_any(self.capabilities, capability)
            if len(self._allowed) < ALLOWS_MEMO:
                self._allowed[capability] = known
        return known


def _string_list(params: Mapping[str, Any], key: str) -> list[str] | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RpcError(code=INVALID_PARAMS, message=f"{key} must be an array of strings")
    return value


def _as_params(params: jsonrpc.Params) -> Mapping[str, Any]:
    return params if isinstance(params, Mapping) else {}


class ServerSession:
    """One MCPL link seen from the server. See the module docstring."""

    def __init__(
        self,
        *,
        name: str,
        version: str,
        manifest: Mapping[str, Any] | None,
        feature_sets: Sequence[FeatureSetDecl] = (),
        tools: bool = False,
        max_pending: int = 256,
        max_inbound: int = 256,
        defer: Iterable[str] = (),
    ) -> None:
        """``defer``: methods the session answers by itself (``initialize``, ``ping``,
        ``mcpl/manifest``, ``featureSets/update``) that it hands over as a :class:`HostCall`
        instead, after doing everything else it does for them (tracking the grant, ...), with
        the answer it would have written as ``default``; the caller answers (or withholds) it.
        A request the session refuses (a malformed update) is still refused by the session."""
        self.defer = frozenset(defer)
        self.name = name
        self.version = version
        self.tools = tools
        self._manifest = dict(manifest) if manifest is not None else None
        self._sets = {fs.name: fs for fs in feature_sets}
        self._rpc = jsonrpc.RpcSession(max_pending=max_pending, max_inbound=max_inbound)
        self.grant = Grant()
        self.initialized = False
        self.host_manifest: Mapping[str, Any] | None = None
        self.coalescing = Advertisement.from_wire(None)

    # -- state -------------------------------------------------------------------------------
    @property
    def manifest(self) -> Mapping[str, Any] | None:
        """The manifest in force (None for an MCP-only server)."""
        return self._manifest

    @property
    def pending_count(self) -> int:
        """How many of our requests await the host's answer."""
        return self._rpc.pending_count

    @property
    def owed_count(self) -> int:
        """How many host requests await our answer."""
        return self._rpc.inbound_count

    @property
    def closed(self) -> bool:
        """Whether the link ended (nothing more may be sent)."""
        return self._rpc.closed

    # -- sending -----------------------------------------------------------------------------
    def check(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Raise :class:`NotGranted` unless the host lets us send ``method`` with ``params``."""
        cap = OUTBOUND_CAPABILITY.get(method)
        if cap is None:
            return
        if not self.grant.received:
            raise NotGranted(
                f"{method} needs the capability {cap!r}, and the host has not sent its grant yet"
            )
        if not self.grant.allows(cap):
            raise NotGranted(
                f"{method} needs the capability {cap!r}, which the host has not granted"
            )
        if method in FEATURE_SET_METHODS:
            fs_name = (params or {}).get("featureSet")
            fs = self._sets.get(fs_name) if isinstance(fs_name, str) else None
            if fs is None:
                raise NotGranted(f"{method} names feature set {fs_name!r}, which is not declared")
            if cap not in fs.uses:
                raise NotGranted(
                    f"{method} needs {cap!r}, which feature set {fs.name!r} does not use"
                )
            if fs.name not in self.grant.enabled_sets:
                raise NotGranted(f"{method}: the host has not enabled feature set {fs.name!r}")
        if method == "push/event" and "coalesce" in (params or {}):
            if not self.coalescing.push_events:
                raise NotGranted("push/event carries coalesce, which the host does not advertise")

    def request(
        self, method: str, params: Mapping[str, Any] | None, *, now: float, timeout: float
    ) -> tuple[jsonrpc.Id, str]:
        """Our request: ``(id, line)``. Raises :class:`NotGranted` (nothing kept or written),
        or :class:`protocol.jsonrpc.PendingFull` past the cap of pending requests."""
        self.check(method, params)
        return self._rpc.send_request(method, dict(params or {}), now=now, timeout=timeout)

    def request_unchecked(
        self, method: str, params: Mapping[str, Any] | None, *, now: float, timeout: float
    ) -> tuple[jsonrpc.Id, str]:
        """Our request, whether or not the host granted it: for a test that plays a server
        breaking the grant, so that the host's refusal can be seen. Raises only
        :class:`protocol.jsonrpc.PendingFull` past the cap."""
        return self._rpc.send_request(method, dict(params or {}), now=now, timeout=timeout)

    def notify(self, method: str, params: Mapping[str, Any] | None) -> str:
        """Our notification's line. Raises :class:`NotGranted` as :meth:`request` does."""
        if self.closed:
            raise LocalProtocolError("session is closed")
        self.check(method, params)
        return self._rpc.send_notification(method, dict(params or {}))

    def answer(self, id: jsonrpc.Id, result: Any) -> str:
        """The line answering the host's request ``id``."""
        return self._rpc.send_response(id, result)

    def answer_error(self, id: jsonrpc.Id, error: RpcError) -> str:
        """The line refusing the host's request ``id``."""
        return self._rpc.send_error(id, error)

    def forget(self, id: jsonrpc.Id) -> None:
        """Drop one of our pending requests (its asker gave up)."""
        self._rpc.cancel(id)

    def replace_manifest(
        self, manifest: Mapping[str, Any], feature_sets: Sequence[FeatureSetDecl]
    ) -> str | None:
        """Put a new manifest in force; the ``mcpl/manifestChanged`` line when it differs."""
        old = self._manifest or {}
        self._manifest = dict(manifest)
        self._sets = {fs.name: fs for fs in feature_sets}
        domains = changed_domains(old, manifest)
        if not domains or self.closed or not self.initialized:
            return None
        params = {"revision": manifest["revision"], "domains": domains}
        return self._rpc.send_notification("mcpl/manifestChanged", params)

    # -- receiving ---------------------------------------------------------------------------
    def receive_line(self, text: str) -> list[Event]:
        """The events one line from the host makes."""
        out: list[Event] = []
        for ev in self._rpc.receive_line(text):
            if isinstance(ev, jsonrpc.Diagnostic):
                if ev.reply is not None:
                    out.append(Outgoing(ev.reply))
                out.append(Skipped(ev.text))
            elif isinstance(ev, jsonrpc.RequestReceived):
                out.extend(self._request(ev.request))
            elif isinstance(ev, jsonrpc.NotificationReceived):
                out.extend(self._notification(ev.notification))
            elif isinstance(ev, jsonrpc.ResponseReceived):
                out.append(Answered(ev.id, ev.method, ev.result))
            elif isinstance(ev, jsonrpc.ErrorReceived):
                out.append(Failed(ev.id, ev.method, ev.error))
        return out

    def expired(self, now: float) -> list[Lost]:
        """Our requests whose deadline passed by ``now``."""
        return [Lost(e.id, e.method, "timed out") for e in self._rpc.expired(now)]

    def close(self) -> list[Lost]:
        """The link ended: every pending request is lost."""
        return [Lost(e.id, e.method, "link closed") for e in self._rpc.close()]

    def _request(self, req: jsonrpc.Request) -> list[Event]:
        params = _as_params(req.params)
        method = req.method
        try:
            if method == "initialize":
                return [self._own(req.id, method, params, self._initialize(params))]
            if method == "ping":
                return [self._own(req.id, method, params, {})]
            if method == "mcpl/manifest":
                if self._manifest is None:
                    raise jsonrpc.method_not_found(method)
                manifest = dict(self._manifest)
                return [self._own(req.id, method, params, manifest), ManifestServed()]
            if method == "featureSets/update":
                receipt = self._update(params, request=True)
                return [self._own(req.id, method, params, receipt), GrantChanged(self.grant)]
            if method in REMOVED_METHODS:
                raise jsonrpc.method_not_found(method)
        except RpcError as err:
            return [Outgoing(self.answer_error(req.id, err)), Skipped(f"{method} refused: {err}")]
        return [HostCall(req.id, method, params)]

    def _own(
        self, id: jsonrpc.Id, method: str, params: Mapping[str, Any], result: Any
    ) -> Outgoing | HostCall:
        """The session's own answer, or the call handed over when ``method`` is deferred."""
        if method in self.defer:
            return HostCall(id, method, params, default=result)
        return Outgoing(self.answer(id, result))

    def _notification(self, note: jsonrpc.Notification) -> list[Event]:
        params = _as_params(note.params)
        if note.method == "notifications/initialized":
            if self.initialized:
                return [Skipped("notifications/initialized received twice")]
            self.initialized = True
            return [Initialized()]
        if note.method == "featureSets/update":
            try:
                self._update(params, request=False)
            except RpcError as err:
                return [Skipped(f"featureSets/update notification refused: {err}")]
            return [GrantChanged(self.grant)]
        return [HostNotice(note.method, params)]

    def _initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        if self.host_manifest is not None:
            raise RpcError(code=INVALID_REQUEST, message="already initialized")
        caps = params.get("capabilities")
        experimental = caps.get("experimental") if isinstance(caps, Mapping) else None
        host = experimental.get("mcpl") if isinstance(experimental, Mapping) else None
        self.host_manifest = host if isinstance(host, Mapping) else {}
        try:
            self.coalescing = Advertisement.from_wire(self.host_manifest.get("eventCoalescing"))
        except ValueError:
            self.coalescing = Advertisement.from_wire(None)
        return initialize_result(
            self._manifest,
            name=self.name,
            version=self.version,
            tools=self.tools,
            requested_version=params.get("protocolVersion"),
        )

    def _update(self, params: Mapping[str, Any], *, request: bool) -> dict[str, Any]:
        effective = _string_list(params, "effectiveCapabilities")
        denied = _string_list(params, "deniedCapabilities")
        enabled = _string_list(params, "enabled")
        disabled = _string_list(params, "disabled") or []
        both = set(effective or ()) & set(denied or ())
        if both:
            raise RpcError(
                code=INVALID_PARAMS, message=f"paths both granted and denied: {sorted(both)}"
            )
        declared = {
            n: FeatureSet(name=n, description=fs.description, uses=fs.uses)
            for n, fs in self._sets.items()
        }
        if request:
            caps = frozenset(effective or ())
            state = derive_feature_sets(declared, _expanded(caps), enabled, disabled)
            self.grant = Grant(capabilities=caps, enabled_sets=state.enabled, received=True)
            return state.receipt()
        # a notification only narrows (SPEC §6.7)
        state = derive_feature_sets(declared, _expanded(self.grant.capabilities), None, disabled)
        self.grant = attrs.evolve(self.grant, enabled_sets=self.grant.enabled_sets & state.enabled)
        return {}


def _expanded(patterns: frozenset[str]) -> frozenset[str]:
    """The vocabulary paths a grant names (the host may send patterns)."""
    return frozenset(p for p in VOCABULARY if matches_any(patterns, p))
