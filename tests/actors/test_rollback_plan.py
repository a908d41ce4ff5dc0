"""Planning a rollback in pages (``actors.agent.rollback_plan``) decides what reading the agent's
whole history decides: the same messages set aside and the same checkpoint targets, or a refusal in
the same cases. A stateful model writes histories as the host does (items, replies, tool results
checkpointing several lineages, coalesce-hidden markers, rollbacks, items arriving while a
rollback is under way, another agent's messages in between) into a real SQLite store, and
compares the paged plan with the whole-history code at every step, on small pages."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from actors.agent import rollback_plan
from actors.agent.history import live_messages
from actors.agent.rollback_plan import RollbackRefused, plan_rollback
from actors.channel.coalescer import HIDDEN_KIND
from protocol.state import Recorded, rollback_targets
from store import Append, Database, MessageRecord, Reader

SPAN = 6  # a small span, so refusals happen
SERVERS = ("s1", "s2")
FEATURE_SETS = ("fa", "fb")

Outcome = tuple[tuple[str, ...], dict[tuple[str, str], str]] | None  # None: refused


def whole_history(
    history: list[dict[str, Any]],
    to: str,
    current: Mapping[tuple[str, str], str],
    span: int = SPAN,
) -> Outcome:
    """The decision as made from the whole history (the code ``roll_back`` ran before it read
    in pages): what is set aside and the targets, or None when it refuses."""
    live = live_messages(history)
    order = [m["id"] for m in live]
    if to not in order:
        return None
    set_aside = order[order.index(to) + 1 :]
    if len(set_aside) > span:
        return None
    recorded = [
        Recorded(
            message_id=m["id"],
            lineage=(c["server"], c["feature_set"]),
            checkpoint=c["checkpoint"],
            parent=c.get("parent"),
        )
        for m in live
        for c in m["metadata"].get("checkpoints", ())
    ]
    now = {r.lineage: c for r in recorded if (c := current.get(r.lineage))}
    return tuple(set_aside), rollback_targets(recorded, to, order, now)


def paged(
    reader: Reader, agent: str, to: str, current: Mapping[tuple[str, str], str], span: int = SPAN
) -> Outcome:
    try:
        plan = plan_rollback(reader, agent, to, span)
    except RollbackRefused:
        return None
    now = {r.lineage: c for r in plan.recorded if (c := current.get(r.lineage))}
    return plan.set_aside, rollback_targets(plan.recorded, to, plan.order, now)


class History(RuleBasedStateMachine):
    """Ada's history (and some of Bob's) written to a real store; every rule that writes checks
    the paged plan against the whole-history one for every candidate ``to``."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rollback-plan-"))
        self.db = Database(self.dir / "store.sqlite3")
        self.reader = Reader(self.dir / "store.sqlite3")
        self.ids = itertools.count()
        self.history: list[dict[str, Any]] = []  # Ada's, oldest first
        self.checkpoints: list[str] = []
        self.occurrences: list[str] = []

    def teardown(self) -> None:
        self.reader.close()
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _write(self, role: str, agent: str = "Ada", **meta: Any) -> str:
        message_id = f"m{next(self.ids)}"
        blocks = ({"type": "text", "text": message_id},)
        record = MessageRecord(
            id=message_id, agent=agent, role=role, blocks=blocks, metadata=meta, created_at=1.0
        )
        self.db.apply([Append(records=(record,))])
        if agent == "Ada":
            self.history.append(
                {"id": message_id, "agent": agent, "role": role, "blocks": list(blocks)}
                | {"metadata": meta}
            )
        return message_id

    def _live(self) -> list[str]:
        return [m["id"] for m in live_messages(self.history)]

    @rule(n=st.integers(1, 3))
    def items(self, n: int) -> None:
        for _ in range(n):
            occurrence = f"o{next(self.ids)}"
            self.occurrences.append(occurrence)
            self._write("user", occurrence=occurrence)

    @rule()
    def reply(self) -> None:
        self._write("assistant")

    @rule()
    def other_agent(self) -> None:
        self._write("user", agent="Bob", occurrence=f"o{next(self.ids)}")

    @rule(
        made=st.lists(
            st.tuples(st.sampled_from(SERVERS), st.sampled_from(FEATURE_SETS), st.booleans()),
            max_size=3,
        ),
        data=st.data(),
    )
    def tool_result(self, made: list[tuple[str, str, bool]], data: st.DataObject) -> None:
        checkpoints = []
        for server, feature_set, with_parent in made:
            parent = None
            if with_parent and self.checkpoints:
                parent = data.draw(st.sampled_from(self.checkpoints))
            checkpoint = f"c{next(self.ids)}"
            self.checkpoints.append(checkpoint)
            checkpoints.append(
                {"server": server, "feature_set": feature_set, "checkpoint": checkpoint}
                | ({"parent": parent} if parent is not None else {})
            )
        self._write("tool", **({"checkpoints": checkpoints} if checkpoints else {}))

    @precondition(lambda self: self.occurrences)
    @rule(data=st.data())
    def hide(self, data: st.DataObject) -> None:
        occurrence = data.draw(st.sampled_from(self.occurrences))
        self._write("system", system=True, kind=HIDDEN_KIND, occurrence=occurrence)

    @rule(data=st.data(), arriving=st.integers(0, 2))
    def roll_back(self, data: st.DataObject, arriving: int) -> None:
        """A rollback as the host makes it: decided from the history as it is, then items may
        arrive for the agent while the servers are asked, then the marker is stored."""
        live = self._live()
        if not live:
            return
        to = data.draw(st.sampled_from(live))
        decided = whole_history(self.history, to, {}, span=len(live))
        assert decided is not None
        for _ in range(arriving):
            self.items(1)
        self._write(
            "system", system=True, kind="rollback", to=to, set_aside=list(decided[0]), state=[]
        )

    @rule(data=st.data())
    def compare(self, data: st.DataObject) -> None:
        lineages = [(s, f) for s in SERVERS for f in FEATURE_SETS]
        current = data.draw(
            st.dictionaries(st.sampled_from(lineages), st.sampled_from([*self.checkpoints, "x"]))
        )
        candidates = [m["id"] for m in self.history] + ["nowhere"]
        for to in candidates:
            want = whole_history(self.history, to, current)
            got = paged(self.reader, "Ada", to, current)
            assert got == want, to
            if got is not None and want is not None:  # and the targets in the same order
                assert list(got[1].items()) == list(want[1].items())


History.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollback_plan, "PLAN_PAGE", 3)


class TestPagedPlanDecidesAsTheWholeHistory(History.TestCase):
    pass


# ---- bounds ------------------------------------------------------------------------------------


def _store(tmp_path: Path, records: Sequence[MessageRecord]) -> Reader:
    path = tmp_path / "store.sqlite3"
    with Database(path) as db:
        db.apply([Append(records=tuple(records))])
    return Reader(path)


def _message(message_id: str, role: str = "user", **meta: Any) -> MessageRecord:
    blocks = ({"type": "text", "text": message_id},)
    return MessageRecord(
        id=message_id, agent="Ada", role=role, blocks=blocks, metadata=meta, created_at=1.0
    )


def test_past_the_held_ids_bound_the_rollback_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A marker list longer than ``MAX_HELD_IDS`` is not held: the rollback is refused with a
    readable reason; at the bound it plans."""
    records = [_message(f"m{i}") for i in range(9)]
    records.append(
        _message(
            "r1",
            "system",
            system=True,
            kind="rollback",
            to="m0",
            set_aside=[f"m{i}" for i in range(1, 9)],
        )
    )
    records.append(_message("m9"))
    with _store(tmp_path, records) as reader:
        monkeypatch.setattr(rollback_plan, "MAX_HELD_IDS", 7)
        with pytest.raises(RollbackRefused, match="more than 7 set-aside or hidden"):
            plan_rollback(reader, "Ada", "m0")
        monkeypatch.setattr(rollback_plan, "MAX_HELD_IDS", 8)
        assert plan_rollback(reader, "Ada", "m0").set_aside == ("m9",)


def test_past_the_lineage_bound_the_rollback_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def tool(i: int) -> MessageRecord:
        checkpoint = {"server": "s", "feature_set": f"f{i}", "checkpoint": f"c{i}"}
        return _message(f"t{i}", "tool", checkpoints=[checkpoint])

    with _store(tmp_path, [tool(0), tool(1), tool(2), _message("to"), tool(3)]) as reader:
        monkeypatch.setattr(rollback_plan, "MAX_PLAN_LINEAGES", 2)
        with pytest.raises(RollbackRefused, match="more than 2 lineages"):
            plan_rollback(reader, "Ada", "to")
        monkeypatch.setattr(rollback_plan, "MAX_PLAN_LINEAGES", 3)
        plan = plan_rollback(reader, "Ada", "to")
    assert [r.lineage[1] for r in plan.recorded] == ["f0", "f1", "f2", "f3"]


def test_more_than_the_span_is_refused_without_reading_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [_message(f"m{i}") for i in range(40)]
    reads: list[int] = []
    with _store(tmp_path, records) as reader:
        rows = reader.rows

        def counting(**kw: Any) -> Any:
            page = rows(**kw)
            reads.append(len(page))
            return page

        monkeypatch.setattr(reader, "rows", counting)
        with pytest.raises(ValueError, match="at most 5 messages, this one more"):
            plan_rollback(reader, "Ada", "m0", span=5)
        assert sum(reads) <= 6 + 3  # the span plus one, within the last page read
        assert plan_rollback(reader, "Ada", "m34", span=5).set_aside == tuple(
            f"m{i}" for i in range(35, 40)
        )
