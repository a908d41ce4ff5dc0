"""What the lobby checks in the host's behaviour (:mod:`tests.lobby.server`, under a
control link): the lobby is a peer that catches a host's mistakes, and reports each as an
``error`` control event.

It watches every line the host sends (the toolkit's :meth:`actors.serverkit.MCPLServer.on_line`
tap, called in arrival order), so the checks see notifications in the order they came:

* ``initialize``: a ``protocolVersion``; the host's RFC-006 ``eventCoalescing`` advertisement
  (``true`` or an object of boolean leaves, ``retryWindowMs`` at least an hour), reported as a
  ``coalescing`` event {advertised, leaves}; ``notifications/initialized`` right after it.
* ``inference/lifecycle``: only to a lobby that declared it (``--context``) and was granted
  ``inferenceLifecycle``; a known phase; ``started`` once, then one terminal phase; no content;
  ``usage`` only on ``completed``; ``model`` only with ``modelInfo`` granted.
* ``channels/outgoing/chunk`` and ``complete``: ``channels.streaming`` granted; a known channel;
  one chunk index counter per inference, from 0; string deltas; one complete per inference and
  channel, never a chunk after it; a ``threadId`` only where the channel declares a publish
  target, and the same one for the whole stream. Each complete is reported as a ``streamed``
  event {inferenceId, channelId, text} (the text the chunks carried).
* ``channels/typing``: ``channels.typing`` granted, a known channel, a boolean ``typing``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from actors.serverkit import MCPLServer
from examples.lobby.server import publish_author
from tests.lobby.words import (
    COALESCE_LEAVES,
    COALESCE_OUTCOMES,
    FINISH_REASONS,
    LIFECYCLE_PHASES,
    MAX_TRACKED,
    channel_label,
    read_coalescing,
    short,
    valid_thread,
)

#: a stream's place before it named one (no ``threadId`` member at all)
UNPLACED = "<none>"


@attrs.define
class _Stream:
    thread: Any
    deltas: list[str] = attrs.Factory(list)
    completed: bool = False


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


def _bounded(table: dict[Any, Any]) -> None:
    """Forget the oldest entries past :data:`MAX_TRACKED` (oldest first)."""
    while len(table) > MAX_TRACKED:
        del table[next(iter(table))]


class HostChecks:
    """The checks of one host connection; ``problem`` reports, ``emit`` sends an event."""

    def __init__(
        self,
        server: MCPLServer,
        *,
        context: bool,
        problem: Callable[[str], None],
        emit: Callable[[dict[str, Any]], None],
    ) -> None:
        self.server = server
        self.context = context
        self.problem = problem
        self.emit = emit
        self.coalescing, _ = read_coalescing(None)
        self._awaiting_initialized = False
        self._inferences: dict[str, str] = {}  # inferenceId: "started" | "ended"
        self._next_index: dict[str, int] = {}  # inferenceId: the next chunk index
        self._streams: dict[tuple[str, str], _Stream] = {}

    def allows(self, capability: str) -> bool:
        """Granted, or no grant yet (a host may send before its policy)."""
        grant = self.server.grant
        return not grant.received or grant.allows(capability)

    def seen(self, message: Any) -> None:
        """One message the host sent, parsed."""
        if self._awaiting_initialized:
            self._awaiting_initialized = False
            if not (
                isinstance(message, dict)
                and message.get("method") == "notifications/initialized"
                and "id" not in message
            ):
                self.problem(
                    "expected notifications/initialized right after initialize, got "
                    + short(message)
                )
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        method = message["method"]
        if method == "initialize" and "id" in message:
            self._initialize(params)
        elif "id" in message:
            return
        elif method == "inference/lifecycle":
            self._lifecycle(params)
        elif method == "channels/outgoing/chunk":
            self._chunk(params)
        elif method == "channels/outgoing/complete":
            self._complete(params)
        elif method == "channels/typing":
            self._typing(params)

    # -- the handshake ---------------------------------------------------------------------
    def _initialize(self, params: dict[str, Any]) -> None:
        self._awaiting_initialized = True
        if not isinstance(params.get("protocolVersion"), str):
            self.problem("initialize without a protocolVersion: " + short(params))
        caps = params.get("capabilities")
        experimental = caps.get("experimental") if isinstance(caps, dict) else None
        host_mcpl = experimental.get("mcpl") if isinstance(experimental, dict) else None
        advertised = host_mcpl.get("eventCoalescing") if isinstance(host_mcpl, dict) else None
        self.coalescing, problems = read_coalescing(advertised)
        for text in problems:
            self.problem(f"initialize: {text}")
        on = [leaf for leaf in COALESCE_LEAVES if self.coalescing[leaf]]
        _log(f"event coalescing advertised: {', '.join(on) or 'nothing'}")
        self.emit(
            {"event": "coalescing", "advertised": advertised, "leaves": dict(self.coalescing)}
        )

    # -- inference/lifecycle ---------------------------------------------------------------
    def _lifecycle(self, params: dict[str, Any]) -> None:
        inference_id, phase = params.get("inferenceId"), params.get("phase")
        if not self.context:
            self.problem("inference/lifecycle sent to a lobby that did not advertise it")
            return
        if not self.allows("inferenceLifecycle"):
            self.problem(f"inference/lifecycle {inference_id} without the inferenceLifecycle grant")
        if not isinstance(inference_id, str) or phase not in LIFECYCLE_PHASES:
            self.problem("malformed inference/lifecycle: " + short(params))
            return
        if "content" in params or "messages" in params:
            self.problem(f"inference/lifecycle {inference_id} carries content")
        if "usage" in params and phase != "completed":
            self.problem(f"inference/lifecycle {inference_id} carries usage on {phase}")
        if "model" in params and self.server.grant.received and not self.allows("modelInfo"):
            self.problem(f"inference/lifecycle {inference_id} carries model without modelInfo")
        seen = self._inferences.get(inference_id)
        if phase == "started":
            if seen is not None:
                self.problem(f"inference/lifecycle {inference_id}: started again")
        elif seen is None:
            self.problem(f"inference/lifecycle {inference_id}: {phase} without started")
        elif seen == "ended":
            self.problem(f"inference/lifecycle {inference_id}: a second terminal phase ({phase})")
        self._inferences[inference_id] = "started" if phase == "started" else "ended"
        _bounded(self._inferences)

    # -- channels/outgoing/* and channels/typing -------------------------------------------
    def _target(self, channel_id: str) -> str | None:
        return self.server.channels[channel_id].spec.publish_target

    def _thread_problem(self, channel_id: str, params: dict[str, Any]) -> str | None:
        if "threadId" not in params:
            return None
        thread = params["threadId"]
        if not valid_thread(thread):
            return f"invalid threadId {short(thread, 60)}"
        target = self._target(channel_id)
        if target is None:
            return f"threadId {short(thread, 60)} on a channel without a declared publish target"
        if target == "root" and thread is not None:
            return f"thread {thread!r} on a channel without threads (target root)"
        return None

    def _pair(self, method: str, params: dict[str, Any]) -> tuple[str, str] | None:
        if not self.allows("channels.streaming"):
            self.problem(f"{method} without the channels.streaming grant")
        inference_id, channel_id = params.get("inferenceId"), params.get("channelId")
        if not isinstance(inference_id, str) or not inference_id:
            self.problem(f"{method}: inferenceId must be a non-empty string: {short(params)}")
            return None
        if not isinstance(channel_id, str) or channel_id not in self.server.channels:
            self.problem(f"{method} {inference_id}: unknown channel {short(channel_id)}")
            return None
        why = self._thread_problem(channel_id, params)
        if why is not None:
            self.problem(f"{method} {inference_id} on {channel_id}: {why}")
        return inference_id, channel_id

    def _stream(self, method: str, pair: tuple[str, str], params: dict[str, Any]) -> _Stream:
        thread = params.get("threadId", UNPLACED)
        stream = self._streams.get(pair)
        if stream is None:
            stream = self._streams[pair] = _Stream(thread)
            _bounded(self._streams)
        elif stream.thread != thread:
            self.problem(
                f"{method} {pair[0]} on {pair[1]}: threadId {short(thread, 60)}, "
                f"the stream had {short(stream.thread, 60)}"
            )
        return stream

    def _chunk(self, params: dict[str, Any]) -> None:
        method = "channels/outgoing/chunk"
        _log(
            f"{method} {short(params.get('inferenceId'), 60)} "
            f"{channel_label(params.get('channelId'))} [{short(params.get('index'), 20)}]: "
            f"{short(params.get('delta'))}"
        )
        pair = self._pair(method, params)
        if pair is None:
            return
        inference_id, channel_id = pair
        index, delta = params.get("index"), params.get("delta")
        expected = self._next_index.get(inference_id, 0)
        if type(index) is not int or index != expected:
            self.problem(
                f"{method} {inference_id} on {channel_id}: index {index!r}, expected {expected}"
            )
        self._next_index[inference_id] = index + 1 if type(index) is int else expected + 1
        _bounded(self._next_index)
        if not isinstance(delta, str):
            self.problem(f"{method} {inference_id} on {channel_id}: delta must be a string")
        stream = self._stream(method, pair, params)
        if stream.completed:
            self.problem(f"{method} {inference_id} on {channel_id}: a chunk after the complete")
        if isinstance(delta, str):
            stream.deltas.append(delta)

    def _complete(self, params: dict[str, Any]) -> None:
        method = "channels/outgoing/complete"
        pair = self._pair(method, params)
        if pair is None:
            return
        inference_id, channel_id = pair
        content = params.get("content")
        if not (
            isinstance(content, list)
            and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content)
        ):
            self.problem(
                f"{method} {inference_id} on {channel_id}: content must be a list of blocks"
            )
            content = []
        known = pair in self._streams
        stream = self._stream(method, pair, params)
        if stream.completed:
            self.problem(f"{method} {inference_id} on {channel_id}: a second complete")
            return
        stream.completed = True
        streamed = "".join(stream.deltas)
        final = "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
        verdict = "same text" if streamed == final else "texts differ"
        if not known:
            verdict = "no chunks came before it"
        by = publish_author(params.get("conversationId"))["name"]
        _log(
            f"{method} {inference_id} {channel_label(channel_id)} by {by}: streamed "
            f"{short(streamed)!r}, complete {short(final)!r} ({verdict})"
        )
        self.emit(
            {
                "event": "streamed",
                "inferenceId": inference_id,
                "channelId": channel_id,
                "text": streamed,
            }
        )

    def _typing(self, params: dict[str, Any]) -> None:
        channel_id, typing = params.get("channelId"), params.get("typing")
        where = f" [{short(params['threadId'], 60)}]" if "threadId" in params else ""
        _log(f"channels/typing {channel_label(channel_id)}{where}: {short(typing, 20)}")
        if not self.allows("channels.typing"):
            self.problem("channels/typing without the channels.typing grant")
        if not isinstance(channel_id, str) or channel_id not in self.server.channels:
            self.problem(f"channels/typing: unknown channel {short(channel_id)}")
            return
        if not isinstance(typing, bool):
            self.problem(
                f"channels/typing on {channel_id}: typing must be a boolean, got {short(typing)}"
            )
        why = self._thread_problem(channel_id, params)
        if why is not None:
            self.problem(f"channels/typing on {channel_id}: {why}")

    # -- the host's answers to the lobby's requests ------------------------------------------
    def answer(self, method: str, request: Mapping[str, Any], response: Mapping[str, Any]) -> None:
        """Check the host's answer to one of the lobby's requests (and log its verdict)."""
        params = request.get("params") or {}
        if "error" in response:
            _log(f"{method} #{request.get('id')}: error {short(response['error'])}")
            return
        result = response.get("result")
        if method == "push/event":
            if not (isinstance(result, dict) and isinstance(result.get("accepted"), bool)):
                self.problem("push/event answer lacks a boolean 'accepted': " + short(result))
                return
            what = f"push/event {params.get('eventId')}"
            verdict = "accepted" if result["accepted"] else f"declined ({result.get('reason')})"
            _log(f"{what}: {verdict}{self._outcome(what, 'pushEvents', params, result)}")
        elif method in ("channels/register", "channels/incoming"):
            self._itemized(method, params, result)
        elif method == "inference/request":
            usage = result.get("usage") if isinstance(result, dict) else None
            if not (
                isinstance(result, dict)
                and isinstance(result.get("content"), str)
                and isinstance(result.get("model"), str)
                and result.get("finishReason") in FINISH_REASONS
                and isinstance(usage, dict)
                and all(type(usage.get(k)) is int for k in ("inputTokens", "outputTokens"))
            ):
                self.problem("inference/request answer is malformed: " + short(result))
        elif method == "model/info":
            caps = result.get("capabilities") if isinstance(result, dict) else None
            if not (
                isinstance(result, dict)
                and isinstance(result.get("id"), str)
                and isinstance(result.get("vendor"), str)
                and type(result.get("contextWindow")) is int
                and isinstance(caps, list)
                and all(isinstance(c, str) for c in caps)
            ):
                self.problem("model/info answer is malformed: " + short(result))

    def _itemized(self, method: str, params: Mapping[str, Any], result: Any) -> None:
        key, items = (
            ("id", params.get("channels"))
            if method == "channels/register"
            else ("messageId", params.get("messages"))
        )
        results = result.get("results") if isinstance(result, dict) else None
        if not isinstance(results, list) or not all(
            isinstance(r, dict) and key in r and isinstance(r.get("accepted"), bool)
            for r in results
        ):
            self.problem(f"{method} answer is not itemized: {short(result)}")
            return
        if isinstance(items, list) and len(results) != len(items):
            self.problem(
                f"{method} answer has {len(results)} results for {len(items)} items: "
                + short(result)
            )
            return
        verdicts = []
        for i, r in enumerate(results):
            verdict = f"{r[key]}={'ok' if r['accepted'] else r.get('reason', 'refused')}"
            if method == "channels/incoming" and isinstance(items, list):
                verdict += self._outcome(f"{method} {r[key]}", "channelsIncoming", items[i], r)
            verdicts.append(verdict)
        _log(f"{method}: {', '.join(verdicts)}")

    def _outcome(self, what: str, lane: str, sent: Any, result: Mapping[str, Any]) -> str:
        """RFC-006: the ``coalesce`` outcome of one occurrence, as a log suffix; checked
        (present whenever a coalesced occurrence was admitted on a lane the host advertised)."""
        carried = isinstance(sent, dict) and "coalesce" in sent
        if "coalesce" not in result:
            if carried and result.get("accepted") is True and self.coalescing[lane]:
                self.problem(f"{what}: admitted with coalesce, but the answer has no outcome")
            return ""
        member = result["coalesce"]
        outcome = member.get("outcome") if isinstance(member, dict) else None
        prior = member.get("priorEventId") if isinstance(member, dict) else None
        if outcome not in COALESCE_OUTCOMES or not (prior is None or isinstance(prior, str)):
            self.problem(f"{what}: malformed coalesce result {short(member)}")
        if not carried:
            _log(f"{what}: a coalesce result for an occurrence sent without coalesce")
        return f" (coalesce {outcome}" + (f", prior {prior}" if prior is not None else "") + ")"


def watch(server: MCPLServer, *, context: bool) -> HostChecks:
    """Run the checks on every line the host sends ``server`` when no test drives the lobby:
    what they find goes to stderr only (``ERROR: …``), as does what they log."""

    def problem(text: str) -> None:
        _log(f"ERROR: {text}")

    checks = HostChecks(server, context=context, problem=problem, emit=lambda _event: None)

    def seen(line: str) -> None:
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):
            return  # the toolkit has already said so
        checks.seen(message)

    server.on_line(seen)
    return checks
