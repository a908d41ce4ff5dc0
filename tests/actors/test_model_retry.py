"""The providers' shared retry rules: one-line errors, the wait a response asks for, and when a
failed attempt ends the call."""

from __future__ import annotations

import math
import random

from hypothesis import example, given
from hypothesis import strategies as st

from actors.models.base import ModelAuthError, ModelError
from actors.models.retry import MAX_LINE, Failure, Retries, one_line, retry_after


@given(st.text())
def test_one_line_is_one_line_within_the_limit(text: str) -> None:
    line = one_line(text)
    assert "\n" not in line and "\r" not in line and "  " not in line
    assert len(line) <= MAX_LINE
    collapsed = " ".join(text.split())
    if len(collapsed) <= MAX_LINE:
        assert line == collapsed
    else:
        assert line == collapsed[: MAX_LINE - 1] + "…"


@given(st.floats(allow_nan=True, allow_infinity=True), st.booleans())
@example(-5e-324, True)  # scaled to ms it rounds to -0.0, once taken for a wait
def test_retry_after_is_a_finite_non_negative_wait_or_none(value: float, in_ms: bool) -> None:
    name = "retry-after-ms" if in_ms else "retry-after"
    got = retry_after({name: repr(value)})
    if math.isfinite(value) and value >= 0:
        assert got == value * (0.001 if in_ms else 1.0)
    else:
        assert got is None


def test_retry_after_prefers_milliseconds_and_ignores_a_date() -> None:
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after({}) is None


def test_a_failure_ends_the_call_when_it_is_the_credential_permanent_or_the_last() -> None:
    retries = Retries(provider="p", max_retries=2, backoff_base_s=1, backoff_cap_s=2,
                      rng=random.Random(1))  # fmt: skip
    auth = retries.final_error(Failure(False, "x", "HTTP 401", auth="refused"), 0, "KEY")
    assert isinstance(auth, ModelAuthError) and auth.credential == "KEY"
    assert str(auth) == "p: HTTP 401"
    permanent = retries.final_error(Failure(False, "x", "bad\nrequest"), 0, "KEY")
    assert isinstance(permanent, ModelError) and str(permanent) == "p: bad request"
    transient = Failure(True, "busy (529)", "HTTP 529")
    assert retries.final_error(transient, 0, "KEY") is None
    assert retries.final_error(transient, 1, "KEY") is None
    last = retries.final_error(transient, 2, "KEY")
    assert str(last) == "p: HTTP 529 (gave up after 3 attempts)"
