"""The facts index (``store.facts``): which records make which facts, the rows the writer adds
in the same transaction as the messages, its bounded memory of rows already written, and the
upgrade of a version-2 store (filled from the messages stored before it)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import (
    HEADER_FACT,
    NOTICE_FACT,
    NOTICE_KIND,
    SCHEMA_VERSION,
    Append,
    AppendResult,
    Database,
    Reader,
    StoreError,
    decode_body,
    encode_body,
    facts_of,
)
from store.facts import FACTS_SCHEMA, MARKERS, FactWriter
from tests.store.conftest import record
from tests.store.old_schema import schema_version, write_v2_store

NOTICE_META = {"system": True, "kind": NOTICE_KIND}

# ------------------------------------------------------------------------------ the rule

_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
_metadata = st.dictionaries(
    st.sampled_from(["source_header", "system", "kind", "source", "message_id"])
    | st.text(max_size=6),
    _values | st.just(NOTICE_KIND) | st.just(True) | st.just(1),
    max_size=5,
)


@given(_metadata)
def test_a_header_fact_is_a_string_source_header_and_a_notice_fact_is_the_hosts_own(
    metadata: dict[str, Any],
) -> None:
    facts = set(facts_of(metadata))
    assert (HEADER_FACT in facts) == isinstance(metadata.get("source_header"), str)
    own = metadata.get("system") is True and metadata.get("kind") == NOTICE_KIND
    assert (NOTICE_FACT in facts) == own
    assert facts <= {HEADER_FACT, NOTICE_FACT}


@given(_metadata, st.text(max_size=20))
def test_a_stored_body_makes_the_same_facts_and_holds_the_marker_of_each(
    metadata: dict[str, Any], text: str
) -> None:
    body = encode_body([{"type": "text", "text": text}], metadata)
    _blocks, stored = decode_body(body)
    assert facts_of(stored) == facts_of(metadata)  # what the writer saw is what a scan sees
    for fact in facts_of(metadata):
        assert MARKERS[fact] in body  # so the scan's byte filter never skips a fact


def test_a_senders_kind_without_system_true_is_no_notice() -> None:
    assert facts_of({"kind": NOTICE_KIND}) == ()
    assert facts_of({"system": 1, "kind": NOTICE_KIND}) == ()
    assert facts_of({"system": True, "kind": "other"}) == ()
    assert facts_of({"source_header": None}) == ()
    assert facts_of({"source_header": "[source: a · unscoped]", **NOTICE_META}) == (
        HEADER_FACT,
        NOTICE_FACT,
    )


# ------------------------------------------------------------------------------ the writer


def test_appends_fill_the_index_in_the_same_transaction(path: Path) -> None:
    with Database(path) as db:
        results = db.apply(
            [
                Append(records=(record(agent="ada", header="[source: a · unscoped]"),)),
                Append(records=(record(agent="bo", role="system", metadata=NOTICE_META),)),
                Append(records=(record(agent="cy", metadata={"kind": NOTICE_KIND}),)),
                # a retry the dedupe key refuses stores nothing, so makes no fact
                Append(records=(record(agent="dee", header="[source: a · unscoped]"),)),
            ]
        )
        assert results == [AppendResult(stored=True)] * 4
        dup = ("event", "lobby", "e1")
        assert db.apply([Append(records=(record(agent="eve"),), dedupe=dup)]) == [
            AppendResult(stored=True)
        ]
        hit = Append(records=(record(agent="fay", header="[source: a · unscoped]"),), dedupe=dup)
        assert db.apply([hit]) == [AppendResult(stored=False)]
    with Reader(path) as reader:
        assert reader.agent_facts("ada") == {HEADER_FACT}
        assert reader.agent_facts("bo") == {NOTICE_FACT}
        assert reader.agent_facts("cy") == frozenset()
        assert reader.agent_facts("dee") == {HEADER_FACT}
        assert reader.agent_facts("eve") == frozenset()
        assert reader.agent_facts("fay") == frozenset()
        assert reader.agent_facts("nobody") == frozenset()


def test_an_append_that_fails_in_its_batch_makes_no_fact(path: Path) -> None:
    with Database(path) as db:
        db.apply([Append(records=(record(id="taken"),))])
        outcomes = db.apply(
            [
                Append(records=(record(agent="ada", header="[source: a · x]"),)),
                # fails (its second id is taken): its header item is not stored, nor its fact
                Append(
                    records=(
                        record(agent="bo", header="[source: a · x]"),
                        record(agent="bo", id="taken"),
                    )
                ),
            ]
        )
        assert outcomes[0] == AppendResult(stored=True)
        assert isinstance(outcomes[1], StoreError)
        assert (("bo", HEADER_FACT)) not in db.facts.known()
        with Reader(path) as reader:
            assert reader.agent_facts("ada") == {HEADER_FACT}
            assert reader.agent_facts("bo") == frozenset()
        # bo's next header item is the first: it is indexed
        db.apply([Append(records=(record(agent="bo", header="[source: a · x]"),))])
    with Reader(path) as reader:
        assert reader.agent_facts("bo") == {HEADER_FACT}


def test_the_writer_remembers_at_most_its_cap_and_a_forgotten_pair_is_written_again(
    path: Path,
) -> None:
    with Database(path) as db:
        db.facts = FactWriter(cap=2)
        for agent in ("ada", "bo", "cy"):
            db.apply([Append(records=(record(agent=agent, header="[source: a · x]"),))])
        # at the cap the oldest pair is forgotten
        assert db.facts.known() == [("bo", HEADER_FACT), ("cy", HEADER_FACT)]
        # met again, the forgotten pair costs one more INSERT OR IGNORE and no error
        db.apply([Append(records=(record(agent="ada", header="[source: a · x]"),))])
        assert db.facts.known() == [("cy", HEADER_FACT), ("ada", HEADER_FACT)]
    with Reader(path) as reader:
        for agent in ("ada", "bo", "cy"):
            assert reader.agent_facts(agent) == {HEADER_FACT}


def test_the_cap_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FactWriter(cap=0)


def test_pairs_of_a_rolled_back_transaction_are_not_remembered() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    for statement in FACTS_SCHEMA:
        conn.execute(statement)
    facts = FactWriter()
    append = Append(records=(record(agent="ada", header="[source: a · x]"),))

    def rows() -> list[Any]:
        return conn.execute("SELECT agent, fact FROM agent_facts").fetchall()

    conn.execute("BEGIN")
    facts.write(conn, [append])
    conn.execute("ROLLBACK")
    facts.rolled_back()
    assert rows() == [] and facts.known() == []
    conn.execute("BEGIN")
    facts.write(conn, [append])  # written again, since the first one was undone
    conn.execute("COMMIT")
    facts.committed()
    assert rows() == [("ada", HEADER_FACT)]
    assert facts.known() == [("ada", HEADER_FACT)]


# ------------------------------------------------------------------------------ the upgrade

HEADER = "[source: lobby · unscoped]"


def _v2_history() -> list[Any]:
    far = record("chimes", agent="ada", header=HEADER, id="far")
    filler = [record(f"filler {i}", agent="ada", id=f"f{i}") for i in range(2000)]
    notice = record("[source] ...", agent="bo", role="system", metadata=NOTICE_META, id="n")
    forged = record("x", agent="cy", metadata={"kind": NOTICE_KIND}, id="forged")
    return [far, *filler, notice, forged]


#: A body that does not decode but holds both markers: it is skipped and makes no fact.
_DAMAGED = ("damaged", "dee", b"\xff" + MARKERS[HEADER_FACT] + MARKERS[NOTICE_FACT])


@pytest.mark.sqlite_only
@pytest.mark.parametrize("opener", [Database, Reader])
def test_a_version_2_store_is_upgraded_with_the_facts_of_what_it_held(
    path: Path, opener: Any
) -> None:
    write_v2_store(path, _v2_history(), raw=[_DAMAGED])
    opener(path).close()
    assert schema_version(path) == str(SCHEMA_VERSION) == "6"  # through 3, 4, 5, then 6
    with Reader(path) as reader:
        assert reader.agent_facts("ada") == {HEADER_FACT}
        assert reader.agent_facts("bo") == {NOTICE_FACT}
        assert reader.agent_facts("cy") == frozenset()
        assert reader.agent_facts("dee") == frozenset()
    with Database(path) as db:  # and the writer goes on from there
        db.apply([Append(records=(record(agent="cy", header=HEADER),))])
    with Reader(path) as reader:
        assert reader.agent_facts("cy") == {HEADER_FACT}


@pytest.mark.sqlite_only
def test_a_version_2_store_read_only_answers_by_scanning_and_stays_version_2(path: Path) -> None:
    write_v2_store(path, _v2_history(), raw=[_DAMAGED])
    with Reader(path, read_only=True) as reader:
        assert reader.agent_facts("ada") == {HEADER_FACT}
        assert reader.agent_facts("bo") == {NOTICE_FACT}
        assert reader.agent_facts("cy") == frozenset()
        assert reader.agent_facts("dee") == frozenset()
    assert schema_version(path) == "2"


@pytest.mark.sqlite_only
def test_a_failed_upgrade_from_version_2_leaves_version_2(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import store.schema

    write_v2_store(path, _v2_history())

    def broken(conn: sqlite3.Connection) -> None:
        store.facts.backfill(conn)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setitem(store.schema.UPGRADES, 2, (broken,))
    with pytest.raises(StoreError):
        Database(path)
    assert schema_version(path) == "2"
    monkeypatch.undo()
    with Database(path):
        pass
    with Reader(path) as reader:
        assert reader.agent_facts("ada") == {HEADER_FACT}
