"""What the PostgreSQL store has of its own (the shared suite runs on it too): its versioned
migrations, taken once by hosts starting together; a database of something else refused; a
read-only reader; text holding NULs; a connection the server ended opened again; and one
readable line, never the password, for a DSN that cannot be used."""

from __future__ import annotations

from typing import Any

import pytest

from store import Append, AppendResult, Database, PutState, Reader, StoreDamaged, StoreError
from store.dbapi import safe_dsn
from store.postgres import MIGRATIONS, PG_SCHEMA_VERSION, PgConnection, escape, unescape
from tests.store.conftest import open_at_once

from .conftest import record, run_sql


def _version(dsn: str) -> int:
    return int(run_sql(dsn, "SELECT value FROM meta WHERE key = 'schema_version'")[0][0])


def test_a_new_database_gets_every_migration_in_one_go(pg_dsn: str) -> None:
    Database(pg_dsn).close()
    assert _version(pg_dsn) == PG_SCHEMA_VERSION == len(MIGRATIONS)
    tables = {
        row[0]
        for row in run_sql(
            pg_dsn, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
    }
    assert {"meta", "dedupe", "state", "journal", "agent_facts", "items", "names"} <= tables
    assert {"message_refs", "messages", "usage", "item_text"} <= tables
    indexes = {row[0] for row in run_sql(pg_dsn, "SELECT indexname FROM pg_indexes")}
    assert "item_text_trgm" in indexes  # the text index is pg_trgm's


def test_hosts_starting_together_migrate_once(pg_dsn: str) -> None:
    assert open_at_once(pg_dsn) == []
    assert _version(pg_dsn) == PG_SCHEMA_VERSION


def test_a_newer_version_is_refused_and_a_read_only_reader_changes_nothing(pg_dsn: str) -> None:
    with Database(pg_dsn) as db:
        db.apply([Append(records=(record("hello", id="a"),))])
    with Reader(pg_dsn, read_only=True) as reader:
        assert [m["id"] for m in reader.history()] == ["a"]
        with pytest.raises(StoreError):  # the connection refuses writes
            reader._query("DELETE FROM meta")
    assert reader.count  # still readable afterwards: nothing was deleted
    assert _version(pg_dsn) == PG_SCHEMA_VERSION
    run_sql(pg_dsn, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    for opener in (Database, Reader, lambda d: Reader(d, read_only=True)):
        with pytest.raises(StoreError, match="99"):
            opener(pg_dsn)


def test_a_read_only_reader_refuses_a_database_without_a_store(pg_dsn: str) -> None:
    with pytest.raises(StoreDamaged):
        Reader(pg_dsn, read_only=True)
    assert run_sql(pg_dsn, "SELECT to_regclass('meta')") == [(None,)]  # nothing was made


def test_a_database_holding_other_tables_of_those_names_is_refused(pg_dsn: str) -> None:
    run_sql(pg_dsn, "CREATE TABLE items (x int)")
    with pytest.raises(StoreDamaged, match="items"):
        Database(pg_dsn)


def test_text_with_nuls_and_the_escape_round_trips(pg_dsn: str) -> None:
    key = ("incoming", "lobby", "c1\x00m\ufffe0\ufffe")
    with Database(pg_dsn) as db:
        assert db.apply(
            [
                Append(records=(record("a\x00b", id="x\x00y"),), dedupe=key),
                PutState(namespace="n\x00", key="k\x00\ufffe", value="v\x00"),
            ]
        ) == [AppendResult(stored=True), None]
    with Reader(pg_dsn) as reader:
        assert reader.has_dedupe(*key)
        assert not reader.has_dedupe("incoming", "lobby", "c1\x00m\ufffe0")
        assert [m["id"] for m in reader.history()] == ["x\x00y"]
        assert reader.seq_of("x\x00y") == 1
        assert reader.state("n\x00") == {"k\x00\ufffe": "v\x00"}
        assert [m["id"] for m in reader.search("A\x00B")] == ["x\x00y"]
    for text in ["", "plain", "\x00", "\ufffe", "\ufffe0", "\x00\ufffe\x00", "a\ufffe\ufffe0"]:
        assert unescape(escape(text)) == text


def test_a_connection_the_server_ended_is_opened_again(pg_dsn: str) -> None:
    with Database(pg_dsn) as db, Reader(pg_dsn) as reader:
        assert db.apply([Append(records=(record(id="one"),))]) == [AppendResult(stored=True)]
        assert reader.count() == 1
        run_sql(
            pg_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        # the batch on the dead connection fails, unacknowledged; the next one goes through
        first = db.apply([Append(records=(record(id="two"),))])
        if first != [AppendResult(stored=True)]:
            assert all(isinstance(o, StoreError) for o in first)
            assert db.apply([Append(records=(record(id="two"),))]) == [AppendResult(stored=True)]
        with pytest.raises(StoreError):
            reader.count()  # the read that met the dead connection fails
        assert reader.count() == 2


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("postgresql://mcplive:s3cretpw@127.0.0.1:1/db", "cannot connect to the store"),
        ("postgresql://mcplive:s3cretpw@127.0.0.1:5432/db?sslmode=bogus", "sslmode"),
        ("postgresql://mcplive:s3cretpw@127.0.0.1:notaport/db", "port"),
    ],
)
def test_a_dsn_that_cannot_be_used_gives_one_line_without_the_password(dsn: str, said: str) -> None:
    for opener in (Database, Reader, PgConnection):
        with pytest.raises(StoreError) as caught:
            opener(dsn)  # type: ignore[operator]
        message = str(caught.value)
        assert said in message
        assert "s3cretpw" not in message and "\n" not in message
        assert caught.value.__cause__ is None or "s3cretpw" not in str(caught.value.__cause__)


def test_a_role_that_may_not_make_the_schema_is_refused_in_one_line(
    pg_cluster: Any, pg_dsn: str
) -> None:
    run_sql(pg_dsn, "CREATE ROLE other LOGIN PASSWORD 'other-pw'")
    # the test cluster trusts every local user: the password is taken as it is
    user = pg_dsn.split("//", 1)[1].split("@", 1)[0]
    dsn = pg_cluster.dsn_of(pg_dsn.rsplit("/", 1)[1]).replace(f"{user}@", "other:other-pw@")
    with pytest.raises(StoreError) as caught:
        Database(dsn)
    assert "permission denied" in str(caught.value)
    assert "other-pw" not in str(caught.value) and "\n" not in str(caught.value)
    assert "other-pw" not in safe_dsn(dsn)
