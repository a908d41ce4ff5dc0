"""``Reader.walk``: every row ``rows`` selects, read a page at a time, at most ``limit``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import Append, Database, Reader, db_path
from tests.decode_count import CountingDecode

from .conftest import record

ROLES = ("user", "assistant", "tool", "system")


def _store(directory: Path, agents: list[str], roles: list[str]) -> Path:
    path = db_path(directory)
    with Database(path) as db:
        db.apply(
            [
                Append(records=(record(f"m{i}", agent=agent, role=role, id=f"id{i}"),))
                for i, (agent, role) in enumerate(zip(agents, roles, strict=True))
            ]
        )
    return path


@settings(max_examples=40, deadline=None)
@given(
    plan=st.lists(st.tuples(st.sampled_from(["ada", "bob"]), st.sampled_from(ROLES)), max_size=25),
    page=st.integers(1, 7),
    limit=st.none() | st.integers(0, 30),
    newest_first=st.booleans(),
    agent=st.none() | st.just("ada"),
    roles=st.none() | st.just(("tool", "system")),
    bound=st.integers(0, 26),
)
def test_walk_reads_what_one_large_page_would(
    plan: list[tuple[str, str]],
    page: int,
    limit: int | None,
    newest_first: bool,
    agent: str | None,
    roles: tuple[str, ...] | None,
    bound: int,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = _store(Path(tmp), [a for a, _ in plan], [r for _, r in plan])
        where = {"before_seq": bound} if newest_first else {"after_seq": bound}
        with Reader(path) as reader:
            whole = reader.rows(
                agent=agent, roles=roles, newest_first=newest_first, limit=1000, **where
            )
            if limit is not None:
                whole = whole[:limit]
            walked = list(
                reader.walk(
                    agent=agent,
                    roles=roles,
                    newest_first=newest_first,
                    page=page,
                    limit=limit,
                    **where,
                )
            )
        assert [r.seq for r in walked] == [r.seq for r in whole]
        assert [r.message for r in walked] == [r.message for r in whole]


def test_walk_reads_no_more_than_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _store(tmp_path, ["ada"] * 50, ["user"] * 50)
    decodes = CountingDecode(monkeypatch)
    with Reader(path) as reader:
        rows = list(reader.walk(agent="ada", newest_first=True, page=8, limit=13))
    assert [r.message["id"] for r in rows] == [f"id{i}" for i in range(49, 36, -1)]
    assert decodes.calls == 13


def test_walk_refuses_a_page_below_one(path: Path) -> None:
    with Reader(path) as reader, pytest.raises(ValueError, match="page must be >= 1"):
        next(reader.walk(page=0))
