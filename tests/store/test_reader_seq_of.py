"""``Reader.seq_of``: a stored message's seq from its id (of a given agent), found without
reading its body; None for an id the store (or that agent) has no message with."""

from __future__ import annotations

from pathlib import Path

from store import Append, Database, Reader
from tests.store.conftest import record


def test_the_seq_of_each_message_and_none_for_an_unknown_id(path: Path) -> None:
    records = [record(f"t{i}", agent="alice" if i % 2 else "bob") for i in range(6)]
    with Database(path) as db:
        db.apply([Append(records=tuple(records[:3])), Append(records=tuple(records[3:]))])
    with Reader(path) as reader:
        rows = reader.rows(limit=100)
        assert [r.message["id"] for r in rows] == [r.id for r in records]
        for row in rows:
            message_id, agent = row.message["id"], row.message["agent"]
            assert reader.seq_of(message_id) == row.seq
            assert reader.seq_of(message_id, agent) == row.seq
            other = "bob" if agent == "alice" else "alice"
            assert reader.seq_of(message_id, other) is None
        assert reader.seq_of("nowhere") is None
        assert reader.seq_of("nowhere", "alice") is None
