"""JSON-RPC 2.0 messages and an id-correlating session, without I/O.

Theory of operation: the transport hands each received line (stdio) or text frame (websocket) to
``RpcSession.receive_line()``, which returns typed events. To send, call ``send_request()``,
``send_notification()``, ``send_response()`` or ``send_error()``; each returns the text to write.
Time is a parameter: ``send_request(..., now=, timeout=)`` records a deadline and ``expired(now)``
reports the requests whose deadline passed.

Both peers number their own requests from 1, so a message is classified by its members, never by
its id: ``method`` makes it a request (with ``id``) or a notification (without); ``result`` or
``error`` with an ``id`` makes it a response.
"""

from __future__ import annotations

import json
import json.scanner
import math
import re
from collections.abc import Mapping
from typing import Any, cast

import attrs

from .display import scrub_surrogates
from .errors import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    LocalProtocolError,
    RpcError,
)

Id = int | str
Params = Mapping[str, Any] | list[Any] | None


@attrs.frozen
class Request:
    id: Id
    method: str
    params: Params = None


@attrs.frozen
class Notification:
    method: str
    params: Params = None


@attrs.frozen
class Response:
    id: Id
    result: Any


@attrs.frozen
class ErrorResponse:
    id: Id | None
    error: RpcError


Message = Request | Notification | Response | ErrorResponse


@attrs.frozen
class Invalid:
    """A line that is not a message we accept. ``reply`` is an error response to send, if any."""

    reason: str
    reply: ErrorResponse | None = None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# Built once: ``json.loads``/``json.dumps`` with options build a new codec on every call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False)

# The C encoder ``json`` itself uses (None without the C accelerator), called without
# JSONEncoder.encode's per-call set-up.
_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
# What JSONEncoder.iterencode passes after the markers, read off _ENCODER once, so the two
# cannot come to disagree.
_C_ENCODER_ARGS = (
    _ENCODER.default,
    json.encoder.encode_basestring_ascii
    if _ENCODER.ensure_ascii
    else json.encoder.encode_basestring,
    _ENCODER.indent,
    _ENCODER.key_separator,
    _ENCODER.item_separator,
    _ENCODER.sort_keys,
    _ENCODER.skipkeys,
    _ENCODER.allow_nan,
)


def _compact(obj: Any) -> str:
    """``_ENCODER.encode(obj)``: the same text, from the same C encoder."""
    if _C_MAKE_ENCODER is None:  # pragma: no cover
        return _ENCODER.encode(obj)
    # markers: a fresh dict each time, as JSONEncoder.iterencode makes for check_circular
    return "".join(_C_MAKE_ENCODER({}, *_C_ENCODER_ARGS)(obj, 0))


_SCAN = json.scanner.make_scanner(cast(Any, _DECODER))  # what _DECODER scans with


class NestedTooDeep(ValueError):
    """JSON text nested deeper than the parser can follow (Python's recursion limit)."""


def decode(text: str) -> Any:
    """Strict JSON decoding (no NaN/Infinity). Raises ``ValueError`` on any failure
    (:class:`NestedTooDeep` for text nested past what the parser can follow).

    Every lone surrogate in the value (written as an escape such as ``"\\ud800"``, which JSON
    allows and UTF-8 cannot hold) is replaced by U+FFFD here, once, for everything downstream:
    see :func:`protocol.display.scrub_surrogates`. A pair written as escapes is joined by the
    decoder and kept.
    """
    try:
        obj = _decode(text)
        if _may_hold_surrogate(text):
            obj = scrub_surrogates(obj)
        return obj
    except RecursionError as exc:
        raise NestedTooDeep("nested too deeply") from exc


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _may_hold_surrogate(text: str) -> bool:
    """Whether ``text`` holds an escape of a surrogate code unit (``\\uD800``-``\\uDFFF``) or a
    raw surrogate: the only ways a value decoded from it can hold one. (True only means the
    value is scrubbed; most lines are cleared by the two plain scans.)"""
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        return True
    return not text.isascii() and _SURROGATE.search(text) is not None


def _decode(text: str) -> Any:
    if text[:1] == "{":
        # An object with nothing around it (every message a peer sends, in practice) is
        # scanned directly, as JSONDecoder.decode would scan it; anything else, and every
        # failure, goes through decode for its exact error.
        try:
            obj, end = _SCAN(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return obj
    return _DECODER.decode(text)


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def encode(obj: Any) -> str:
    """Compact JSON text; never contains a raw newline, and always encodes as UTF-8.

    A lone surrogate (which a peer can send as ``"\\ud800"``) cannot be written as UTF-8, so
    text holding one is sent with every non-ASCII character escaped instead.
    """
    text = _compact(obj)
    if not text.isascii() and _SURROGATE.search(text):
        text = _ASCII_ENCODER.encode(obj)
    return text


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | str):
        return True
    return isinstance(value, float) and math.isfinite(value) and value.is_integer()


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def parse_message(text: str) -> Message | Invalid:
    """Classify one line or frame."""
    try:
        obj = decode(text)
    except NestedTooDeep:
        # JSON, but too deep to read even its id: answered as a parse error with a null id
        # (a line that is not JSON at all is only skipped: it may be a server's stray output).
        error = RpcError(code=PARSE_ERROR, message="Parse error: nested too deeply")
        return Invalid(f"nested too deeply, refused: {_clip(text)!r}", ErrorResponse(None, error))
    except ValueError:
        return Invalid(f"not JSON, skipped: {_clip(text)!r}")
    if type(obj) is dict and obj.get("jsonrpc") == "2.0":
        # a well-formed request (the common case) is classified with the fewest checks: the
        # same answer as the general path below
        method = obj.get("method")
        rid = obj.get("id")
        params = obj.get("params")
        if (
            type(method) is str
            and method
            and (type(rid) is int or type(rid) is str)
            and (params is None or type(params) is dict or type(params) is list)
        ):
            return Request(rid, method, params)
    if not isinstance(obj, dict):
        kind = "batch" if isinstance(obj, list) else type(obj).__name__
        return Invalid(
            f"a JSON {kind} is not a message",
            ErrorResponse(None, RpcError(code=INVALID_REQUEST, message=f"{kind} not supported")),
        )
    has_id = "id" in obj
    raw_id = obj.get("id")
    id_ok = has_id and _valid_id(raw_id)
    msg_id: Id | None = None
    if id_ok:
        msg_id = int(raw_id) if isinstance(raw_id, float) else raw_id
    if obj.get("jsonrpc") != "2.0":
        reply = None
        if "method" in obj and id_ok:
            reply = ErrorResponse(
                msg_id, RpcError(code=INVALID_REQUEST, message='"jsonrpc": "2.0" is required')
            )
        return Invalid('message without "jsonrpc": "2.0" refused', reply)
    if "method" in obj:
        method = obj["method"]
        params = obj.get("params")
        problem = None
        if not isinstance(method, str) or not method:
            problem = "method must be a non-empty string"
        elif params is not None and not isinstance(params, dict | list):
            problem = "params must be an object or an array"
        elif has_id and not id_ok:
            problem = "id must be a string or an integer"
        if problem is not None:
            reply = ErrorResponse(msg_id, RpcError(code=INVALID_REQUEST, message=problem))
            return Invalid(problem, reply if has_id else None)
        if msg_id is None:
            return Notification(method, params)
        return Request(msg_id, method, params)
    if not id_ok and raw_id is not None:
        return Invalid("response id must be a string or an integer")
    if "error" in obj:
        err = obj["error"]
        if isinstance(err, dict) and isinstance(err.get("code"), int):
            message = err.get("message")
            error = RpcError(
                code=err["code"],
                message=message if isinstance(message, str) else "",
                data=err.get("data"),
            )
        else:
            error = RpcError(code=INVALID_REQUEST, message="malformed error object", data=err)
        return ErrorResponse(msg_id, error)
    if "result" in obj:
        if msg_id is None:
            return Invalid("response without an id")
        return Response(msg_id, obj["result"])
    return Invalid("neither a request, a notification nor a response")


def message_to_wire(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"jsonrpc": "2.0"}
    if isinstance(msg, Request):
        out["id"] = msg.id
        out["method"] = msg.method
        if msg.params is not None:
            out["params"] = msg.params
    elif isinstance(msg, Notification):
        out["method"] = msg.method
        if msg.params is not None:
            out["params"] = msg.params
    elif isinstance(msg, Response):
        out["id"] = msg.id
        out["result"] = msg.result
    else:
        out["id"] = msg.id
        out["error"] = msg.error.to_wire()
    return out


# --- session events -------------------------------------------------------------------------


@attrs.frozen
class RequestReceived:
    request: Request


@attrs.frozen
class NotificationReceived:
    notification: Notification


@attrs.frozen
class ResponseReceived:
    id: Id
    method: str
    result: Any


@attrs.frozen
class ErrorReceived:
    id: Id
    method: str
    error: RpcError


@attrs.frozen
class RequestExpired:
    id: Id
    method: str


@attrs.frozen
class RequestAbandoned:
    """The link ended while our request was pending."""

    id: Id
    method: str


@attrs.frozen
class Diagnostic:
    """Something the peer sent was refused or skipped. ``reply`` is the line to answer, if any."""

    text: str
    reply: str | None = None


Event = (
    RequestReceived
    | NotificationReceived
    | ResponseReceived
    | ErrorReceived
    | RequestExpired
    | RequestAbandoned
    | Diagnostic
)


@attrs.frozen
class Pending:
    method: str
    deadline: float


class PendingFull(LocalProtocolError):
    """Too many of our requests are unanswered; the caller refuses the new one."""


class RpcSession:
    """One side of a JSON-RPC link.

    Caps: ``max_pending`` of our requests may be unanswered (``send_request`` raises
    ``PendingFull`` past it); ``max_inbound`` of the peer's requests may await our answer (past it,
    a new request is answered at once with an error and never reaches the caller).
    """

    def __init__(self, *, max_pending: int = 256, max_inbound: int = 256) -> None:
        self.max_pending = max_pending
        self.max_inbound = max_inbound
        self._next_id = 1
        self._pending: dict[Id, Pending] = {}
        self._inbound: set[Id] = set()
        self.closed = False

    # -- outbound --------------------------------------------------------------------------
    def send_request(
        self, method: str, params: Params = None, *, now: float, timeout: float
    ) -> tuple[int, str]:
        if self.closed:
            raise LocalProtocolError("session is closed")
        if len(self._pending) >= self.max_pending:
            raise PendingFull(f"{len(self._pending)} requests already pending")
        rid = self._next_id
        line = encode(message_to_wire(Request(rid, method, params)))  # may raise: nothing kept
        self._next_id += 1
        self._pending[rid] = Pending(method, now + timeout)
        return rid, line

    def send_notification(self, method: str, params: Params = None) -> str:
        return encode(message_to_wire(Notification(method, params)))

    def send_response(self, id: Id, result: Any) -> str:
        # message_to_wire(Response(id, result)), written directly: every answer takes this way
        return self._answer(id, {"jsonrpc": "2.0", "id": id, "result": result})

    def send_error(self, id: Id, error: RpcError) -> str:
        return self._answer(id, message_to_wire(ErrorResponse(id, error)))

    def _answer(self, id: Id, wire: dict[str, Any]) -> str:
        if id not in self._inbound:
            raise LocalProtocolError(f"request {id!r} is not awaiting an answer")
        # Encode first: a result that is not JSON (NaN…) raises and leaves the request owed, so
        # the caller can still answer it with an error.
        line = encode(wire)
        self._inbound.discard(id)
        return line

    def cancel(self, id: Id) -> None:
        """Forget one of our pending requests (its asker gave up)."""
        self._pending.pop(id, None)

    # -- inbound ---------------------------------------------------------------------------
    def receive_line(self, text: str) -> list[Event]:
        msg = parse_message(text)
        if isinstance(msg, Invalid):
            reply = encode(message_to_wire(msg.reply)) if msg.reply is not None else None
            return [Diagnostic(msg.reason, reply)]
        if isinstance(msg, Request):
            if msg.id in self._inbound:
                err = RpcError(code=INVALID_REQUEST, message=f"duplicate request id {msg.id!r}")
                line = encode(message_to_wire(ErrorResponse(msg.id, err)))
                return [Diagnostic(f"duplicate request id {msg.id!r} refused", line)]
            if len(self._inbound) >= self.max_inbound:
                err = RpcError(code=-32603, message="too many requests in flight; retry later")
                line = encode(message_to_wire(ErrorResponse(msg.id, err)))
                return [Diagnostic(f"{msg.method} refused: too many requests in flight", line)]
            self._inbound.add(msg.id)
            return [RequestReceived(msg)]
        if isinstance(msg, Notification):
            return [NotificationReceived(msg)]
        if msg.id is None:
            return [Diagnostic(f"error response without an id: {msg.error}")]
        pending = self._pending.pop(msg.id, None)
        if pending is None:
            return [Diagnostic(f"response to unknown or expired request {msg.id!r} ignored")]
        if isinstance(msg, Response):
            return [ResponseReceived(msg.id, pending.method, msg.result)]
        return [ErrorReceived(msg.id, pending.method, msg.error)]

    def expired(self, now: float) -> list[RequestExpired]:
        gone = [rid for rid, p in self._pending.items() if p.deadline <= now]
        return [RequestExpired(rid, self._pending.pop(rid).method) for rid in gone]

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self._pending.values()), default=None)

    def close(self) -> list[RequestAbandoned]:
        """The link ended: every pending request is abandoned; nothing more may be sent."""
        self.closed = True
        out = [RequestAbandoned(rid, p.method) for rid, p in self._pending.items()]
        self._pending.clear()
        self._inbound.clear()
        return out

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def inbound_count(self) -> int:
        return len(self._inbound)


def method_not_found(method: str) -> RpcError:
    return RpcError(code=METHOD_NOT_FOUND, message=f"Method not found: {method}")
