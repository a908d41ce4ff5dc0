"""An agent's context is read from the store a page at a time, newest first, and only as far back
as its token budget can reach: the same context as reading everything, far fewer records.

The reference is a :class:`ContextTail` with the reader's budget and trim target fed every stored
message, read by read: trimming in steps makes the context depend on when it was read, never on
how far back the pages went."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.agent import history as agent_history
from actors.agent.history import ContextReader, ContextTail, live_messages, render_for_model
from actors.kernel import Work
from actors.storage import DB_NAME, StoreClient
from store import Append, Database, MessageRecord, Reader

_ids = itertools.count()


def record(agent: str, role: str, text: str) -> MessageRecord:
    if role == "tool":
        blocks: tuple[dict[str, Any], ...] = (
            {"type": "tool_result", "tool_use_id": "t", "content": text, "is_error": False},
        )
    else:
        blocks = ({"type": "text", "text": text},)
    return MessageRecord(
        id=f"m{next(_ids)}",
        agent=agent,
        role=role,
        blocks=blocks,
        metadata={},
        created_at=time.time(),
    )


def write(data_dir: Path, records: list[MessageRecord]) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    db = Database(data_dir / DB_NAME)
    try:
        if records:
            db.apply([Append(records=tuple(records))])
    finally:
        db.close()


def everything(data_dir: Path, agent: str) -> list[dict[str, Any]]:
    reader = Reader(data_dir / DB_NAME)
    try:
        return [r.message for r in reader.rows(agent=agent, limit=1_000_000)]
    finally:
        reader.close()


class Expected:
    """The context from every stored message, read at the same moments: what paging must give."""

    def __init__(self, data_dir: Path, agent: str, budget: int) -> None:
        self.data_dir, self.agent = data_dir, agent
        self.tail = ContextTail(budget, int(budget * agent_history.TRIM_TARGET))
        self.seen = 0

    def read(self) -> list[str]:
        stored = everything(self.data_dir, self.agent)
        fresh, self.seen = stored[self.seen :], len(stored)
        self.tail.extend([render_for_model(m) for m in live_messages(fresh)])
        return shown(self.tail.messages())


def shown(context: list[Any]) -> list[str]:
    return [f"{m['role']}: {m['blocks']}" for m in context]


class Counting:
    """The store client with a count of the messages its reads returned."""

    def __init__(self, store: StoreClient) -> None:
        self.inner = store
        self.reader = store.reader
        self.feeds = store.feeds
        self.decoded = 0

    async def read(self, fn: Any, *args: Any) -> Any:
        out = await self.inner.read(fn, *args)
        rows = out[0] if isinstance(out, tuple) else out
        self.decoded += len(rows)
        return out


async def open_reader(data_dir: Path, budget: int) -> tuple[ContextReader, Counting, StoreClient]:
    store = StoreClient(data_dir, Work())
    counting = Counting(store)
    ctx = SimpleNamespace(store=counting, coalescer=None)
    return ContextReader(ctx, "Ada", budget), counting, store  # type: ignore[arg-type]


async def test_a_long_history_is_read_only_as_far_back_as_the_budget_reaches(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    # 3,000 messages of about 50 tokens each; a budget of 2,000 tokens holds about 40 of them
    write(data, [record("Ada", "user", f"message {i} " + "x" * 160) for i in range(3000)])
    reader, counting, store = await open_reader(data, 2000)
    reference = Expected(data, "Ada", 2000)
    with trio.fail_after(60):
        context = await reader.read()
    assert shown(context) == reference.read()
    assert 25 < len(context) < 50
    # one page: enough to fill the budget, never the 251 records a scan read
    assert counting.decoded <= agent_history.CONTEXT_PAGE
    # and the next read takes only what is new
    write(data, [record("Ada", "user", "one more")])
    before = counting.decoded
    context = await reader.read()
    assert counting.decoded - before == 1
    assert shown(context) == reference.read()
    store.reader.close()


ROLES = st.sampled_from(["user", "user", "assistant", "tool"])
MESSAGE = st.tuples(ROLES, st.integers(min_value=0, max_value=1600))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    phases=st.lists(st.lists(MESSAGE, max_size=14), min_size=1, max_size=3),
    budget=st.sampled_from([320, 400, 800]),
    page=st.integers(min_value=1, max_value=5),
)
def test_paging_gives_the_context_of_reading_everything(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    phases: list[list[tuple[str, int]]],
    budget: int,
    page: int,
) -> None:
    """Whatever the roles and sizes (units of an assistant message and its tool results
    included), and however the writes fall between reads, the paged context is the one
    reading every stored message gives (fewer messages than the read cap are stored)."""
    monkeypatch.setattr(agent_history, "CONTEXT_PAGE", page)
    data = tmp_path_factory.mktemp("store") / "data"

    async def main() -> None:
        write(data, [])
        reader, _, store = await open_reader(data, budget)
        reference = Expected(data, "Ada", budget)
        try:
            for n, phase in enumerate(phases):
                text = [(role, f"{n}:{i} " + "y" * size) for i, (role, size) in enumerate(phase)]
                write(data, [record("Ada", role, t) for role, t in text])
                context = await reader.read()
                assert shown(context) == reference.read()
        finally:
            store.reader.close()

    trio.run(main)
