"""The server side of an MCPL link, without I/O: handshake, grants, refusals, both id spaces."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from protocol import server_session as ss
from protocol.errors import CAPABILITY_DENIED, INVALID_PARAMS, RpcError
from protocol.manifest import manifest_digest
from protocol.mcpl import VOCABULARY, advertised_paths, declared_feature_sets
from protocol.server_manifest import FeatureSetDecl, build_manifest, changed_domains

SETS = [
    FeatureSetDecl(name="demo", description="events", uses=("pushEvents", "channels.incoming")),
    FeatureSetDecl(name="demo.ask", description="asks", uses=("inferenceRequest",)),
]
CAPS = {"pushEvents", "channels.incoming", "channels.register", "inferenceRequest"}


def session() -> ss.ServerSession:
    return ss.ServerSession(
        name="demo", version="1.0", manifest=build_manifest(CAPS, SETS), feature_sets=SETS
    )


def line(obj: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", **obj})


def wire(event: ss.Event) -> dict[str, Any]:
    assert isinstance(event, ss.Outgoing)
    out: dict[str, Any] = json.loads(event.line)
    return out


def handshake(s: ss.ServerSession, granted: list[str], enabled: list[str] | None = None) -> None:
    s.receive_line(
        line({"id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05"}})
    )
    s.receive_line(line({"method": "notifications/initialized"}))
    params: dict[str, Any] = {"effectiveCapabilities": granted}
    if enabled is not None:
        params["enabled"] = enabled
    s.receive_line(line({"id": 2, "method": "featureSets/update", "params": params}))


PUSH = {"featureSet": "demo", "eventId": "e1", "timestamp": "t", "payload": {"content": []}}


def test_initialize_answers_the_manifest_the_host_reads_back() -> None:
    s = session()
    [out] = s.receive_line(
        line({"id": 1, "method": "initialize", "params": {"protocolVersion": "2024-11-05"}})
    )
    result = wire(out)["result"]
    manifest = result["capabilities"]["experimental"]["mcpl"]
    assert result["protocolVersion"] == "2024-11-05" and result["serverInfo"]["name"] == "demo"
    assert advertised_paths(manifest, result["capabilities"]) == CAPS
    assert set(declared_feature_sets(manifest).sets) == {"demo", "demo.ask"}
    assert manifest["revision"] == manifest_digest(manifest)
    again, served = s.receive_line(line({"id": 9, "method": "mcpl/manifest"}))
    assert wire(again)["result"] == manifest and served == ss.ManifestServed()


def test_nothing_is_granted_before_the_policy_and_the_refusal_writes_nothing() -> None:
    s = session()
    with pytest.raises(ss.NotGranted, match="has not sent its grant"):
        s.request("push/event", PUSH, now=0, timeout=1)
    assert s.pending_count == 0


def test_a_grant_admits_exactly_what_it_names() -> None:
    s = session()
    handshake(s, ["pushEvents", "channels.incoming"])
    _, text = s.request("push/event", PUSH, now=0, timeout=1)
    assert json.loads(text)["method"] == "push/event"
    with pytest.raises(ss.NotGranted, match="'inferenceRequest', which the host has not granted"):
        s.request("inference/request", {"featureSet": "demo.ask", "messages": []}, now=0, timeout=1)
    with pytest.raises(ss.NotGranted, match=r"'channels\.register'"):
        s.notify("channels/changed", {"added": []})
    with pytest.raises(ss.NotGranted, match="not declared"):
        s.request("push/event", {**PUSH, "featureSet": "other"}, now=0, timeout=1)
    assert s.pending_count == 1


def test_a_set_the_host_did_not_enable_refuses_its_sends() -> None:
    s = session()
    handshake(s, ["pushEvents", "channels.incoming"], enabled=[])
    with pytest.raises(ss.NotGranted, match="has not enabled feature set 'demo'"):
        s.request("push/event", PUSH, now=0, timeout=1)


def test_the_receipt_reports_sets_the_grant_cannot_run() -> None:
    s = session()
    handshake(s, [])
    s2 = session()
    s2.receive_line(line({"id": 1, "method": "initialize", "params": {}}))
    [receipt, changed] = s2.receive_line(
        line(
            {
                "id": 2,
                "method": "featureSets/update",
                "params": {"effectiveCapabilities": ["pushEvents"]},
            }
        )
    )
    body = wire(receipt)["result"]
    assert body["accepted"] is True and body["mode"] == "degraded"
    assert {u["featureSet"] for u in body["unavailableFeatures"]} == {"demo", "demo.ask"}
    assert isinstance(changed, ss.GrantChanged) and changed.grant.allows("pushEvents")


def test_a_malformed_policy_is_refused_and_changes_nothing() -> None:
    s = session()
    handshake(s, ["pushEvents", "channels.incoming"])
    both = {"effectiveCapabilities": ["pushEvents"], "deniedCapabilities": ["pushEvents"]}
    out = s.receive_line(line({"id": 3, "method": "featureSets/update", "params": both}))
    assert wire(out[0])["error"]["code"] == INVALID_PARAMS
    s.request("push/event", PUSH, now=0, timeout=1)


def test_a_notification_of_the_policy_only_narrows() -> None:
    s = session()
    handshake(s, ["pushEvents", "channels.incoming"])
    widen = {"effectiveCapabilities": ["pushEvents", "channels.incoming", "inferenceRequest"]}
    s.receive_line(line({"method": "featureSets/update", "params": widen}))
    assert not s.grant.allows("inferenceRequest")
    s.receive_line(line({"method": "featureSets/update", "params": {"disabled": ["demo"]}}))
    with pytest.raises(ss.NotGranted):
        s.request("push/event", PUSH, now=0, timeout=1)


def test_removed_methods_are_refused_and_others_reach_the_server() -> None:
    s = session()
    [out, skipped] = s.receive_line(
        line({"id": 4, "method": "context/afterInference", "params": {}})
    )
    assert wire(out)["error"]["code"] == -32601 and isinstance(skipped, ss.Skipped)
    [call] = s.receive_line(line({"id": 5, "method": "tools/call", "params": {"name": "x"}}))
    assert call == ss.HostCall(5, "tools/call", {"name": "x"})
    assert json.loads(s.answer(5, {"content": []}))["id"] == 5


def test_the_manifest_change_names_its_domains() -> None:
    s = session()
    handshake(s, ["pushEvents"])
    more = [*SETS, FeatureSetDecl(name="demo.more", description="more", uses=("pushEvents",))]
    manifest = build_manifest(CAPS, more)
    note = s.replace_manifest(manifest, more)
    assert note is not None
    params = json.loads(note)["params"]
    assert params == {"revision": manifest["revision"], "domains": ["featureSets"]}
    assert s.replace_manifest(manifest, more) is None  # unchanged: nothing to say
    assert changed_domains({}, {"pushEvents": True}) == ["capabilities"]


def test_declarations_refuse_paths_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="not capability paths"):
        FeatureSetDecl(name="x", description="", uses=("channels",))
    with pytest.raises(ValueError, match="does not advertise"):
        build_manifest(
            {"pushEvents"}, [FeatureSetDecl(name="x", description="", uses=("channels.publish",))]
        )


# -- both id spaces under any interleaving ----------------------------------------------------

HOST_METHODS = ["tools/call", "channels/publish", "context/beforeInference", "tools/list"]
OUR_METHODS = ["push/event", "channels/incoming"]


class Correlation(RuleBasedStateMachine):
    """Host and server both number requests from 1; every answer reaches its own asker."""

    def __init__(self) -> None:
        super().__init__()
        self.s = session()
        handshake(self.s, ["pushEvents", "channels.incoming"])
        self.host_next = 3  # the host used 1 and 2 in the handshake
        self.ours: dict[Any, str] = {}  # our pending request id -> method
        self.owed: dict[Any, str] = {}  # host request id -> method, awaiting our answer

    @rule(method=st.sampled_from(HOST_METHODS))
    def host_asks(self, method: str) -> None:
        rid = self.host_next
        self.host_next += 1
        [event] = self.s.receive_line(line({"id": rid, "method": method, "params": {}}))
        assert event == ss.HostCall(rid, method, {})
        self.owed[rid] = method

    @rule(method=st.sampled_from(OUR_METHODS))
    def we_ask(self, method: str) -> None:
        rid, text = self.s.request(
            method, PUSH if method == "push/event" else {}, now=0, timeout=60
        )
        assert rid not in self.ours and json.loads(text)["id"] == rid
        self.ours[rid] = method

    @precondition(lambda self: self.ours)
    @rule(data=st.data(), error=st.booleans())
    def host_answers(self, data: st.DataObject, error: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.ours)))
        body = (
            {"error": {"code": CAPABILITY_DENIED, "message": "no"}}
            if error
            else {"result": {"n": rid}}
        )
        [event] = self.s.receive_line(line({"id": rid, **body}))
        method = self.ours.pop(rid)
        if error:
            assert event == ss.Failed(rid, method, RpcError(code=CAPABILITY_DENIED, message="no"))
        else:
            assert event == ss.Answered(rid, method, {"n": rid})

    @precondition(lambda self: self.owed)
    @rule(data=st.data(), error=st.booleans())
    def we_answer(self, data: st.DataObject, error: bool) -> None:
        rid = data.draw(st.sampled_from(sorted(self.owed)))
        text = self.s.answer_error(rid, RpcError(code=-32601)) if error else self.s.answer(rid, {})
        assert json.loads(text)["id"] == rid
        del self.owed[rid]

    @rule(method=st.sampled_from(["inference/lifecycle", "channels/publish", "notifications/x"]))
    def host_notifies(self, method: str) -> None:
        [event] = self.s.receive_line(line({"method": method, "params": {"a": 1}}))
        assert event == ss.HostNotice(method, {"a": 1})

    @rule()
    def host_answers_nothing_of_ours(self) -> None:
        stale = max([*self.ours, 0]) + 1000
        [event] = self.s.receive_line(line({"id": stale, "result": {}}))
        assert isinstance(event, ss.Skipped)

    @invariant()
    def counts_match(self) -> None:
        assert self.s.pending_count == len(self.ours)
        assert self.s.owed_count == len(self.owed)

    def teardown(self) -> None:
        lost = self.s.close()
        assert {x.id: x.method for x in lost} == self.ours


Correlation.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestCorrelation = Correlation.TestCase


@given(st.sets(st.sampled_from(sorted(VOCABULARY - {"tools"}))))
def test_the_host_reads_back_exactly_the_paths_a_server_advertises(paths: set[str]) -> None:
    manifest = build_manifest(paths, [])
    # an object at a path node advertises the node: streaming brings inferenceRequest along
    implied = {"inferenceRequest"} if "inferenceRequest.streaming" in paths else set()
    assert advertised_paths(manifest) == paths | implied
    assert manifest["revision"] == manifest_digest(manifest)
