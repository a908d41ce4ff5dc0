"""How the lobby answers ``context/beforeInference`` and ``push/render`` under a control
link, switched by control commands (:mod:`tests.lobby.steering`), so that a host's tests
can watch it cope with a hook or a renderer that is slow, failing or silent.

* ``hook`` {mode, injections?, featureSet?} (with ``--context``; acknowledged with a
  ``hook_mode`` event): ``answer`` (the default: the injections, or the lobby's status line),
  ``never``, ``error`` (-32603), ``infer-first`` (ask the host for an inference, then answer).
  Each request is checked (a non-empty ``inferenceId``, a string ``userMessage`` only with
  ``observe`` granted, some hook granted) and reported as a ``hook_reply`` event {requestId,
  inferenceId, mode, result? | error?}.
* ``render_mode`` {mode, content?, delaySeconds?} (acknowledged with a ``render_mode`` event):
  ``result`` (the default: the given content, or a text such as ``2 updates: {"n":1},
  {"n":2}; 0 dropped``), ``empty``, ``error`` (-32603), ``never``, ``slow`` (the result after
  ``delaySeconds``). Each ``push/render`` is checked (RFC-006: advertised, granted, a known
  channel, a key, notices oldest first ending with the latest ``eventId``, an integer
  ``dropped``) and reported as a ``render`` event {requestId, params, mode, result? | error?,
  delaySeconds?}. The lobby never asks for an inference while it renders.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import trio

from actors.serverkit import NO_ANSWER, HostRequest, MCPLServer
from protocol.errors import INTERNAL_ERROR, INVALID_PARAMS, RpcError
from tests.lobby.checks import HostChecks
from tests.lobby.words import (
    ASSIST_FEATURE_SET,
    DEFAULT_INJECTIONS,
    DEFAULT_RENDER_DELAY,
    HOOK_FEATURE_SET,
    HOOK_MODES,
    HOOK_PATHS,
    INFER_FIRST_MESSAGES,
    MAX_COALESCE_KEY_BYTES,
    RENDER_MODES,
    read_timestamp,
    render_summary,
    short,
)

OBSERVE = "contextHooks.beforeInference.observe"
Ask = Callable[[str, Mapping[str, Any], int, Callable[[dict[str, Any] | None], None]], None]


def _log(text: str) -> None:
    print(f"[lobby] {text}", file=sys.stderr, flush=True)


def render_problems(params: Mapping[str, Any], checks: HostChecks) -> list[str]:
    """What is wrong with a ``push/render`` request: its shape, and whether it may come."""
    problems = []
    if not checks.coalescing["deferred"]:
        problems.append("the host did not advertise eventCoalescing.deferred")
    if not checks.allows("pushEvents"):
        problems.append("without the pushEvents grant")
    feature_set = params.get("featureSet")
    if not isinstance(feature_set, str) or not feature_set:
        problems.append(f"featureSet must be a non-empty string, got {short(feature_set, 60)}")
    if "channelId" in params and params["channelId"] not in checks.server.channels:
        problems.append(f"unknown channel {short(params['channelId'], 60)}")
    key = params.get("key")
    if "key" not in params:
        problems.append("no key")
    elif not isinstance(key, str) or not key:
        problems.append(f"key must be a non-empty string, got {short(key, 60)}")
    elif len(key.encode("utf-8")) > MAX_COALESCE_KEY_BYTES:
        problems.append(f"key longer than {MAX_COALESCE_KEY_BYTES} bytes")
    event_id = params.get("eventId")
    if not isinstance(event_id, str) or not event_id:
        problems.append(f"eventId must be a non-empty string, got {short(event_id, 60)}")
    notices = params.get("notices")
    if not isinstance(notices, list) or not notices:
        problems.append(f"notices must be a non-empty list, got {short(notices, 60)}")
        notices = []
    previous: dt.datetime | None = None
    for i, notice in enumerate(notices):
        if not isinstance(notice, dict):
            problems.append(f"notice {i} is not an object: {short(notice, 60)}")
            continue
        nid = notice.get("eventId")
        if not isinstance(nid, str) or not nid:
            problems.append(f"notice {i}: eventId must be a non-empty string")
        stamp = read_timestamp(notice.get("timestamp"))
        if stamp is None:
            problems.append(f"notice {i}: unreadable timestamp {short(notice.get('timestamp'))}")
            continue
        if previous is not None and stamp < previous:
            problems.append(
                f"notices are not oldest first: notice {i} ({notice['timestamp']}) is older "
                "than the one before it"
            )
        previous = stamp
    if notices and isinstance(notices[-1], dict) and notices[-1].get("eventId") != event_id:
        problems.append(
            f"eventId {short(event_id, 60)} is not the latest notice's "
            f"({short(notices[-1].get('eventId'), 60)})"
        )
    dropped = params.get("dropped")
    if type(dropped) is not int or dropped < 0:
        problems.append(f"dropped must be a non-negative integer, got {short(dropped, 60)}")
    return problems


class KitAnswers:
    """The hook and render modes, and the answer overrides that follow them."""

    def __init__(
        self,
        server: MCPLServer,
        checks: HostChecks,
        *,
        context: bool,
        emit: Callable[[dict[str, Any]], None],
        ask: Ask,
    ) -> None:
        self.server = server
        self.checks = checks
        self.emit = emit
        self.ask = ask
        self.hook_mode = "answer"
        self.hook_injections: list[Any] | None = None  # None: DEFAULT_INJECTIONS
        self.hook_feature_set = HOOK_FEATURE_SET
        self.render_mode = "result"
        self.render_content: list[Any] | None = None  # None: a summary of the notices
        self.render_delay = DEFAULT_RENDER_DELAY
        if context:
            server.answer_for("context/beforeInference")(self._hook)
        server.answer_for("push/render")(self._render)

    # -- context/beforeInference ---------------------------------------------------------------
    def _hook_checked(self, params: Mapping[str, Any]) -> str:
        inference_id = params.get("inferenceId")
        if not isinstance(inference_id, str) or not inference_id:
            raise RpcError(code=INVALID_PARAMS, message="inferenceId must be a non-empty string")
        user_message = params.get("userMessage")
        if user_message is not None and not isinstance(user_message, str):
            raise RpcError(code=INVALID_PARAMS, message="userMessage must be a string or null")
        turn = params.get("turnIndex")
        if turn is not None and (type(turn) is not int or turn < 0):
            raise RpcError(code=INVALID_PARAMS, message="turnIndex must be a non-negative integer")
        if self.server.grant.received:
            if not any(self.checks.allows(path) for path in HOOK_PATHS):
                self.checks.problem(
                    f"context/beforeInference {inference_id} without any hook grant"
                )
            if user_message is not None and not self.checks.allows(OBSERVE):
                self.checks.problem(
                    f"context/beforeInference {inference_id} carries the user's message, "
                    f"but {OBSERVE} is not granted"
                )
        _log(f"context/beforeInference {inference_id} (turn {turn}, mode {self.hook_mode})")
        return inference_id

    async def _hook(self, request: HostRequest) -> Any:
        inference_id = self._hook_checked(request.params)
        mode = self.hook_mode
        event: dict[str, Any] = {
            "event": "hook_reply",
            "requestId": request.id,
            "inferenceId": inference_id,
            "mode": mode,
        }
        if mode == "never":
            self.emit(event)
            return NO_ANSWER
        if mode == "error":
            err = RpcError(
                code=INTERNAL_ERROR, message="Internal error", data={"reason": "hook mode 'error'"}
            )
            self.emit({**event, "error": err.to_wire()})
            raise err
        injections = self.hook_injections
        result = {
            "featureSet": self.hook_feature_set,
            "contextInjections": copy.deepcopy(
                injections if injections is not None else DEFAULT_INJECTIONS
            ),
        }
        if mode == "infer-first":
            answered = trio.Event()
            params = {"featureSet": ASSIST_FEATURE_SET, "messages": INFER_FIRST_MESSAGES}
            self.ask("inference/request", copy.deepcopy(params), 1, lambda _: answered.set())
            await answered.wait()
            _log(f"context/beforeInference {inference_id}: answering after the inference")
        self.emit({**event, "result": result})
        return result

    def hook_command(self, cmd: dict[str, Any]) -> None:
        mode, injections = cmd["mode"], cmd.get("injections")
        feature_set = cmd.get("featureSet", HOOK_FEATURE_SET)
        if mode not in HOOK_MODES:
            raise ValueError(f"mode must be one of {HOOK_MODES}")
        if injections is not None and not isinstance(injections, list):
            raise TypeError("injections must be a list")
        if not isinstance(feature_set, str):
            raise TypeError("featureSet must be a string")
        self.hook_mode, self.hook_injections = mode, injections
        self.hook_feature_set = feature_set
        _log(f"hooks: mode {mode}, injections {short(injections)}")
        self.emit(
            {
                "event": "hook_mode",
                "mode": mode,
                "injections": injections,
                "featureSet": feature_set,
            }
        )

    # -- push/render ---------------------------------------------------------------------------
    async def _render(self, request: HostRequest) -> Any:
        params = request.params
        for text in render_problems(params, self.checks):
            self.checks.problem(f"push/render: {text}")
        mode = self.render_mode
        notices = params.get("notices")
        _log(f"push/render {short(params.get('key'), 60)}: mode {mode}")
        event: dict[str, Any] = {
            "event": "render",
            "requestId": request.id,
            "params": dict(params),
            "mode": mode,
        }
        if mode == "never":
            self.emit(event)
            return NO_ANSWER
        if mode == "error":
            err = RpcError(
                code=INTERNAL_ERROR,
                message="Internal error",
                data={"reason": "render mode 'error'"},
            )
            self.emit({**event, "error": err.to_wire()})
            raise err
        content: list[Any]
        if mode == "empty":
            content = []
        elif self.render_content is not None:
            content = copy.deepcopy(self.render_content)
        else:
            content = [{"type": "text", "text": render_summary(notices, params.get("dropped"))}]
        result = {"content": content}
        if mode == "slow":
            self.emit({**event, "result": result, "delaySeconds": self.render_delay})
            await trio.sleep(self.render_delay)
            return result
        self.emit({**event, "result": result})
        return result

    def render_mode_command(self, cmd: dict[str, Any]) -> None:
        mode, content = cmd["mode"], cmd.get("content")
        delay = cmd.get("delaySeconds", DEFAULT_RENDER_DELAY)
        if mode not in RENDER_MODES:
            raise ValueError(f"mode must be one of {RENDER_MODES}")
        if content is not None and not isinstance(content, list):
            raise TypeError("content must be a list of content blocks")
        if type(delay) not in (int, float) or not 0 <= delay < math.inf:
            raise ValueError("delaySeconds must be a non-negative number")
        self.render_mode, self.render_content = mode, content
        self.render_delay = float(delay)
        _log(f"push/render mode: {mode}, content {short(content)}, delay {delay} s")
        self.emit(
            {
                "event": "render_mode",
                "mode": mode,
                "content": content,
                "delaySeconds": self.render_delay,
            }
        )
