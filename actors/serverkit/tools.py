"""Tools of the server toolkit: JSON Schemas from type hints, argument checks, results.

A tool is a plain function (sync or async). Its parameters become the ``inputSchema``
properties (``str`` → string, ``int`` → integer, ``float`` → number, ``bool`` → boolean,
``list[X]``/``tuple[X, ...]`` → array, ``dict[str, X]`` → object, ``X | None`` → nullable,
``Literal[...]`` → enum); a parameter without a default is required. Its return value becomes
the result's content: a string is one text block, a list of blocks is kept, a
:class:`ToolResult` says everything (``is_error``, a ``state`` checkpoint), anything else is
written as JSON text. A :class:`ToolError` raised by the tool is an error result carrying its
message; any other exception is an error result naming only the exception's type and message.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from protocol.errors import INVALID_PARAMS, RpcError

__all__ = ["Tool", "ToolError", "ToolResult", "schema_for", "tool_from_function"]

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolError(Exception):
    """Raised by a tool: the call's result is an error carrying this message."""


def _blocks(value: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ToolResult:
    """A tool's full result: content blocks, the error flag and an optional state checkpoint
    (``{"checkpoint", "parent", "data"?}``, SPEC §8)."""

    content: tuple[Mapping[str, Any], ...] = attrs.field(converter=_blocks, default=())
    is_error: bool = False
    state: Mapping[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The ``tools/call`` result."""
        out: dict[str, Any] = {"content": [dict(b) for b in self.content], "isError": self.is_error}
        if self.state is not None:
            out["state"] = dict(self.state)
        return out


def _schema_of(hint: Any) -> dict[str, Any]:
    if hint is inspect.Parameter.empty or hint is Any:
        return {}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if hint is type(None):
        return {"type": "null"}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        parts = [_schema_of(a) for a in args]
        return {"anyOf": parts} if all(parts) else {}
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        item = args[0] if args else inspect.Parameter.empty
        out: dict[str, Any] = {"type": "array"}
        if (schema := _schema_of(item)) and not (origin is tuple and len(args) > 2):
            out["items"] = schema
        return out
    if origin in (dict, Mapping) or hint is dict:
        out = {"type": "object"}
        if len(args) == 2 and (schema := _schema_of(args[1])):
            out["additionalProperties"] = schema
        return out
    raise TypeError(f"no JSON Schema for the type {hint!r}; use str, int, float, bool, list, dict")


def schema_for(fn: Callable[..., Any]) -> dict[str, Any]:
    """The ``inputSchema`` of ``fn``'s parameters (keyword-callable ones only)."""
    hints = typing.get_type_hints(fn)
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(f"tool parameter {name!r} must be passable by keyword")
        schema = _schema_of(hints.get(name, inspect.Parameter.empty))
        if param.default is not inspect.Parameter.empty:
            try:
                json.dumps(param.default)
            except TypeError:
                pass
            else:
                schema = {**schema, "default": param.default}
        else:
            required.append(name)
        props[name] = schema
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    return out


def _describe(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _check(value: Any, schema: Mapping[str, Any], where: str) -> None:
    kind = schema.get("type")
    ok = True
    if kind == "string":
        ok = isinstance(value, str)
    elif kind == "integer":
        ok = type(value) is int
    elif kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "boolean":
        ok = isinstance(value, bool)
    elif kind == "array":
        ok = isinstance(value, list)
    elif kind == "object":
        ok = isinstance(value, dict)
    elif kind == "null":
        ok = value is None
    if "enum" in schema:
        ok = value in schema["enum"]
    if "anyOf" in schema:
        ok = any(_fits(value, s) for s in schema["anyOf"])
    if not ok:
        raise RpcError(
            code=INVALID_PARAMS, message=f"{where}: expected {_name(schema)}, got {_given(value)}"
        )


#: The JSON name of each Python type a decoded argument can have.
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_JSON_TYPES.update({list: "array", dict: "object", type(None): "null"})


def _given(value: Any) -> str:
    """What an argument was, for an error: its JSON type, and the value itself when short."""
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    shown = json.dumps(value, ensure_ascii=False, default=str)
    return f"{kind} {shown}" if len(shown) <= 40 else kind


def _fits(value: Any, schema: Mapping[str, Any]) -> bool:
    try:
        _check(value, schema, "")
    except RpcError:
        return False
    return True


def _name(schema: Mapping[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_name(s) for s in schema["anyOf"])
    return str(schema.get("type", "a value"))


@attrs.frozen(kw_only=True)
class Tool:
    """One registered tool."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    fn: Callable[..., Any]

    def to_wire(self) -> dict[str, Any]:
        """The ``tools/list`` entry."""
        return {
            "name": self.name,
            "description": self.description,
            "inputSchema": dict(self.input_schema),
        }

    def arguments(self, raw: Any) -> dict[str, Any]:
        """The call's arguments checked against the schema; ``-32602`` when they do not fit."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise RpcError(code=INVALID_PARAMS, message="arguments must be an object")
        props = self.input_schema.get("properties", {})
        unknown = sorted(set(raw) - set(props))
        if unknown:
            raise RpcError(
                code=INVALID_PARAMS, message=f"{self.name}: unknown argument {unknown[0]!r}"
            )
        for key in self.input_schema.get("required", ()):
            if key not in raw:
                raise RpcError(code=INVALID_PARAMS, message=f"{self.name}: {key!r} is required")
        for key, value in raw.items():
            _check(value, props[key], f"{self.name}: {key!r}")
        return dict(raw)

    async def call(self, raw: Any, limiter: trio.CapacityLimiter) -> dict[str, Any]:
        """Run the tool; its ``tools/call`` result. A sync tool runs in a worker thread."""
        args = self.arguments(raw)
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await self.fn(**args)
            else:
                value = await trio.to_thread.run_sync(lambda: self.fn(**args), limiter=limiter)
        except ToolError as exc:
            return ToolResult(content=[text_block(str(exc))], is_error=True).to_wire()
        except Exception as exc:  # the tool's own failure is the caller's error result
            text = f"{self.name} failed: {type(exc).__name__}: {exc}"
            return ToolResult(content=[text_block(text)], is_error=True).to_wire()
        return result_of(value)


def text_block(text: str) -> dict[str, Any]:
    """A text content block."""
    return {"type": "text", "text": text}


def result_of(value: Any) -> dict[str, Any]:
    """A tool's return value as a ``tools/call`` result."""
    if isinstance(value, ToolResult):
        return value.to_wire()
    if isinstance(value, str):
        return ToolResult(content=[text_block(value)]).to_wire()
    if isinstance(value, list) and all(isinstance(b, dict) and "type" in b for b in value):
        return ToolResult(content=value).to_wire()
    return ToolResult(content=[text_block(json.dumps(value, ensure_ascii=False))]).to_wire()


def tool_from_function(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
) -> Tool:
    """A :class:`Tool` from ``fn``: its name, first docstring paragraph and schema."""
    return Tool(
        name=name or fn.__name__,
        description=description if description is not None else _describe(fn),
        input_schema=schema_for(fn),
        fn=fn,
    )
