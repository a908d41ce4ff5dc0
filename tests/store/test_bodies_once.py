"""Schema 4: the copies of one item for every agent hearing it store the body once, each agent a
small index row; messages read back exactly as they were written, ids stay unique, and the
``messages`` view keeps the shape (and the inserts) of the old table."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from store import (
    Append,
    AppendResult,
    Database,
    MessageRecord,
    Reader,
    StoreError,
    encode_body,
)
from store.items import ItemWriter
from tests.store.conftest import item_copies as copies
from tests.store.conftest import run_sql

AGENTS = [f"agent{i}" for i in range(12)]


def tables(path: Path) -> dict[str, int]:
    return {
        name: int(run_sql(path, f"SELECT COUNT(*) FROM {name}")[0][0])
        for name in ("items", "names", "message_refs", "messages")
    }


def test_the_copies_of_an_item_share_one_body_and_read_back_as_written(path: Path) -> None:
    ops = [copies(i, AGENTS, invited=frozenset({"agent3"} if i == 1 else ())) for i in range(3)]
    with Database(path) as db:
        assert db.apply(ops) == [AppendResult(stored=True)] * 3
    # three items, plus the invitation copy's own (the copies after it still share theirs)
    assert tables(path) == {"items": 4, "names": 12, "message_refs": 36, "messages": 36}
    written = [r for op in ops for r in op.records]
    with Reader(path) as reader:
        for agent in AGENTS:
            assert reader.history(agent) == [r.as_message() for r in written if r.agent == agent]
        assert reader.history() == [r.as_message() for r in written]
        assert [row.seq for row in reader.rows(limit=100)] == list(range(1, 37))
        assert reader.count() == 36 and reader.last_message_seq() == 36
        assert reader.agents() == sorted(AGENTS)


def test_records_that_only_look_alike_are_items_of_their_own(path: Path) -> None:
    one = copies(0, ["a", "b"])
    other_time = MessageRecord(
        id="c-0",
        agent="c",
        role="user",
        blocks=one.records[0].blocks,
        metadata=one.records[0].metadata,
        created_at=3.0,
    )
    apart = copies(0, ["d"]).records[0]  # equal blocks, other objects
    with Database(path) as db:
        db.apply([Append(records=(*one.records, other_time, attrs_evolve(apart, "d-0")))])
    assert tables(path)["items"] == 3
    with Reader(path) as reader:
        assert [r.created_at for r in reader.rows()] == [2.0, 2.0, 3.0, 2.0]


def attrs_evolve(record: MessageRecord, new_id: str) -> MessageRecord:
    return MessageRecord(
        id=new_id,
        agent=record.agent,
        role=record.role,
        blocks=record.blocks,
        metadata=record.metadata,
        created_at=record.created_at,
    )


def test_a_duplicate_id_is_refused_and_fails_its_op_alone(path: Path) -> None:
    with Database(path) as db:
        db.apply([copies(0, ["a", "b"])])
        outcomes = db.apply(
            [
                copies(1, ["a", "new-agent"]),
                copies(0, ["c", "b"]),  # b-0 is stored already
                Append(records=copies(2, ["x", "x"]).records[:1] * 2),  # the same id twice
                copies(3, ["new-agent", "other"]),
            ]
        )
        assert outcomes[0] == outcomes[3] == AppendResult(stored=True)
        assert isinstance(outcomes[1], StoreError) and "b-0" in str(outcomes[1])
        assert isinstance(outcomes[2], StoreError) and "x-2" in str(outcomes[2])
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history()] == [
            "a-0", "b-0", "a-1", "new-agent-1", "new-agent-3", "other-3",
        ]  # fmt: skip
        assert reader.agents() == ["a", "b", "new-agent", "other"]  # nothing of c or x


def test_an_agent_named_in_a_rolled_back_batch_is_numbered_again(path: Path) -> None:
    with Database(path) as db:
        db.apply([copies(0, ["a"])])
        # the whole batch fails in bulk (dup), then op by op: "fresh" is named in the undone op
        outcomes = db.apply([copies(0, ["fresh", "a"])])
        assert isinstance(outcomes[0], StoreError)
        assert "fresh" not in db.items.known()
        assert db.apply([copies(1, ["fresh"])]) == [AppendResult(stored=True)]
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history("fresh")] == ["fresh-1"]


def test_a_write_by_another_connection_meanwhile_is_written_around(path: Path) -> None:
    """The writer remembers the last seq and item number it wrote; when another connection
    wrote in between, its next batch is refused in bulk and written op by op after a fresh
    look, so nothing is lost and no seq is given twice."""
    with Database(path) as db, Database(path) as other:
        db.apply([copies(0, ["a", "b"])])
        assert other.apply([copies(1, ["a"])]) == [AppendResult(stored=True)]
        assert (
            db.apply([copies(2, ["a", "b"]), copies(3, ["b"])]) == [AppendResult(stored=True)] * 2
        )
        assert db.apply([copies(4, ["a"])]) == [AppendResult(stored=True)]
    with Reader(path) as reader:
        rows = reader.rows(agent="a", limit=100) + reader.rows(agent="b", limit=100)
        assert sorted(r.message["id"] for r in rows) == [
            "a-0", "a-1", "a-2", "a-4", "b-0", "b-2", "b-3",
        ]  # fmt: skip
        assert len({r.seq for r in rows}) == len(rows)
        assert [m["id"] for m in reader.history("a")] == ["a-0", "a-1", "a-2", "a-4"]


def test_the_writer_remembers_at_most_its_cap_of_names(path: Path) -> None:
    with Database(path) as db:
        db.items = ItemWriter(cap=3)
        for i, agent in enumerate(AGENTS[:5]):
            db.apply([copies(i, [agent])])
        assert db.items.known() == AGENTS[2:5]  # the oldest forgotten first
        db.apply([copies(9, AGENTS[:5])])  # the forgotten ones are read back, not renumbered
    assert tables(path)["names"] == 5
    with Reader(path) as reader:
        assert [m["id"] for m in reader.history(AGENTS[0])] == ["agent0-0", "agent0-9"]
    with pytest.raises(ValueError):
        ItemWriter(cap=0)


@pytest.mark.sqlite_only
def test_the_messages_view_keeps_the_old_shape_for_inserts_and_updates(path: Path) -> None:
    with Database(path) as db:
        db.apply([copies(0, ["a", "b"])])
    conn = sqlite3.connect(path)
    body = encode_body([{"type": "text", "text": "raw"}], {})
    conn.execute(
        "INSERT INTO messages (id, agent, role, created_at, body) VALUES (?, ?, ?, ?, ?)",
        ("raw-1", "z", "assistant", 5.0, body),
    )
    conn.commit()
    assert conn.execute("SELECT seq FROM messages WHERE id = 'raw-1'").fetchone() == (3,)
    conn.execute("UPDATE messages SET role = 'system' WHERE id = 'raw-1'")
    conn.commit()
    conn.close()
    with Reader(path) as reader:
        (row,) = reader.rows(agent="z")
        assert (row.seq, row.created_at, row.message["role"]) == (3, 5.0, "system")
        assert row.message["blocks"] == [{"type": "text", "text": "raw"}]
    with Database(path) as db:  # the writer numbers on after it
        db.apply([copies(1, ["z"])])
    with Reader(path) as reader:
        assert [r.seq for r in reader.rows(agent="z")] == [3, 4]
