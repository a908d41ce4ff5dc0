from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from protocol.redact import MIN_SECRET_CHARS, NO_REDACTION, REDACTED, Redactor

secret_st = st.text(min_size=MIN_SECRET_CHARS, max_size=24)


@given(st.lists(secret_st, min_size=1, max_size=3), st.lists(st.text(max_size=20), max_size=6))
def test_no_secret_survives(secrets: list[str], pieces: list[str]) -> None:
    for s in secrets:
        assume(not set(s) & set(REDACTED))  # a secret made of the marker's letters is moot
    text = "".join(p + secrets[i % len(secrets)] for i, p in enumerate(pieces))
    out = Redactor(secrets).text(text)
    for s in secrets:
        assert s not in out


@given(st.text(max_size=40), secret_st)
def test_text_without_the_secret_is_unchanged(text: str, secret: str) -> None:
    assume(secret not in text)
    assert Redactor([secret]).text(text) == text


def test_values_are_redacted_everywhere_and_short_secrets_are_not() -> None:
    r = Redactor(["tok-123456", "abc", None])
    assert r.secrets == ("tok-123456",)
    value = {"Authorization": "Bearer tok-123456", "tok-123456": ["x tok-123456 y", 3, None]}
    assert r.value(value) == {
        "Authorization": f"Bearer {REDACTED}",
        REDACTED: [f"x {REDACTED} y", 3, None],
    }
    assert r.value(("tok-123456",)) == (REDACTED,)
    assert not NO_REDACTION and NO_REDACTION.text("tok-123456") == "tok-123456"


def test_the_longer_of_two_overlapping_secrets_goes_whole() -> None:
    r = Redactor(["secret", "secret-and-more"])
    assert r.text("a secret-and-more b") == f"a {REDACTED} b"
