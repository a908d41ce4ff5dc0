"""RFC-006 coalescing bookkeeping: validation, outcomes, the render state machine, caps,
receipts, recovery and the journal, with a stateful model and a replay property."""

from __future__ import annotations

import json
from collections import Counter, OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from protocol.coalesce import (
    ABSENT,
    MAX_NOTICES,
    MAX_RECEIPTS,
    MAX_SUBJECTS,
    MIN_RETRY_WINDOW_MS,
    RECORD_OPS,
    Advertisement,
    Append,
    Audit,
    CoalesceInvalid,
    Coalescer,
    CoalesceSpec,
    Hide,
    Materialize,
    RequestRender,
    Step,
    Subject,
    inference_needed,
    parse_coalesce,
)

A, B = "A", "B"
AB = (A, B)
HOUR = MIN_RETRY_WINDOW_MS
FULL = Advertisement()


def fs(key: str = "K", *, binding: str = "b", feature_set: str = "doc") -> Subject:
    return Subject(binding=binding, scope_kind="featureSet", scope_id=feature_set, key=key)


def chan(key: str = "K", *, binding: str = "b", channel: str = "chat") -> Subject:
    return Subject(binding=binding, scope_kind="channel", scope_id=channel, key=key)


def text(t: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": t}]


class World:
    """The host side of the contract: contexts as lists of occurrences, effects applied in
    order, with the safety assertions every test relies on."""

    def __init__(self, co: Coalescer | None = None, agents: tuple[str, ...] = AB) -> None:
        self.co = co if co is not None else Coalescer()
        self.journal: list[dict[str, Any]] = []
        self.ctx: dict[str, list[dict[str, Any]]] = {a: [] for a in agents}
        self.materialized: Counter[str] = Counter()
        self.asked: list[RequestRender] = []
        self.audits: list[Audit] = []
        self.seq = 0
        self.now = 0

    def apply(self, step: Step) -> Step:
        json.dumps(step.records)  # journal records are plain JSON
        self.journal.extend(step.records)
        for effect in step.effects:
            if isinstance(effect, Append):
                for a in sorted(effect.contexts):
                    self.ctx[a].append({"id": effect.occurrence, "consumed": False})
            elif isinstance(effect, Hide):
                for a in effect.contexts:
                    found = [i for i in self.ctx[a] if i["id"] == effect.occurrence]
                    assert found, f"hiding {effect.occurrence} absent from {a}"
                    assert not any(i["consumed"] for i in found), "a consumed item was hidden"
                    self.ctx[a] = [i for i in self.ctx[a] if i["id"] != effect.occurrence]
            elif isinstance(effect, Materialize):
                self.materialized[effect.batch] += 1
                assert self.materialized[effect.batch] == 1, "a batch materialized twice"
                for a in sorted(effect.contexts):
                    self.ctx[a].append({"id": effect.occurrence, "consumed": False})
            elif isinstance(effect, RequestRender):
                self.asked.append(effect)
            else:
                self.audits.append(effect)
        return step

    def occ(self) -> str:
        self.seq += 1
        return f"o{self.seq}"

    def plain(self, subject: Subject, eid: str, *, initial: bool = False, ctx: Any = AB) -> Step:
        return self.apply(
            self.co.admit_plain(
                subject,
                event_id=eid,
                occurrence=self.occ(),
                contexts=ctx,
                initial=initial,
                now=self.now,
            )
        )

    def notice(
        self,
        subject: Subject,
        eid: str,
        *,
        fallback: str = "FB",
        initial: bool = False,
        data: Any = ABSENT,
        ctx: Any = AB,
    ) -> Step:
        return self.apply(
            self.co.admit_notice(
                subject,
                event_id=eid,
                feature_set="doc",
                fallback=text(fallback),
                contexts=ctx,
                timestamp=f"t-{eid}",
                initial=initial,
                data=data,
                now=self.now,
            )
        )

    def retract(self, subject: Subject, eid: str, *, notice: bool = True, ctx: Any = AB) -> Step:
        return self.apply(
            self.co.retract(
                subject,
                event_id=eid,
                occurrence=self.occ(),
                notice=notice,
                contexts=ctx,
                now=self.now,
            )
        )

    def begin(self, agent: str, **kw: Any) -> list[RequestRender]:
        before = len(self.asked)
        self.apply(self.co.begin_assembly(agent, **kw))
        return self.asked[before:]

    def result(self, batch: str, body: str = "R", *, authorized: bool = True) -> Step:
        content = text(body) if body else []
        return self.apply(self.co.render_result(batch, content, authorized=authorized))

    def fail(self, batch: str, reason: Any = "timeout", *, authorized: bool = True) -> Step:
        return self.apply(self.co.render_failed(batch, reason=reason, authorized=authorized))

    def request(self, agent: str) -> Step:
        for item in self.ctx[agent]:
            item["consumed"] = True
        return self.apply(self.co.assembled(agent, [i["id"] for i in self.ctx[agent]]))

    def ids(self, agent: str, *, unread: bool | None = None) -> list[str]:
        return [i["id"] for i in self.ctx[agent] if unread is None or i["consumed"] is not unread]


# ---------------------------------------------------------------------------------------------
# Advertisement


def test_advertisement_defaults_to_everything_and_one_hour() -> None:
    assert FULL.to_wire() == {
        "pushEvents": True,
        "channelsIncoming": True,
        "deferred": True,
        "channelScopedPush": True,
        "retryWindowMs": 3_600_000,
    }
    assert Advertisement.from_wire(True) == FULL
    assert Advertisement.from_wire(FULL.to_wire()) == FULL


def test_advertisement_object_form_omits_leaves() -> None:
    adv = Advertisement.from_wire({"pushEvents": True, "channelScopedPush": False})
    assert adv == Advertisement(channels_incoming=False, deferred=False, channel_scoped_push=False)
    assert not any(Advertisement.from_wire(False).to_wire()[k] for k in ("pushEvents", "deferred"))
    assert Advertisement.from_wire({"retryWindowMs": 7_200_000}).retry_window_ms == 7_200_000


@pytest.mark.parametrize("window", [3_599_999, 0, -1, 3_600_000.0, True, "3600000"])
def test_advertisement_window_is_an_integer_of_at_least_an_hour(window: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        Advertisement(retry_window_ms=window)
    with pytest.raises(ValueError):
        Advertisement.from_wire({"retryWindowMs": window})


@pytest.mark.parametrize("value", [1, "true", [], {"deferred": "yes"}])
def test_advertisement_rejects_malformed_values(value: Any) -> None:
    with pytest.raises(ValueError):
        Advertisement.from_wire(value)
    with pytest.raises(TypeError):
        Advertisement(deferred=1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Validation


def parse(raw: Any, lane: Any = "push", adv: Advertisement = FULL, eid: Any = "e1") -> Any:
    return parse_coalesce(raw, lane=lane, advertised=adv, event_id=eid)


INVALID = [
    # (raw, lane, advertisement, eventId, field, reason)
    ({"key": "K"}, "push", Advertisement(push_events=False), "e", "coalesce", "not_advertised"),
    (
        {"key": "K"},
        "incoming",
        Advertisement(channels_incoming=False),
        "e",
        "coalesce",
        "not_advertised",
    ),
    ("K", "push", FULL, "e", "coalesce", "not_an_object"),
    (None, "push", FULL, "e", "coalesce", "not_an_object"),
    ([], "incoming", FULL, "e", "coalesce", "not_an_object"),
    ({}, "push", FULL, "e", "coalesce.key", "required"),
    ({"key": 5}, "push", FULL, "e", "coalesce.key", "not_a_string"),
    ({"key": ""}, "push", FULL, "e", "coalesce.key", "empty"),
    ({"key": "x" * 257}, "push", FULL, "e", "coalesce.key", "too_long"),
    ({"key": "é" * 129}, "push", FULL, "e", "coalesce.key", "too_long"),
    ({"key": "\ud800"}, "push", FULL, "e", "coalesce.key", "not_utf8"),
    ({"key": "K", "deferred": "true"}, "push", FULL, "e", "coalesce.deferred", "not_a_boolean"),
    ({"key": "K", "retract": 1}, "push", FULL, "e", "coalesce.retract", "not_a_boolean"),
    ({"key": "K", "initial": None}, "incoming", FULL, "e", "coalesce.initial", "not_a_boolean"),
    (
        {"key": "K", "retract": True, "deferred": True},
        "push",
        FULL,
        "e",
        "coalesce.retract",
        "conflicts_with_deferred",
    ),
    (
        {"key": "K", "retract": True, "initial": True},
        "incoming",
        FULL,
        "e",
        "coalesce.retract",
        "conflicts_with_initial",
    ),
    ({"key": "K", "data": 1}, "push", FULL, "e", "coalesce.data", "requires_deferred"),
    (
        {"key": "K", "data": None, "retract": True},
        "push",
        FULL,
        "e",
        "coalesce.data",
        "requires_deferred",
    ),
    (
        {"key": "K", "deferred": True, "data": "x" * 4095},
        "push",
        FULL,
        "e",
        "coalesce.data",
        "too_large",
    ),
    (
        {"key": "K", "deferred": True, "data": float("nan")},
        "push",
        FULL,
        "e",
        "coalesce.data",
        "not_json",
    ),
    (
        {"key": "K", "channelId": "c"},
        "incoming",
        FULL,
        "e",
        "coalesce.channelId",
        "not_allowed_on_lane",
    ),
    (
        {"key": "K", "deferred": True},
        "incoming",
        FULL,
        "e",
        "coalesce.deferred",
        "not_allowed_on_lane",
    ),
    (
        {"key": "K", "deferred": False},
        "incoming",
        FULL,
        "e",
        "coalesce.deferred",
        "not_allowed_on_lane",
    ),
    (
        {"key": "K", "channelId": "c"},
        "push",
        Advertisement(channel_scoped_push=False),
        "e",
        "coalesce.channelId",
        "not_advertised",
    ),
    ({"key": "K", "channelId": ""}, "push", FULL, "e", "coalesce.channelId", "empty"),
    ({"key": "K", "channelId": 7}, "push", FULL, "e", "coalesce.channelId", "not_a_string"),
    ({"key": "K", "channelId": None}, "push", FULL, "e", "coalesce.channelId", "not_a_string"),
    (
        {"key": "K", "deferred": True},
        "push",
        Advertisement(deferred=False),
        "e",
        "coalesce.deferred",
        "not_advertised",
    ),
    ({"key": "K"}, "incoming", FULL, None, "eventId", "required"),
    ({"key": "K"}, "incoming", FULL, "", "eventId", "empty"),
    ({"key": "K"}, "incoming", FULL, 12, "eventId", "not_a_string"),
    ({"key": "K"}, "push", FULL, None, "eventId", "required"),
]


@pytest.mark.parametrize(("raw", "lane", "adv", "eid", "field", "reason"), INVALID)
def test_malformed_coalesce_names_field_and_reason(
    raw: Any, lane: Any, adv: Advertisement, eid: Any, field: str, reason: str
) -> None:
    got = parse(raw, lane, adv, eid)
    assert got == CoalesceInvalid(field, reason)
    assert got.error_data() == {"field": field, "reason": reason}


def test_limits_are_inclusive_and_in_bytes() -> None:
    assert isinstance(parse({"key": "x" * 256}), CoalesceSpec)
    assert isinstance(parse({"key": "é" * 128}), CoalesceSpec)  # 256 bytes
    assert isinstance(parse({"key": "🙂" * 64}), CoalesceSpec)  # 256 bytes
    assert parse({"key": "🙂" * 64 + "x"}) == CoalesceInvalid("coalesce.key", "too_long")
    # "x" * 4094 serializes to 4096 bytes with its quotes.
    assert isinstance(parse({"key": "K", "deferred": True, "data": "x" * 4094}), CoalesceSpec)
    assert isinstance(parse({"key": "K", "deferred": True, "data": "é" * 2047}), CoalesceSpec)
    assert parse({"key": "K", "deferred": True, "data": "é" * 2048}).reason == "too_large"
    assert isinstance(parse({"key": "K", "deferred": True, "data": {"a": [1, 2]}}), CoalesceSpec)


def test_valid_members_and_scopes() -> None:
    spec = parse({"key": "K", "initial": True, "future": {"x": 1}}, "incoming")
    assert spec == CoalesceSpec(lane="incoming", key="K", event_id="e1", initial=True)
    assert spec.mode == "plain"
    assert spec.subject(binding="b", channel_id="chat") == chan()
    with pytest.raises(ValueError):
        spec.subject(binding="b", feature_set="doc")
    push = parse({"key": "K"})
    assert push.subject(binding="b", feature_set="doc", channel_id="ignored") == fs()
    scoped = parse({"key": "K", "channelId": "chat", "retract": True})
    assert scoped.mode == "retract" and scoped.subject(binding="b", feature_set="doc") == chan()
    deferred = parse({"key": "K", "deferred": True, "data": None})
    assert deferred.mode == "deferred" and deferred.data is None
    assert parse({"key": "K", "deferred": True}).data is ABSENT
    assert parse({"key": "K", "retract": True, "deferred": False}).mode == "retract"


# ---------------------------------------------------------------------------------------------
# Plain mode


def test_first_replaced_appended() -> None:
    w = World()
    s1 = w.plain(fs(), "a", initial=True)
    assert (s1.outcome, s1.prior_event_id) == ("first", None)
    assert s1.result() == {"outcome": "first"}
    s2 = w.plain(fs(), "b")
    assert s2.result() == {"outcome": "replaced", "priorEventId": "a"}
    assert s2.effects[0] == Hide("o1", frozenset(AB)) and s2.effects[-1] == Append(
        "o2", frozenset(AB)
    )
    assert w.ids(A) == ["o2"]
    w.request(A)
    w.request(B)
    s3 = w.plain(fs(), "c")
    assert s3.result() == {"outcome": "appended", "priorEventId": "b"}
    assert w.ids(A) == ["o2", "o3"]


def test_untracked_subject_appends_and_initial_never_lowers() -> None:
    w = World()
    assert w.plain(fs(), "a").outcome == "appended"  # no initial: history unknown
    assert w.plain(fs(), "b", initial=True).outcome == "replaced"
    w.request(A)
    w.request(B)
    assert w.co.history(fs()) == "unknown"
    w2 = World()
    w2.plain(fs(), "a", initial=True)
    w2.request(A)
    w2.request(B)
    assert w2.plain(fs(), "b", initial=True).outcome == "appended"  # 34b
    assert w2.co.history(fs()) == "some"


def test_repeated_edits_leave_one_occurrence() -> None:
    w = World()
    w.plain(fs(), "a", initial=True)
    assert [w.plain(fs(), e).outcome for e in "123"] == ["replaced"] * 3
    assert w.ids(A) == w.ids(B) == ["o4"]


def test_consumption_is_per_context() -> None:
    w = World()
    w.plain(fs(), "a", initial=True)
    w.request(A)
    assert w.co.history(fs(), A) == "some" and w.co.history(fs(), B) == "none"
    step = w.plain(fs(), "b")
    assert step.result() == {"outcome": "appended", "priorEventId": "a"}  # conservative
    assert Hide("o1", frozenset({B})) in step.effects
    assert w.ids(A) == ["o1", "o2"] and w.ids(B) == ["o2"]


def test_replacement_never_widens_the_audience() -> None:
    w = World()
    w.plain(fs(), "a", initial=True, ctx=[A])
    step = w.plain(fs(), "b", ctx=AB)
    assert step.outcome == "replaced" and Append("o2", frozenset({A})) in step.effects
    assert w.ids(B) == []
    gone = w.plain(fs(), "c", ctx=[B])  # reaches none of the prior contexts
    assert gone.outcome == "replaced" and not any(isinstance(e, Append) for e in gone.effects)
    assert w.ids(A) == w.ids(B) == [] and w.co.view(fs()).occupant is None  # type: ignore[union-attr]


def test_scopes_and_bindings_do_not_touch_each_other() -> None:
    w = World()
    subjects = [
        fs(),
        fs(binding="other"),
        fs(feature_set="fs2"),
        chan(),
        chan(channel="c2"),
        fs("K2"),
    ]
    outcomes = [w.plain(s, f"a{i}", initial=True).outcome for i, s in enumerate(subjects)]
    assert outcomes == ["first"] * 6
    assert w.plain(fs(), "b").outcome == "replaced"
    assert len(w.ids(A)) == 6
    # an eventId names one occurrence per binding, whatever subject a retry names
    assert w.plain(fs("K9"), "a0").duplicate and fs("K9") not in w.co


# ---------------------------------------------------------------------------------------------
# Retraction


def test_retract_outcomes() -> None:
    w = World()
    w.plain(fs(), "a", initial=True)
    w.plain(fs(), "b")
    step = w.retract(fs(), "z")
    assert step.result() == {"outcome": "retracted", "priorEventId": "b"}
    assert w.ids(A) == [] and w.co.view(fs()).occupant is None  # type: ignore[union-attr]
    # never seen: unknown -> the notice is appended, and nothing is tracked for it
    unseen = w.retract(fs("new"), "y")
    assert unseen.outcome == "noted" and Append(f"o{w.seq}", frozenset(AB)) in unseen.effects
    assert fs("new") not in w.co
    assert w.retract(fs("new2"), "x", notice=False).outcome == "consumed"


def test_read_original_unread_edit_delete() -> None:
    w = World()
    w.plain(fs(), "a", initial=True)
    w.request(A)
    w.request(B)
    assert w.plain(fs(), "edit").outcome == "appended"
    step = w.retract(fs(), "z")
    assert step.result() == {"outcome": "noted", "priorEventId": "edit"}
    assert Hide("o2", frozenset(AB)) in step.effects
    assert w.ids(A) == ["o1", "o3"]
    # the slot is empty, the history bit stays: a new create is appended, a delete noted
    assert w.plain(fs(), "c", initial=True).outcome == "appended"
    assert w.retract(fs(), "z2", notice=False).result() == {
        "outcome": "consumed",
        "priorEventId": "c",
    }


def test_retract_notice_goes_only_where_history_is_not_none() -> None:
    w = World()
    w.plain(fs(), "a", initial=True)
    w.request(A)
    w.plain(fs(), "b")
    step = w.retract(fs(), "z")
    assert step.outcome == "noted"
    assert Append(f"o{w.seq}", frozenset({A})) in step.effects
    assert w.ids(B) == []


# ---------------------------------------------------------------------------------------------
# Deferred mode and the render state machine


def test_notices_join_one_batch_and_render_once() -> None:
    w = World()
    outcomes = [w.notice(fs(), f"n{i}", data={"i": i}).outcome for i in range(3)]
    assert outcomes == ["first", "replaced", "replaced"]
    assert w.ids(A) == []  # a batch is not model-visible
    (ask,) = w.begin(A)
    assert ask.params == {
        "featureSet": "doc",
        "key": "K",
        "eventId": "n2",
        "notices": [
            {"eventId": f"n{i}", "timestamp": f"t-n{i}", "data": {"i": i}} for i in range(3)
        ],
        "dropped": 0,
    }
    assert w.begin(B) == []  # one render serves every context
    step = w.result(ask.batch, "RENDERED")
    assert step.outcome == "materialized"
    (mat,) = step.effects
    assert isinstance(mat, Materialize) and mat.contexts == frozenset(AB) and mat.source == "result"
    assert mat.occurrence == ask.batch and mat.event_id == "n2" and mat.feature_set == "doc"
    w.request(A)
    assert w.begin(A) == [] and w.co.view(fs()).pending is None  # type: ignore[union-attr]
    assert w.notice(fs(), "n3").outcome == "first"


def test_the_batch_being_rendered_is_shown_until_it_completes() -> None:
    w = World()
    assert w.co.rendering(fs()) is None
    w.notice(fs(), "n1", data={"i": 1})
    w.notice(fs(), "n2")
    assert w.co.rendering(fs()) is None  # pending, not yet rendering
    (ask,) = w.begin(A)
    shown = w.co.rendering(fs())
    assert shown is not None and shown.batch == ask.batch
    assert (shown.event_id, shown.feature_set, shown.audience) == ("n2", "doc", frozenset(AB))
    assert shown.fallback == tuple(text("FB"))
    w.result(ask.batch, "RENDERED")
    assert w.co.rendering(fs()) is None


def test_channel_scoped_render_names_the_channel() -> None:
    w = World()
    w.notice(chan(), "n1")
    (ask,) = w.begin(A)
    assert ask.params["channelId"] == "chat" and ask.params["key"] == "K"


def test_notice_cap_keeps_the_newest_64() -> None:
    w = World()
    for i in range(MAX_NOTICES):
        w.notice(fs(), f"n{i}")
    assert w.co.view(fs()).pending_notices == 64 and w.co.view(fs()).dropped == 0  # type: ignore[union-attr]
    for i in range(MAX_NOTICES, 100):
        w.notice(fs(), f"n{i}")
    (ask,) = w.begin(A)
    notices = ask.params["notices"]
    assert len(notices) == 64 and ask.params["dropped"] == 36
    assert [n["eventId"] for n in notices] == [f"n{i}" for i in range(36, 100)]
    with pytest.raises(ValueError):
        Coalescer(max_notices=63)


def test_render_outcomes() -> None:
    for body, outcome, source in (("R", "materialized", "result"), ("", "empty", None)):
        w = World()
        w.notice(fs(), "n1", fallback="FALLBACK")
        (ask,) = w.begin(A)
        step = w.result(ask.batch, body)
        assert step.outcome == outcome
        mats = [e for e in step.effects if isinstance(e, Materialize)]
        assert [m.source for m in mats] == ([source] if source else [])
    for reason in ("timeout", "error", "disconnect"):
        w = World()
        w.notice(fs(), "n1", fallback="FALLBACK")
        (ask,) = w.begin(A)
        step = w.fail(ask.batch, reason)
        (mat,) = [e for e in step.effects if isinstance(e, Materialize)]
        assert step.outcome == "fallback" and mat.content == tuple(text("FALLBACK"))
        assert mat.timestamp == "t-n1"
        # a late result is discarded: no effect but the audit, nothing journaled
        late = w.result(ask.batch, "LATE")
        assert late.outcome == "discarded" and late.records == ()
        assert [type(e) for e in late.effects] == [Audit]
        assert w.materialized[ask.batch] == 1
    with pytest.raises(ValueError):
        World().co.render_failed("x", reason="gone", authorized=True)  # type: ignore[arg-type]


def test_notice_during_render_opens_a_new_batch_that_waits() -> None:
    w = World()
    w.notice(fs(), "n1")
    (ask,) = w.begin(A)
    assert w.notice(fs(), "n2").outcome == "first"
    assert ask.params["notices"] == [{"eventId": "n1", "timestamp": "t-n1"}]
    assert w.begin(A) == []  # one render in flight per subject
    w.result(ask.batch, "ONE")
    (ask2,) = w.begin(A)
    assert ask2.params["notices"] == [{"eventId": "n2", "timestamp": "t-n2"}]


def test_retract_during_render_cancels_frozen_and_pending() -> None:
    w = World()
    w.notice(fs(), "n1", initial=True)
    (ask,) = w.begin(A)
    w.notice(fs(), "n2")
    step = w.retract(fs(), "z")
    assert step.result() == {"outcome": "retracted", "priorEventId": "n2"}
    assert {a.kind for a in step.effects if isinstance(a, Audit)} == {"cancelled", "superseded"}
    assert w.result(ask.batch, "LATE").outcome == "discarded"
    assert w.fail(ask.batch).outcome == "discarded"
    assert w.begin(A) == [] and w.ids(A) == [] and not w.materialized


def test_plain_during_render_supersedes_and_a_later_notice_survives() -> None:
    w = World()
    w.notice(fs(), "n1")
    (ask,) = w.begin(A)
    w.notice(fs(), "n2")
    assert w.plain(fs(), "p").outcome == "replaced"
    assert w.notice(fs(), "n3").result() == {"outcome": "replaced", "priorEventId": "p"}
    assert w.ids(A) == []  # the plain occurrence was displaced unread
    assert w.fail(ask.batch).outcome == "discarded"
    (ask3,) = w.begin(A)
    assert ask3.params["eventId"] == "n3" and len(ask3.params["notices"]) == 1


def test_plain_to_deferred_displaces_unread_and_keeps_read() -> None:
    w = World()
    w.plain(fs(), "a", initial=True)
    step = w.notice(fs(), "n1")
    assert step.result() == {"outcome": "replaced", "priorEventId": "a"}
    assert w.ids(A) == []
    w2 = World()
    w2.plain(fs(), "a", initial=True)
    w2.request(A)
    w2.request(B)
    assert w2.notice(fs(), "n1").outcome == "first"
    assert w2.ids(A) == ["o1"]


def test_materialized_unread_is_replaceable_and_consumed_is_history() -> None:
    w = World()
    w.notice(fs(), "n1", initial=True)
    (ask,) = w.begin(A)
    w.result(ask.batch)  # materialized, nobody read it
    step = w.retract(fs(), "z")
    assert step.outcome == "retracted" and Hide(ask.batch, frozenset(AB)) in step.effects
    w = World()
    w.notice(fs(), "n1", initial=True)
    (ask,) = w.begin(A)
    w.result(ask.batch)
    w.request(A)
    assert w.retract(fs(), "z").outcome == "noted"
    assert w.ids(A) == [ask.batch, f"o{w.seq}"]


def test_shared_render_baseline_survives_in_unread_contexts() -> None:
    w = World()
    w.notice(fs(), "n1")
    (ask,) = w.begin(A)
    w.result(ask.batch, "R1")
    w.request(A)  # B has not read R1
    assert w.co.history(fs(), B) == "unknown"
    w.notice(fs(), "n2")
    (ask2,) = w.begin(B)
    w.result(ask2.batch, "R2")
    assert w.ids(B) == [ask.batch, ask2.batch]  # R1 before R2
    # and a plain occurrence cannot remove R1 from B either
    w.request(B)
    step = w.plain(fs(), "p")
    assert not any(isinstance(e, Hide) and e.occurrence == ask.batch for e in step.effects)


def test_a_newer_materialization_seals_an_unread_older_one() -> None:
    w = World()
    w.notice(fs(), "n1", initial=True)
    (ask,) = w.begin(A)
    w.result(ask.batch, "R1")
    w.notice(fs(), "n2")
    (ask2,) = w.begin(A)
    step = w.result(ask2.batch, "R2")
    assert any(isinstance(e, Audit) and e.kind == "sealed" for e in step.effects)
    assert w.co.view(fs()).occupant == ask2.batch  # type: ignore[union-attr]
    assert w.retract(fs(), "z").outcome == "noted"  # R1 stays, so the notice is due
    assert w.ids(A)[0] == ask.batch


def test_authority_is_checked_before_and_after_the_render() -> None:
    w = World()
    w.notice(fs(), "n1")
    assert w.begin(A, authorized=lambda view: view.subject != fs()) == []
    assert w.co.view(fs()).pending is None  # type: ignore[union-attr]
    assert any(isinstance(e, Audit) and e.kind == "dropped" for e in w.audits)
    w.notice(fs(), "n2")
    (ask,) = w.begin(A, authorized=lambda view: True)
    step = w.result(ask.batch, "R", authorized=False)
    assert step.outcome == "dropped" and not w.materialized and w.ids(A) == []
    assert w.fail(ask.batch).outcome == "discarded"
    w.notice(fs(), "n3")
    (ask3,) = w.begin(A)
    assert w.fail(ask3.batch, authorized=False).outcome == "dropped" and not w.materialized


def test_pending_batches_follow_the_audience() -> None:
    w = World()
    w.notice(fs(), "n1", ctx=[A])
    assert [v.event_id for v in w.co.pending_batches(A)] == ["n1"]
    assert w.co.pending_batches(B) == () and w.begin(B) == []
    w.notice(fs(), "n2", ctx=[B])  # joining narrows: the batch reaches no context any more
    assert w.co.pending_batches(A) == () and w.co.view(fs()).pending is None  # type: ignore[union-attr]


def test_inference_needed_rule() -> None:
    assert not inference_needed(other_causes=False, render_outcomes=["empty", "discarded"])
    assert inference_needed(other_causes=False, render_outcomes=["empty", "fallback"])
    assert inference_needed(other_causes=True, render_outcomes=[])


# ---------------------------------------------------------------------------------------------
# Receipts


def test_retry_returns_the_original_result_without_effects() -> None:
    w = World()
    first = w.plain(fs(), "a", initial=True)
    w.plain(fs(), "b")
    for retry in (
        w.co.admit_plain(fs(), event_id="a", occurrence="x", contexts=AB, now=HOUR - 1),
        w.co.admit_notice(
            fs(), event_id="a", feature_set="doc", fallback=[], contexts=AB, timestamp="", now=1
        ),
        w.co.retract(fs(), event_id="a", occurrence="x", notice=True, contexts=AB, now=2),
    ):
        assert retry.duplicate and retry.effects == () and retry.records == ()
        assert retry.result() == first.result()
    assert w.co.receipt("b", "a", now=0) == {"outcome": "first"}
    # past the window it is a new occurrence
    late = w.co.admit_plain(fs(), event_id="a", occurrence="x", contexts=AB, now=HOUR)
    assert not late.duplicate and late.outcome == "replaced"
    # receipts are per binding
    assert not w.co.admit_plain(
        fs(binding="z"), event_id="a", occurrence="y", contexts=AB, now=0
    ).duplicate


def test_window_advertised_at_admission_is_honoured() -> None:
    w = World()
    w.apply(w.co.advertise(Advertisement(retry_window_ms=2 * HOUR)))
    first = w.plain(fs(), "a", initial=True)
    w.apply(w.co.advertise(Advertisement(retry_window_ms=HOUR)))
    retry = w.co.admit_plain(fs(), event_id="a", occurrence="x", contexts=AB, now=90 * 60_000)
    assert retry.duplicate and retry.result() == first.result()
    assert w.co.retry_window_ms == HOUR
    again = Coalescer.replay(w.journal)  # and across a restart
    assert again.receipt("b", "a", now=2 * HOUR - 1) == {"outcome": "first"}
    assert again.receipt("b", "a", now=2 * HOUR) is None


def test_receipt_cap_drops_the_oldest() -> None:
    co = Coalescer()
    for i in range(MAX_RECEIPTS):
        co.admit_plain(fs(), event_id=f"e{i}", occurrence=f"o{i}", contexts=AB, now=0)
    assert co.receipt_count == MAX_RECEIPTS and co.receipt("b", "e0", now=0) is not None
    co.admit_plain(fs(), event_id="last", occurrence="ol", contexts=AB, now=0)
    assert co.receipt_count == MAX_RECEIPTS
    assert co.receipt("b", "e0", now=0) is None and co.receipt("b", "e1", now=0) is not None


def test_expired_receipts_are_purged() -> None:
    co = Coalescer(max_receipts=3)
    for i in range(3):
        co.admit_plain(fs(), event_id=f"e{i}", occurrence=f"o{i}", contexts=AB, now=i)
    co.admit_plain(fs(), event_id="new", occurrence="on", contexts=AB, now=HOUR + 1)
    assert co.receipt_count == 2  # e0 and e1 expired, e2 still open
    assert co.receipt("b", "e2", now=HOUR + 1) is not None


# ---------------------------------------------------------------------------------------------
# Capacity


def test_subject_cap_evicts_the_least_recently_touched() -> None:
    w = World()
    for i in range(MAX_SUBJECTS):
        w.plain(fs(f"K{i}"), f"e{i}", initial=True)
    assert len(w.co) == MAX_SUBJECTS and not w.audits
    w.plain(fs("K0"), "touch")  # K0 becomes the most recent: K1 is next out
    w.notice(fs("K2"), "n2")  # K2 holds a pending batch (its plain occupant displaced)
    step = w.plain(fs("new"), "x", initial=True)
    assert step.outcome == "first" and len(w.co) == MAX_SUBJECTS
    assert fs("K1") not in w.co and fs("K0") in w.co
    assert [e.kind for e in step.effects if isinstance(e, Audit)] == ["evicted"]
    # the evicted occupant stays as an ordinary occurrence; its history is now unknown
    assert "o2" in w.ids(A, unread=True)
    assert w.plain(fs("K1"), "again").outcome == "appended"
    assert w.co.history(fs("K1")) == "unknown"


def test_eviction_materializes_pending_and_rendering_batches_as_fallback() -> None:
    w = World(Coalescer(max_subjects=2))
    w.notice(fs("P"), "p1", fallback="PENDING_FB", ctx=[B])
    w.notice(fs("R"), "r1", fallback="RENDER_FB")
    (ask,) = w.begin(A)
    w.plain(fs("X"), "x")  # evicts P (least recently touched)
    w.plain(fs("Y"), "y")  # evicts R
    mats = [b for b, n in w.materialized.items() if n]
    assert len(mats) == 2 and ask.batch in mats
    assert w.result(ask.batch).outcome == "discarded"
    # never refused: a deferred notice at the cap still opens a batch
    assert w.notice(fs("Z"), "z").outcome == "first" and len(w.co) == 2


# ---------------------------------------------------------------------------------------------
# Recovery and the journal


def test_conservative_recovery() -> None:
    w = World()
    w.plain(fs("K"), "a", initial=True)
    w.notice(fs("P"), "p1", initial=True, ctx=[B])
    w.notice(fs("R"), "r1", fallback="RFB")
    (ask,) = w.begin(A)
    w.co = Coalescer.replay(w.journal)
    step = w.apply(w.co.recover())
    assert [e.source for e in step.effects if isinstance(e, Materialize)] == ["fallback"]
    assert w.plain(fs("K"), "b").outcome == "appended"  # sealed, history unknown
    assert w.ids(A)[:1] == ["o1"]
    assert w.result(ask.batch).outcome == "discarded"  # never rendered twice
    (again,) = w.begin(B)  # the untouched pending batch still renders
    assert again.params["eventId"] == "p1"
    assert w.co.history(fs("P")) == "none"
    w.apply(w.co.recover(history_lost=True))
    assert w.co.history(fs("P")) == "unknown"
    assert w.retract(fs("P"), "z").outcome == "noted"


def test_replay_and_snapshot_rebuild_the_state() -> None:
    w = World()
    w.plain(fs(), "a", initial=True)
    w.notice(fs("D"), "n1", data={"x": 1})
    (ask,) = w.begin(A)
    w.notice(fs("D"), "n2")
    w.request(A)
    w.retract(fs("gone"), "z")
    replayed = Coalescer.replay(w.journal)
    assert replayed.snapshot() == w.co.snapshot()
    from_snapshot = Coalescer.replay([json.loads(json.dumps(w.co.snapshot()))])
    assert from_snapshot.snapshot() == w.co.snapshot()
    assert {r["op"] for r in w.journal} <= set(RECORD_OPS)
    # the same next steps
    for co in (replayed, from_snapshot, w.co):
        assert co.render_result(ask.batch, text("R"), authorized=True).outcome == "materialized"
        assert co.admit_plain(fs(), event_id="a", occurrence="x", contexts=AB, now=5).duplicate


@pytest.mark.parametrize(
    "record",
    [
        {"v": 2, "op": "plain"},
        {"v": 1, "op": "nope"},
        {"v": 1, "op": "rendered", "batch": "coalesced:9", "empty": True},
        {"v": 1, "op": "begin", "context": "A", "render": ["coalesced:1"], "drop": []},
    ],
)
def test_replay_rejects_records_that_do_not_fit(record: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Coalescer.replay([record])


def test_constructor_limits() -> None:
    with pytest.raises(ValueError):
        Coalescer(max_subjects=0)
    with pytest.raises(ValueError):
        Coalescer(retry_window_ms=HOUR - 1)
    with pytest.raises(ValueError):
        World().co.admit(
            parse({"key": "K", "deferred": True}), binding="b", occurrence="o", contexts=AB, now=0
        )


def test_admit_dispatches_by_mode() -> None:
    co = Coalescer()
    kw: dict[str, Any] = {"binding": "b", "contexts": AB, "now": 0, "feature_set": "doc"}
    assert (
        co.admit(parse({"key": "K", "initial": True}, eid="a"), occurrence="o1", **kw).outcome
        == "first"
    )
    step = co.admit(
        parse({"key": "K", "deferred": True, "data": [1]}, eid="n"),
        occurrence="o2",
        content=text("FB"),
        timestamp="t",
        tags=["x:y"],
        **kw,
    )
    assert step.outcome == "replaced" and co.view(fs()).pending is not None  # type: ignore[union-attr]
    retract = co.admit(
        parse({"key": "K", "retract": True}, eid="z"), occurrence="o3", content=[], **kw
    )
    assert retract.outcome == "retracted"


# ---------------------------------------------------------------------------------------------
# Stateful model


AGENTS = (A, B)
KEYS = ("K0", "K1", "K2", "K3")
MAX_S = 3
MAX_R = 6
PLANS = ("result", "empty", "error", "held", "drop")


class KeyModel:
    def __init__(self, initial: bool) -> None:
        self.none = {a: initial for a in AGENTS}
        self.occ: dict[str, Any] | None = None  # {"id", "kind", "unread": set}
        self.batch: int | None = None  # pending notices count
        self.batch_id: str | None = None
        self.rendering: str | None = None


class CoalescerMachine(RuleBasedStateMachine):
    """The coalescer against a reference model of RFC-006 written in terms of subjects, with a
    host world applying the effects. Every context hears every admission."""

    def __init__(self) -> None:
        super().__init__()
        self.w = World(Coalescer(max_subjects=MAX_S, max_receipts=MAX_R))
        self.keys: OrderedDict[str, KeyModel] = OrderedDict()
        self.sealed: set[str] = set()
        self.receipts: OrderedDict[str, tuple[str, int, int]] = OrderedDict()
        self.sent: dict[str, tuple[str, str, bool]] = {}  # eid -> (op, key, flag)
        self.window = HOUR
        self.held: list[tuple[str, str]] = []  # (batch, key)
        self.renders_started: set[str] = set()
        self.eid = 0

    # -- model helpers

    def touch(self, key: str) -> None:
        self.keys.move_to_end(key)

    def track(self, key: str, initial: bool) -> KeyModel:
        if key in self.keys:
            self.touch(key)
            return self.keys[key]
        while len(self.keys) >= MAX_S:
            _, old = self.keys.popitem(last=False)
            if old.occ is not None:
                self.sealed.add(old.occ["id"])
            if old.rendering is not None:
                self.sealed.add(old.rendering)
            if old.batch is not None:
                assert old.batch_id is not None
                self.sealed.add(old.batch_id)
        self.keys[key] = KeyModel(initial)
        return self.keys[key]

    def remember(self, eid: str, outcome: str) -> None:
        now = self.w.now
        while self.receipts:
            first = next(iter(self.receipts.values()))
            if now - first[1] < first[2]:
                break
            self.receipts.popitem(last=False)
        self.receipts.pop(eid, None)
        self.receipts[eid] = (outcome, now, self.window)
        while len(self.receipts) > MAX_R:
            self.receipts.popitem(last=False)

    def next_eid(self) -> str:
        self.eid += 1
        return f"e{self.eid}"

    def unread_work(self, m: KeyModel) -> set[str]:
        unread: set[str] = set(m.occ["unread"]) if m.occ else set()
        if m.batch is not None or m.rendering is not None:
            unread |= set(AGENTS)
        return unread

    def withdraw(self, m: KeyModel) -> None:
        m.occ, m.batch, m.rendering = None, None, None

    def materialize(self, m: KeyModel, batch: str) -> None:
        if m.occ is not None:
            assert m.occ["kind"] == "materialized"
            for a in m.occ["unread"]:
                m.none[a] = False
            self.sealed.add(m.occ["id"])
        m.occ = {"id": batch, "kind": "materialized", "unread": set(AGENTS)}

    # -- rules

    @rule(key=st.sampled_from(KEYS), initial=st.booleans())
    def plain(self, key: str, initial: bool) -> None:
        m = self.track(key, initial)
        unread = self.unread_work(m)
        if unread:
            expected = "appended" if set(AGENTS) - unread else "replaced"
        else:
            expected = "first" if all(m.none.values()) else "appended"
        eid = self.next_eid()
        step = self.w.plain(fs(key), eid, initial=initial)
        assert step.outcome == expected
        self.withdraw(m)
        m.occ = {"id": f"o{self.w.seq}", "kind": "plain", "unread": set(AGENTS)}
        self.remember(eid, expected)
        self.sent[eid] = ("plain", key, initial)

    @rule(key=st.sampled_from(KEYS), initial=st.booleans())
    def notice(self, key: str, initial: bool) -> None:
        m = self.track(key, initial)
        if m.batch is not None:
            expected = "replaced"
            m.batch += 1
        elif m.occ is not None and m.occ["kind"] == "plain":
            expected = "replaced"
            m.occ, m.batch = None, 1
        else:
            expected, m.batch = "first", 1
        eid = self.next_eid()
        assert self.w.notice(fs(key), eid, initial=initial).outcome == expected
        view = self.w.co.view(fs(key))
        assert view is not None and view.pending is not None
        m.batch_id = view.pending
        self.remember(eid, expected)
        self.sent[eid] = ("notice", key, initial)

    @rule(key=st.sampled_from(KEYS), notice=st.booleans())
    def retract(self, key: str, notice: bool) -> None:
        m = self.keys.get(key)
        if m is not None:
            self.touch(key)
            self.withdraw(m)
        seen = m is None or not all(m.none.values())
        expected = "retracted" if not seen else ("noted" if notice else "consumed")
        eid = self.next_eid()
        step = self.w.retract(fs(key), eid, notice=notice)
        assert step.outcome == expected
        appended = [e for e in step.effects if isinstance(e, Append)]
        if expected == "noted":
            reach = set(AGENTS) if m is None else {a for a in AGENTS if not m.none[a]}
            assert appended == [Append(f"o{self.w.seq}", frozenset(reach))]
            self.sealed.add(f"o{self.w.seq}")
        else:
            assert appended == []
        self.remember(eid, expected)
        self.sent[eid] = ("retract", key, notice)

    @rule(
        agent=st.sampled_from(AGENTS),
        plans=st.lists(st.sampled_from(PLANS), min_size=4, max_size=4),
    )
    def assemble(self, agent: str, plans: list[str]) -> None:
        expected = [k for k, m in self.keys.items() if m.batch is not None and m.rendering is None]
        choice = dict(zip(expected, plans, strict=False))
        asked = self.w.begin(agent, authorized=lambda v: choice[v.subject.key] != "drop")
        assert [r.subject.key for r in asked] == [k for k in expected if choice[k] != "drop"]
        rendered = [k for k in expected if choice[k] != "drop"]
        for key in rendered + [k for k in expected if choice[k] == "drop"]:
            self.touch(key)
            self.keys[key].batch = None
        for request in asked:
            key = request.subject.key
            m = self.keys[key]
            m.rendering = request.batch
            assert request.batch not in self.renders_started
            self.renders_started.add(request.batch)
            plan = choice[key]
            if plan == "held":
                self.held.append((request.batch, key))
                continue
            if plan == "error":
                outcome = self.w.fail(request.batch, "error").outcome
            else:
                outcome = self.w.result(request.batch, "R" if plan == "result" else "").outcome
            assert (
                outcome == {"result": "materialized", "empty": "empty", "error": "fallback"}[plan]
            )
            self.touch(key)
            m.rendering = None
            if plan != "empty":
                self.materialize(m, request.batch)
        # the request: everything in the agent's context is consumed, in context order
        for item in self.w.ctx[agent]:
            for key, m in self.keys.items():
                if m.occ is not None and m.occ["id"] == item["id"]:
                    if m.occ["kind"] == "materialized":
                        self.touch(key)
                        for a in AGENTS:
                            m.none[a] = False
                        self.sealed.add(m.occ["id"])  # shared baseline: kept everywhere
                        m.occ = None
                    elif agent in m.occ["unread"]:
                        self.touch(key)
                        m.none[agent] = False
                        m.occ["unread"].discard(agent)
                        if not m.occ["unread"]:
                            m.occ = None
                    break
        self.w.request(agent)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), how=st.sampled_from(["result", "empty", "timeout", "lapsed"]))
    def complete(self, data: st.DataObject, how: str) -> None:
        batch, key = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        m = self.keys.get(key)
        live = m is not None and m.rendering == batch
        if how == "timeout":
            step = self.w.fail(batch)
        else:
            step = self.w.result(batch, "" if how == "empty" else "R", authorized=how != "lapsed")
        if not live:
            assert step.outcome == "discarded" and step.records == ()
            return
        assert m is not None
        expected = {
            "result": "materialized",
            "empty": "empty",
            "timeout": "fallback",
            "lapsed": "dropped",
        }
        assert step.outcome == expected[how]
        self.touch(key)
        m.rendering = None
        if how in ("result", "timeout"):
            self.materialize(m, batch)

    @precondition(lambda self: self.receipts)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        eid = data.draw(st.sampled_from(sorted(self.receipts)))
        outcome, at, window = self.receipts[eid]
        if self.w.now - at >= window:
            return
        op, key, flag = self.sent[eid]
        co = self.w.co
        if op == "plain":
            step = co.admit_plain(
                fs(key), event_id=eid, occurrence="x", contexts=AB, now=self.w.now
            )
        elif op == "notice":
            step = co.admit_notice(
                fs(key),
                event_id=eid,
                feature_set="doc",
                fallback=[],
                contexts=AB,
                timestamp="",
                now=self.w.now,
            )
        else:
            step = co.retract(
                fs(key), event_id=eid, occurrence="x", notice=flag, contexts=AB, now=self.w.now
            )
        assert (
            step.duplicate and step.outcome == outcome and step.effects == () and step.records == ()
        )

    @rule(ms=st.sampled_from([1, 60_000, HOUR - 1, HOUR, 2 * HOUR]))
    def advance(self, ms: int) -> None:
        self.w.now += ms

    @rule(hours=st.sampled_from([1, 2]))
    def advertise(self, hours: int) -> None:
        self.w.apply(self.w.co.advertise(Advertisement(retry_window_ms=hours * HOUR)))
        self.window = hours * HOUR

    @rule(mode=st.sampled_from(["replay", "recover", "lost", "snapshot"]))
    def restart(self, mode: str) -> None:
        before = self.w.co.snapshot()
        if mode == "snapshot":
            self.w.co = Coalescer.replay([before], max_subjects=MAX_S, max_receipts=MAX_R)
            self.w.journal = [before]
        else:
            self.w.co = Coalescer.replay(self.w.journal, max_subjects=MAX_S, max_receipts=MAX_R)
        assert self.w.co.snapshot() == before
        if mode in ("recover", "lost"):
            self.w.apply(self.w.co.recover(history_lost=mode == "lost"))
            for m in self.keys.values():
                sealed = m.occ is not None or m.rendering is not None
                if m.occ is not None:
                    self.sealed.add(m.occ["id"])
                if m.rendering is not None:
                    self.sealed.add(m.rendering)
                m.occ, m.rendering = None, None
                if sealed or mode == "lost":
                    m.none = dict.fromkeys(AGENTS, False)

    # -- invariants

    @invariant()
    def matches_the_model(self) -> None:
        co = self.w.co
        assert list(co.subjects()) == [fs(k) for k in self.keys]
        for key, m in self.keys.items():
            view = co.view(fs(key))
            assert view is not None
            assert view.occupant == (m.occ["id"] if m.occ else None)
            assert view.unread == (frozenset(m.occ["unread"]) if m.occ else frozenset())
            assert (view.pending_notices or None) == m.batch
            assert view.rendering == m.rendering
            for a in AGENTS:
                assert (co.history(fs(key), a) == "none") is m.none[a]
            # one slot per subject: a plain occupant excludes any batch
            if m.occ is not None and m.occ["kind"] == "plain":
                assert m.batch is None and m.rendering is None
        for eid, (outcome, at, window) in self.receipts.items():
            got = co.receipt("b", eid, now=self.w.now)
            if self.w.now - at < window:
                assert got is not None and got["outcome"] == outcome
            else:
                assert got is None
        assert co.receipt_count == len(self.receipts)

    @invariant()
    def replaced_unread_work_is_gone(self) -> None:
        occupants = {m.occ["id"]: set(m.occ["unread"]) for m in self.keys.values() if m.occ}
        for agent, items in self.w.ctx.items():
            for item in items:
                if item["consumed"]:
                    continue
                if item["id"] in occupants:
                    assert agent in occupants[item["id"]]
                else:
                    # an unread item that is nobody's occupant was sealed, never replaced
                    assert item["id"] in self.sealed, (agent, item, occupants)
        for occurrence, agents in occupants.items():
            for agent in agents:
                assert occurrence in self.w.ids(agent, unread=True)

    @invariant()
    def one_materialization_per_batch(self) -> None:
        assert all(n == 1 for n in self.w.materialized.values())
        assert set(self.w.materialized) <= self.renders_started | self.sealed

    @invariant()
    def journal_replays_to_the_same_state(self) -> None:
        replayed = Coalescer.replay(self.w.journal, max_subjects=MAX_S, max_receipts=MAX_R)
        assert replayed.snapshot() == self.w.co.snapshot()


TestCoalescerMachine = CoalescerMachine.TestCase
TestCoalescerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------------------------------------
# Journal replay property: same state, same next outcomes


OP = st.one_of(
    st.tuples(st.just("plain"), st.sampled_from(KEYS), st.booleans(), st.sampled_from(AGENTS)),
    st.tuples(st.just("notice"), st.sampled_from(KEYS), st.booleans(), st.sampled_from(AGENTS)),
    st.tuples(st.just("retract"), st.sampled_from(KEYS), st.booleans(), st.sampled_from(AGENTS)),
    st.tuples(st.just("begin"), st.sampled_from(AGENTS), st.booleans(), st.sampled_from(AGENTS)),
    st.tuples(st.just("finish"), st.integers(0, 3), st.sampled_from(PLANS), st.booleans()),
    st.tuples(st.just("consume"), st.sampled_from(AGENTS), st.booleans(), st.sampled_from(AGENTS)),
    st.tuples(st.just("retry"), st.integers(0, 30), st.booleans(), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([1, HOUR]), st.booleans(), st.booleans()),
    st.tuples(st.just("recover"), st.booleans(), st.booleans(), st.booleans()),
)


def drive(
    co: Coalescer, ops: list[tuple[Any, ...]], clock: list[int], log: list[str]
) -> list[Step]:
    """Run ops; ``log`` is the shared list of event ids and batches seen (by position)."""
    steps = []
    for op in ops:
        kind = op[0]
        now = clock[0]
        if kind == "plain":
            eid = f"e{len(log)}"
            log.append(eid)
            ctx = AB if op[2] else (op[3],)
            step = co.admit_plain(
                fs(op[1]), event_id=eid, occurrence=eid, contexts=ctx, initial=op[2], now=now
            )
        elif kind == "notice":
            eid = f"e{len(log)}"
            log.append(eid)
            step = co.admit_notice(
                fs(op[1]), event_id=eid, feature_set="doc", fallback=text(eid), contexts=AB,
                timestamp=eid, initial=op[2], data={"eid": eid}, now=now,
            )  # fmt: skip
        elif kind == "retract":
            eid = f"e{len(log)}"
            log.append(eid)
            step = co.retract(
                fs(op[1]), event_id=eid, occurrence=eid, notice=op[2], contexts=AB, now=now
            )
        elif kind == "begin":
            step = co.begin_assembly(
                op[1], authorized=lambda v, allow=op[2]: allow or v.notices > 1
            )
            log.extend(e.batch for e in step.effects if isinstance(e, RequestRender))
        elif kind == "finish":
            batches = [x for x in log if x.startswith("coalesced:")]
            if not batches:
                continue
            batch = batches[op[1] % len(batches)]
            if op[2] in ("error", "held"):
                step = co.render_failed(batch, reason="error", authorized=op[3])
            else:
                step = co.render_result(
                    batch, text("R") if op[2] == "result" else [], authorized=op[3]
                )
        elif kind == "consume":
            step = co.assembled(op[1], list(log))
        elif kind == "retry":
            eids = [x for x in log if x.startswith("e")]
            if not eids:
                continue
            step = co.admit_plain(
                fs("K0"), event_id=eids[op[1] % len(eids)], occurrence="r", contexts=AB, now=now
            )
        elif kind == "tick":
            clock[0] += op[1]
            continue
        else:
            step = co.recover(history_lost=op[1])
        steps.append(step)
    return steps


@given(st.lists(OP, max_size=40), st.lists(OP, max_size=20))
@settings(max_examples=150, deadline=None)
def test_journal_replay_gives_the_same_next_outcomes(
    before: list[tuple[Any, ...]], after: list[tuple[Any, ...]]
) -> None:
    original = Coalescer(max_subjects=3, max_receipts=5)
    clock, log = [0], []
    steps = drive(original, before, clock, log)
    journal = [r for s in steps for r in s.records]
    json.loads(json.dumps(journal))
    replayed = Coalescer.replay(journal, max_subjects=3, max_receipts=5)
    compacted = Coalescer.replay([original.snapshot()], max_subjects=3, max_receipts=5)
    assert replayed.snapshot() == original.snapshot() == compacted.snapshot()
    expected = drive(original, after, list(clock), list(log))
    assert drive(replayed, after, list(clock), list(log)) == expected
    assert drive(compacted, after, list(clock), list(log)) == expected
