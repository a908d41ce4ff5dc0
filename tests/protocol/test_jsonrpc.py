"""JSON-RPC 2.0 classification, the id-correlating ``RpcSession``, and their properties."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from protocol.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    LocalProtocolError,
    RpcError,
)
from protocol.framing import encode_line
from protocol.jsonrpc import (
    Diagnostic,
    ErrorReceived,
    ErrorResponse,
    Invalid,
    Notification,
    NotificationReceived,
    PendingFull,
    Request,
    RequestAbandoned,
    RequestExpired,
    RequestReceived,
    Response,
    ResponseReceived,
    RpcSession,
    decode,
    encode,
    message_to_wire,
    method_not_found,
    parse_message,
)

EVENT_TYPES = (
    RequestReceived,
    NotificationReceived,
    ResponseReceived,
    ErrorReceived,
    RequestExpired,
    RequestAbandoned,
    Diagnostic,
)


def line(**members: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", **members})


def bare(**members: Any) -> str:
    """A message without the ``jsonrpc`` member."""
    return json.dumps(members)


def wire(text: str) -> dict[str, Any]:
    obj = json.loads(text)
    assert isinstance(obj, dict)
    assert obj["jsonrpc"] == "2.0"
    return obj


def only(events: list[Any]) -> Any:
    assert len(events) == 1, events
    return events[0]


# --- classification ---------------------------------------------------------------------------


def test_request_notification_response_and_error_are_told_apart() -> None:
    assert parse_message(line(id=1, method="tools/list", params={})) == Request(1, "tools/list", {})
    assert parse_message(line(method="notifications/initialized")) == Notification(
        "notifications/initialized"
    )
    assert parse_message(line(id=1, method="m", params=[1, 2])) == Request(1, "m", [1, 2])
    assert parse_message(line(id=1, result={"ok": True})) == Response(1, {"ok": True})
    assert parse_message(line(id=1, result=None)) == Response(1, None)
    err = parse_message(line(id=2, error={"code": -32601, "message": "nope", "data": {"x": 1}}))
    assert isinstance(err, ErrorResponse)
    assert err.id == 2
    assert (err.error.code, err.error.message, err.error.data) == (-32601, "nope", {"x": 1})


def test_method_with_id_is_a_request_even_with_result_or_error() -> None:
    assert parse_message(line(id=1, method="push/event", result={})) == Request(1, "push/event")
    assert parse_message(line(id=1, method="m", error={"code": 1})) == Request(1, "m")
    assert parse_message(line(method="m", result={})) == Notification("m")


@pytest.mark.parametrize("rid", [0, 1, -7, 2**53 + 1, 10**30, "1", "", "abc", "ü-✓", " 1 "])
def test_number_and_string_ids_are_kept_and_echoed_verbatim(rid: int | str) -> None:
    req = parse_message(line(id=rid, method="m"))
    assert isinstance(req, Request)
    assert req.id == rid
    assert type(req.id) is type(rid)
    session = RpcSession()
    assert only(session.receive_line(line(id=rid, method="m"))) == RequestReceived(req)
    out = wire(session.send_response(rid, {"echo": True}))
    assert out["id"] == rid
    assert type(out["id"]) is type(rid)


def test_integral_float_id_is_read_as_the_integer() -> None:
    # 1.0 and 1 are the same JSON number; a peer that writes 1.0 means our request 1.
    assert parse_message(line(id=1.0, method="m")) == Request(1, "m")
    session = RpcSession()
    rid, _ = session.send_request("m", now=0, timeout=1)
    assert only(session.receive_line(line(id=1.0, result=3))) == ResponseReceived(rid, "m", 3)


@pytest.mark.parametrize("bad_id", [True, False, 1.5, None, [1], {"a": 1}, 1e400])
def test_bool_float_null_and_structured_request_ids_are_refused(bad_id: Any) -> None:
    raw_id = "1e400" if bad_id == 1e400 else json.dumps(bad_id)
    text = '{"jsonrpc":"2.0","id":' + raw_id + ',"method":"m"}'
    msg = parse_message(text)
    assert isinstance(msg, Invalid)
    assert msg.reply is not None
    assert msg.reply.id is None
    assert msg.reply.error.code == INVALID_REQUEST
    session = RpcSession()
    diag = only(session.receive_line(text))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is not None
    out = wire(diag.reply)
    assert out["id"] is None
    assert out["error"]["code"] == INVALID_REQUEST
    assert session.inbound_count == 0


@pytest.mark.parametrize("bad_id", [True, 1.5, [1], {"a": 1}])
def test_bool_float_and_structured_response_ids_are_refused_without_reply(bad_id: Any) -> None:
    session = RpcSession()
    session.send_request("m", now=0, timeout=1)
    assert isinstance(parse_message(line(id=bad_id, result=1)), Invalid)
    diag = only(session.receive_line(line(id=bad_id, result=1)))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is None
    assert session.pending_count == 1


def test_result_with_null_id_is_refused_and_error_with_null_id_is_a_diagnostic() -> None:
    assert isinstance(parse_message(line(id=None, result=1)), Invalid)
    assert isinstance(parse_message(line(result=1)), Invalid)
    err = parse_message(line(id=None, error={"code": -32700, "message": "Parse error"}))
    assert isinstance(err, ErrorResponse)
    assert err.id is None
    session = RpcSession()
    session.send_request("m", now=0, timeout=1)
    diag = only(session.receive_line(line(id=None, error={"code": -32700, "message": "x"})))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is None
    assert session.pending_count == 1


def test_message_with_neither_method_result_nor_error_is_refused() -> None:
    assert isinstance(parse_message(line(id=1)), Invalid)
    assert isinstance(parse_message(line()), Invalid)


@pytest.mark.parametrize("version", [None, "1.0", 2.0, "2.0 "])
def test_missing_or_wrong_jsonrpc_member_refuses_a_request_with_an_error_reply(
    version: Any,
) -> None:
    members: dict[str, Any] = {"id": 41, "method": "tools/call"}
    if version is not None:
        members["jsonrpc"] = version
    session = RpcSession()
    diag = only(session.receive_line(json.dumps(members)))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is not None
    out = wire(diag.reply)
    assert out["id"] == 41
    assert out["error"]["code"] == INVALID_REQUEST
    assert "jsonrpc" in out["error"]["message"]
    assert session.inbound_count == 0
    with pytest.raises(LocalProtocolError):
        session.send_response(41, {})


@pytest.mark.parametrize(
    "text",
    [
        bare(method="notifications/initialized"),
        bare(id=1, result={}),
        bare(id=1, error={"code": 1, "message": "x"}),
        json.dumps({"jsonrpc": "1.0", "method": "m"}),
    ],
)
def test_missing_jsonrpc_member_on_a_notification_or_response_gets_no_reply(text: str) -> None:
    session = RpcSession()
    session.send_request("m", now=0, timeout=1)
    diag = only(session.receive_line(text))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is None
    assert session.pending_count == 1


@pytest.mark.parametrize(
    "text", ["[server] Client initialized", "", "{", "{'a': 1}", '{"a":1} trailing', "\x00"]
)
def test_non_json_is_a_diagnostic_without_reply(text: str) -> None:
    diag = only(RpcSession().receive_line(text))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is None
    assert "not JSON" in diag.text


def test_non_json_diagnostic_text_is_clipped() -> None:
    diag = only(RpcSession().receive_line("x" * 10_000))
    assert isinstance(diag, Diagnostic)
    assert len(diag.text) < 300


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '[{"jsonrpc":"2.0","id":1,"method":"m"}]',
        '[{"jsonrpc":"2.0","method":"a"},{"jsonrpc":"2.0","method":"b"}]',
    ],
)
def test_batch_is_refused_with_invalid_request(text: str) -> None:
    session = RpcSession()
    diag = only(session.receive_line(text))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is not None
    out = wire(diag.reply)
    assert out["id"] is None
    assert out["error"]["code"] == INVALID_REQUEST
    assert "batch" in diag.text
    assert session.inbound_count == 0


@pytest.mark.parametrize("text", ["1", '"2.0"', "null", "true"])
def test_json_scalar_is_refused_with_invalid_request(text: str) -> None:
    diag = only(RpcSession().receive_line(text))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is not None
    assert wire(diag.reply)["error"]["code"] == INVALID_REQUEST


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(constant: str) -> None:
    text = '{"jsonrpc":"2.0","id":1,"method":"m","params":{"x":' + constant + "}}"
    with pytest.raises(ValueError):
        decode(text)
    assert isinstance(parse_message(text), Invalid)
    diag = only(RpcSession().receive_line(text))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_encode_refuses_nan(value: float) -> None:
    with pytest.raises(ValueError):
        encode({"x": value})


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_deep_nesting_does_not_raise(depth: int) -> None:
    for text in (
        "[" * depth + "]" * depth,
        '{"jsonrpc":"2.0","id":1,"method":"m","params":' + '{"a":' * depth + "1" + "}" * depth,
        '{"jsonrpc":"2.0","id":1,"method":"m","params":[' + "[" * depth,
    ):
        events = RpcSession().receive_line(text)
        assert all(isinstance(e, Diagnostic) for e in events)


def test_moderate_nesting_is_accepted() -> None:
    params = {"a": json.loads("[" * 200 + "]" * 200)}
    assert parse_message(line(id=1, method="m", params=params)) == Request(1, "m", params)


@pytest.mark.parametrize(
    ("members", "problem"),
    [
        ({"method": ""}, "method"),
        ({"method": 5}, "method"),
        ({"method": None}, "method"),
        ({"method": "m", "params": "x"}, "params"),
        ({"method": "m", "params": 3}, "params"),
    ],
)
def test_malformed_requests_are_answered_and_malformed_notifications_are_not(
    members: dict[str, Any], problem: str
) -> None:
    with_id = only(RpcSession().receive_line(line(id=9, **members)))
    assert isinstance(with_id, Diagnostic)
    assert with_id.reply is not None
    out = wire(with_id.reply)
    assert out["id"] == 9
    assert out["error"]["code"] == INVALID_REQUEST
    assert problem in out["error"]["message"]
    without = only(RpcSession().receive_line(line(**members)))
    assert isinstance(without, Diagnostic)
    assert without.reply is None


def test_params_null_is_the_same_as_absent() -> None:
    assert parse_message(line(id=1, method="m", params=None)) == Request(1, "m", None)


@pytest.mark.parametrize(
    "error", [None, "boom", 5, [], {"message": "no code"}, {"code": "1"}, {"code": 1.5}]
)
def test_malformed_error_object_becomes_invalid_request_with_the_original_as_data(
    error: Any,
) -> None:
    msg = parse_message(line(id=3, error=error))
    assert isinstance(msg, ErrorResponse)
    assert msg.id == 3
    assert msg.error.code == INVALID_REQUEST
    assert msg.error.data == error


def test_error_without_message_gets_the_standard_message() -> None:
    msg = parse_message(line(id=3, error={"code": METHOD_NOT_FOUND, "message": 7}))
    assert isinstance(msg, ErrorResponse)
    assert msg.error.message == "Method not found"


def test_error_helpers() -> None:
    assert method_not_found("x/y").to_wire() == {
        "code": METHOD_NOT_FOUND,
        "message": "Method not found: x/y",
    }
    assert RpcError(code=-1, data=False).to_wire() == {
        "code": -1,
        "message": "Error",
        "data": False,
    }


def test_errors_compare_by_value() -> None:
    assert RpcError(code=1, message="a", data={"x": [1]}) == RpcError(
        code=1, message="a", data={"x": [1]}
    )
    assert RpcError(code=1, message="a") != RpcError(code=1, message="b")
    assert RpcError(code=1, data=1) != RpcError(code=1, data=2)
    hash(RpcError(code=1, data={"unhashable": []}))  # exceptions stay hashable


def test_encoded_text_never_holds_a_raw_newline() -> None:
    text = encode({"a": "line1\nline2\r\n", "b": ["\u2028"]})
    assert "\n" not in text
    assert "\r" not in text
    assert json.loads(text) == {"a": "line1\nline2\r\n", "b": ["\u2028"]}


# --- session ----------------------------------------------------------------------------------


def test_request_ids_count_from_one() -> None:
    session = RpcSession()
    first = session.send_request("initialize", {"a": 1}, now=0, timeout=30)
    second = session.send_request("tools/list", now=0, timeout=30)
    assert [first[0], second[0]] == [1, 2]
    assert parse_message(first[1]) == Request(1, "initialize", {"a": 1})
    assert wire(second[1]) == {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    assert session.pending_count == 2


def test_notification_line() -> None:
    text = RpcSession().send_notification("notifications/initialized")
    assert wire(text) == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert parse_message(RpcSession().send_notification("n", {"x": 1})) == Notification(
        "n", {"x": 1}
    )


def test_colliding_id_spaces_peer_request_then_our_response() -> None:
    session = RpcSession()
    rid, _ = session.send_request("tools/call", {"name": "t"}, now=0, timeout=30)
    assert rid == 1
    # the server's own request 1 arrives while ours is pending
    push = line(id=1, method="push/event", params={"eventId": "e"})
    assert only(session.receive_line(push)) == RequestReceived(
        Request(1, "push/event", {"eventId": "e"})
    )
    assert (session.pending_count, session.inbound_count) == (1, 1)
    # its answer to our request 1 still reaches us
    assert only(session.receive_line(line(id=1, result={"content": []}))) == ResponseReceived(
        1, "tools/call", {"content": []}
    )
    assert (session.pending_count, session.inbound_count) == (0, 1)
    # and we can still answer its request 1
    assert wire(session.send_response(1, {})) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert session.inbound_count == 0


def test_colliding_id_spaces_our_answer_first_then_their_response() -> None:
    session = RpcSession()
    session.send_request("tools/call", now=0, timeout=30)
    only(session.receive_line(line(id=1, method="push/event")))
    session.send_error(1, RpcError(code=-32002, data={"capability": "pushEvents"}))
    assert session.pending_count == 1
    event = only(session.receive_line(line(id=1, error={"code": -32000, "message": "tool"})))
    assert isinstance(event, ErrorReceived)
    assert (event.id, event.method, event.error.code) == (1, "tools/call", -32000)
    assert session.pending_count == 0


def test_string_id_response_does_not_match_our_integer_request() -> None:
    session = RpcSession()
    session.send_request("m", now=0, timeout=30)
    diag = only(session.receive_line(line(id="1", result={})))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is None
    assert session.pending_count == 1


def test_response_to_unknown_id_is_a_diagnostic() -> None:
    session = RpcSession()
    diag = only(session.receive_line(line(id=99, result={})))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is None
    assert "99" in diag.text


def test_each_of_our_requests_is_answered_once() -> None:
    session = RpcSession()
    session.send_request("m", now=0, timeout=30)
    assert isinstance(only(session.receive_line(line(id=1, result=1))), ResponseReceived)
    assert isinstance(only(session.receive_line(line(id=1, result=2))), Diagnostic)
    assert isinstance(
        only(session.receive_line(line(id=1, error={"code": 1, "message": "x"}))), Diagnostic
    )


def test_notification_is_delivered() -> None:
    event = only(RpcSession().receive_line(line(method="notifications/tools/list_changed")))
    assert event == NotificationReceived(Notification("notifications/tools/list_changed"))


def test_expired_reports_requests_whose_deadline_passed() -> None:
    session = RpcSession()
    assert session.next_deadline() is None
    session.send_request("a", now=100.0, timeout=5.0)
    session.send_request("b", now=101.0, timeout=10.0)
    assert session.next_deadline() == 105.0
    assert session.expired(104.999) == []
    assert session.expired(105.0) == [RequestExpired(1, "a")]
    assert session.expired(105.0) == []
    assert session.pending_count == 1
    assert session.next_deadline() == 111.0
    late = only(session.receive_line(line(id=1, result={})))
    assert isinstance(late, Diagnostic)
    assert session.expired(1e9) == [RequestExpired(2, "b")]
    assert session.pending_count == 0
    assert session.next_deadline() is None


def test_cancel_forgets_a_pending_request() -> None:
    session = RpcSession()
    session.send_request("a", now=0, timeout=5)
    session.cancel(1)
    session.cancel(1)
    session.cancel("never")
    assert session.pending_count == 0
    assert isinstance(only(session.receive_line(line(id=1, result=1))), Diagnostic)


def test_close_abandons_every_pending_request() -> None:
    session = RpcSession()
    for method in ("a", "b", "c"):
        session.send_request(method, now=0, timeout=5)
    only(session.receive_line(line(id=1, result=None)))
    only(session.receive_line(line(id=5, method="peer")))
    assert session.close() == [RequestAbandoned(2, "b"), RequestAbandoned(3, "c")]
    assert session.closed
    assert (session.pending_count, session.inbound_count) == (0, 0)
    assert session.close() == []
    assert session.expired(1e9) == []
    with pytest.raises(LocalProtocolError):
        session.send_request("d", now=0, timeout=5)
    with pytest.raises(LocalProtocolError):
        session.send_response(5, {})
    assert isinstance(only(session.receive_line(line(id=2, result=1))), Diagnostic)


def test_pending_full_at_max_pending() -> None:
    session = RpcSession(max_pending=3)
    ids = [session.send_request("m", now=0, timeout=5)[0] for _ in range(3)]
    assert ids == [1, 2, 3]
    with pytest.raises(PendingFull):
        session.send_request("m", now=0, timeout=5)
    assert issubclass(PendingFull, LocalProtocolError)
    assert session.pending_count == 3
    only(session.receive_line(line(id=2, result=None)))
    # the refused request did not use up an id
    assert session.send_request("m", now=0, timeout=5)[0] == 4
    with pytest.raises(PendingFull):
        session.send_request("m", now=0, timeout=5)


def test_inbound_cap_refuses_past_max_inbound_with_an_error_line() -> None:
    session = RpcSession(max_inbound=2)
    for rid in (1, 2):
        assert isinstance(only(session.receive_line(line(id=rid, method="m"))), RequestReceived)
    assert session.inbound_count == 2
    diag = only(session.receive_line(line(id=3, method="channels/incoming")))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is not None
    out = wire(diag.reply)
    assert out["id"] == 3
    assert out["error"]["code"] == INTERNAL_ERROR
    assert session.inbound_count == 2
    with pytest.raises(LocalProtocolError):
        session.send_response(3, {})
    # notifications are not requests in flight
    assert isinstance(only(session.receive_line(line(method="n"))), NotificationReceived)
    session.send_response(1, {})
    assert isinstance(only(session.receive_line(line(id=3, method="m"))), RequestReceived)


def test_duplicate_inbound_id_is_refused_and_the_first_stays_answerable() -> None:
    session = RpcSession()
    first = only(session.receive_line(line(id=7, method="a")))
    assert isinstance(first, RequestReceived)
    dup = only(session.receive_line(line(id=7, method="b")))
    assert isinstance(dup, Diagnostic)
    assert dup.reply is not None
    out = wire(dup.reply)
    assert (out["id"], out["error"]["code"]) == (7, INVALID_REQUEST)
    assert session.inbound_count == 1
    session.send_response(7, {"answer": "a"})
    with pytest.raises(LocalProtocolError):
        session.send_response(7, {"answer": "b"})
    # once answered, the peer may reuse the id
    assert isinstance(only(session.receive_line(line(id=7, method="c"))), RequestReceived)


def test_int_and_string_inbound_ids_are_distinct() -> None:
    session = RpcSession()
    assert isinstance(only(session.receive_line(line(id=1, method="a"))), RequestReceived)
    assert isinstance(only(session.receive_line(line(id="1", method="b"))), RequestReceived)
    session.send_response("1", {})
    assert session.inbound_count == 1
    session.send_response(1, {})


def test_answering_twice_or_unasked_raises() -> None:
    session = RpcSession()
    only(session.receive_line(line(id=4, method="m")))
    session.send_response(4, {})
    with pytest.raises(LocalProtocolError):
        session.send_response(4, {})
    with pytest.raises(LocalProtocolError):
        session.send_error(4, RpcError(code=INTERNAL_ERROR))
    with pytest.raises(LocalProtocolError):
        session.send_response(5, {})


def test_unencodable_result_leaves_the_request_answerable() -> None:
    session = RpcSession()
    only(session.receive_line(line(id=4, method="m")))
    with pytest.raises(ValueError):
        session.send_response(4, {"x": float("nan")})
    assert session.inbound_count == 1
    out = wire(session.send_error(4, RpcError(code=INTERNAL_ERROR)))
    assert out["error"]["code"] == INTERNAL_ERROR
    assert session.inbound_count == 0


def test_unencodable_params_register_nothing() -> None:
    session = RpcSession(max_pending=1)
    with pytest.raises(ValueError):
        session.send_request("m", {"x": float("inf")}, now=0, timeout=5)
    assert session.pending_count == 0
    rid, _ = session.send_request("m", now=0, timeout=5)
    assert rid == 1


def test_lone_surrogates_from_the_peer_do_not_break_the_reply_line() -> None:
    session = RpcSession()
    text = '{"id":"\\ud800x","method":"m"}'  # no "jsonrpc": refused with a reply
    diag = only(session.receive_line(text))
    assert isinstance(diag, Diagnostic)
    assert diag.reply is not None
    raw = encode_line(diag.reply)
    # the peer's lone surrogate became U+FFFD as the line was decoded
    assert json.loads(raw.decode("utf-8"))["id"] == "\ufffdx"
    received = only(
        session.receive_line('{"jsonrpc":"2.0","id":2,"method":"m","params":["\\udfff"]}')
    )
    assert isinstance(received, RequestReceived) and received.request.params == ["\ufffd"]
    # what the host itself sends is written as UTF-8 whatever it holds
    raw = encode_line(session.send_response(2, {"echo": "\udfff", "ok": "é"}))
    assert json.loads(raw.decode("utf-8"))["result"] == {"echo": "\udfff", "ok": "é"}


# --- properties -------------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.one_of(st.integers(), st.text(max_size=8))
methods = st.text(min_size=1, max_size=20)
params = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=6), json_values, max_size=4),
    st.lists(json_values, max_size=4),
)
errors = st.builds(
    lambda code, message, data: RpcError(code=code, message=message, data=data),
    st.integers(min_value=-33000, max_value=33000),
    st.text(max_size=20),
    json_values,
)
messages = st.one_of(
    st.builds(Request, ids, methods, params),
    st.builds(Notification, methods, params),
    st.builds(Response, ids, json_values),
    st.builds(ErrorResponse, st.one_of(st.none(), ids), errors),
)


@given(messages)
def test_message_round_trip(msg: Any) -> None:
    text = encode(message_to_wire(msg))
    assert "\n" not in text
    assert parse_message(text) == msg
    # and what we send can always be written as UTF-8
    encode_line(text).decode("utf-8")


# Lines that look like JSON-RPC: objects over the member names with odd values.
_members = st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "x"])
_member_values = st.one_of(
    json_values,
    st.just("2.0"),
    st.sampled_from(["m", "", "push/event"]),
    st.fixed_dictionaries({"code": json_values, "message": json_values}),
)
rpcish = st.one_of(
    st.dictionaries(_members, _member_values, max_size=6),
    st.builds(
        lambda d, extra: {"jsonrpc": "2.0", **d, **extra},
        st.dictionaries(_members, _member_values, max_size=4),
        st.fixed_dictionaries({"id": st.one_of(ids, json_values)}),
    ),
    json_values,
)


def _check_events(events: list[Any]) -> None:
    assert len(events) == 1
    for event in events:
        assert isinstance(event, EVENT_TYPES)
        if isinstance(event, Diagnostic) and event.reply is not None:
            out = wire(encode_line(event.reply).decode("utf-8"))
            assert "error" in out
            assert isinstance(out["error"]["code"], int)


@settings(max_examples=300)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("utf-8", "replace"))))
def test_arbitrary_text_never_raises_out_of_receive_line(text: str) -> None:
    session = RpcSession(max_inbound=2)
    session.send_request("m", now=0, timeout=1)
    _check_events(session.receive_line(text))


@settings(max_examples=300)
@given(st.lists(rpcish, min_size=1, max_size=8))
def test_jsonish_lines_never_raise_and_every_request_is_answered_or_delivered(
    objs: list[Any],
) -> None:
    session = RpcSession(max_inbound=3)
    for _ in range(3):
        session.send_request("m", now=0, timeout=1)
    delivered = set()
    for obj in objs:
        events = session.receive_line(json.dumps(obj))
        _check_events(events)
        (event,) = events
        if isinstance(event, RequestReceived):
            assert event.request.id not in delivered
            delivered.add(event.request.id)
        elif isinstance(obj, dict) and isinstance(event, Diagnostic) and "method" in obj:
            # a request that is refused is answered at once when its id can be read
            rid = obj.get("id")
            if isinstance(rid, int | str) and not isinstance(rid, bool):
                assert event.reply is not None
                assert wire(event.reply)["id"] == rid
    assert session.inbound_count == len(delivered)
    for rid in delivered:
        session.send_response(rid, None)
    assert session.inbound_count == 0


# --- a session driven against a model of what must happen ------------------------------------


class SessionMachine(RuleBasedStateMachine):
    """Our session against a scripted peer; the model tracks what is owed on each side."""

    ours = Bundle("ours")
    theirs = Bundle("theirs")

    @initialize(max_pending=st.integers(1, 4), max_inbound=st.integers(1, 4))
    def start(self, max_pending: int, max_inbound: int) -> None:
        self.session = RpcSession(max_pending=max_pending, max_inbound=max_inbound)
        self.now = 0.0
        self.next_id = 1
        self.unanswered: dict[int, tuple[str, float]] = {}  # our requests awaiting an answer
        self.outcomes: dict[int, int] = {}  # how many outcomes each of our requests had
        self.owed: set[int | str] = set()  # peer requests delivered and not yet answered
        self.asked: dict[int | str, int] = {}  # deliveries of each peer id
        self.answers: dict[int | str, int] = {}  # our answers to each peer id

    def _settle(self, rid: int) -> None:
        self.outcomes[rid] = self.outcomes.get(rid, 0) + 1

    @rule(target=ours, method=st.sampled_from(["tools/call", "init"]), timeout=st.integers(1, 5))
    def send_request(self, method: str, timeout: int) -> int:
        if len(self.unanswered) >= self.session.max_pending:
            with pytest.raises(PendingFull):
                self.session.send_request(method, now=self.now, timeout=timeout)
            return -1  # an id the session never used
        rid, text = self.session.send_request(method, now=self.now, timeout=timeout)
        assert rid == self.next_id
        assert parse_message(text) == Request(rid, method)
        self.next_id += 1
        self.unanswered[rid] = (method, self.now + timeout)
        return rid

    @rule(rid=ours, result=json_values, as_error=st.booleans())
    def peer_answers(self, rid: int, result: Any, as_error: bool) -> None:
        if as_error:
            text = line(id=rid, error={"code": -32000, "message": "x", "data": result})
        else:
            text = line(id=rid, result=result)
        event = only(self.session.receive_line(text))
        if rid in self.unanswered:
            method, _ = self.unanswered.pop(rid)
            self._settle(rid)
            if as_error:
                assert isinstance(event, ErrorReceived)
                assert (event.id, event.method, event.error.data) == (rid, method, result)
            else:
                assert event == ResponseReceived(rid, method, result)
        else:
            assert isinstance(event, Diagnostic)
            assert event.reply is None

    @rule(target=theirs, rid=st.one_of(st.integers(0, 6), st.sampled_from(["1", "a"])))
    def peer_requests(self, rid: int | str) -> int | str:
        event = only(self.session.receive_line(line(id=rid, method="push/event")))
        if rid in self.owed:
            assert isinstance(event, Diagnostic)
            assert event.reply is not None
            assert wire(event.reply)["error"]["code"] == INVALID_REQUEST
        elif len(self.owed) >= self.session.max_inbound:
            assert isinstance(event, Diagnostic)
            assert event.reply is not None
            assert wire(event.reply)["id"] == rid
        else:
            assert event == RequestReceived(Request(rid, "push/event"))
            self.owed.add(rid)
            self.asked[rid] = self.asked.get(rid, 0) + 1
        return rid

    @rule(rid=theirs, as_error=st.booleans())
    def we_answer(self, rid: int | str, as_error: bool) -> None:
        if rid not in self.owed:
            with pytest.raises(LocalProtocolError):
                self.session.send_response(rid, {})
            return
        if as_error:
            text = self.session.send_error(rid, RpcError(code=-32002))
        else:
            text = self.session.send_response(rid, {"ok": True})
        assert wire(text)["id"] == rid
        self.owed.discard(rid)
        self.answers[rid] = self.answers.get(rid, 0) + 1

    @rule(step=st.floats(0, 3))
    def time_passes(self, step: float) -> None:
        self.now += step
        gone = self.session.expired(self.now)
        expect = sorted(r for r, (_, d) in self.unanswered.items() if d <= self.now)
        assert sorted(e.id for e in gone) == expect
        for e in gone:
            assert e.method == self.unanswered.pop(e.id)[0]
            self._settle(e.id)

    @rule(rid=ours)
    def cancel(self, rid: int) -> None:
        self.session.cancel(rid)
        if self.unanswered.pop(rid, None) is not None:
            self._settle(rid)

    @rule(text=st.one_of(st.text(max_size=30), st.sampled_from(["[]", "{}", "null", '{"id":1}'])))
    def garbage(self, text: str) -> None:
        event = only(self.session.receive_line(text))
        assert isinstance(event, Diagnostic)

    @invariant()
    def nothing_answered_twice(self) -> None:
        assert all(n == 1 for n in self.outcomes.values())
        for rid, n in self.answers.items():
            assert n <= self.asked[rid]
        assert set(self.outcomes).isdisjoint(self.unanswered)

    @invariant()
    def counts_match_the_model(self) -> None:
        assert self.session.pending_count == len(self.unanswered)
        assert self.session.inbound_count == len(self.owed)
        deadlines = [d for _, d in self.unanswered.values()]
        assert self.session.next_deadline() == (min(deadlines) if deadlines else None)

    def teardown(self) -> None:
        if hasattr(self, "session"):
            abandoned = self.session.close()
            assert sorted(a.id for a in abandoned) == sorted(self.unanswered)
            assert self.session.pending_count == 0
            assert self.session.inbound_count == 0


SessionMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
test_session_machine = SessionMachine.TestCase


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1}',
        '{"a":1} ',
        ' {"a":1}',
        "{}",
        '{"a":1}x',
        '{"a":1}{}',
        "{",
        '{"a":[1,2',
        '{"a":NaN}',
        '{"a":-Infinity}',
        '{"a":"\\ud83d\\ude00"}',
        "[1]",
        "",
    ],
)
def test_decode_agrees_with_the_strict_decoder(text: str) -> None:
    from protocol import jsonrpc

    strict = json.JSONDecoder(parse_constant=jsonrpc._reject_constant)
    try:
        expected: object = strict.decode(text)
    except ValueError as exc:
        with pytest.raises(type(exc)) as got:
            decode(text)
        assert str(got.value) == str(exc)
    else:
        assert decode(text) == expected
