from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from store import Append, AppendResult, Database, MessageRecord, Reader

from .conftest import kill_child_after

ACKS_BEFORE_KILL = 300


@pytest.mark.slow
def test_acknowledged_appends_survive_sigkill(path: Path) -> None:
    acked = kill_child_after(path, acks=ACKS_BEFORE_KILL)

    with Reader(path) as reader:
        stored = Counter(m["id"] for m in reader.history("alice"))
        stored_count = reader.count()
    assert len(set(acked)) == len(acked)
    for record_id in acked:
        assert stored[record_id] == 1, record_id
    assert all(count == 1 for count in stored.values())
    # Stored ids form a prefix of the submission order.
    assert sorted(stored, key=lambda i: int(i[1:])) == [f"m{i}" for i in range(stored_count)]

    # A retry after the restart is not stored twice.
    retries = [
        Append(
            records=(
                MessageRecord(
                    id=f"retry-{record_id}",
                    agent="alice",
                    role="user",
                    blocks=({"type": "text", "text": "again"},),
                    metadata={},
                    created_at=0.0,
                ),
            ),
            dedupe=("event", "lobby", f"e{record_id[1:]}"),
        )
        for record_id in acked
    ]
    with Database(path) as db:
        assert db.apply(retries) == [AppendResult(stored=False)] * len(retries)
    with Reader(path) as reader:
        assert reader.count() == stored_count
