"""inference/lifecycle over any sequence of turn outcomes: a hypothesis state machine driving one
real AgentActor (real store, in-memory server stand-in, MockClock) through successes, silent
turns, model failures and aborts, with the server's grant changing between turns.

The machine's rules are synchronous; the actors live in one trio run hosted by the test thread
(trio's guest mode), so the agent keeps its state from rule to rule.
"""

from __future__ import annotations

import queue
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors.agent.actor import AbortTurn, AgentActor, PostLocal
from actors.config import AgentConfig, HostConfig, ServerConfig
from actors.context import HostContext
from actors.errors import NotConnected
from actors.kernel import Actor, Reply, Work
from actors.messages import ConnStatus, Notify
from actors.models.base import ModelError, ModelReply, ModelRequest
from actors.storage import StoreClient
from actors.trace import TraceBus
from protocol.hooks import ModelInfo

LIFECYCLE_KEYS = {"inferenceId", "conversationId", "turnIndex", "phase", "model", "usage"}
USAGE = {"input_tokens": 7, "output_tokens": 3}


class GuestLoop:
    """One trio run hosted by the calling thread: ``call(fn)`` runs ``fn()`` in it."""

    def __init__(self, clock: trio.abc.Clock) -> None:
        self._callbacks: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self._nursery: trio.Nursery | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._finished: Any = None

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await trio.sleep_forever()

        trio.lowlevel.start_guest_run(
            main,
            run_sync_soon_threadsafe=self._callbacks.put,
            done_callback=self._done,
            clock=clock,
        )
        self._pump(lambda: self._nursery is not None)

    def _done(self, result: Any) -> None:
        self._finished = result

    def _pump(self, until: Callable[[], bool]) -> None:
        while not until():
            if self._finished is not None:
                self._finished.unwrap()
                raise RuntimeError("the trio run ended")
            self._callbacks.get()()

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        box: list[tuple[bool, Any]] = []

        async def run() -> None:
            try:
                box.append((True, await fn(*args)))
            except BaseException as exc:  # handed back to the caller's thread
                box.append((False, exc))

        assert self._token is not None and self._nursery is not None
        self._token.run_sync_soon(self._nursery.start_soon, run)
        self._pump(lambda: bool(box))
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        assert self._token is not None and self._nursery is not None
        self._token.run_sync_soon(self._nursery.cancel_scope.cancel)
        self._pump(lambda: self._finished is not None)


class ServerStandIn(Actor):
    """Takes the place of a ConnectionActor: records notifications, refuses calls."""

    def __init__(self, work: Work) -> None:
        super().__init__("connection:s1", work)
        self.notes: list[dict[str, Any]] = []

    async def handle(self, msg: Any, reply: Reply) -> None:
        if isinstance(msg, Notify):
            assert msg.method == "inference/lifecycle"
            self.notes.append(dict(msg.params))
            reply.value(None)
        else:
            reply.error(NotConnected("stand-in"))


class PlannedModel:
    """Each call does what ``plan`` says: answer, say nothing, fail, or hang until cancelled."""

    name = "planned"
    info = ModelInfo(id="planned-1", vendor="tests", context_window=1000, capabilities=())

    def __init__(self) -> None:
        self.plan = "ok"
        self.entered = trio.Event()

    async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
        if self.plan == "fail":
            raise ModelError("the provider is down")
        if self.plan == "hang":
            self.entered.set()
            await trio.sleep_forever()
        if request.messages and request.messages[-1].get("role") == "assistant":
            return ModelReply(blocks=(), model=self.name)
        blocks = ({"type": "text", "text": "noted"},) if self.plan == "ok" else ()
        return ModelReply(blocks=blocks, model=self.name, usage=dict(USAGE))


class TurnLifecycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        base = Path(self.tmp.name)
        self.config = HostConfig(
            data_dir=base / "data",
            servers=(ServerConfig(id="s1", command=("unused",)),),
            agents=(AgentConfig(name="Ada", model="scripted:unused"),),
            base_dir=base,
        )
        self.model = PlannedModel()
        self.grant = frozenset({"inferenceLifecycle"})
        self.expected: list[tuple[str, bool]] = []  # (terminal phase, model named) per turn
        self.loop = GuestLoop(trio.testing.MockClock(autojump_threshold=0))
        self.loop.call(self._start)

    async def _start(self) -> None:
        work = Work()
        self.store = StoreClient(self.config.data_dir, work)
        self.store.start()
        self.ctx = HostContext(self.config, self.store, TraceBus(), work)
        self.server = ServerStandIn(work)
        nursery = self.loop._nursery
        assert nursery is not None
        self.ctx.connections["s1"] = await nursery.start(self.server.run)
        self._publish_grant()
        agent = AgentActor(self.config.agents[0], self.model, self.ctx)  # type: ignore[arg-type]
        self.agent = await nursery.start(agent.run)

    def _publish_grant(self) -> None:
        self.ctx.statuses["s1"] = ConnStatus(
            server_id="s1",
            connected=True,
            ready=True,
            mcp_only=False,
            grant=self.grant,
            tools=(),
            channels=(),
        )

    async def _turn(self, plan: str) -> None:
        self.model.plan = plan
        self.model.entered = trio.Event()
        # ``tell``, not ``ask``: nothing here may carry a deadline while the store's thread
        # works, or the mock clock would jump to it.
        await self.agent.tell(PostLocal(text=f"turn {len(self.expected)}"))
        if plan == "hang":
            await self.model.entered.wait()
            assert await self._abort() is True
        await self.ctx.work.wait_idle()

    async def _abort(self) -> bool:
        return bool(await self.agent.ask(AbortTurn(), timeout=60))

    def _run(self, plan: str, terminal: str) -> None:
        self.expected.append((terminal, "modelInfo" in self.grant))
        self.loop.call(self._turn, plan)

    @rule()
    def a_turn_that_answers(self) -> None:
        self._run("ok", "completed")

    @rule()
    def a_turn_that_says_nothing(self) -> None:
        self._run("silent", "completed")

    @rule()
    def a_turn_whose_model_fails(self) -> None:
        self._run("fail", "failed")

    @rule()
    def a_turn_aborted_midway(self) -> None:
        self._run("hang", "aborted")

    @rule()
    def abort_with_no_turn_running(self) -> None:
        before = len(self.server.notes)
        assert self.loop.call(self._abort) is False
        assert len(self.server.notes) == before

    @precondition(lambda self: "modelInfo" not in self.grant)
    @rule()
    def grant_model_info(self) -> None:
        self.grant = self.grant | {"modelInfo"}
        self._publish_grant()

    @precondition(lambda self: "modelInfo" in self.grant)
    @rule()
    def revoke_model_info(self) -> None:
        self.grant = self.grant - {"modelInfo"}
        self._publish_grant()

    @invariant()
    def each_turn_started_once_and_ended_once(self) -> None:
        notes = self.server.notes
        assert len(notes) == 2 * len(self.expected)
        for turn, (terminal, named) in enumerate(self.expected):
            started, ended = notes[2 * turn], notes[2 * turn + 1]
            assert (started["phase"], ended["phase"]) == ("started", terminal)
            assert started["inferenceId"] == ended["inferenceId"]
            assert started["turnIndex"] == ended["turnIndex"] == turn
            assert started["conversationId"] == ended["conversationId"] == "agent:Ada"
            for note in (started, ended):
                assert set(note) <= LIFECYCLE_KEYS  # metadata only, never content
                assert ("model" in note) == named
            assert "usage" not in started
            if terminal == "completed":
                assert ended["usage"] == {"inputTokens": 7, "outputTokens": 3}
            else:
                assert "usage" not in ended
        assert len({n["inferenceId"] for n in notes}) == len(self.expected)

    def teardown(self) -> None:
        try:
            self.loop.call(self.store.aclose)
            self.loop.close()
        finally:
            self.tmp.cleanup()


TurnLifecycle.TestCase.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)
TestTurnLifecycle = TurnLifecycle.TestCase
