"""An agent's drafts are written to the store when they changed, and only then: a turn that
kept nothing costs no write, and what was kept is there after a restart."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio

from actors.agent.speech import Drafts
from actors.kernel import Work
from actors.storage import StoreClient


def unfenced(_agent: str, op: Any) -> Any:
    """A context's fencing on the embedded store: the op as it is."""
    return op


async def test_drafts_are_written_only_when_they_changed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = StoreClient(data, Work())
    store.start()
    try:
        with trio.fail_after(60):
            drafts = Drafts(SimpleNamespace(store=store, agent_fenced=unfenced), "Ada")  # type: ignore[arg-type]
            await drafts.load()
            await drafts.save()
            assert store.writer.stats().ops == 0  # nothing kept, nothing written
            drafts.add("kept text", "kept")
            await drafts.save()
            assert store.writer.stats().ops == 1
            await drafts.save()
            assert store.writer.stats().ops == 1
            del drafts.items["d1"]  # dismissed in place, then saved
            await drafts.save()
            assert store.writer.stats().ops == 2
            drafts.add("second", "kept")
            await drafts.save()
    finally:
        await store.aclose()
    store = StoreClient(data, Work())
    store.start()
    try:
        with trio.fail_after(60):
            again = Drafts(SimpleNamespace(store=store, agent_fenced=unfenced), "Ada")  # type: ignore[arg-type]
            await again.load()
            assert [d.text for d in again.items.values()] == ["second"]
            assert again.next == 3
            await again.save()
            assert store.writer.stats().ops == 0  # loaded as saved: nothing to write
    finally:
        await store.aclose()
        store.reader.close()
