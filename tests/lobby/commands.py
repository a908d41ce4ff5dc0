"""The commands of the lobby's control link (:mod:`tests.lobby.steering`): each
makes the lobby send something to the host, unchecked against the host's grant (a test may
play a server that sends what it was not granted, to watch the host refuse it).

``incoming`` {channelId, messageId, text, author?, tags?, threadId?, eventId?, coalesce?,
force?}, ``incoming_batch`` {messages, force?}, ``push`` {eventId, text, featureSet?, tags?,
origin?, coalesce?, force?}, ``share`` {file, text?, eventId?, uri?, tags?, origin?,
featureSet?, coalesce?, force?} (a push carrying a reference to one of the files served with
``--ws --files``), ``flood`` {count, text?}, ``register`` {channels} (the channels become the
lobby's: publishes into them are taken), ``threads`` {channelId, threads} (threads a publish
may target; acknowledged with a ``threads`` event), ``infer``, ``model_info``, ``raw``,
``line``.

RFC-006: a ``coalesce`` member goes out only where the host's ``initialize`` advertised every
``eventCoalescing`` leaf it uses (the lane, ``deferred``, ``channelScopedPush`` for a
``channelId``); otherwise the occurrence is sent without it and a ``coalesce_withheld`` event
{method, eventId?, messageId?, coalesce, missing} says so, unless the command says
``"force": true``.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from actors.serverkit import MCPLServer
from actors.serverkit.channels import Channel, ChannelSpec
from examples.lobby.server import PEOPLE
from tests.lobby.checks import HostChecks
from tests.lobby.modes import KitModes
from tests.lobby.options import LobbyOptions
from tests.lobby.words import (
    REGISTER_CHUNK,
    builtin_files,
    channel_descriptor,
    dumps,
    now_iso,
    short,
)

#: raw requests whose answers are still awaited, by id (oldest dropped at the cap)
MAX_RAW_PENDING = 65_536


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


def valid_id(value: Any) -> bool:
    """A JSON-RPC id: a string or an integer."""
    return isinstance(value, str) or (type(value) is int)


def event_params(
    event_id: str,
    text: str,
    feature_set: str,
    tags: list[Any] | None,
    extra: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ``push/event``'s params: one text block (and ``extra`` blocks after it)."""
    return {
        "featureSet": feature_set,
        "eventId": event_id,
        "timestamp": now_iso(),
        "payload": {"content": [{"type": "text", "text": text}, *(extra or ())]},
        "tags": list(tags or []),
    }


def file_reference(origin: str | None, name: str, uri: str | None = None) -> dict[str, Any]:
    """The ``resource`` block for one of the lobby's files served at ``origin/files/``."""
    if origin is None:
        raise ValueError("no files to share: start the lobby with --ws and --files")
    files = builtin_files()
    if name not in files:
        raise ValueError(f"unknown file {name!r}; known: {sorted(files)}")
    f = files[name]
    return {
        "type": "resource",
        "uri": uri if uri is not None else f"{origin}/files/{name}",
        "mimeType": f.mime_type,
        "sizeBytes": f.size,
        "digest": f.digest,
        "name": f.name,
    }


def _force(cmd: dict[str, Any]) -> bool:
    force = cmd.get("force", False)
    if not isinstance(force, bool):
        raise TypeError("force must be a boolean")
    return force


def _coalesce(cmd: dict[str, Any]) -> dict[str, Any] | None:
    coalesce = cmd.get("coalesce")
    if coalesce is not None and not isinstance(coalesce, dict):
        raise TypeError("coalesce must be an object")
    return coalesce


class KitCommands:
    """The command handlers; :class:`tests.lobby.steering.KitControl` supplies the rest."""

    server: MCPLServer
    options: LobbyOptions
    modes: KitModes
    checks: HostChecks
    _raw: dict[Any, dict[str, Any]]
    _shares: itertools.count[int]

    def emit(self, event: dict[str, Any]) -> None:
        raise NotImplementedError

    def send_request(
        self,
        method: str,
        params: Mapping[str, Any],
        attempts: int = 1,
        on_answer: Callable[[dict[str, Any] | None], None] | None = None,
    ) -> None:
        raise NotImplementedError

    def send_line(self, line: str) -> None:
        raise NotImplementedError

    def _queue(self, fn: Callable[[], Awaitable[Any]], name: str) -> None:
        raise NotImplementedError

    def _sender(
        self,
        method: str,
        params: Mapping[str, Any],
        attempts: int,
        on_answer: Callable[[dict[str, Any] | None], None] | None,
    ) -> Callable[[], Awaitable[None]]:
        raise NotImplementedError

    # -- RFC-006 -----------------------------------------------------------------------------
    def coalesced(self, target: dict[str, Any], force: bool, lane: str, method: str) -> Any:
        """``target`` as it may be sent: without a ``coalesce`` member the host did not
        advertise the leaves of (unless forced)."""
        if "coalesce" not in target or force:
            return target
        coalesce, leaves = target["coalesce"], self.checks.coalescing
        needed = [lane]
        if isinstance(coalesce, dict):
            if coalesce.get("deferred") not in (None, False):
                needed.append("deferred")
            if coalesce.get("channelId") is not None:
                needed.append("channelScopedPush")
        missing = [leaf for leaf in needed if not leaves[leaf]]
        if not missing:
            return target
        ident: dict[str, Any] = {k: target[k] for k in ("eventId", "messageId") if k in target}
        _log(f"{method} {short(ident)}: coalesce withheld ({', '.join(missing)} not advertised)")
        self.emit(
            {
                "event": "coalesce_withheld",
                "method": method,
                **ident,
                "coalesce": coalesce,
                "missing": missing,
            }
        )
        return {k: v for k, v in target.items() if k != "coalesce"}

    # -- the commands ------------------------------------------------------------------------
    def _cmd_incoming(self, cmd: dict[str, Any]) -> None:
        coalesce, force = _coalesce(cmd), _force(cmd)
        event_id = cmd.get("eventId")
        if event_id is not None and not (isinstance(event_id, str) and event_id):
            raise TypeError("eventId must be a non-empty string")
        for key in ("channelId", "messageId", "text"):
            if not isinstance(cmd[key], str):
                raise TypeError(f"{key} must be a string")
        message: dict[str, Any] = {
            "channelId": cmd["channelId"],
            "messageId": cmd["messageId"],
            "author": cmd.get("author") or dict(PEOPLE[0]),
            "timestamp": now_iso(),
            "content": [{"type": "text", "text": cmd["text"]}],
            "tags": list(cmd.get("tags") or []),
        }
        for key in ("threadId", "eventId"):
            if cmd.get(key) is not None:
                message[key] = cmd[key]
        if coalesce is not None:
            message["coalesce"] = coalesce
        message = self.coalesced(message, force, "channelsIncoming", "channels/incoming")
        self.modes.note_thread(message["channelId"], message.get("threadId"))
        self.send_request("channels/incoming", {"messages": [message]})

    def _cmd_incoming_batch(self, cmd: dict[str, Any]) -> None:
        messages = cmd["messages"]
        if not isinstance(messages, list):
            raise TypeError("messages must be a list")
        force = _force(cmd)
        messages = [
            self.coalesced(m, force, "channelsIncoming", "channels/incoming")
            if isinstance(m, dict)
            else m
            for m in messages
        ]
        for m in messages:
            if isinstance(m, dict):
                self.modes.note_thread(m.get("channelId"), m.get("threadId"))
        self.send_request("channels/incoming", {"messages": messages})

    def _cmd_push(self, cmd: dict[str, Any]) -> None:
        coalesce, force = _coalesce(cmd), _force(cmd)
        event_id, text = cmd["eventId"], cmd["text"]
        feature_set = cmd.get("featureSet", "lobby.events")
        if not all(isinstance(v, str) for v in (event_id, text, feature_set)):
            raise TypeError("eventId, text and featureSet must be strings")
        params = event_params(event_id, text, feature_set, cmd.get("tags"))
        if cmd.get("origin") is not None:
            params["origin"] = cmd["origin"]
        if coalesce is not None:
            params["coalesce"] = coalesce
        self.send_request("push/event", self.coalesced(params, force, "pushEvents", "push/event"))

    def _cmd_share(self, cmd: dict[str, Any]) -> None:
        """A ``push/event`` whose content is a text and a reference to one of our files."""
        name = cmd["file"]
        text = cmd.get("text", f"Shared {name}.")
        event_id = cmd.get("eventId") or self.options.make_id("share-", next(self._shares))
        uri, feature_set = cmd.get("uri"), cmd.get("featureSet", "lobby.events")
        if not all(isinstance(v, str) for v in (name, text, event_id, feature_set)):
            raise TypeError("file, text, eventId and featureSet must be strings")
        if uri is not None and not isinstance(uri, str):
            raise TypeError("uri must be a string")
        coalesce, force = _coalesce(cmd), _force(cmd)
        origin = self.server.shelf.origin if self.options.files else None
        reference = file_reference(origin, name, uri)
        params = event_params(event_id, text, feature_set, cmd.get("tags"), [reference])
        if cmd.get("origin") is not None:
            params["origin"] = cmd["origin"]
        if coalesce is not None:
            params["coalesce"] = coalesce
        _log(f"push/event {event_id}: {text} [{reference['uri']}]")
        self.send_request("push/event", self.coalesced(params, force, "pushEvents", "push/event"))

    def _cmd_flood(self, cmd: dict[str, Any]) -> None:
        """``count`` push events ``f1`` ... at once; ``flood_done`` once all are answered."""
        count, text = cmd["count"], cmd.get("text", "flood")
        if type(count) is not int or not 0 <= count <= 100_000:
            raise ValueError("count must be an integer from 0 to 100000")
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        tally = {"answered": 0, "accepted": 0}

        def answered(response: dict[str, Any] | None) -> None:
            result = response.get("result") if response else None
            if isinstance(result, dict) and result.get("accepted") is True:
                tally["accepted"] += 1
            tally["answered"] += 1
            if tally["answered"] == count:
                _log(f"flood of {count}: {tally['accepted']} accepted")
                self.emit({"event": "flood_done", "accepted": tally["accepted"], "count": count})

        async def flood() -> None:
            if count == 0:
                self.emit({"event": "flood_done", "accepted": 0, "count": 0})
            for i in range(1, count + 1):
                params = event_params(f"f{i}", text, "lobby.events", None)
                await self._sender("push/event", params, 1, answered)()

        self._queue(flood, "a flood")

    def _cmd_register(self, cmd: dict[str, Any]) -> None:
        if not isinstance(cmd["channels"], list):
            raise TypeError("channels must be a list")
        for descriptor in cmd["channels"]:
            self._adopt(descriptor)
        self.send_request(
            "channels/register", {"channels": cmd["channels"]}, on_answer=self._accepted
        )

    def _accepted(self, response: dict[str, Any] | None) -> None:
        """The channels the host accepted take the lobby's messages (echoes included)."""
        result = (response or {}).get("result")
        link = self.server.link
        if not isinstance(result, dict) or link is None:
            return
        for entry in result.get("results") or ():
            if isinstance(entry, dict) and entry.get("accepted") is True:
                if entry.get("id") in self.server.channels:
                    self.server.accepted_channels(link).add(entry["id"])

    def _adopt(self, descriptor: Any) -> None:
        """Make a registered channel the lobby's own (publishes into it are taken)."""
        if not isinstance(descriptor, dict) or not isinstance(descriptor.get("id"), str):
            return
        caps = descriptor.get("capabilities")
        publish = caps.get("publish") if isinstance(caps, dict) else None
        target = publish.get("target") if isinstance(publish, dict) else None
        try:
            spec = ChannelSpec(
                id=descriptor["id"],
                label=str(descriptor.get("label") or descriptor["id"]),
                type=str(descriptor.get("type", "chat")),
                direction=str(descriptor.get("direction", "bidirectional")),
                initially_open=descriptor.get("initiallyOpen") is not False,
                publish_target=target if target in ("root", "exact") else None,
            )
        except ValueError as exc:
            _log(f"registering {short(descriptor)} without taking it: {exc}")
            return
        self.server.channels[spec.id] = Channel(self.server, spec)

    def register_extra(self, count: int) -> None:
        """``--channels N``: register ``lobby:#c1`` ... ``lobby:#cN`` in requests of at most
        :data:`REGISTER_CHUNK`; once all are answered, a ``channels`` event {accepted,
        refused: [{id, reason}]}."""
        extra = [channel_descriptor(f"c{i}") for i in range(1, count + 1)]
        chunks = [extra[i : i + REGISTER_CHUNK] for i in range(0, count, REGISTER_CHUNK)]
        tally: dict[str, Any] = {"accepted": 0, "refused": [], "answered": 0}

        def answered(response: dict[str, Any] | None) -> None:
            self._accepted(response)
            result = (response or {}).get("result")
            for entry in result.get("results", []) if isinstance(result, dict) else []:
                if isinstance(entry, dict) and entry.get("accepted") is True:
                    tally["accepted"] += 1
                elif isinstance(entry, dict):
                    tally["refused"].append({"id": entry.get("id"), "reason": entry.get("reason")})
            tally["answered"] += 1
            if tally["answered"] == len(chunks):
                _log(f"{tally['accepted']} of {count} extra channels registered")
                event = {"event": "channels", "accepted": tally["accepted"]}
                self.emit({**event, "refused": tally["refused"]})

        for descriptor in extra:
            self._adopt(descriptor)
        for chunk in chunks:
            self.send_request("channels/register", {"channels": chunk}, on_answer=answered)

    def _cmd_threads(self, cmd: dict[str, Any]) -> None:
        """RFC-011: threads of a channel that a publish may target from now on."""
        channel_id, threads = cmd["channelId"], cmd["threads"]
        if not isinstance(channel_id, str):
            raise TypeError("channelId must be a string")
        if not isinstance(threads, list) or not all(isinstance(t, str) and t for t in threads):
            raise TypeError("threads must be a list of non-empty strings")
        for thread in threads:
            self.modes.note_thread(channel_id, thread)
        known = sorted(self.modes.threads.get(channel_id, ()))
        _log(f"threads of {channel_id}: {known}")
        self.emit({"event": "threads", "channelId": channel_id, "threads": known})

    def _cmd_infer(self, cmd: dict[str, Any]) -> None:
        """``inference/request`` (``stream`` asks for chunks, which are not checked here)."""
        messages, stream = cmd["messages"], cmd.get("stream", False)
        feature_set = cmd.get("featureSet", "lobby.assist")
        if not isinstance(messages, list):
            raise TypeError("messages must be a list")
        if not isinstance(stream, bool):
            raise TypeError("stream must be a boolean")
        if not isinstance(feature_set, str):
            raise TypeError("featureSet must be a string")
        params: dict[str, Any] = {"featureSet": feature_set, "messages": messages, "stream": stream}
        if cmd.get("conversationId") is not None:
            params["conversationId"] = cmd["conversationId"]
        if cmd.get("maxTokens") is not None:
            if type(cmd["maxTokens"]) is not int:
                raise TypeError("maxTokens must be an integer")
            params["preferences"] = {"maxTokens": cmd["maxTokens"]}
        self.send_request("inference/request", params)

    def _cmd_model_info(self, cmd: dict[str, Any]) -> None:
        self.send_request("model/info", {})

    def _cmd_raw(self, cmd: dict[str, Any]) -> None:
        message = cmd["message"]
        if (
            isinstance(message, dict)
            and isinstance(message.get("method"), str)
            and valid_id(message.get("id"))
        ):
            if len(self._raw) >= MAX_RAW_PENDING:
                self._raw.pop(next(iter(self._raw)))
            self._raw[message["id"]] = message
        self.send_line(dumps(message))

    def _cmd_line(self, cmd: dict[str, Any]) -> None:
        if not isinstance(cmd["text"], str):
            raise TypeError("text must be a string")
        self.send_line(cmd["text"])
