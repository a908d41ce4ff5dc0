"""Typed params of the inbound MCPL lanes, structured from wire JSON with cattrs.

Unknown members are tolerated (MCPL is an extension protocol). A shape error becomes
``RpcError(-32602)`` whose message names the path of the bad member.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.errors import IterableValidationError, IterableValidationNote
from cattrs.gen import make_dict_structure_fn, override

from .depth import MAX_DEPTH, too_deep_member
from .errors import INVALID_PARAMS, RpcError

T = TypeVar("T")

MAX_BATCH = 100


@attrs.frozen(kw_only=True)
class Author:
    id: str
    name: str = ""


@attrs.frozen(kw_only=True)
class Origin:
    mcpl_channel_id: str | None = None


@attrs.frozen(kw_only=True)
class PushEvent:
    feature_set: str
    event_id: str
    timestamp: str
    payload_content: tuple[Any, ...]
    origin: Mapping[str, Any] | None = None
    tags: tuple[Any, ...] = ()
    coalesce: Any = None  # RFC-006, as sent (validated by protocol.coalesce.parse_coalesce)


@attrs.frozen(kw_only=True)
class ChannelDescriptor:
    id: str
    type: str = ""
    label: str = ""
    direction: str = "bidirectional"
    address: Any = None
    metadata: Mapping[str, Any] | None = None
    initially_open: bool | None = None
    capabilities: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class IncomingMessage:
    channel_id: str
    message_id: str
    author: Author
    content: tuple[Any, ...]
    timestamp: str = ""
    thread_id: str | None = None
    metadata: Mapping[str, Any] | None = None
    tags: tuple[Any, ...] = ()
    reply_to: str | None = None  # the message this one answers, as the server names it
    event_id: Any = None  # RFC-006: the occurrence, required with ``coalesce``; as sent
    coalesce: Any = None  # RFC-006, as sent (validated by protocol.coalesce.parse_coalesce)


@attrs.frozen(kw_only=True)
class ChannelsChanged:
    added: tuple[ChannelDescriptor, ...] = ()
    removed: tuple[str, ...] = ()
    updated: tuple[ChannelDescriptor, ...] = ()


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


#: Members whose wire path is not the camelCase of the attribute (``parse_push`` flattens them).
_WIRE_PATHS = {"payload_content": "payload.content"}


_WIRE_PATHS_BY_KEY = {_camel(k): v for k, v in _WIRE_PATHS.items()}


def _wire_name(name: str) -> str:
    return _WIRE_PATHS.get(name, _camel(name))


class _Shape(TypeError):
    """A wire value of the wrong JSON type; the message says what was expected."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _strict_str(value: Any, _: type) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # ids sent as numbers are common; they are kept as their decimal text
    raise _Shape(f"expected a string, got {_kind(value)}")


def _strict_bool(value: Any, _: type) -> bool:
    if isinstance(value, bool):
        return value
    raise _Shape(f"expected a boolean, got {_kind(value)}")


def _tuple_of_any(value: Any, _: type) -> tuple[Any, ...]:
    if isinstance(value, list):
        return tuple(value)
    raise _Shape(f"expected an array, got {_kind(value)}")


def _mapping(value: Any, _: type) -> Mapping[str, Any]:
    if isinstance(value, dict):
        return value
    raise _Shape(f"expected an object, got {_kind(value)}")


def make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(detailed_validation=True)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook_func(lambda t: t == tuple[Any, ...], _tuple_of_any)
    conv.register_structure_hook_func(lambda t: t == Mapping[str, Any], _mapping)

    def _list_then_tuple(value: Any, cls: Any) -> Any:
        if not isinstance(value, list):
            raise _Shape(f"expected an array, got {_kind(value)}")
        (item,) = {a for a in cls.__args__ if a is not Ellipsis}
        out: list[Any] = []
        problems: list[Exception] = []
        for index, v in enumerate(value):
            try:
                out.append(conv.structure(v, item))
            except Exception as exc:  # every element's problem is reported, by its index
                exc.add_note(IterableValidationNote(f"index {index}", index, item))
                problems.append(exc)
        if problems:
            raise IterableValidationError(f"while structuring {cls!r}", problems, cls)
        return tuple(out)

    conv.register_structure_hook_func(
        lambda t: getattr(t, "__origin__", None) is tuple and t != tuple[Any, ...],
        _list_then_tuple,
    )

    def factory(cls: type[Any]) -> Any:
        overrides = {f.name: override(rename=_camel(f.name)) for f in attrs.fields(cls)}
        inner = make_dict_structure_fn(cls, conv, **overrides)  # type: ignore[arg-type]

        def structure_object(value: Any, cl: Any) -> Any:
            if not isinstance(value, dict):
                raise _Shape(f"expected an object, got {_kind(value)}")
            return inner(value, cl)

        return structure_object

    conv.register_structure_hook_factory(attrs.has, factory)
    return conv


_CONVERTER = make_converter()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _Shape):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required member missing"
    return f"invalid value ({exc})"


def _problems(exc: BaseException, path: str) -> list[str]:
    """Each problem as ``what @ path``, the path spelled in wire member names."""
    out: list[str] = []
    if isinstance(exc, cattrs.ClassValidationError):
        with_notes, without = exc.group_exceptions()
        for sub, note in with_notes:
            out.extend(_problems(sub, f"{path}.{_wire_name(note.name)}"))
        for sub in without:
            out.extend(_problems(sub, path))
    elif isinstance(exc, IterableValidationError):
        with_index, without = exc.group_exceptions()
        for sub, inote in with_index:
            out.extend(_problems(sub, f"{path}[{inote.index!r}]"))
        for sub in without:
            out.extend(_problems(sub, path))
    else:
        out.append(f"{_describe(exc)} @ {path}")
    return out


def check_depth(value: Any, names: Mapping[str, str] | None = None) -> None:
    """Refuse (``RpcError(-32602)``, ``data`` naming the member) an object one of whose members
    nests deeper than :data:`~protocol.depth.MAX_DEPTH`: the store could not read it back.
    ``names`` maps a member's key to its wire path where they differ."""
    if not isinstance(value, Mapping):
        return
    member = too_deep_member(value)
    if member is None:
        return
    member = (names or {}).get(member, member)
    reason = f"nested deeper than {MAX_DEPTH}"
    raise RpcError(
        code=INVALID_PARAMS,
        message=f"Invalid params: {member} {reason}",
        data={"member": member, "reason": reason},
    )


def structure(value: Any, cls: type[T]) -> T:
    """Structure wire JSON into ``cls`` or raise ``RpcError(-32602)`` naming the bad members
    (a member nested too deeply included: see :func:`check_depth`)."""
    check_depth(value, _WIRE_PATHS_BY_KEY)
    try:
        return _CONVERTER.structure(value, cls)
    except (cattrs.BaseValidationError, TypeError, ValueError, AttributeError, KeyError) as exc:
        problems = "; ".join(_problems(exc, "params"))
        raise RpcError(code=INVALID_PARAMS, message=f"Invalid params: {problems}") from None


def _require_object(params: Any) -> Mapping[str, Any]:
    if type(params) is dict:
        return params
    if not isinstance(params, Mapping):
        raise RpcError(code=INVALID_PARAMS, message="Invalid params: params must be an object")
    return params


_ISO = re.compile(r"\d{4}-\d{2}-\d{2}([T ][\d:.]+)?(Z|[+-]\d{2}:?\d{2})?")


def parse_push(params: Any) -> PushEvent:
    p = _require_object(params)
    payload = p.get("payload")
    if not isinstance(payload, Mapping) or "content" not in payload:
        raise RpcError(code=INVALID_PARAMS, message="Invalid params: payload.content is required")
    flat = {k: v for k, v in p.items() if k != "payload"}
    flat["payloadContent"] = payload["content"]
    event = structure(flat, PushEvent)
    if not event.event_id:
        raise RpcError(code=INVALID_PARAMS, message="Invalid params: eventId must not be empty")
    if not _ISO.fullmatch(event.timestamp):
        raise RpcError(
            code=INVALID_PARAMS, message="Invalid params: timestamp must be an ISO 8601 string"
        )
    return event


#: The ``origin`` members a server may name its channel by, in its own (native) id.
NATIVE_CHANNEL_KEYS = ("channelId", "channel_id", "channel")


def native_channel(origin: Mapping[str, Any] | None, registered: Iterable[str]) -> str | None:
    """The registered channel a push names only by the id its server uses natively (an
    ``origin.channelId`` of ``evt-3`` for a channel registered as ``toy:evt-3``): the one channel
    whose id is that value, or ends in ``:`` and that value. Two or more such channels, or none,
    name no channel: the push stays unscoped rather than land in the wrong one. Linear in the
    registered channels; a push naming ``mcplChannelId`` never comes here."""
    if not isinstance(origin, Mapping):
        return None
    native = next(
        (v for k in NATIVE_CHANNEL_KEYS if isinstance(v := origin.get(k), str) and v), None
    )
    if native is None:
        return None
    suffix = ":" + native
    found = None
    for channel_id in registered:
        if channel_id == native or channel_id.endswith(suffix):
            if found is not None:
                return None  # ambiguous
            found = channel_id
    return found


def parse_descriptors(params: Any, key: str = "channels") -> list[Any]:
    p = _require_object(params)
    items = p.get(key)
    if not isinstance(items, list):
        raise RpcError(code=INVALID_PARAMS, message=f"Invalid params: {key} must be an array")
    if len(items) > MAX_BATCH:
        raise RpcError(
            code=INVALID_PARAMS, message=f"Invalid params: more than {MAX_BATCH} {key} at once"
        )
    return items


def _fast_incoming(raw: Any) -> IncomingMessage | None:
    """The message when every member already has exactly its type (the common case), built
    without the general converter; None sends it through ``structure`` instead."""
    if type(raw) is not dict:
        return None
    cid = raw.get("channelId")
    mid = raw.get("messageId")
    author = raw.get("author")
    content = raw.get("content")
    if not (
        type(cid) is str and type(mid) is str and type(author) is dict and type(content) is list
    ):
        return None
    aid = author.get("id")
    name = author.get("name", "")
    timestamp = raw.get("timestamp", "")
    thread = raw.get("threadId")
    reply = raw.get("replyTo")
    metadata = raw.get("metadata")
    tags = raw.get("tags", [])
    if not (
        type(aid) is str
        and type(name) is str
        and type(timestamp) is str
        and (thread is None or type(thread) is str)
        and (reply is None or type(reply) is str)
        and (metadata is None or type(metadata) is dict)
        and type(tags) is list
    ):
        return None
    return IncomingMessage(
        channel_id=cid,
        message_id=mid,
        author=Author(id=aid, name=name),
        content=tuple(content),
        timestamp=timestamp,
        thread_id=thread,
        metadata=metadata,
        tags=tuple(tags),
        reply_to=reply,
        event_id=raw.get("eventId"),
        coalesce=raw.get("coalesce"),
    )


def parse_incoming(raw: Any) -> IncomingMessage:
    """One message of a ``channels/incoming`` batch; ``RpcError(-32602)`` when malformed."""
    fast = _fast_incoming(raw)
    if fast is None:
        return structure(raw, IncomingMessage)
    check_depth(raw)
    return fast


def parse_incoming_batch(params: Any) -> list[Any]:
    return parse_descriptors(params, "messages")
