"""``Reader.rows(shared=True)``: the copies of one item stored for several agents decode once, and
the results are the ones a plain read gives; the reader keeps a bounded number of bodies."""

from __future__ import annotations

from pathlib import Path

import pytest

import store.reader
from store import Database, Reader
from tests.decode_count import CountingDecode

from .conftest import item_copies


def stored(tmp_path: Path, items: int, agents: list[str]) -> Path:
    path = tmp_path / "store.sqlite3"
    with Database(path) as db:
        db.apply([item_copies(i, agents) for i in range(items)])
    return path


def test_the_copies_of_one_item_decode_once_and_read_as_a_plain_read_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = [f"A{i}" for i in range(10)]
    path = stored(tmp_path, 20, agents)
    with Reader(path) as reader:
        plain = {a: reader.rows(agent=a, newest_first=True, limit=64) for a in agents}
    decodes = CountingDecode(monkeypatch)
    with Reader(path) as reader:
        shared = {a: reader.rows(agent=a, newest_first=True, limit=64, shared=True) for a in agents}
    assert shared == plain
    assert decodes.calls == 20  # one per item, not one per agent's copy


def test_the_reader_keeps_at_most_its_cap_of_bodies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.reader, "MAX_SHARED_BODIES", 3)
    path = stored(tmp_path, 10, ["A", "B"])
    decodes = CountingDecode(monkeypatch)
    with Reader(path) as reader:
        first = reader.rows(agent="A", limit=64, shared=True)
        assert decodes.calls == 10
        assert len(reader._shared) == 3  # the newest three bodies; the older went first
        again = reader.rows(agent="B", newest_first=True, limit=64, shared=True)
        assert decodes.calls == 10 + 7  # the three kept ones were not decoded again
        assert [r.message["metadata"]["n"] for r in again] == list(range(9, -1, -1))
        assert len(reader._shared) == 3
    assert [r.message["metadata"] for r in first] == [r.message["metadata"] for r in again][::-1]
