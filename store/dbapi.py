"""What the store's shared SQL code needs of a connection, and where a store is.

A store is at a *location*: a path (the embedded SQLite file) or a PostgreSQL DSN
(``postgresql://…`` or ``postgres://…``, see :mod:`store.postgres`). The write side
(:mod:`store.sqlite`, :mod:`store.items`, :mod:`store.facts`) and the :class:`~store.reader.Reader`
run the same statements on both, through the :class:`Connection` protocol: an
:class:`sqlite3.Connection`, or the PostgreSQL adapter (which reads ``?`` placeholders as
SQLite does). The statements are those both engines read alike (``INSERT … ON CONFLICT``,
``RETURNING``, ``NULLS FIRST``); what differs is asked of :func:`dialect_of`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

#: Where a store is: a path (SQLite) or a PostgreSQL DSN.
Location: TypeAlias = str | os.PathLike[str]

#: The schemes of a PostgreSQL DSN.
DSN_SCHEMES = ("postgresql://", "postgres://")

Dialect: TypeAlias = Literal["sqlite", "postgresql"]


class Cursor(Protocol):
    """The part of a DB-API cursor the store uses."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """The part of a connection the store's shared SQL uses (``?`` placeholders, autocommit:
    the caller issues ``BEGIN``/``COMMIT``)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...

    @property
    def in_transaction(self) -> bool: ...


class IntegrityError(Exception):
    """A unique key refused a row (what :class:`sqlite3.IntegrityError` is for SQLite); raised by
    the PostgreSQL adapter inside the write side, never to a caller of the store."""


#: What a refused unique key raises, on either engine.
INTEGRITY_ERRORS = (sqlite3.IntegrityError, IntegrityError)


def is_dsn(location: object) -> bool:
    """Whether ``location`` names a PostgreSQL database rather than a file."""
    return isinstance(location, str) and location.startswith(DSN_SCHEMES)


def dialect_of(conn: object) -> Dialect:
    """The engine behind ``conn``."""
    return "sqlite" if isinstance(conn, sqlite3.Connection) else "postgresql"


def dsn_password(dsn: str) -> str | None:
    """The password a DSN holds (after the user name, or as a ``password=`` parameter), if any;
    None when it has none or cannot be read."""
    try:
        parts = urlsplit(dsn)
        password = parts.password
    except ValueError:
        return None
    if not password:
        found = [v for k, v in parse_qsl(parts.query) if k == "password"]
        password = found[-1] if found else None
    return password or None


def safe_dsn(dsn: str) -> str:
    """``dsn`` with its password (if any) left out: what may be printed."""
    try:
        parts = urlsplit(dsn)
        password = parts.password
    except ValueError:
        return dsn.split("://", 1)[0] + "://…"
    query = [(k, "***" if k == "password" else v) for k, v in parse_qsl(parts.query)]
    if not password:
        if any(k == "password" for k, _ in query):
            return urlunsplit(parts._replace(query=urlencode(query, safe="*")))
        return dsn
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}:…@{host}", query=urlencode(query, safe="*")))


def describe(location: Location) -> str:
    """How a location is named in messages: a path, or a DSN without its password."""
    if is_dsn(location):
        assert isinstance(location, str)
        return safe_dsn(location)
    return str(location)


def as_location(location: Location) -> Path | str:
    """A path as a :class:`~pathlib.Path`, a DSN as it is (a path would eat its ``//``)."""
    if is_dsn(location):
        assert isinstance(location, str)
        return location
    return Path(location)
