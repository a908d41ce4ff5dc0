"""How a link ended, told to an operator: one line, and the server's last stderr lines.

``StderrTail`` keeps the last ``TAIL_LINES`` lines a server process wrote to stderr, each clipped
to ``TAIL_LINE_CHARS``, with every configured credential redacted and with the wall-clock time
it was read. ``ending`` turns what the
link left behind (an exception, how its process exited, why the host closed it, the handshake
step in flight) into the one-line reason of a ``disconnected`` event and of
``ConnStatus.last_error``: the cause closest to the server first (the command was not found, the
process exited with a code or was killed by a signal, the websocket upgrade was refused), then
the step it died in.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from actors.errors import NotConnected
from protocol.display import clip, one_line
from protocol.redact import Redactor

from .state import describe
from .transport import ProcessExit, TransportFailure, exit_text

TAIL_LINES = 20
TAIL_LINE_CHARS = 300
REASON_CHARS = 400
CLOSED = "the server closed the connection"


class StderrTail:
    """The last lines a server wrote to stderr, each with when it was read: bounded (the
    oldest goes past ``TAIL_LINES``), clipped, redacted."""

    def __init__(self, redactor: Redactor, wall_clock: Callable[[], float] = time.time) -> None:
        self.redactor = redactor
        self.clock = wall_clock
        self._lines: deque[tuple[float, str]] = deque(maxlen=TAIL_LINES)

    def add(self, line: str) -> str:
        """Keep ``line`` (the oldest line goes past ``TAIL_LINES``); returns it as kept."""
        kept = clip(self.redactor.text(line.rstrip()), TAIL_LINE_CHARS)
        self._lines.append((self.clock(), kept))
        return kept

    def clear(self) -> None:
        self._lines.clear()

    def lines(self) -> tuple[str, ...]:
        return tuple(line for _, line in self._lines)

    def timed(self) -> tuple[tuple[float, str], ...]:
        """The lines with the wall-clock time each was read, oldest first."""
        return tuple(self._lines)


def ending(
    *,
    error: BaseException | None,
    process: ProcessExit | None,
    close_reason: str | None,
    step: str | None,
    redactor: Redactor,
) -> str:
    """The one-line reason a link ended (never a credential).

    - ``error``: what ended the link, if it raised (a transport that could not open, a failed
      handshake request, a bug);
    - ``process``: how the server process ended, for a transport that started one;
    - ``close_reason``: why the host closed the link, if it did;
    - ``step``: the handshake request in flight, if the link was not ready yet.
    """
    failure = _transport_failure(error)
    if failure is not None:
        text = str(failure)  # already one line: the transport wrote it for the operator
        step = None  # it never got as far as a handshake step
    elif close_reason is not None:
        text = close_reason
    elif process is not None and process.returncode is not None and not process.killed:
        text = exit_text(process.returncode)
    elif process is not None and process.killed:
        text = f"{CLOSED}; it did not exit and was killed"
    elif error is not None and not _only_disconnects(error):
        text = describe(error)
    else:
        text = CLOSED
    if step is not None and step not in text:
        text += f" during {step}"
    return one_line(redactor.text(text), REASON_CHARS)


def _transport_failure(error: BaseException | None) -> TransportFailure | None:
    if isinstance(error, TransportFailure):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = _transport_failure(inner)
            if found is not None:
                return found
    return None


def _only_disconnects(error: BaseException) -> bool:
    """Whether ``error`` says no more than that the server went away (its requests failed
    because the link closed): the process's exit, if any, says it better."""
    if isinstance(error, BaseExceptionGroup):
        return all(_only_disconnects(e) for e in error.exceptions)
    return isinstance(error, NotConnected)
