"""A server session told to hand over the answers it would write itself (``defer``)."""

from __future__ import annotations

import json

from protocol import server_session as ss
from protocol.server_manifest import build_manifest
from tests.protocol.test_server_session import CAPS, SETS, line, session, wire


def deferring(*methods: str) -> ss.ServerSession:
    return ss.ServerSession(
        name="demo",
        version="1.0",
        manifest=build_manifest(CAPS, SETS),
        feature_sets=SETS,
        defer=methods,
    )


def test_a_deferred_update_is_handed_over_with_its_receipt_and_still_grants() -> None:
    s = deferring("featureSets/update")
    s.receive_line(line({"id": 1, "method": "initialize", "params": {}}))
    params = {"effectiveCapabilities": ["pushEvents", "channels.incoming"]}
    call, changed = s.receive_line(
        line({"id": 2, "method": "featureSets/update", "params": params})
    )
    assert isinstance(call, ss.HostCall) and call.id == 2 and call.params == params
    plain = session()
    plain.receive_line(line({"id": 1, "method": "initialize", "params": {}}))
    written = plain.receive_line(line({"id": 2, "method": "featureSets/update", "params": params}))
    assert call.default == wire(written[0])["result"] and call.default["accepted"] is True
    assert isinstance(changed, ss.GrantChanged) and changed.grant.allows("pushEvents")
    # the caller answers, or not: nothing was written for it
    assert json.loads(s.answer(2, call.default))["result"] == call.default
    assert s.owed_count == 0


def test_the_default_is_what_the_session_would_have_answered() -> None:
    plain, deferred = session(), deferring("initialize", "ping", "mcpl/manifest")
    for rid, method in enumerate(("initialize", "ping", "mcpl/manifest"), start=1):
        msg = line({"id": rid, "method": method, "params": {"protocolVersion": "2024-11-05"}})
        written = wire(plain.receive_line(msg)[0])
        handed = deferred.receive_line(msg)[0]
        assert isinstance(handed, ss.HostCall) and handed.method == method
        assert handed.default == written["result"]


def test_methods_not_deferred_are_still_answered_by_the_session() -> None:
    s = deferring("featureSets/update")
    [answer] = s.receive_line(line({"id": 1, "method": "ping"}))
    assert wire(answer) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    # a malformed update is refused by the session even when updates are deferred
    bad = {"effectiveCapabilities": ["pushEvents"], "deniedCapabilities": ["pushEvents"]}
    refused = s.receive_line(line({"id": 2, "method": "featureSets/update", "params": bad}))
    assert wire(refused[0])["error"]["code"] == -32602
