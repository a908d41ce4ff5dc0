"""What the model providers share about a failed attempt: its classification
(:class:`Failure`), and :class:`Retries`, which says whether the call ends (and with which
one-line error) or waits and tries again (telling the request's ``on_retry`` and the notice
sink of each retry first).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping

import attrs
import trio

from actors.kernel import backoff_delay

from .base import ModelAuthError, ModelError, ModelRequest, ModelRetry

#: The longest error line a provider reports.
MAX_LINE = 300


@attrs.frozen
class Failure:
    retryable: bool
    label: str  # for the retry notice, e.g. "rate limited (429)"
    detail: str  # for the final error, e.g. "HTTP 429 rate_limit_exceeded: slow down"
    retry_after: float | None = None
    auth: str | None = None  # what a 401 or 403 means for the credential


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for (``retry-after-ms``, else ``retry-after`` in seconds); None
    for none, or for an HTTP date (the backoff's own wait stands)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:  # judged before scaling: a tiny negative
            return value * scale  # number of milliseconds must not round to a wait of -0.0
    return None


def one_line(text: str) -> str:
    """``text`` on one line of at most :data:`MAX_LINE` characters."""
    line = re.sub(r"\s+", " ", text).strip()
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"


@attrs.frozen(kw_only=True)
class Retries:
    provider: str  # e.g. "anthropic"
    max_retries: int
    backoff_base_s: float
    backoff_cap_s: float
    rng: random.Random = attrs.field(factory=random.Random)
    notice: Callable[[str], None] | None = None

    def final_error(self, failure: Failure, retries_done: int, credential: str) -> Exception | None:
        """The error that ends the call after ``failure`` (``retries_done`` retries made so
        far), or None when it is retried."""
        if failure.auth is not None:
            return ModelAuthError(
                one_line(f"{self.provider}: {failure.detail}"),
                provider=self.provider,
                problem=failure.auth,
                credential=credential,
            )
        if not failure.retryable:
            return ModelError(one_line(f"{self.provider}: {failure.detail}"))
        if retries_done >= self.max_retries:
            attempts = retries_done + 1
            plural = "s" if attempts != 1 else ""
            return ModelError(
                one_line(
                    f"{self.provider}: {failure.detail} (gave up after {attempts} attempt{plural})"
                )
            )
        return None

    async def wait(self, retry: int, failure: Failure, request: ModelRequest) -> None:
        """Tell of retry number ``retry`` (from 1) and wait before it: the backoff, or longer
        when the failure asked for it (never past the cap)."""
        delay = backoff_delay(retry, self.backoff_base_s, self.backoff_cap_s, self.rng)
        if failure.retry_after is not None:
            delay = max(delay, min(failure.retry_after, self.backoff_cap_s))
        notice = ModelRetry(
            provider=self.provider,
            failure=failure.label,
            attempt=retry,
            retries=self.max_retries,
            wait_s=delay,
        )
        if request.on_retry is not None:
            request.on_retry(notice)
        if self.notice is not None:
            self.notice(notice.line)
        await trio.sleep(delay)
