"""The MCPL project's conformance vectors, vendored (see README.md here for where they come
from and how to refresh them). Tests load them through :func:`load_vectors`, so a clone of this
repository needs nothing beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

VECTOR_DIR = Path(__file__).resolve().parent


def load_vectors(name: str) -> Any:
    """The parsed JSON of one vendored vector file.

    Decoded as UTF-8 by a real JSON parser and never normalized: several files hold both NFC
    and NFD spellings of one letter, lone-surrogate escapes and integers past 2**53, and the
    vectors depend on each staying as written."""
    return json.loads((VECTOR_DIR / name).read_text(encoding="utf-8"))
