"""A batch applied at once stores exactly what its ops applied one by one would store."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from store import Append, AppendResult, Database, MessageRecord, PutState, Reader, StoreError

_KEYS = [
    ("incoming", "s1", "a"),
    ("incoming", "s1", "b"),
    ("event", "s2", "a"),
    ("event", "s1", "c"),
]


def _record(rid: str, text: str) -> MessageRecord:
    return MessageRecord(
        id=rid,
        agent="ada",
        role="user",
        blocks=({"type": "text", "text": text},),
        metadata={"n": text},
        created_at=2.0,
    )


_appends = st.builds(
    lambda ids, key, text: Append(
        records=tuple(_record(i, f"{text}{n}") for n, i in enumerate(ids)), dedupe=key
    ),
    st.lists(st.sampled_from(["r1", "r2", "r3", "r4", "r5", "r6"]), min_size=0, max_size=3),
    st.none() | st.sampled_from(_KEYS),
    st.text(max_size=5),
)
_states = st.builds(
    PutState,
    namespace=st.sampled_from(["n1", "n2"]),
    key=st.sampled_from(["k1", "k2"]),
    value=st.none() | st.integers() | st.just({"bad": object()}),
)
_ops = st.lists(_appends | _states, max_size=12)


def _shape(outcome: Any) -> Any:
    return "error" if isinstance(outcome, StoreError) else outcome


def _contents(path: Path) -> tuple[Any, ...]:
    with Reader(path) as reader:
        history = [(m["id"], m["blocks"], m["metadata"]) for m in reader.history()]
        keys = [k for k in _KEYS if reader.has_dedupe(*k)]
        states = (reader.state("n1"), reader.state("n2"))
    return history, keys, states


@given(before=_ops, batch=_ops)
def test_batch_equals_ops_one_by_one(before: list[Any], batch: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        together, alone = Path(tmp, "together.db"), Path(tmp, "alone.db")
        with Database(together) as db_t, Database(alone) as db_a:
            for op in before:  # the same earlier state in both stores
                db_t.apply([op])
                db_a.apply([op])
            batched = db_t.apply(batch)
            one_by_one = [db_a.apply([op])[0] for op in batch]
        assert [_shape(o) for o in batched] == [_shape(o) for o in one_by_one]
        assert _contents(together) == _contents(alone)


def test_a_batch_larger_than_one_statement(tmp_path: Path) -> None:
    # More rows and keys than one multi-row statement holds, with duplicates of earlier keys
    # spread through it.
    path = tmp_path / "s.db"
    with Database(path) as db:
        db.apply([Append(records=(_record("old", "x"),), dedupe=("k", "s", "7"))])
        ops = [
            Append(records=(_record(f"id{i}", str(i)),), dedupe=("k", "s", str(i % 700)))
            for i in range(1000)
        ]
        outcomes = db.apply(ops)
    stored = [o == AppendResult(stored=True) for o in outcomes]
    assert stored == [i < 700 and i != 7 for i in range(1000)]
    with Reader(path) as reader:
        assert reader.count() == 700
        ids = [m["id"] for m in reader.history()]
    assert ids == ["old"] + [f"id{i}" for i in range(700) if i != 7]
