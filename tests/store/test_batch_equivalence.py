"""A batch applied at once stores exactly what its ops applied one by one would store."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from store import (
    Append,
    AppendResult,
    Database,
    JournalEntry,
    MessageRecord,
    PutState,
    Reader,
    StoreError,
    TrimJournal,
)

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


# Journal entries and trims. Message ids are unique per op unless ``dup`` asks for a shared one,
# and a batch holds at most one op that cannot be encoded (``poison``), so most batches stay on
# the bulk path and some fall back to one op at a time.
_STREAMS = ["j1", "j2"]
_entries = st.lists(
    st.builds(
        JournalEntry,
        st.sampled_from(_STREAMS),
        st.fixed_dictionaries({"v": st.just(1), "n": st.integers(0, 9)}),
    ),
    max_size=3,
).map(tuple)
_journal_appends = st.tuples(
    st.just("append"),
    st.integers(0, 2),  # messages
    st.sampled_from([False] * 7 + [True]),  # one of them has the shared id "dup"
    st.none() | st.sampled_from(_KEYS),
    _entries,
)
_good_states = st.builds(
    PutState,
    namespace=st.sampled_from(["n1", "n2"]),
    key=st.sampled_from(["k1", "k2"]),
    value=st.none() | st.integers(),
)
# A trim's before_seq counts back from the entries submitted so far (seqs are not known when
# generating), so trims often reach entries written earlier in the same batch.
_trims = st.tuples(st.just("trim"), st.sampled_from(_STREAMS), st.integers(0, 4))
_journal_specs = st.tuples(
    st.lists(_journal_appends | _journal_appends | _good_states | _trims, max_size=12),
    st.none() | st.none() | st.none() | st.integers(0, 12),  # where a poison op goes, if any
)
_POISON = (
    Append(records=(_record("poison", "p"),), journal=(JournalEntry("j1", {"bad": object()}),)),
    PutState(namespace="n1", key="k1", value={"bad": object()}),
)


def _build(specs: tuple[list[Any], int | None], prefix: str, submitted: list[int]) -> list[Any]:
    ops: list[Any] = []
    for i, spec in enumerate(specs[0]):
        if not isinstance(spec, tuple):
            ops.append(spec)
            continue
        if spec[0] == "trim":
            _, stream, back = spec
            ops.append(TrimJournal(stream=stream, before_seq=max(0, submitted[0] + 1 - back)))
            continue
        _, count, dup, key, journal = spec
        submitted[0] += len(journal)
        ids = [f"{prefix}{i}.{n}" for n in range(count)]
        if dup and ids:
            ids[0] = "dup"
        records = tuple(_record(rid, rid) for rid in ids)
        ops.append(Append(records=records, dedupe=key, journal=journal))
    if specs[1] is not None:
        ops.insert(min(specs[1], len(ops)), _POISON[specs[1] % 2])
    return ops


def _journal_contents(path: Path) -> tuple[Any, ...]:
    with Reader(path) as reader:
        journal = [reader.journal(stream) for stream in _STREAMS]
    return (*_contents(path), journal)


@given(before=_journal_specs, batch=_journal_specs)
def test_journal_batch_equals_one_by_one(
    before: tuple[list[Any], int | None], batch: tuple[list[Any], int | None]
) -> None:
    """The bulk path, the savepoint path and one op per transaction write the same rows (seqs
    included) and give the same outcomes."""
    submitted = [0]  # entries in the ops so far: at least the newest seq
    earlier, ops = _build(before, "b", submitted), _build(batch, "t", submitted)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp, f"{name}.db") for name in ("bulk", "savepoints", "alone")]
        with Database(paths[0]) as bulk, Database(paths[1]) as sp, Database(paths[2]) as alone:
            for op in earlier:  # the same earlier state in every store
                for db in (bulk, sp, alone):
                    db.apply([op])
            outcomes = [
                bulk.apply(ops),
                sp._apply_one_by_one(sp._connection(), ops),
                [alone.apply([op])[0] for op in ops],
            ]
        shapes = [[_shape(o) for o in each] for each in outcomes]
        assert shapes[0] == shapes[1] == shapes[2]
        contents = [_journal_contents(p) for p in paths]
        assert contents[0] == contents[1] == contents[2]
