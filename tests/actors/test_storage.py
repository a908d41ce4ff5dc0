"""The store client's cap on writes in flight: a submit waits at the cap until commits make room,
and a batch larger than the cap is handed over in parts. The store writer is replaced by a
stand-in that commits only when the test says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import storage
from actors.kernel import Work
from actors.storage import StoreClient


class HeldWriter:
    """Takes ops like the group-commit writer, and commits them when ``commit`` is called."""

    def __init__(self) -> None:
        self.held: list[tuple[Any, Callable[[object], None]]] = []
        self.committed: list[Any] = []

    def submit_many(
        self, items: list[tuple[Any, Callable[[object], None]]], *, bulk: bool = False
    ) -> None:
        self.held.extend(items)

    def commit(self, n: int) -> None:
        for op, done in self.held[:n]:
            self.committed.append(op)
            done(f"stored {op}")
        del self.held[:n]


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], StoreClient]:
    monkeypatch.setattr(storage, "MAX_IN_FLIGHT", 4)

    def make() -> StoreClient:
        c = StoreClient(tmp_path / "data", Work())
        c.writer = HeldWriter()  # type: ignore[assignment]
        return c

    return make


async def test_a_submit_waits_at_the_cap_until_commits_make_room(
    client: Callable[[], StoreClient], autojump_clock: trio.abc.Clock
) -> None:
    store = client()
    writer: HeldWriter = store.writer  # type: ignore[assignment]
    first = await store.submit_many(["a", "b", "c"])
    handed: list[Any] = []

    async def more() -> None:
        handed.extend(await store.submit_many(["d", "e"]))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(more)
            await trio.testing.wait_all_tasks_blocked()
            assert handed == []  # 3 in flight + 2 > 4: the second submit waits
            assert [op for op, _ in writer.held] == ["a", "b", "c"]
            writer.commit(3)  # the first batch commits: room for d and e
    assert [await f.wait() for f in first] == ["stored a", "stored b", "stored c"]
    assert [op for op, _ in writer.held] == ["d", "e"]
    writer.commit(2)
    assert [await f.wait() for f in handed] == ["stored d", "stored e"]


async def test_a_batch_larger_than_the_cap_goes_in_parts(
    client: Callable[[], StoreClient], autojump_clock: trio.abc.Clock
) -> None:
    store = client()
    writer: HeldWriter = store.writer  # type: ignore[assignment]
    ops = [f"op{i}" for i in range(10)]
    result: list[Any] = []

    async def submit() -> None:
        result.extend(await store.submit_many(ops))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit)
            for expected in (4, 4, 2):  # never more than the cap in flight
                await trio.testing.wait_all_tasks_blocked()
                assert len(writer.held) == expected
                writer.commit(expected)
    assert writer.committed == ops
    assert [await f.wait() for f in result] == [f"stored {op}" for op in ops]
