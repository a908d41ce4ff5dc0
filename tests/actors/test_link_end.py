"""How a link ended, in one line; a server's stderr tail; a refused websocket upgrade."""

from __future__ import annotations

from actors.errors import NotConnected
from actors.link.end import TAIL_LINE_CHARS, TAIL_LINES, StderrTail, ending
from actors.link.transport import (
    BODY_EXCERPT_CHARS,
    CommandNotFound,
    HandshakeRefused,
    ProcessExit,
    exit_text,
    rejection_text,
)
from protocol.redact import REDACTED, Redactor

TOKEN = "tok-9f8e7d6c5b4a"
REDACT = Redactor([TOKEN])


def test_exit_codes_and_signals_in_words() -> None:
    assert exit_text(0) == "exited with code 0"
    assert exit_text(3) == "exited with code 3"
    assert exit_text(-9) == "killed by signal 9 (SIGKILL)"
    assert exit_text(-200) == "killed by signal 200"


def test_a_process_that_died_in_the_handshake() -> None:
    gone = ExceptionGroup("nursery", [NotConnected("server x disconnected during initialize")])
    reason = ending(
        error=gone,
        process=ProcessExit(returncode=1),
        close_reason=None,
        step="initialize",
        redactor=REDACT,
    )
    assert reason == "exited with code 1 during initialize"


def test_a_command_that_does_not_exist_names_it_and_no_step() -> None:
    reason = ending(
        error=CommandNotFound("no-such-cmd"),
        process=None,
        close_reason=None,
        step=None,
        redactor=REDACT,
    )
    assert reason == "command not found: no-such-cmd"


def test_the_host_closing_the_link_says_why() -> None:
    reason = ending(
        error=None,
        process=ProcessExit(returncode=-9, killed=True),
        close_reason="the server went silent (no answer to ping)",
        step=None,
        redactor=REDACT,
    )
    assert reason == "the server went silent (no answer to ping)"
    hung = ending(
        error=None,
        process=ProcessExit(returncode=-9, killed=True),
        close_reason=None,
        step=None,
        redactor=REDACT,
    )
    assert hung == "the server closed the connection; it did not exit and was killed"


def test_other_errors_are_one_redacted_line() -> None:
    reason = ending(
        error=RuntimeError(f"bad\nthing with Bearer {TOKEN}"),
        process=None,
        close_reason=None,
        step="tools/list",
        redactor=REDACT,
    )
    assert reason == f"RuntimeError: bad thing with Bearer {REDACTED} during tools/list"


def test_a_refused_upgrade_gives_the_status_line_and_a_clipped_body() -> None:
    body = f"no entry for\r\nAuthorization: Bearer {TOKEN}\n".encode() + b"x" * 500
    text = rejection_text(401, body)
    assert text.startswith("handshake refused: HTTP 401 Unauthorized: no entry for Authorization")
    assert "\n" not in text and "\r" not in text
    prefix = len("handshake refused: HTTP 401 Unauthorized: ")
    assert len(text) == prefix + BODY_EXCERPT_CHARS and text.endswith("…")
    assert rejection_text(599, None) == "handshake refused: HTTP 599"
    # the failure's text is what ``ending`` reports, redacted
    reason = ending(
        error=HandshakeRefused(403, f"token {TOKEN} is not welcome".encode()),
        process=None,
        close_reason=None,
        step=None,
        redactor=REDACT,
    )
    assert reason == f"handshake refused: HTTP 403 Forbidden: token {REDACTED} is not welcome"


def test_the_stderr_tail_keeps_the_newest_lines_clipped_and_redacted() -> None:
    tail = StderrTail(REDACT)
    for i in range(TAIL_LINES + 5):
        tail.add(f"line {i}")
    lines = tail.lines()
    assert len(lines) == TAIL_LINES  # the cap: the oldest lines go first
    assert lines[0] == "line 5" and lines[-1] == f"line {TAIL_LINES + 4}"
    kept = tail.add(f"token {TOKEN} " + "y" * 1000)
    assert kept.startswith(f"token {REDACTED} ") and len(kept) == TAIL_LINE_CHARS
    tail.clear()
    assert tail.lines() == ()
