from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from store import MessageRecord, db_path

_ids = itertools.count()


def record(
    text: str = "hello",
    *,
    agent: str = "alice",
    role: str = "user",
    id: str | None = None,
    header: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> MessageRecord:
    """A message record with one text block, or a header block plus a body block."""
    meta = dict(metadata or {})
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if header is not None:
        meta["source_header"] = header
        blocks.insert(0, {"type": "text", "text": header})
    return MessageRecord(
        id=id if id is not None else f"m{next(_ids)}",
        agent=agent,
        role=role,
        blocks=tuple(blocks),
        metadata=meta,
        created_at=1.5,
    )


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return db_path(tmp_path / "data")
