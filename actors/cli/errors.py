"""The lines the ``mcplive`` command prints for failures an operator can act on.

A failure that is the operator's to fix (a config problem, a busy or unusable data dir, a damaged
store, a file that cannot be read) gets one line each and an exit status, never a traceback;
inside an exception group (a failure in one of the host's tasks) the first such failure counts.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys

from actors.config import ConfigErrors
from actors.errors import ConfigError, DataDirBusy
from store import StoreDamaged, StoreError
from store.dbapi import is_dsn

#: Exit status for configuration and usage problems (as argparse uses).
EXIT_CONFIG = 2
#: Exit status for everything else that stopped the command.
EXIT_FAILED = 1
#: Exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


def failure_lines(exc: BaseException) -> tuple[list[str], int] | None:
    """The lines (without the ``mcplive:`` prefix) and exit status owed for ``exc``, or None
    when it is not an operator's failure."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = failure_lines(inner)
            if found is not None:
                return found
        return None
    if isinstance(exc, ConfigErrors):
        return list(exc.problems), EXIT_CONFIG
    if isinstance(exc, ConfigError):
        return [str(exc)], EXIT_CONFIG
    if isinstance(exc, DataDirBusy):
        return [str(exc)], EXIT_FAILED
    if isinstance(exc, StoreDamaged) and is_dsn(exc.path):
        return [
            f"{exc.path}: the database is not an mcplive store ({exc.detail}); give the store "
            "a database of its own (CREATE DATABASE … TEMPLATE template0)"
        ], EXIT_FAILED
    if isinstance(exc, StoreDamaged):
        return [
            f"{exc.path}: the store is damaged or is not an mcplive store ({exc.detail}); stop "
            "mcplive, move the file aside (a new, empty store is made) or restore a backup"
        ], EXIT_FAILED
    if isinstance(exc, StoreError):
        return [f"store: {exc}"], EXIT_FAILED
    if isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
        where = f"{exc.filename}: " if exc.filename else ""
        return [f"{where}{exc.strerror or exc}"], EXIT_FAILED
    return None


def is_broken_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` is (or, in a group, holds only) a write to a closed pipe (``| head``)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(is_broken_pipe(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def quiet_after_broken_pipe() -> None:
    """The reader of standard output went away: point it at ``/dev/null`` so the flush at exit
    does not fail again (the recipe of Python's ``signal`` documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
