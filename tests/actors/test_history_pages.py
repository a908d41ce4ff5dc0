"""``Host.history`` pages (``limit``, ``before``, ``after``) and ``Host.rollback`` read the store a
page at a time: the same answers as slicing the whole history, and only the pages they need are
decoded, however long the history is.

A real SQLite store in ``tmp_path``, written before the host opens; a host with two agents on
scripted models and no server, on trio's MockClock, or on the real clock where a rollback waits
on the store's thread (no deadline is ever reached).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from actors import Host
from actors.agent import history as agent_history
from actors.agent import rollback_plan
from actors.storage import DB_NAME
from store import Append, Database, MessageRecord, Reader
from tests.decode_count import CountingDecode
from tests.helpers import config, scripted

_seq = itertools.count()


def message(agent: str = "Ada", role: str = "user", **meta: Any) -> MessageRecord:
    message_id = f"{agent.lower()}{next(_seq)}"
    blocks = ({"type": "text", "text": f"text of {message_id}"},)
    return MessageRecord(
        id=message_id, agent=agent, role=role, blocks=blocks, metadata=meta, created_at=1.0
    )


def write(tmp_path: Path, records: Sequence[MessageRecord]) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    with Database(data_dir / DB_NAME) as db:
        db.apply([Append(records=tuple(records[i : i + 500])) for i in range(0, len(records), 500)])


@asynccontextmanager
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    agents = [
        {"name": "Ada", "model": scripted(tmp_path, "ada", "")},
        {"name": "Bob", "model": scripted(tmp_path, "bob", "")},
    ]
    async with Host.open(config(tmp_path, [], agents), status_file=False) as h:
        yield h


def interleaved(n: int) -> list[MessageRecord]:
    """``n`` of Ada's messages of every role, with one of Bob's after every third."""
    roles = itertools.cycle(["user", "assistant", "tool", "system"])
    out = []
    for i in range(n):
        out.append(message(role=next(roles)))
        if i % 3 == 2:
            out.append(message("Bob"))
    return out


def test_every_page_is_the_slice_of_the_whole_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_history, "HISTORY_PAGE", 4)
    write(tmp_path, interleaved(23))

    async def main() -> None:
        async with host(tmp_path) as h:
            whole = h.history("Ada")
            with Reader(tmp_path / "data" / DB_NAME) as reader:
                assert whole == reader.history("Ada")  # as before paging
            ids = [m["id"] for m in whole]
            assert len(ids) == 23
            for after in [None, *ids]:
                for before in [None, *ids]:
                    lo = 0 if after is None else ids.index(after) + 1
                    hi = len(ids) if before is None else ids.index(before)
                    part = whole[lo:hi] if lo < hi else []
                    for limit in (None, 0, 1, 3, 4, 5, 9, 100):
                        want = part if limit is None else part[max(0, len(part) - limit) :]
                        got = h.history("Ada", limit=limit, before=before, after=after)
                        assert got == want, (after, before, limit)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_id_not_of_the_agent_or_a_negative_limit_is_a_clear_error(tmp_path: Path) -> None:
    ada, bob = message(), message("Bob")
    write(tmp_path, [ada, bob])

    async def main() -> None:
        async with host(tmp_path) as h:
            with pytest.raises(ValueError, match=r"^Ada has no message 'nowhere'$"):
                h.history("Ada", before="nowhere")
            with pytest.raises(ValueError, match=f"^Ada has no message '{bob.id}'$"):
                h.history("Ada", after=bob.id)
            with pytest.raises(ValueError, match="limit must be >= 0"):
                h.history("Ada", limit=-1)
            with pytest.raises(KeyError, match="no agent named 'Eve'"):
                h.history("Eve")
            assert [m["id"] for m in h.history("Bob", after=None)] == [bob.id]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_the_newest_page_decodes_only_what_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [message() for _ in range(3000)]
    write(tmp_path, records)

    async def main() -> None:
        async with host(tmp_path) as h:
            decodes = CountingDecode(monkeypatch)
            page = h.history("Ada", limit=20, before=records[-5].id)
            assert [m["id"] for m in page] == [r.id for r in records[-25:-5]]
            assert decodes.calls == 20

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_rollback_in_a_long_history_reads_only_what_decides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 stored items, a tool result checkpointing early on: rolling back over the last
    four decodes those, the target and the tool results and markers, not the items; the report
    and the stored marker are what the whole history decides."""
    checkpoint = {"server": "gone", "feature_set": "f", "checkpoint": "c1"}
    early = message(role="tool", checkpoints=[checkpoint])
    items = [message() for _ in range(3000)]
    write(tmp_path, [early, *items])

    async def main() -> None:
        async with host(tmp_path) as h:
            h.ctx.lineages.record(("gone", "f"), "c2")  # moved on since: rolled back to c1
            decodes = CountingDecode(monkeypatch)
            report = await h.rollback("Ada", items[-5].id)
            assert decodes.calls <= 4 + 1 + 1 + 1  # four after, the target, the tool result
            assert report == {
                "to": items[-5].id,
                "set_aside": 4,
                "state": [
                    {
                        "server": "gone",
                        "feature_set": "f",
                        "requested": "c1",
                        "error": "server gone is not connected",
                    }
                ],
            }
            marker = h.history("Ada", limit=1)[0]
            assert marker["metadata"]["set_aside"] == [r.id for r in items[-4:]]
            assert marker["metadata"]["to"] == items[-5].id

    trio.run(main)  # the real clock: a rollback waits on the store's thread


def test_a_rollback_over_more_than_the_span_is_refused_through_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollback_plan, "MAX_ROLLBACK_SPAN", 3)
    items = [message() for _ in range(10)]
    write(tmp_path, items)

    async def main() -> None:
        async with host(tmp_path) as h:
            with pytest.raises(ValueError, match="at most 3 messages, this one more"):
                await h.rollback("Ada", items[5].id)
            with pytest.raises(ValueError, match="Ada has no message 'bob"):
                await h.rollback("Ada", "bob0")
            report = await h.rollback("Ada", items[6].id)
            assert report == {"to": items[6].id, "set_aside": 3, "state": []}
            assert len(h.history("Ada")) == 11  # the marker stored, nothing removed

    trio.run(main)  # the real clock: a rollback waits on the store's thread
