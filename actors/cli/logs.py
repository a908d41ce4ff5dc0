"""Python logging for the ``mcplive`` command: one handler on stderr, timestamped like the
transcript, with configured secrets redacted from every record.

mcplive's own loggers (``mcplive.*``, ``store.*``) follow the chosen level; other libraries'
loggers stay at ``warning`` unless the chosen level is higher (an HTTP client logging each
request at ``info`` is not the host's news).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from protocol.display import well_formed
from protocol.redact import NO_REDACTION, Redactor

OWN_LOGGERS = ("mcplive", "store")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class RedactingFilter(logging.Filter):
    """Replaces configured secrets in a record's message and in its traceback text, and every
    surrogate in them with U+FFFD (so a record always encodes as UTF-8)."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True  # the handler reports a record that cannot be formatted
        # whatever text a server put in a record can be written out (a lone surrogate as U+FFFD)
        record.msg = self._clean(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._clean(record.exc_text)
        if record.stack_info:
            record.stack_info = self._clean(record.stack_info)
        return True

    def _clean(self, text: str) -> str:
        text = well_formed(text)
        return self.redactor.text(text) if self.redactor else text


class StderrHandler(logging.StreamHandler[Any]):
    """Writes to whatever ``sys.stderr`` is at the time of the record."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def setup_logging(level: int = logging.WARNING, redactor: Redactor = NO_REDACTION) -> None:
    """Route log records to stderr at ``level`` (see the module docstring); calling it again
    replaces the level and the redactor."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, StderrHandler)), None)
    if handler is None:
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
        root.addHandler(handler)
    redact_logs(redactor)
    root.setLevel(max(level, logging.WARNING))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)


def redact_logs(redactor: Redactor) -> None:
    """Redact ``redactor``'s secrets from the records :func:`setup_logging` routes."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, StderrHandler):
            for old in list(handler.filters):
                handler.removeFilter(old)
            handler.addFilter(RedactingFilter(redactor))
