"""Error codes and the errors of the sans-I/O protocol layer."""

from __future__ import annotations

from typing import Any

import attrs

# JSON-RPC 2.0
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# MCPL (Appendix A)
FEATURE_SET_NOT_ENABLED = -32001
CAPABILITY_DENIED = -32002
UNKNOWN_FEATURE_SET = -32003
CHECKPOINT_NOT_FOUND = -32005
CHANNEL_NOT_PERMITTED = -32017
UNKNOWN_CHANNEL = -32023
CHANNEL_OPEN_FAILED = -32024

STANDARD_MESSAGES: dict[int, str] = {
    PARSE_ERROR: "Parse error",
    INVALID_REQUEST: "Invalid Request",
    METHOD_NOT_FOUND: "Method not found",
    INVALID_PARAMS: "Invalid params",
    INTERNAL_ERROR: "Internal error",
    FEATURE_SET_NOT_ENABLED: "Feature set not enabled",
    CAPABILITY_DENIED: "Capability denied",
    UNKNOWN_FEATURE_SET: "Unknown feature set",
    CHECKPOINT_NOT_FOUND: "Checkpoint not found",
    CHANNEL_NOT_PERMITTED: "Channel not permitted",
    UNKNOWN_CHANNEL: "Unknown channel",
    CHANNEL_OPEN_FAILED: "Channel open failed",
}


@attrs.frozen(kw_only=True)
class RpcError(Exception):
    """A JSON-RPC error object, raised by handlers and carried by error responses."""

    code: int
    message: str = ""
    data: Any = None

    def __attrs_post_init__(self) -> None:
        if not self.message:
            object.__setattr__(self, "message", STANDARD_MESSAGES.get(self.code, "Error"))

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out

    def __str__(self) -> str:
        return f"{self.code} {self.message}"

    # An exception class made by attrs compares by identity; an error object is a value (two
    # parses of one line are equal). The hash stays defined even when ``data`` is unhashable.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RpcError):
            return NotImplemented
        return (self.code, self.message, self.data) == (other.code, other.message, other.data)

    def __hash__(self) -> int:
        return hash((self.code, self.message))


class ProtocolError(Exception):
    """Base of protocol violations."""


class LocalProtocolError(ProtocolError):
    """We misused the session (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol; ``code_hint`` is the JSON-RPC code to answer with."""

    def __init__(self, message: str, code_hint: int = INVALID_REQUEST) -> None:
        super().__init__(message)
        self.code_hint = code_hint
