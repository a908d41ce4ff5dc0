"""RFC-006 conformance vectors (``event-coalescing-vectors.json``) over ``protocol.coalesce``.

A small *model host* drives the coalescer the way mcplive's actors will: contexts are lists of
occurrence texts (one per agent, every agent hears every server), an assembly builds a request
text from a context and tells the coalescer what it included, a scripted render server answers
``push/render`` as the vector's ``render`` plan says, and a restart is a replay of the journal
(``restart`` / ``kill``: :meth:`Coalescer.replay` then :meth:`Coalescer.recover`). The model
host's own observations (replies, request texts, contexts, renders, model calls, its fixed
policy) answer the checks.

Classification of the 80 variants (asserted by ``test_tally``, printed with ``-s``):

* **53 pass purely**: 1, 1a, 2, 3, 6, 7, 8, 9, 10, 14, 15, 15a, 16, 17, 18, 19, 21 (rpc-error,
  timeout), 22, 23, 27 (server-fixture: the notice-summary server is the scripted one here),
  27a-27j (27e both variants), 28-33, 34 (both), 34a, 34b, 35, 37 (advisory: executed, no
  mandatory checks), 38, 40 (all four), 42, 46, 47, 48 (a reconnect keeps the binding, so to
  the coalescer ``reconnectWithWindow`` is a new advertisement).
* **24 need the host** and run over it in
  ``tests/integration/test_coalesce_vectors_host.py`` (all 24 pass there), named here by the
  first setup key, op or check that needs it:
  setup ``gate`` 5 (43: wake policy), ``turn`` 4 (20 only-cause, 20a both, 25: the host's wake
  decides whether and for whom an inference runs), ``grant`` 2 (13, 24 during-render: channel
  authority and -32017), ``disconnect`` 2 (39, 41), setup ``errorPolicy`` (4: failing model),
  setup ``compression`` (5), ``channelTool`` (11), setup ``conversations`` (12: audience
  routing), ``queueInference`` (20 host-cause), check ``servers.editor.connected`` (21
  disconnected), ``wait`` (23 supporting: real time), ``disableFeature`` (24 before-assembly),
  render mode ``inference-request`` (26: the host refuses ``inference/request`` during a
  render, -32600), check ``event``/``metadata`` (45: reply-target provenance is stored
  metadata, not coalescing state), ``suppressWake`` (49).
* **3 are unexercised** by profile requirement: ``hard-subject-limit`` (34c: this coalescer
  evicts the least recently touched subject instead of capping), ``timing-observation`` (36),
  ``finite-wake-postponement-bound`` + ``paired-debounce-control`` (44).

``startTurn`` / ``waitRender`` / ``releaseRender`` / ``joinTurn`` are modelled: the test starts
the agent's assembly itself (no wake decision is involved), a held render stays outstanding
until released, and ``joinTurn`` is the render timeout firing followed by the request, which
runs only if the context holds unread content (revision 8: nothing materialized and no other
cause, no inference).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from protocol.coalesce import (
    Advertisement,
    Append,
    Audit,
    CoalesceInvalid,
    Coalescer,
    Hide,
    Materialize,
    RequestRender,
    Step,
    parse_coalesce,
)
from tests.conformance import load_vectors

DATA: dict[str, Any] = load_vectors("event-coalescing-vectors.json")
CASES: list[dict[str, Any]] = DATA["cases"]

# Profile capabilities this coalescer (and the model host over it) genuinely constructs.
IMPLEMENTED = {
    "initial-history-none",
    "untracked-history-unknown",
    "conservative-recovery",
    "retain-64-notices",
    "materialized-unread",
    "restart-without-history",
    "per-context-consumption",
    "unadvertised-channel-scoped-push",
    "changing-advertised-retry-window",
}

PURE_OPS = {
    "send",
    "assemble",
    "render",
    "register",
    "startTurn",
    "waitRender",
    "releaseRender",
    "joinTurn",
    "observe",
    "restart",
    "kill",
    "restartWithoutHistory",
    "materializeWithoutConsume",
    "consumeContext",
    "reassign",
    "advertiseWindow",
    "reconnectWithWindow",
    "advanceClock",
}
PURE_SETUP = {"servers", "agents", "eventCoalescing"}
PURE_ROOTS = {
    "reply",
    "requestText",
    "allRequestText",
    "allContextText",
    "contexts",
    "renders",
    "modelCalls",
    "agents",
}
PURE_SERVER_LEAVES = {"operatorPolicy", "binding"}
PREDICATES = {
    "eq",
    "includes",
    "excludes",
    "counts",
    "order",
    "oneOf",
    "exactlyOneOf",
    "gte",
    "sameAs",
    "recoveryContent",
    "recoveryFrom",
}
HOST_RENDER_MODES = {"inference-request"}
DEFAULT_PLAN = {"mode": "immediate", "text": "RENDERED"}


def classify(variant: dict[str, Any]) -> tuple[str, str] | None:
    """``None`` when the pure harness runs it, else ``(kind, reason)``."""
    missing = [r for r in variant["requires"] if r not in IMPLEMENTED]
    if missing:
        return "unexercised", "requires " + ", ".join(missing)
    for key in variant["setup"]:
        if key not in PURE_SETUP:
            return "host", f"setup {key}"
    for step in variant["steps"]:
        op = step["op"]
        if op not in PURE_OPS:
            return "host", f"op {op} ({step['id']})"
        if op == "render" and step["plan"]["mode"] in HOST_RENDER_MODES:
            return "host", f"render mode {step['plan']['mode']} ({step['id']})"
        for check in step.get("checks", []):
            extra = set(check) - PREDICATES - {"path"}
            if extra or "path" not in check:
                return "host", f"check {'/'.join(sorted(extra))} ({step['id']})"
            parts = check["path"].split(".")
            if parts[0] not in PURE_ROOTS and not (
                parts[0] == "servers" and parts[-1] in PURE_SERVER_LEAVES
            ):
                return "host", f"check path {check['path']} ({step['id']})"
    return None


VARIANTS = [
    pytest.param(case, variant, id=f"{case['id']}-{variant['name']}")
    for case in CASES
    for variant in case["variants"]
]


class HarnessError(Exception):
    """The harness could not execute a step (never a pass)."""


def _text(blocks: Any) -> str:
    return "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict))


class ModelHost:
    """Contexts as lists of occurrence texts over one coalescer, with a scripted renderer."""

    def __init__(self, setup: dict[str, Any]) -> None:
        self.servers: list[str] = list(setup.get("servers", ["editor"]))
        self.bindings = {s: f"{s}#1" for s in self.servers}
        self.agents: list[str] = list(setup.get("agents", ["agent"]))
        self.advertised = Advertisement.from_wire(setup.get("eventCoalescing", True))
        self.journal: list[dict[str, Any]] = []
        self.co = Coalescer()
        self.contexts: dict[str, list[dict[str, Any]]] = {a: [] for a in self.agents}
        self.texts: dict[str, str] = {}
        self.requests: list[str] = []
        self.renders: list[dict[str, Any]] = []
        self.plan: dict[str, Any] = dict(DEFAULT_PLAN)
        self.held: list[dict[str, Any]] = []  # outstanding held renders, oldest first
        self.materialized: Counter[str] = Counter()
        self.turn: dict[str, Any] | None = None
        self.now = 1_000_000
        self.seq = 0
        self.registered: set[str] = set()
        self.apply(self.co.advertise(self.advertised))

    # -- effects

    def apply(self, step: Step) -> list[RequestRender]:
        self.journal.extend(step.records)
        asked = []
        for effect in step.effects:
            if isinstance(effect, Append):
                for agent in sorted(effect.contexts):
                    item = {"id": effect.occurrence, "text": self.texts[effect.occurrence]}
                    self.contexts[agent].append(item | {"consumed": False})
            elif isinstance(effect, Hide):
                for agent in effect.contexts:
                    items = [i for i in self.contexts[agent] if i["id"] == effect.occurrence]
                    assert items and not any(i["consumed"] for i in items), effect
                    self.contexts[agent] = [
                        i for i in self.contexts[agent] if i["id"] != effect.occurrence
                    ]
            elif isinstance(effect, Materialize):
                self.materialized[effect.batch] += 1
                assert self.materialized[effect.batch] == 1, "materialized twice"
                self.texts[effect.occurrence] = _text(effect.content)
                for agent in sorted(effect.contexts):
                    item = {"id": effect.occurrence, "text": self.texts[effect.occurrence]}
                    self.contexts[agent].append(item | {"consumed": False})
            elif isinstance(effect, RequestRender):
                self.renders.append({"params": json.loads(json.dumps(effect.params))})
                asked.append(effect)
            else:
                assert isinstance(effect, Audit)
        return asked

    def serve(self, asked: list[RequestRender]) -> list[dict[str, Any]]:
        """The scripted render server answers; held renders stay outstanding."""
        held = []
        for request in asked:
            plan = self.plan.get("byKey", {}).get(request.params["key"], self.plan)
            mode = plan["mode"]
            text = plan.get("text", self.plan.get("text", "RENDERED"))
            if mode == "immediate":
                step = self.co.render_result(
                    request.batch, [{"type": "text", "text": text}], authorized=True
                )
            elif mode == "empty":
                step = self.co.render_result(request.batch, [], authorized=True)
            elif mode == "error":
                step = self.co.render_failed(request.batch, reason="error", authorized=True)
            elif mode == "notice-summary":
                p = request.params
                summary = f"NOTICES={len(p['notices'])} DROPPED={p['dropped']}"
                step = self.co.render_result(
                    request.batch, [{"type": "text", "text": summary}], authorized=True
                )
            elif mode == "held":
                entry = {"batch": request.batch, "released": False, "timed_out": False}
                self.held.append(entry)
                held.append(entry)
                continue
            else:
                raise HarnessError(f"render mode {mode}")
            self.apply(step)
        return held

    def time_out(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            if not entry["released"] and not entry["timed_out"]:
                entry["timed_out"] = True
                self.apply(self.co.render_failed(entry["batch"], reason="timeout", authorized=True))

    def begin(self, agent: str) -> list[dict[str, Any]]:
        return self.serve(self.apply(self.co.begin_assembly(agent)))

    def request(self, agent: str) -> None:
        items = self.contexts[agent]
        self.requests.append(json.dumps([i["text"] for i in items], ensure_ascii=False))
        for item in items:
            item["consumed"] = True
        self.apply(self.co.assembled(agent, [i["id"] for i in items]))

    def restart(self, *, history_lost: bool = False) -> None:
        self.co = Coalescer.replay(self.journal)
        self.held, self.turn = [], None
        self.apply(self.co.recover(history_lost=history_lost))

    # -- lanes

    def mint(self) -> str:
        self.seq += 1
        return f"o{self.seq}"

    def push(self, params: dict[str, Any], server: str) -> dict[str, Any]:
        content = params.get("payload", {}).get("content", [])
        occurrence = self.mint()
        self.texts[occurrence] = _text(content)
        if "coalesce" not in params:
            self.apply(Step(outcome=None, effects=(Append(occurrence, frozenset(self.agents)),)))
            return {"result": {"accepted": True}}
        spec = parse_coalesce(
            params["coalesce"],
            lane="push",
            advertised=self.advertised,
            event_id=params.get("eventId"),
        )
        if isinstance(spec, CoalesceInvalid):
            return {
                "error": {"code": -32602, "message": "Invalid params", "data": spec.error_data()}
            }
        step = self.co.admit(
            spec,
            binding=self.bindings[server],
            occurrence=occurrence,
            contexts=self.agents,
            now=self.now,
            feature_set=params["featureSet"],
            content=content,
            timestamp=params.get("timestamp", ""),
            tags=params.get("tags", ()),
            origin=params.get("origin"),
        )
        self.apply(step)
        return {"result": {"accepted": True, "coalesce": step.result()}}

    def incoming(self, params: dict[str, Any], server: str) -> dict[str, Any]:
        results = []
        for message in params["messages"]:
            occurrence = self.mint()
            self.texts[occurrence] = _text(message.get("content", []))
            base = {"messageId": message["messageId"]}
            if "coalesce" not in message:
                self.apply(
                    Step(outcome=None, effects=(Append(occurrence, frozenset(self.agents)),))
                )
                results.append(base | {"accepted": True})
                continue
            spec = parse_coalesce(
                message["coalesce"],
                lane="incoming",
                advertised=self.advertised,
                event_id=message.get("eventId"),
            )
            if isinstance(spec, CoalesceInvalid):
                results.append(base | {"accepted": False, "reason": "coalesce_invalid"})
                continue
            step = self.co.admit(
                spec,
                binding=self.bindings[server],
                occurrence=occurrence,
                contexts=self.agents,
                now=self.now,
                channel_id=message["channelId"],
                content=message.get("content", []),
            )
            self.apply(step)
            results.append(base | {"accepted": True, "coalesce": step.result()})
        return {"result": {"results": results}}

    # -- ops

    def run(self, step: dict[str, Any]) -> dict[str, Any]:
        op = step["op"]
        agent = self.agents[0]
        reply = None
        if op == "send":
            server = step.get("server", self.servers[0])
            if step["method"] == "push/event":
                reply = self.push(step["params"], server)
            else:
                reply = self.incoming(step["params"], server)
        elif op == "assemble":
            self.time_out(self.begin(agent))
            self.request(agent)
        elif op == "consumeContext":
            self.time_out(self.begin(step["agent"]))
            self.request(step["agent"])
        elif op == "materializeWithoutConsume":
            self.time_out(self.begin(agent))
        elif op == "render":
            self.plan = step["plan"]
        elif op == "startTurn":
            if self.turn is not None:
                raise HarnessError("a turn is already running")
            self.turn = {"agent": agent, "held": self.begin(agent)}
        elif op == "waitRender":
            if len(self.renders) < step["count"]:
                raise HarnessError(f"only {len(self.renders)} renders were requested")
        elif op == "releaseRender":
            waiting = [e for e in self.held if not e["released"]]
            if not waiting:
                raise HarnessError("no held render to release")
            waiting[0]["released"] = True
            content = [{"type": "text", "text": step["text"]}]
            self.apply(self.co.render_result(waiting[0]["batch"], content, authorized=True))
        elif op == "joinTurn":
            if self.turn is None:
                raise HarnessError("no turn to join")
            self.time_out(self.turn["held"])
            if any(not i["consumed"] for i in self.contexts[self.turn["agent"]]):
                self.request(self.turn["agent"])
            self.turn = None
        elif op in ("restart", "kill"):
            self.restart()
        elif op == "restartWithoutHistory":
            self.restart(history_lost=True)
        elif op == "reassign":
            server = step.get("server", self.servers[0])
            self.bindings[server] = f"{server}#reassigned{self.seq}"
        elif op in ("advertiseWindow", "reconnectWithWindow"):
            # a reconnect keeps the binding: to the coalescer it is the new advertisement
            self.advertised = Advertisement(
                push_events=self.advertised.push_events,
                channels_incoming=self.advertised.channels_incoming,
                deferred=self.advertised.deferred,
                channel_scoped_push=self.advertised.channel_scoped_push,
                retry_window_ms=step["ms"],
            )
            self.apply(self.co.advertise(self.advertised))
        elif op == "advanceClock":
            self.now += step["ms"]
        elif op == "register":
            self.registered.add(step["channel"])
        elif op != "observe":
            raise HarnessError(f"op {op}")
        return self.observe(reply)

    def observe(self, reply: dict[str, Any] | None) -> dict[str, Any]:
        contexts = {
            a: json.dumps([i["text"] for i in items], ensure_ascii=False)
            for a, items in self.contexts.items()
        }
        obs: dict[str, Any] = {
            "allRequestText": "\n".join(self.requests),
            "allContextText": "\n".join(contexts.values()),
            "contexts": contexts,
            "renders": json.loads(json.dumps(self.renders)),
            "modelCalls": len(self.requests),
            "agents": list(self.agents),
            "servers": {
                s: {
                    "binding": self.bindings[s],
                    "operatorPolicy": {"eventCoalescing": self.advertised.to_wire()},
                }
                for s in self.servers
            },
        }
        if self.requests:
            obs["requestText"] = self.requests[-1]
        if reply is not None:
            obs["reply"] = reply
        return obs


_MISSING = object()


def resolve(root: Any, path: str) -> Any:
    value = root
    for part in path.split("."):
        if isinstance(value, list) and part == "length":
            value = len(value)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return _MISSING
    return value


def evaluate(check: dict[str, Any], obs: dict[str, Any], seen: dict[str, Any]) -> None:
    path = check["path"]
    value = resolve(obs, path)
    assert value is not _MISSING, f"{path} is not observed"
    if "eq" in check:
        assert value == check["eq"], f"{path}: {value!r} != {check['eq']!r}"
    if "oneOf" in check:
        assert value in check["oneOf"], f"{path}: {value!r} not in {check['oneOf']!r}"
    if "gte" in check:
        assert value >= check["gte"], f"{path}: {value!r} < {check['gte']!r}"
    if "sameAs" in check:
        step_id, _, rest = check["sameAs"].partition(".")
        other = resolve(seen[step_id], rest)
        assert other is not _MISSING and value == other, f"{path}: {value!r} != {other!r}"
    text_checks = {"includes", "excludes", "counts", "order", "exactlyOneOf", "recoveryContent"}
    if text_checks & set(check):
        assert isinstance(value, str), f"{path} is not text"
    for needle in check.get("includes", ()):
        assert needle in value, f"{path} lacks {needle!r}: {value}"
    for needle in check.get("excludes", ()):
        assert needle not in value, f"{path} holds {needle!r}: {value}"
    for needle, count in check.get("counts", {}).items():
        assert value.count(needle) == count, f"{path}: {needle!r} x{value.count(needle)}"
    if "order" in check:
        places = [value.find(n) for n in check["order"]]
        assert -1 not in places and places == sorted(places), f"{path} order: {value}"
    if "exactlyOneOf" in check:
        counts = [value.count(n) for n in check["exactlyOneOf"]]
        assert sorted(counts)[-1] == 1 and sum(counts) == 1, f"{path}: {counts}"
    if "recoveryContent" in check:
        old, new = check["recoveryContent"]
        step_id, _, rest = check["recoveryFrom"].partition(".")
        outcome = resolve(seen[step_id], rest)
        assert value.count(new) == 1
        if outcome == "replaced":
            assert old not in value
        else:
            assert outcome == "appended" and value.count(old) == 1
            assert value.find(old) < value.find(new)


def run_variant(variant: dict[str, Any]) -> None:
    host = ModelHost(variant["setup"])
    seen: dict[str, Any] = {}
    for step in variant["steps"]:
        obs = host.run(step)
        seen[step["id"]] = json.loads(json.dumps(obs))
        for check in step.get("checks", []):
            evaluate(check, obs, seen)


@pytest.mark.parametrize(("case", "variant"), VARIANTS)
def test_vector(case: dict[str, Any], variant: dict[str, Any]) -> None:
    why = classify(variant)
    if why is not None:
        kind, reason = why
        label = "unexercised" if kind == "unexercised" else "runs over the host"
        pytest.skip(f"case {case['id']} ({variant['name']}): {label}: {reason}")
    run_variant(variant)


def tally() -> tuple[Counter[str], Counter[str], Counter[str]]:
    outcome: Counter[str] = Counter()
    host: Counter[str] = Counter()
    unexercised: Counter[str] = Counter()
    for case in CASES:
        for variant in case["variants"]:
            why = classify(variant)
            if why is None:
                outcome["pure"] += 1
            elif why[0] == "host":
                outcome["host"] += 1
                host[why[1].split(" (")[0]] += 1
            else:
                outcome["unexercised"] += 1
                unexercised[why[1]] += 1
    return outcome, host, unexercised


def test_tally() -> None:
    outcome, host, unexercised = tally()
    print(f"\nRFC-006 vectors: {sum(outcome.values())} variants in {len(CASES)} cases")
    print(f"  pass purely: {outcome['pure']}")
    print(f"  need the host: {outcome['host']}")
    for reason, n in host.most_common():
        print(f"    {n} x {reason}")
    print(f"  unexercised (profile): {outcome['unexercised']}")
    for reason, n in unexercised.most_common():
        print(f"    {n} x {reason}")
    assert len(CASES) == 65 and sum(outcome.values()) == 80
    assert outcome == Counter(pure=53, host=24, unexercised=3)
    assert host["setup gate"] == 5 and host["op turn"] == 4


def test_every_case_is_a_row_of_the_rfc() -> None:
    ids = [c["id"] for c in CASES]
    assert len(set(ids)) == len(ids) == 65
    assert {c["kind"] for c in CASES} == {"host", "server-fixture", "advisory"}
    for case in CASES:
        assert case["contract"].startswith(case["id"] + ". ")


def test_the_harness_refuses_to_fake() -> None:
    # An op the model host cannot perform is an error, never a silent pass.
    host = ModelHost({})
    with pytest.raises(HarnessError):
        host.run({"op": "turn", "id": "x"})
    with pytest.raises(HarnessError):
        host.run({"op": "joinTurn", "id": "x"})
    # A failing check fails.
    with pytest.raises(AssertionError):
        evaluate({"path": "modelCalls", "eq": 1}, host.observe(None), {})
    with pytest.raises(AssertionError):
        evaluate({"path": "requestText", "includes": ["X"]}, host.observe(None), {})
