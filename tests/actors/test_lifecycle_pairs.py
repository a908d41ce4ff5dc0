"""``inference/lifecycle`` pairs: whatever the servers' readiness and grants do between a turn's
``started`` and its terminal, no server hears a terminal without its ``started``, and a server
that heard ``started`` and still has the grant hears exactly one terminal."""

from __future__ import annotations

import types
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from actors.agent.hooks import LIFECYCLE, TurnHooks
from actors.messages import ConnStatus, Notify
from actors.trace import TraceBus
from protocol.hooks import ModelInfo

SERVERS = ("a", "b", "c")
#: A server's state at one moment: no status yet, connected but not ready, ready without the
#: lifecycle grant, ready with it.
STATES = st.sampled_from(["none", "connecting", "ready", "granted"])


class Recorder:
    def __init__(self, sid: str, heard: list[tuple[str, str]]) -> None:
        self.sid, self.heard = sid, heard

    def tell_nowait(self, msg: Notify) -> None:
        self.heard.append((self.sid, msg.params["phase"]))


def status(sid: str, state: str) -> ConnStatus | None:
    if state == "none":
        return None
    return ConnStatus(
        server_id=sid,
        connected=True,
        ready=state != "connecting",
        mcp_only=False,
        grant=frozenset({LIFECYCLE}) if state == "granted" else frozenset(),
        tools=(),
        channels=(),
    )


def put(ctx: Any, states: tuple[str, ...]) -> None:
    for sid, state in zip(SERVERS, states, strict=True):
        st_ = status(sid, state)
        if st_ is None:
            ctx.statuses.pop(sid, None)
        else:
            ctx.statuses[sid] = st_


@given(
    st.tuples(STATES, STATES, STATES),
    st.tuples(STATES, STATES, STATES),
    st.sampled_from(["completed", "failed", "aborted"]),
)
def test_a_terminal_goes_only_where_started_went(
    before: tuple[str, ...], after: tuple[str, ...], phase: str
) -> None:
    heard: list[tuple[str, str]] = []
    ctx = types.SimpleNamespace(
        statuses={},
        connections={sid: Recorder(sid, heard) for sid in SERVERS},
        trace=TraceBus(),
    )
    hooks = TurnHooks(
        ctx,  # type: ignore[arg-type]
        "Ada",
        SERVERS,
        model=ModelInfo(id="m", vendor="v", context_window=10, capabilities=()),
        inference_id="i1",
        conversation_id="agent:Ada",
        turn_index=0,
    )
    put(ctx, before)
    hooks.started()
    put(ctx, after)
    hooks.ended(phase)
    hooks.ended("failed")  # every exit path may call it: only the first counts
    for sid, was, now in zip(SERVERS, before, after, strict=True):
        phases = [p for s, p in heard if s == sid]
        expected = ["started"] if was == "granted" else []
        if was == "granted" and now == "granted":
            expected.append(phase)
        assert phases == expected
