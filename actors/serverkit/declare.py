"""What a toolkit server declares: tools, channels, hooks, feature sets, and its manifest.

The declaring half of :class:`actors.serverkit.MCPLServer`. The manifest is built from these
declarations each time it is needed (:meth:`Declarations.manifest`): the feature set
``<name>`` uses what the server needs for pushes, channels and tools, ``<name>.context`` its
context hooks and ``<name>.inference`` its inference requests, plus any declared with
:meth:`Declarations.feature_set`; the advertised capabilities are exactly the paths those sets
use.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from protocol.mcpl import VOCABULARY
from protocol.server_manifest import FeatureSetDecl, build_manifest

from .channels import Channel, ChannelOwner, ChannelSpec, OpenHandler, PublishHandler
from .context import BeforeInference, Lifecycle, Render, Rollback
from .link import HostRequest
from .tools import Tool, tool_from_function

__all__ = ["Declarations"]

F = TypeVar("F", bound=Callable[..., Any])
_NAME = re.compile(r"[A-Za-z0-9._:-]+")
CHANNEL_CAPS = ("channels.register", "channels.incoming", "channels.publish", "channels.lifecycle")
HOOK_CAPS = (
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.beforeUser",
    "contextHooks.beforeInference.inject.afterUser",
)
INFERENCE_CAPS = ("inferenceRequest", "inferenceRequest.streaming", "modelInfo")


class Declarations:
    """Tools, channels, handlers and feature sets of one server."""

    def __init__(
        self,
        name: str,
        *,
        version: str = "0.1.0",
        push_events: bool = True,
        inference: bool = False,
        default_feature_sets: bool = True,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"server name {name!r} may hold only letters, digits and . _ : -")
        self.name = name
        self.version = version
        self.push_events = push_events
        self.inference = inference
        self.default_feature_sets = default_feature_sets
        self.tools: dict[str, Tool] = {}
        self.channels: dict[str, Channel] = {}
        self.default_publish_handler: PublishHandler | None = None
        self.open_handler: OpenHandler | None = None
        self.close_handler: OpenHandler | None = None
        self.before_inference_hook: Callable[[BeforeInference], Any] | None = None
        self.lifecycle_hook: Callable[[Lifecycle], Any] | None = None
        self.rollback_handler: Callable[[Rollback], Any] | None = None
        self.render_handler: Callable[[Render], Any] | None = None
        self._extra_sets: dict[str, FeatureSetDecl] = {}
        self._advertised: set[str] = set()
        self._on_granted: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        self._on_ready: list[Callable[[], Awaitable[Any]]] = []
        #: per method, the function answering the host's request in place of the toolkit
        self.answer_overrides: dict[str, Callable[[HostRequest], Any]] = {}
        self.line_taps: list[Callable[[str], None]] = []
        self.problem_taps: list[Callable[[str], None]] = []

    # -- declarations ------------------------------------------------------------------------
    def tool(self, name: str | None = None, *, description: str | None = None) -> Callable[[F], F]:
        """Decorator: register a function (sync or async) as a tool; its schema comes from its
        type hints, its description from its docstring.

        Tools belong to the server's main feature set (``<name>``), or, with
        ``default_feature_sets=False``, to the first declared set that uses ``tools``. Adding
        one while the server runs changes the tool list, not the manifest: announce it with
        :meth:`MCPLServer.tools_changed` (the host lists the tools again). The manifest changes
        only with the capabilities or feature sets (:meth:`feature_set`); then call
        :meth:`MCPLServer.manifest_changed`."""

        def register(fn: F) -> F:
            t = tool_from_function(fn, name=name, description=description)
            if t.name in self.tools:
                raise ValueError(f"tool {t.name!r} is already registered")
            self.tools[t.name] = t
            return fn

        return register

    def channel(
        self,
        channel_id: str,
        *,
        label: str | None = None,
        type: str = "chat",
        direction: str = "bidirectional",
        initially_open: bool = True,
        publish_target: str | None = None,
        address: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Channel:
        """Declare a channel; it is registered with every host that grants ``channels.register``."""
        if channel_id in self.channels:
            raise ValueError(f"channel {channel_id!r} is already declared")
        spec = ChannelSpec(
            id=channel_id,
            label=label or channel_id,
            type=type,
            direction=direction,
            initially_open=initially_open,
            publish_target=publish_target,
            address=address,
            metadata=metadata,
        )
        channel = Channel(cast("ChannelOwner", self), spec)
        self.channels[channel_id] = channel
        return channel

    def feature_set(
        self, name: str, *, description: str, uses: Sequence[str], rollback: bool = False
    ) -> FeatureSetDecl:
        """Declare one more feature set; call :meth:`manifest_changed` when already running."""
        decl = FeatureSetDecl(
            name=name, description=description, uses=tuple(uses), rollback=rollback
        )
        self._extra_sets[name] = decl
        return decl

    def on_publish(self, fn: PublishHandler) -> PublishHandler:
        """Decorator: handle publishes into channels that have no handler of their own (in
        order per channel, answered by the handler's first call to the host: see
        :meth:`actors.serverkit.Channel.on_publish`)."""
        self.default_publish_handler = fn
        return fn

    def on_open(self, fn: OpenHandler) -> OpenHandler:
        """Decorator: ``fn(request)`` runs when the host opens a channel; it may return history
        items (a list) for the result."""
        self.open_handler = fn
        return fn

    def on_close(self, fn: OpenHandler) -> OpenHandler:
        """Decorator: ``fn(request)`` runs when the host closes a channel."""
        self.close_handler = fn
        return fn

    def before_inference(
        self, fn: Callable[[BeforeInference], Any]
    ) -> Callable[[BeforeInference], Any]:
        """Decorator: the ``context/beforeInference`` hook; return None, a string or a list of
        :class:`actors.serverkit.context.Injection`."""
        self.before_inference_hook = fn
        return fn

    def on_lifecycle(self, fn: Callable[[Lifecycle], Any]) -> Callable[[Lifecycle], Any]:
        """Decorator: ``fn(event)`` for each ``inference/lifecycle`` notice, one at a time in
        the order the host sent them (the next waits until ``fn`` has returned)."""
        self.lifecycle_hook = fn
        return fn

    def on_rollback(self, fn: Callable[[Rollback], Any]) -> Callable[[Rollback], Any]:
        """Decorator: the ``state/rollback`` handler; declares the main feature set with
        ``rollback: true``.

        ``fn(rollback)`` (sync or async) gets a :class:`Rollback` (``feature_set``,
        ``checkpoint``: an id a tool returned in ``ToolResult(state={"checkpoint": ...,
        "parent": ...})``; ``parent`` is None for the first) and returns True (or None) when
        the state is back at that checkpoint, a string to name the new checkpoint it is now
        at, or False for "not rolled back"; it raises :class:`CheckpointNotFound` for an id it
        does not know. The host may ask from another run than the one that made the
        checkpoint (``mcplive rollback`` starts the server anew): keep checkpoints where a new
        process finds them (a file), not only in memory. A rollback to a point before the first
        checkpoint sends nothing to the server."""
        self.rollback_handler = fn
        return fn

    def on_render(self, fn: Callable[[Render], Any]) -> Callable[[Render], Any]:
        """Decorator: the ``push/render`` handler for deferred notices (RFC-006); return the
        batch's content (a string or blocks; None for nothing)."""
        self.render_handler = fn
        return fn

    def on_granted(self, capability: str) -> Callable[[F], F]:
        """Decorator: run the async ``fn()`` each time a host grants ``capability`` (and the
        feature set that uses it), or enables the feature set of that name; it is cancelled
        when that host disconnects."""

        def register(fn: F) -> F:
            self._on_granted.append((capability, fn))
            return fn

        return register

    def on_ready(self, fn: F) -> F:
        """Decorator: run the async ``fn()`` once per host connection, when the host's first
        grant (``featureSets/update``) arrived, whatever it granted; it is cancelled when that
        host disconnects. Check :meth:`is_granted` before each send it makes."""
        self._on_ready.append(fn)
        return fn

    def on_line(self, fn: Callable[[str], None]) -> Callable[[str], None]:
        """Decorator: ``fn(line)`` (sync, quick) sees every line the host sends, before the
        toolkit handles it: for a server that logs or checks what the host says. Its error is
        logged, never the connection's end."""
        self.line_taps.append(fn)
        return fn

    def on_problem(self, fn: Callable[[str], None]) -> Callable[[str], None]:
        """Decorator: ``fn(text)`` (sync, quick) is told each thing the session refused or
        skipped of what the host sent (a line that is not JSON-RPC, an answer to no request,
        a malformed ``featureSets/update``, ...), which otherwise goes to stderr."""
        self.problem_taps.append(fn)
        return fn

    def answer_for(self, method: str) -> Callable[[F], F]:
        """Decorator: ``fn(request)`` (sync or async) answers every host request for
        ``method`` in place of the toolkit, which otherwise answers it itself (``ping``,
        ``featureSets/update``, ...) or through the server's handlers. It gets a
        :class:`actors.serverkit.link.HostRequest` (``default``: the answer the toolkit would
        have written for a method it answers itself, after tracking what it tracks, e.g. the
        grant) and returns the result, raises :class:`protocol.errors.RpcError` to refuse, or
        returns :data:`actors.serverkit.link.NO_ANSWER` to leave the request unanswered. For
        hosts' tests: an ordinary server needs none."""

        def register(fn: F) -> F:
            self.answer_overrides[method] = fn
            return fn

        return register

    # -- the manifest --------------------------------------------------------------------------
    @property
    def context_feature_set(self) -> str:
        """The feature set context hooks answer for."""
        if not self.default_feature_sets:
            return self._set_for(HOOK_CAPS[0]) or f"{self.name}.context"
        return f"{self.name}.context"

    @property
    def inference_feature_set(self) -> str:
        """The feature set inference requests name by default."""
        if not self.default_feature_sets:
            return self._set_for(INFERENCE_CAPS[0]) or f"{self.name}.inference"
        return f"{self.name}.inference"

    @property
    def feature_set_names(self) -> frozenset[str]:
        """Every declared feature set."""
        return frozenset(fs.name for fs in self.feature_sets())

    def feature_sets(self) -> list[FeatureSetDecl]:
        """The declared feature sets, built from what the server uses (only those declared
        with :meth:`feature_set` when the server was made with ``default_feature_sets=False``)."""
        if not self.default_feature_sets:
            return list(self._extra_sets.values())
        main: list[str] = []
        if self.push_events:
            main.append("pushEvents")
        if self.channels or self.default_publish_handler is not None:
            main.extend(CHANNEL_CAPS)
        if self.tools:
            main.append("tools")
        out: list[FeatureSetDecl] = []
        if main:
            out.append(
                FeatureSetDecl(
                    name=self.name,
                    description=f"{self.name}: events, channels and tools",
                    uses=tuple(main),
                    rollback=self.rollback_handler is not None,
                )
            )
        context: list[str] = []
        if self.before_inference_hook is not None:
            context.extend(HOOK_CAPS)
        if self.lifecycle_hook is not None:
            context.append("inferenceLifecycle")
        if context:
            out.append(
                FeatureSetDecl(
                    name=self.context_feature_set,
                    description=f"{self.name}: context hooks",
                    uses=tuple(context),
                )
            )
        if self.inference:
            out.append(
                FeatureSetDecl(
                    name=self.inference_feature_set,
                    description=f"{self.name}: asks for inference",
                    uses=INFERENCE_CAPS,
                )
            )
        out.extend(self._extra_sets.values())
        return out

    def advertise(self, *paths: str) -> None:
        """Advertise capability paths that no feature set uses, for a host to grant on its own
        (e.g. ``contextHooks.beforeInference.inject.system``, which hosts grant only when
        configured to); call :meth:`manifest_changed` when already running."""
        unknown = [p for p in paths if p not in VOCABULARY]
        if unknown:
            raise ValueError(f"not MCPL capability paths: {', '.join(unknown)}")
        self._advertised.update(paths)

    def capabilities(self) -> frozenset[str]:
        """The advertised capability paths: every path a feature set uses, and those given to
        :meth:`advertise`."""
        return frozenset(u for fs in self.feature_sets() for u in fs.uses) | self._advertised

    def manifest(self) -> dict[str, Any]:
        """The current ``experimental.mcpl`` object."""
        return build_manifest(self.capabilities(), self.feature_sets())

    def _set_for(self, capability: str) -> str | None:
        for fs in self.feature_sets():
            if capability in fs.uses:
                return fs.name
        return None
