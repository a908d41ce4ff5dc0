"""The one-time source-header notice (refs-and-headers G) is bounded work: the first turn after
a long history decodes only what the turn's context needs, and once an agent is told, later
turns neither take the host-wide lock nor read anything for it.

A real host over a real store in a temp dir; the long history is written straight into the
store before the host opens. Real clock, ``trio.fail_after``, counts rather than times.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import store.reader
from actors import Host
from store import Append, AppendResult, Database, MessageRecord, db_path
from tests.helpers import (
    RecordingModel,
    config,
    install,
    is_header_notice,
    scripted,
    wait_trace,
)
from tests.store.old_schema import schema_version, write_v2_store

EXPLAINED_NS, EXPLAINED_KEY = "framework", "source_headers_explained"
#: Messages stored before the host opens: one header-bearing item first, then these many.
FILLER = 20_000
#: The agent's context budget, in tokens: its context read decodes at most a few dozen messages.
CONTEXT_TOKENS = 400
#: What the first turn may decode in all (its context read and the notice): far below FILLER.
FIRST_TURN_DECODES = 500


def _old_history(agent: str) -> Iterator[MessageRecord]:
    header = "[source: lobby · unscoped]"
    yield MessageRecord(
        id="far-back",
        agent=agent,
        role="user",
        blocks=({"type": "text", "text": header}, {"type": "text", "text": "the clock chimes"}),
        metadata={"source_header": header},
        created_at=1.0,
    )
    for i in range(FILLER):
        yield MessageRecord(
            id=f"filler-{i}",
            agent=agent,
            role="user" if i % 2 == 0 else "assistant",
            blocks=({"type": "text", "text": f"filler {i}"},),
            metadata={},
            created_at=2.0,
        )


def write_old_history(tmp_path: Path, agent: str) -> None:
    with Database(db_path(tmp_path / "data")) as db:
        records = list(_old_history(agent))
        for start in range(0, len(records), 1000):
            chunk = tuple(records[start : start + 1000])
            assert db.apply([Append(records=chunk)]) == [AppendResult(stored=True)]


def host_config(tmp_path: Path) -> dict[str, Any]:
    agent = {
        "name": "Ada",
        "model": scripted(tmp_path, "ada", ""),
        "context_tokens": CONTEXT_TOKENS,
    }
    return config(tmp_path, [], [agent])


class Decodes:
    """Counts the stored messages readers decode (every read of a message goes through
    ``store.reader.decode_row``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        decode = store.reader.decode_row

        def counting(row: tuple[Any, ...], shared: Any = None) -> dict[str, Any]:
            self.count += 1  # reader calls are serialized by the reader's lock
            return decode(row, shared)

        monkeypatch.setattr(store.reader, "decode_row", counting)


async def turn(host: Host, stream: Any, text: str) -> None:
    await host.post_local("Ada", text)
    await wait_trace(stream, lambda e: e.kind == "turn-end" and e.agent == "Ada", "Ada's turn")
    await host.run_until_idle()


def notices(host: Host) -> list[dict[str, Any]]:
    return [m for m in host.history("Ada") if is_header_notice(m)]


async def test_the_first_turn_after_a_long_history_gives_the_notice_decoding_a_bounded_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_old_history(tmp_path, "Ada")
    model = RecordingModel()
    install(monkeypatch, model)
    decodes = Decodes(monkeypatch)
    with trio.fail_after(120):
        async with Host.open(host_config(tmp_path)) as host:
            stream = host.trace()
            before = decodes.count
            await turn(host, stream, "good morning")
            first_turn = decodes.count - before
            [notice] = notices(host)
            assert notice["metadata"] == {"system": True, "kind": "source-header-notice"}
            [call] = model.calls("Ada")
            assert len([m for m in call.messages if is_header_notice(m)]) == 1
            assert host.ctx.store.reader.state(EXPLAINED_NS)[EXPLAINED_KEY] == ["Ada"]
    assert first_turn <= FIRST_TURN_DECODES < FILLER


class CountingLock:
    """A ``trio.Lock`` stand-in that counts how often it is taken."""

    def __init__(self) -> None:
        self.taken = 0
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        self.taken += 1
        await self._lock.acquire()

    async def __aexit__(self, *_exc: object) -> None:
        self._lock.release()


async def test_after_the_agent_is_told_later_turns_take_no_lock_and_read_nothing_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_old_history(tmp_path, "Ada")
    install(monkeypatch, RecordingModel())
    with trio.fail_after(120):
        async with Host.open(host_config(tmp_path)) as host:
            stream = host.trace()
            lock = CountingLock()
            monkeypatch.setattr(host.ctx, "explained_lock", lock)
            client = host.ctx.store
            asked: list[str] = []
            read = client.read

            async def counting(fn: Any, *args: Any) -> Any:
                asked.append(getattr(fn, "__name__", repr(fn)))
                return await read(fn, *args)

            monkeypatch.setattr(client, "read", counting)

            await turn(host, stream, "first")
            assert len(notices(host)) == 1
            assert lock.taken == 2  # to read the record, then to hand its write over
            assert "state" in asked

            asked.clear()
            for i in range(3):
                await turn(host, stream, f"later {i}")
            assert lock.taken == 2
            assert "state" not in asked and "agent_facts" not in asked
            assert len(notices(host)) == 1

        # a new process learns it once from the record, then stops asking
        async with Host.open(host_config(tmp_path)) as host:
            stream = host.trace()
            client = host.ctx.store
            asked = []
            read = client.read
            monkeypatch.setattr(client, "read", counting)
            await turn(host, stream, "after the restart")
            assert asked.count("state") == 1
            asked.clear()
            await turn(host, stream, "and again")
            assert "state" not in asked and "agent_facts" not in asked
            assert len(notices(host)) == 1


async def test_a_header_item_stored_before_the_upgrade_from_version_2_still_brings_the_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = db_path(tmp_path / "data")
    write_v2_store(path, _old_history("Ada"))
    model = RecordingModel()
    install(monkeypatch, model)
    with trio.fail_after(120):
        async with Host.open(host_config(tmp_path)) as host:
            assert schema_version(path) == "6"
            stream = host.trace()
            await turn(host, stream, "good morning")
            assert len(notices(host)) == 1
            [call] = model.calls("Ada")
            assert len([m for m in call.messages if is_header_notice(m)]) == 1
            await turn(host, stream, "again")
            assert len(notices(host)) == 1


async def test_the_lock_is_never_held_while_a_record_write_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two agents told at once: while the first agent's record write waits for its commit,
    the second reads the record and hands its own write over; the record ends with both."""
    header = "[source: lobby · unscoped]"
    with Database(db_path(tmp_path / "data")) as db:
        db.apply(
            [
                Append(
                    records=tuple(
                        MessageRecord(
                            id=f"{name}-far-back",
                            agent=name,
                            role="user",
                            blocks=(
                                {"type": "text", "text": header},
                                {"type": "text", "text": "x"},
                            ),
                            metadata={"source_header": header},
                            created_at=1.0,
                        )
                        for name in ("Ada", "Bob")
                    )
                )
            ]
        )
    install(monkeypatch, RecordingModel())
    agents = [
        {"name": name, "model": scripted(tmp_path, name.lower(), ""), "context_tokens": 400}
        for name in ("Ada", "Bob")
    ]
    with trio.fail_after(60):
        async with Host.open(config(tmp_path, [], agents)) as host:
            client = host.ctx.store
            submit = client.submit
            handed: list[list[str]] = []
            release = trio.Event()
            second = trio.Event()

            class HeldCommit:
                def __init__(self, inner: Any) -> None:
                    self.inner = inner

                async def wait(self) -> Any:
                    await release.wait()
                    return await self.inner.wait()

            async def holding(op: Any) -> Any:
                future = await submit(op)
                if getattr(op, "key", None) == EXPLAINED_KEY:
                    handed.append(list(op.value))
                    if len(handed) == 1:
                        return HeldCommit(future)
                    second.set()
                return future

            monkeypatch.setattr(client, "submit", holding)
            stream = host.trace()
            await host.post_local("Ada", "one")
            await host.post_local("Bob", "two")
            await second.wait()  # the first commit is still held here
            assert not release.is_set() and len(handed) == 2
            release.set()
            ended: set[str | None] = set()
            while len(ended) < 2:  # the two turns may end in either order
                end = await wait_trace(stream, lambda e: e.kind == "turn-end", "a turn-end")
                ended.add(end.agent)
            await host.run_until_idle()
            assert sorted(handed[-1]) == ["Ada", "Bob"]
            assert sorted(host.ctx.store.reader.state(EXPLAINED_NS)[EXPLAINED_KEY]) == [
                "Ada",
                "Bob",
            ]
