"""Redaction of configured credentials from anything the host prints or stores.

A :class:`Redactor` is built once from the secrets an operator configured (server bearer tokens,
model API keys) and replaces every occurrence of any of them with :data:`REDACTED`. Secrets
shorter than :data:`MIN_SECRET_CHARS` are not redacted: replacing every two-letter run of text
would make the output unreadable, and a secret that short protects nothing anyway.

Pure: no I/O; the caller decides where it applies (the transcript, ``--json`` lines, log
records, host-written notices).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "«redacted»"
MIN_SECRET_CHARS = 6


class Redactor:
    """Replaces the configured secrets in text, or in every string of a JSON-like value."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        kept = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_CHARS}
        # longest first, so a secret that contains another is replaced whole
        ordered = sorted(kept, key=lambda s: (-len(s), s))
        self.secrets: tuple[str, ...] = tuple(ordered)
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, text: str) -> str:
        """``text`` with every secret replaced."""
        if self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)

    def value(self, value: Any) -> Any:
        """A copy of a JSON-like value (dicts, lists, tuples, strings, scalars) with every
        secret replaced in its strings, keys included; other values are returned as they are."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                (self.text(k) if isinstance(k, str) else k): self.value(v) for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self.value(v) for v in value)
        return value


NO_REDACTION = Redactor()
