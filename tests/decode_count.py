"""Counting the stored bodies the store's reader decodes (what a paged read must keep small)."""

from __future__ import annotations

from typing import Any

import pytest

import store.reader


class CountingDecode:
    """Counts the stored bodies the store's reader decodes while the monkeypatch is in force."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        decode = store.reader.decode_body

        def counting(body: bytes) -> Any:
            self.calls += 1
            return decode(body)

        monkeypatch.setattr(store.reader, "decode_body", counting)
