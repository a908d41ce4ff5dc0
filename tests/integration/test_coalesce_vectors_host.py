"""The RFC-006 conformance vectors that need a host, over the real one.

``tests/protocol/test_coalesce_vectors.py`` runs what the pure coalescer can answer by itself;
the variants it names as needing the host run here, through :class:`actors.Host` with its
store in a temp dir, and a :class:`tests.vector_server.VectorServer` joined by memory channels.
Time is a MockClock that moves only where a vector says time passes (``wait``, a render
still held timing out at ``joinTurn``, a reconnect's backoff), never by itself: the store's
writer thread would make an autojumping clock leap to the next deadline whenever it commits,
and a leap while a commit is slow would decide a vector's outcome (a render join timing out)
by the machine's load. A hung step fails instead, naming the step, once every task has been
blocked for ``HANG_S`` real seconds; no step waits for that in a passing run.

The profile: between steps every agent's turns are held (``Host.hold``), so the host's own
wake decision runs where a vector says so: ``turn`` releases the agents, waits for the host
to be idle and holds them again. Between ``startTurn`` and ``joinTurn`` one turn is open (its
render may be held): a step then waits for what it did to be in force (the host's answer,
or the ``manifest-changed`` trace event of a changed grant), not for the host to be idle,
which it is not until the turn ends; ``joinTurn`` waits for that end. ``assemble`` is an
operator line (``post_local``) and a turn: one model request from the agent's context as it
is. ``queueInference`` is an operator line left waiting. ``suppressWake`` keeps one agent held
through the next ``turn``. With setup ``compression`` the agent's context budget is small, and
``compress`` is an operator line outgrowing it and a turn: its read folds what came before into
a summary (``summaryLevel`` counts the agent's stored summaries) before its model request.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Host
from actors.agent.actor import live_messages
from actors.channel.coalescer import RENDER_TIMEOUT_S, CoalescerActor
from actors.link.connection import BACKOFF_CAP_S
from actors.models.base import ModelError, ModelReply, ModelRequest
from protocol.hooks import ModelInfo
from tests.helpers import config, scripted
from tests.protocol.test_coalesce_vectors import CASES, classify, evaluate, resolve
from tests.vector_server import VectorServer, memory_transports

SERVER = "editor"
HANG_S = 60.0  # real seconds with every task blocked before a step counts as hung
DEADLINE_S = 3600.0  # virtual: past what any vector needs
ASSEMBLE = "(operator) go on"
QUEUED = "(operator) a queued request"

#: Variants this host cannot exercise, and why (a profile capability it does not have).
UNEXERCISED: dict[tuple[str, str], str] = {}
#: With setup ``compression``: the agent's context budget, and what ``compress`` posts to
#: outgrow it (the agent's next read folds what came before into a summary).
COMPRESSION_BUDGET = 400
COMPRESS = "(operator) compress " + "x" * 1800


def host_variants() -> list[Any]:
    out = []
    for case in CASES:
        for variant in case["variants"]:
            why = classify(variant)
            if why is not None and why[0] == "host":
                out.append(pytest.param(case, variant, id=f"{case['id']}-{variant['name']}"))
    return out


class VectorModel:
    """Every agent's model: records each request's text per agent; fails when told to."""

    name = "vector"
    info = ModelInfo(id="vector-1", vendor="tests", context_window=200_000, capabilities=())

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []  # (agent, request text), oldest first
        self.failures = 0
        self.fail_next = False

    async def complete(self, request: ModelRequest, on_delta: Any = None) -> ModelReply:
        if request.purpose == "summary":  # folding a context: no inference of the agent's
            return ModelReply(blocks=({"type": "text", "text": "(earlier events)"},))
        self.requests.append((request.agent, _text(request.messages)))
        if self.fail_next:
            self.fail_next = False
            self.failures += 1
            raise ModelError("the model failed, as the vector asked")
        return ModelReply(blocks=(), model=self.name)


def _text(messages: Any) -> str:
    return json.dumps(
        [
            b.get("text", "")
            for m in messages
            for b in m.get("blocks", ())
            if isinstance(b, dict) and b.get("type") == "text"
        ],
        ensure_ascii=False,
    )


def gate_file(tmp_path: Path, gate: dict[str, Any]) -> str:
    """The vector's gate in mcplive's gate format (JSON)."""
    policies = []
    for policy in gate.get("policies", ()):
        match = {"tags_any": policy["match"]["tagsAny"]} if "tagsAny" in policy["match"] else {}
        behavior = policy["behavior"]
        if isinstance(behavior, dict) and "debounce" in behavior:
            behavior = {"debounce_ms": behavior["debounce"]}
        policies.append({"name": policy["name"], "behavior": behavior, "match": match})
    path = tmp_path / "gate.json"
    path.write_text(
        json.dumps({"default": gate.get("default", "always"), "policies": policies}),
        encoding="utf-8",
    )
    return str(path)


class Harness:
    def __init__(
        self,
        host: Host,
        server: VectorServer,
        model: VectorModel,
        clock: trio.testing.MockClock,
        agents: list[str],
    ) -> None:
        self.host = host
        self.server = server
        self.model = model
        self.clock = clock
        self.agents = agents
        self.suppressed: set[str] = set()
        self.turn_open = False
        self.step: Any = None  # the step being run, for a hang's message

    async def settle(self) -> None:
        """Let every task run that can, then wait until the host has no work; while a turn is
        open the host has work until it ends, so only the former."""
        await trio.testing.wait_all_tasks_blocked()
        if not self.turn_open:
            await self.host.run_until_idle()

    async def watch(self) -> None:
        """Fail the run once every task has been blocked for ``HANG_S`` real seconds: the clock
        never moves by itself, so a step waiting for time no vector passes waits for ever."""
        await trio.testing.wait_all_tasks_blocked(cushion=HANG_S)
        raise AssertionError(f"hung for {HANG_S:g}s of real time at step {self.step!r}")

    async def change_manifest(self) -> None:
        """Announce the server's changed manifest; return once the host applied it."""
        # subscribed without the bus's replay: an earlier change's event is not this one's
        events = self.host.ctx.trace.subscribe_nowait(kinds=frozenset({"manifest-changed"}))
        try:
            await self.server.change_manifest()
            await events.receive()
        finally:
            events.close()
        await self.settle()

    async def pass_time(self, seconds: float) -> None:
        self.clock.jump(seconds)
        await self.settle()

    async def connected(self) -> None:
        """Wait until the server's current link has its policy and channels in force."""
        while self.server.session is None or not self.server.session.ready.is_set():
            await trio.testing.wait_all_tasks_blocked()
            if self.server.session is not None:
                await self.server.session.ready.wait()
        await self.settle()

    async def turns(self, agents: list[str]) -> None:
        for agent in agents:
            await self.host.release(agent)
        await self.settle()
        for agent in agents:
            await self.host.hold(agent)

    async def run(self, step: dict[str, Any]) -> dict[str, Any]:
        self.step = step
        op = step["op"]
        reply = None
        if op == "send":
            reply = await self.server.request(step["method"], step["params"])
            await self.settle()
        elif op == "register":
            await self.server.register(step["channel"])
            await self.settle()
        elif op == "assemble":
            await self.host.post_local(self.agents[0], ASSEMBLE)
            await self.turns([self.agents[0]])
        elif op == "turn":
            await self.turns([a for a in self.agents if a not in self.suppressed])
            self.suppressed.clear()
        elif op == "compress":
            await self.host.post_local(self.agents[0], COMPRESS)
            await self.turns([self.agents[0]])
        elif op == "queueInference":
            await self.host.post_local(self.agents[0], QUEUED)
            await self.settle()
        elif op == "suppressWake":
            self.suppressed.add(step["agent"])
        elif op == "failNextModel":
            self.model.fail_next = True
        elif op == "render":
            self.server.plan = step["plan"]
        elif op == "channelTool":
            arguments = {"channel_id": "chat", "server_id": SERVER}
            result = await self.host.execute_tool_call(self.agents[0], step["name"], arguments)
            assert not result["is_error"], result
            await self.settle()
        elif op == "grant":
            leaves = step["leaves"]
            self.server.capabilities = {leaf: True for leaf in leaves}
            await self.change_manifest()
        elif op == "disableFeature":
            self.server.feature_sets.pop("doc")
            await self.change_manifest()
        elif op == "startTurn":
            self.server.render_asked = trio.Event()
            await self.host.release(self.agents[0])
            await self.server.render_asked.wait()
            await trio.testing.wait_all_tasks_blocked()
            await self.host.hold(self.agents[0])
            self.turn_open = True
        elif op == "waitRender":
            assert len(self.server.renders) >= step["count"], self.server.renders
        elif op == "releaseRender":
            await self.server.release(step["text"])
            await self.settle()
        elif op == "joinTurn":
            assert self.turn_open, "no turn to join"
            self.turn_open = False
            if self.server.held:  # its render is still unanswered: let it time out
                await self.pass_time(RENDER_TIMEOUT_S + 0.001)
            else:
                await self.settle()
        elif op == "wait":
            await self.pass_time(step["ms"] / 1000)
        elif op == "disconnect":
            await self.server.disconnect()
            await self.settle()
        elif op == "reconnect":
            await self.pass_time(BACKOFF_CAP_S * 1.5)
            await self.connected()
        elif op != "observe":
            raise AssertionError(f"the harness cannot perform op {op}")
        return self.observe(reply)

    def contexts(self) -> dict[str, str]:
        """Each agent's context as the model would read it now: its stored text, without the
        occurrences hidden before they were read."""
        return {agent: _text(live_messages(self.host.history(agent))) for agent in self.agents}

    def observe(self, reply: dict[str, Any] | None) -> dict[str, Any]:
        contexts = self.contexts()
        requests = [text for _, text in self.model.requests]
        status = self.host.ctx.statuses.get(SERVER)
        session = self.server.session
        updates = session.updates if session is not None else []
        obs: dict[str, Any] = {
            "allRequestText": "\n".join(requests),
            "allContextText": "\n".join(contexts.values()),
            "contexts": contexts,
            "renders": json.loads(json.dumps(self.server.renders)),
            "modelCalls": len(requests),
            "modelFailures": self.model.failures,
            "requests": requests,
            "agents": list(self.agents),
            "servers": {
                SERVER: {
                    "connected": bool(status and status.connected),
                    "policyEstablished": bool(status and status.ready),
                    "binding": self.host.ctx.binding(SERVER),
                    "grant": updates[-1]["effectiveCapabilities"] if updates else None,
                    "enabledFeatures": updates[-1]["enabled"] if updates else None,
                    "operatorPolicy": {"eventCoalescing": self.server.advertised},
                }
            },
        }
        if requests:
            obs["requestText"] = requests[-1]
        history = self.host.history(self.agents[0])
        obs["summaryLevel"] = sum(m["metadata"].get("kind") == "summary" for m in history)
        if reply is not None:
            obs["reply"] = reply
        return obs

    def check(self, check: dict[str, Any], obs: dict[str, Any], seen: dict[str, Any]) -> None:
        """The vector checks the shared evaluator does not know: per-model requests, every
        request, the audience of a replacement, and an item's stored metadata."""
        if "model" in check:
            agent = check["model"].removeprefix("fixture-")
            mine = [text for who, text in self.model.requests if who == agent]
            if "requestCount" in check:
                assert len(mine) == check["requestCount"], (agent, mine)
            text = "\n".join(mine)
            for needle in check.get("includes", ()):
                assert needle in text, (agent, needle, text)
            if "order" in check:
                # the order holds in what the agent reads: its last request, or its context if
                # it has made none since
                where = mine[-1] if mine else obs["contexts"][agent]
                places = [where.find(n) for n in check["order"]]
                assert -1 not in places and places == sorted(places), (agent, where)
        elif "everyIncludes" in check:
            values = resolve(obs, check["path"])
            assert values and all(check["everyIncludes"] in v for v in values), values
        elif "audienceFrom" in check:
            before = seen[check["audienceFrom"]]["contexts"]
            for agent, text in obs["contexts"].items():
                had = check["original"] in before[agent]
                assert check["original"] not in text, (agent, text)
                assert (check["replacement"] in text) == had, (agent, had, text)
        elif "event" in check:
            stored = [
                m
                for m in self.host.history(self.agents[0])
                if m["metadata"].get("event_id") == check["event"]
            ]
            assert stored, f"event {check['event']} is not stored"
            wanted = {"messageId": "message_id", "threadId": "thread_id"}
            for key, value in check["metadata"].items():
                assert stored[-1]["metadata"].get(wanted[key]) == value, stored[-1]["metadata"]
        else:
            evaluate(check, obs, seen)


@asynccontextmanager
async def harness(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    clock: trio.testing.MockClock,
    setup: dict[str, Any],
) -> AsyncIterator[Harness]:
    agents = list(setup.get("agents", ["agent"]))
    server = VectorServer()
    model = VectorModel()
    monkeypatch.setattr(
        "actors.link.connection.open_transport", memory_transports({SERVER: server})
    )
    monkeypatch.setattr("actors.host.make_model", lambda cfg: model)
    specs = []
    for name in agents:
        spec: dict[str, Any] = {"name": name, "model": scripted(tmp_path, name, "")}
        if setup.get("compression"):
            spec["context_tokens"] = COMPRESSION_BUDGET
        if "gate" in setup:
            spec["gate"] = gate_file(tmp_path, setup["gate"])
        specs.append(spec)
    cfg = config(tmp_path, [{"id": SERVER, "command": ["vector-server"]}], specs)
    clock.autojump_threshold = math.inf  # the default; time moves only where a step says
    with trio.fail_after(DEADLINE_S), trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            server.nursery = nursery
            # no status file: its writer wakes the host every second of real time, so the host
            # would never sit idle for HANG_S and a hung step would never be told
            async with Host.open(cfg, status_file=False) as host:
                h = Harness(host, server, model, clock, agents)
                nursery.start_soon(h.watch)
                for name in agents:
                    await host.hold(name)
                await h.connected()
                yield h
            scope.cancel()


@pytest.mark.parametrize(("case", "variant"), host_variants())
async def test_vector_over_the_host(
    case: dict[str, Any],
    variant: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mock_clock: trio.testing.MockClock,
) -> None:
    reason = UNEXERCISED.get((case["id"], variant["name"]))
    if reason is not None:
        pytest.skip(f"case {case['id']} ({variant['name']}): unexercised: {reason}")
    async with harness(tmp_path, monkeypatch, mock_clock, variant["setup"]) as h:
        seen: dict[str, Any] = {}
        for step in variant["steps"]:
            obs = await h.run(step)
            seen[step["id"]] = json.loads(json.dumps(obs))
            for check in step.get("checks", []):
                h.check(check, obs, seen)


def test_every_host_variant_is_run_or_named() -> None:
    names = {(c.values[0]["id"], c.values[1]["name"]) for c in host_variants()}
    assert len(names) == 24
    assert set(UNEXERCISED) <= names


def push(event_id: str, text: str, **coalesce: Any) -> dict[str, Any]:
    """A ``send`` step of a coalesced push of the ``doc`` feature set."""
    params = {
        "featureSet": "doc",
        "eventId": event_id,
        "timestamp": "2026-01-01T00:00:00Z",
        "coalesce": coalesce,
        "payload": {"content": [{"type": "text", "text": text}]},
    }
    return {"op": "send", "method": "push/event", "params": params}


async def test_a_cause_displaced_while_its_wake_waits_starts_no_inference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # Case 43's rule without a gate: the wake of an unread push waits in the agent's buffer
    # (its turns held) when the push is retracted; the withdrawn wake starts nothing, while
    # another cause still does.
    async with harness(tmp_path, monkeypatch, mock_clock, {}) as h:
        await h.run(push("a", "GONE", key="K"))
        await h.run(push("z", "", key="K", retract=True))
        obs = await h.run({"op": "turn"})
        assert obs["modelCalls"] == 0
        assert "GONE" not in obs["allContextText"]
        await h.run(push("b", "KEPT", key="J"))
        obs = await h.run({"op": "turn"})
        assert obs["modelCalls"] == 1 and "KEPT" in obs["requestText"]
        assert "GONE" not in obs["allRequestText"]


async def test_held_turns_wait_for_release_and_then_run_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    async with harness(tmp_path, monkeypatch, mock_clock, {}) as h:
        host = h.host
        assert await host.hold("agent") is False  # the harness holds it already
        await host.post_local("agent", "one")
        await h.run(push("p", "two", key="K"))
        assert h.model.requests == []  # stored, waiting
        assert await host.release("agent") is True
        await h.settle()
        assert len(h.model.requests) == 1  # both wakes in one turn
        assert "one" in h.model.requests[0][1] and "two" in h.model.requests[0][1]
        assert await host.release("agent") is False


def deferred(event_id: str, text: str) -> dict[str, Any]:
    """A ``send`` step of a deferred notice of subject ``K`` (``text`` is its fallback)."""
    return push(event_id, text, key="K", deferred=True)


async def test_a_render_that_landed_before_an_agent_assembled_still_starts_its_inference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # Case 25 with b's turn beginning only after agent's render of their batch completed (as a
    # slow store read can make it under load): the render is still one, and b, whose wake
    # the batch caused, still reads what materialized in its context.
    async with harness(tmp_path, monkeypatch, mock_clock, {"agents": ["agent", "b"]}) as h:
        await h.run({"op": "render", "plan": {"mode": "immediate", "text": "RENDERED"}})
        await h.run(deferred("n1", "FALLBACK"))
        await h.run({"op": "suppressWake", "agent": "b"})
        obs = await h.run({"op": "turn"})
        assert obs["modelCalls"] == 1 and "RENDERED" in obs["contexts"]["b"]
        obs = await h.run({"op": "turn"})
        assert len(obs["renders"]) == 1
        assert [who for who, _ in h.model.requests] == ["agent", "b"]
        assert "RENDERED" in obs["requestText"] and "FALLBACK" not in obs["allRequestText"]
        # told once: b's next turn caused only by a render that landed nothing runs no inference
        await h.run({"op": "render", "plan": {"mode": "empty"}})
        await h.run(deferred("n2", "FALLBACK_TWO"))
        obs = await h.run({"op": "turn"})
        assert obs["modelCalls"] == 2 and len(obs["renders"]) == 2


async def test_agents_told_of_a_landed_render_are_bounded_oldest_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # At the cap the agent told longest ago is forgotten: its turn caused only by the batch
    # runs no inference, though what landed stays in its context for the next one.
    monkeypatch.setattr(CoalescerActor, "max_landed", 1)
    async with harness(tmp_path, monkeypatch, mock_clock, {"agents": ["agent", "b", "c"]}) as h:
        await h.run({"op": "render", "plan": {"mode": "immediate", "text": "RENDERED"}})
        await h.run(deferred("n1", "FALLBACK"))
        await h.run({"op": "suppressWake", "agent": "b"})
        await h.run({"op": "suppressWake", "agent": "c"})
        await h.run({"op": "turn"})
        obs = await h.run({"op": "turn"})
        assert [who for who, _ in h.model.requests] == ["agent", "c"]
        assert "RENDERED" in obs["contexts"]["b"]


async def test_a_step_waiting_for_time_no_vector_passes_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    # The clock never jumps by itself: a step that would wait for a render's timeout the vector
    # does not pass (here: waiting for the host to be idle while the render is held) fails.
    monkeypatch.setattr("tests.integration.test_coalesce_vectors_host.HANG_S", 0.5)
    with pytest.raises(BaseExceptionGroup) as caught:
        async with harness(tmp_path, monkeypatch, mock_clock, {}) as h:
            await h.run({"op": "render", "plan": {"mode": "held"}})
            await h.run(deferred("n1", "FALLBACK"))
            await h.run({"op": "startTurn"})
            h.turn_open = False  # as if the step did not know of the open turn
            await h.settle()
    assert caught.group_contains(AssertionError, match="hung for 0.5s .*'op': 'startTurn'")
    assert trio.current_time() == 0  # the render did not time out meanwhile
