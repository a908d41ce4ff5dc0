"""The test lobby's vocabulary, shared by its modules: the protocol's codes and the lobby's modes,
the files it serves, and small helpers for logging and reading what the host sends. Its people,
what they say, how a post's author is named and the photo Alice shares are the example's
(:mod:`examples.lobby.server`), so that the tests hold the bundled lobby to them too."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any

from examples.lobby.server import PHOTO, PHOTO_NAME, STATUS

SERVER_NAME = "lobby"
SERVER_VERSION = "0.1.0"
PROTOCOL_VERSION = "2024-11-05"

# JSON-RPC and MCPL error codes used here.
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
NOT_READY = -32002
UNKNOWN_FEATURE_SET = -32003
CHECKPOINT_NOT_FOUND = -32005
UNKNOWN_CHANNEL = -32023
CHANNEL_OPEN_FAILED = -32024

# Requests of ours that are retried when the host answers -32002 (not ready yet).
RETRIED_METHODS = frozenset({"push/event", "channels/incoming", "channels/register"})
MAX_RETRIES = 5
RETRY_DELAY = 0.5

MAX_LINE_BYTES = 16 * 1024 * 1024
REGISTER_CHUNK = 100  # channels per channels/register request (the most a host takes at once)
MODES = ("request", "notification-only", "never")
HOOK_MODES = ("answer", "never", "error", "infer-first")
ROLLBACK_MODES = ("exact", "forward")
OPEN_MODES = ("answer", "never")
ECHO_THREAD_MODES = ("echo", "omit", "wrong")
PUBLISH_TARGETS = ("exact", "root")
LIFECYCLE_PHASES = ("started", "completed", "aborted", "failed")
FINISH_REASONS = ("end_turn", "max_tokens", "stop_sequence")
# RFC-006 event coalescing
RENDER_MODES = ("result", "empty", "error", "never", "slow")
DEFAULT_RENDER_DELAY = 10.0  # "slow" renders: beyond the host's recommended 5 s timeout
COALESCE_LEAVES = ("pushEvents", "channelsIncoming", "deferred", "channelScopedPush")
MIN_RETRY_WINDOW_MS = 3_600_000
COALESCE_OUTCOMES = ("first", "replaced", "appended", "retracted", "noted", "consumed")
MAX_COALESCE_KEY_BYTES = 256

HOOK_FEATURE_SET = "lobby.context"
ASSIST_FEATURE_SET = "lobby.assist"
NOTES_FEATURE_SET = "lobby.notes"
DEFAULT_INJECTIONS: list[dict[str, Any]] = [
    {
        "namespace": "lobby",
        "position": "beforeUser",
        "content": STATUS,
    }
]
INFER_FIRST_MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "summarize"}]
HOOK_PATHS = (
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.system",
    "contextHooks.beforeInference.inject.beforeUser",
    "contextHooks.beforeInference.inject.afterUser",
)

# Methods that only an MCPL server knows; an --mcp-only lobby answers them with -32601.
MCPL_METHODS = frozenset(
    {
        "featureSets/update",
        "mcpl/manifest",
        "channels/publish",
        "channels/open",
        "channels/close",
        "channels/list",
        "context/beforeInference",
        "state/rollback",
        "inference/lifecycle",
        "inference/chunk",
        "channels/outgoing/chunk",
        "channels/outgoing/complete",
        "channels/typing",
        "push/render",
    }
)


def log(text: str) -> None:
    try:
        print(f"[lobby] {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def now_iso() -> str:
    stamp = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def short(obj: Any, limit: int = 200) -> str:
    text = obj if isinstance(obj, str) else dumps(obj)
    return text if len(text) <= limit else text[:limit] + "…"


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return short(content)
    parts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict):
            parts.append(f"[{block.get('type', '?')}]")
        else:
            parts.append(short(block))
    return " ".join(parts)


def channel_descriptor(name: str) -> dict[str, Any]:
    return {
        "id": f"lobby:#{name}",
        "type": "chat",
        "label": name,
        "direction": "bidirectional",
        "capabilities": {"publish": {"target": "root"}},
    }


def publish_target(descriptor: Any) -> str | None:
    """A descriptor's RFC-011 ``capabilities.publish.target``: "exact", "root" or None."""
    caps = descriptor.get("capabilities") if isinstance(descriptor, dict) else None
    publish = caps.get("publish") if isinstance(caps, dict) else None
    target = publish.get("target") if isinstance(publish, dict) else None
    return target if target in PUBLISH_TARGETS else None


def valid_thread(value: Any) -> bool:
    """A place inside a channel: a non-empty string (a thread) or None (the root)."""
    return value is None or (isinstance(value, str) and value != "")


def channel_label(channel_id: Any) -> str:
    text = str(channel_id)
    return text.removeprefix("lobby:")


def read_coalescing(value: Any) -> tuple[dict[str, Any], list[str]]:
    """The host's ``eventCoalescing`` advertisement as leaves, and what is wrong with it.

    ``true`` advertises every leaf (retry window one hour); in the object form an omitted leaf
    is not advertised; absent (None) or ``false`` advertises nothing.
    """
    leaves: dict[str, Any] = {leaf: value is True for leaf in COALESCE_LEAVES}
    leaves["retryWindowMs"] = MIN_RETRY_WINDOW_MS if value is True else None
    if value is None or isinstance(value, bool):
        return leaves, []
    if not isinstance(value, dict):
        return leaves, [f"eventCoalescing must be true or an object, got {short(value, 60)}"]
    problems = []
    for leaf in COALESCE_LEAVES:
        given = value.get(leaf, False)
        if type(given) is not bool:
            problems.append(f"eventCoalescing.{leaf} must be a boolean, got {short(given, 60)}")
        leaves[leaf] = given is True
    window = value.get("retryWindowMs", MIN_RETRY_WINDOW_MS)
    if type(window) is not int or window < MIN_RETRY_WINDOW_MS:
        problems.append(
            f"eventCoalescing.retryWindowMs must be an integer >= {MIN_RETRY_WINDOW_MS}, "
            f"got {short(window, 60)}"
        )
    leaves["retryWindowMs"] = window
    return leaves, problems


def read_timestamp(value: Any) -> dt.datetime | None:
    """An RFC 3339 timestamp (no zone: UTC), or None if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        stamp = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=dt.UTC)


def render_summary(notices: Any, dropped: Any) -> str:
    """The default rendering of a batch: how many notices, each one's data, how many dropped."""
    items = notices if isinstance(notices, list) else []
    parts = [dumps(n["data"]) if isinstance(n, dict) and "data" in n else "-" for n in items]
    return f"{len(items)} updates: {', '.join(parts)}; {short(dropped, 40)} dropped"


def valid_id(value: Any) -> bool:
    return (type(value) is int) or isinstance(value, str)


MAX_TRACKED = 10_000  # inferences and streams remembered per session


# -- the files a lobby with --files serves ---------------------------------------------------


NOTES_TXT = (
    "Board game night -- notes\n"
    "\n"
    "* Alice won Carcassonne by 4 points.\n"
    "* Bob rolled three 20s in a row (suspicious).\n"
    "* Next time: Ticket to Ride; Bob brings snacks.\n"
)


def digest_of(data: bytes) -> str:
    """The RFC-005 digest form: sha256, unpadded base64url."""
    raw = hashlib.sha256(data).digest()
    return "sha256:" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@dataclass(frozen=True)
class LobbyFile:
    name: str
    mime_type: str
    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def digest(self) -> str:
        return digest_of(self.data)


def builtin_files() -> dict[str, LobbyFile]:
    files = [
        LobbyFile(PHOTO_NAME, "image/png", PHOTO),
        LobbyFile("notes.txt", "text/plain", NOTES_TXT.encode("utf-8")),
    ]
    return {f.name: f for f in files}
