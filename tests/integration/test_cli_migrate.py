"""``mcplive migrate``: an embedded store copied into a real PostgreSQL (the ``pg_dsn`` fixture,
a fresh database per test), with the counts and digests it prints checked against both sides;
a target holding rows refused without ``--force``; a bad target said in one line, without its
password."""

from __future__ import annotations

import sqlite3
import sys
import types
from pathlib import Path

import psycopg
import pytest
import trio

from actors.cli import main
from actors.cli import migrate as mig
from store import (
    Append,
    Database,
    JournalEntry,
    PutState,
    RecordUsage,
    TrimJournal,
    db_path,
)
from tests.cli_helpers import mcplive, one_line, stored
from tests.integration.test_example_rerun import ALICE, SHARED
from tests.integration.test_server_failures import run_until

pytestmark = pytest.mark.slow


def rich_store(data_dir: Path) -> Path:
    """A store with a row in every table: a body shared by two agents' copies, a message with
    a source header (a fact), a dedupe key, a journal trimmed at its start, state, a usage row
    with no server (NULLs), text beyond ASCII and bytes with a NUL."""
    path = db_path(data_dir)
    shared = [
        stored(f"lobby-1-{a}", "héllo ✓ every one", agent=a, server="lobby", channel="#general")
        for a in ("Ada", "Bo")
    ]
    ops = [
        Append(
            records=tuple(shared),
            dedupe=("message", "lobby", "#general\x00m1"),
            journal=(JournalEntry(stream="coalesce:Ada", record={"n": 1}),),
        ),
        Append(records=(stored("a1", "reply", role="assistant"),)),
        Append(records=(stored("h1", "x", metadata={"source_header": "from: lobby"}),)),
        Append(
            records=(stored("b2", "second\x00part", agent="Bo"),),
            journal=(
                JournalEntry(stream="coalesce:Ada", record={"n": 2}),
                JournalEntry(stream="coalesce:Bo", record={"n": 3, "f": 0.1}),
            ),
        ),
        TrimJournal(stream="coalesce:Ada", before_seq=2),
        TrimJournal(stream="coalesce:Bo", before_seq=4),  # the last seq given: 3
        PutState(namespace="links", key="lobby", value={"cursor": b"\x00\xff", "n": 7}),
        RecordUsage(
            at=1_800_000_000.25, agent="Ada", model="scripted:x", turn=1, turn_id="t1",
            phase="completed", calls=1, input_tokens=12, output_tokens=3,
        ),
    ]  # fmt: skip
    with Database(path) as db:
        outcomes = db.apply(ops)
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    return path


def printed_table(out: str) -> dict[str, list[str]]:
    """The comparison table ``migrate`` printed: table -> its cells."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("table "))
    rows = {}
    for line in lines[start + 1 :]:
        cells = line.split()
        if cells and cells[0] in {t.name for t in mig.TABLES}:
            rows[cells[0]] = cells[1:]
    return rows


def sqlite_counts(path: Path) -> dict[str, int]:
    with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as conn:
        return {
            t.name: conn.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0] for t in mig.TABLES
        }


def pg_counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {
            t.name: conn.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0]  # type: ignore[index]
            for t in mig.TABLES
        }


def run_migrate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["migrate", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_every_table_is_copied_counted_and_digested(
    tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rich_store(tmp_path / "data")
    status, out, err = run_migrate(capsys, "--from", str(tmp_path / "data"), "--to", pg_dsn)
    assert status == 0, err
    expected = sqlite_counts(path)
    assert all(expected.values()), expected  # a row in every table
    assert pg_counts(pg_dsn) == expected
    table = printed_table(out)
    assert list(table) == [t.name for t in mig.TABLES]
    for name, (rows_from, rows_to, digest_from, digest_to, verdict) in table.items():
        assert int(rows_from) == int(rows_to) == expected[name]
        assert digest_from == digest_to and verdict == "ok"
    assert "every table matches" in out
    # the digest printed is the one of the rows as PostgreSQL holds them
    with psycopg.connect(pg_dsn) as conn:
        for t in mig.TABLES:
            assert mig.target_tally(conn, t).hexdigest[:16] == table[t.name][3]
        # the values themselves: the shared body once per copy, the NUL, the NULLs
        copies = "SELECT agent, body FROM messages WHERE id LIKE 'lobby-1-%' ORDER BY agent"
        bodies = conn.execute(copies).fetchall()
        assert [a for a, _ in bodies] == ["Ada", "Bo"] and bodies[0][1] == bodies[1][1]
        usage = conn.execute("SELECT server, channel, at FROM usage").fetchall()
        assert usage == [(None, None, 1_800_000_000.25)]
        # the numbers go on after the largest the store gave, the trimmed journal's too
        conn.execute("INSERT INTO journal (stream, record) VALUES ('s', '\\x00')")
        (seq,) = conn.execute("SELECT max(seq) FROM journal").fetchone()  # type: ignore[misc]
        assert seq == 4


def test_the_bundled_examples_store_moves_into_postgresql(tmp_path: Path, pg_dsn: str) -> None:
    data = tmp_path / "data"
    # run the example until its people have spoken and Alice's photo is stored, then stop it
    run = ["run", "--data-dir", str(data), "--duration", "120"]
    trio.run(run_until, run, [ALICE, SHARED], tmp_path)
    done = mcplive("migrate", "--from", str(data), "--to", pg_dsn, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = sqlite_counts(db_path(data))
    assert expected["messages"] > 0 and expected["dedupe"] > 0
    assert pg_counts(pg_dsn) == expected
    table = printed_table(done.stdout)
    assert {name: int(cells[0]) for name, cells in table.items()} == expected
    assert all(cells[2] == cells[3] and cells[4] == "ok" for cells in table.values())


def test_a_target_holding_rows_is_refused_unless_forced(
    tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rich_store(tmp_path / "data")
    args = ("--from", str(tmp_path / "data"), "--to", pg_dsn)
    assert run_migrate(capsys, *args)[0] == 0
    before = pg_counts(pg_dsn)
    status, out, err = run_migrate(capsys, *args)
    assert status == 1 and out == ""
    assert err.count("\n") == 1
    assert "is not empty: messages (5 rows)" in err and "--force" in err
    assert pg_counts(pg_dsn) == before  # nothing written
    status, out, err = run_migrate(capsys, *args, "--force")
    assert status == 0, err
    assert pg_counts(pg_dsn) == before
    assert "every table matches" in out


def test_rows_changed_on_the_way_are_caught(
    tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rich_store(tmp_path / "data")
    with psycopg.connect(pg_dsn) as conn:  # a target that alters what it is given
        for statement in mig.FALLBACK_DDL:
            conn.execute(statement)
        conn.execute(
            "CREATE FUNCTION spoil() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN NEW.value := NEW.value || '\\x00'::bytea; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER spoil BEFORE INSERT ON state FOR EACH ROW EXECUTE FUNCTION spoil()"
        )
    status, out, err = run_migrate(capsys, "--from", str(tmp_path / "data"), "--to", pg_dsn)
    assert status == 1
    table = printed_table(out)
    assert table["state"][0] == table["state"][1] == "1"
    assert table["state"][2] != table["state"][3] and table["state"][4] == "DIFFERS"
    assert table["messages"][4] == "ok"
    assert err == "mcplive: migrate: the copy differs in state\n"


def test_the_postgresql_stores_schema_is_used_when_there(
    tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[object] = []

    def ensure_schema(conn: psycopg.Connection[tuple[object, ...]]) -> None:
        made.append(conn)
        for statement in mig.FALLBACK_DDL:
            conn.execute(statement)

    fake = types.ModuleType("store.postgres")
    fake.ensure_schema = ensure_schema  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "store.postgres", fake)
    rich_store(tmp_path / "data")
    status, out, err = run_migrate(capsys, "--from", str(tmp_path / "data"), "--to", pg_dsn)
    assert status == 0, err
    assert len(made) == 1
    assert "(tables: store.postgres.ensure_schema)" in out


@pytest.mark.parametrize(
    ("target", "status", "said"),
    [
        ("mysql://u:sekret@127.0.0.1/x", 2, "--to: not a PostgreSQL URL"),
        ("postgresql://u:sekret@127.0.0.1/x?nonsense=1", 2, "--to: the URL does not parse"),
        (
            "postgresql://u:sekret@127.0.0.1:1/x",
            1,
            "cannot connect to postgresql://u@127.0.0.1:1/x",
        ),
    ],
)
def test_a_bad_target_is_one_line_without_its_password(
    tmp_path: Path, target: str, status: int, said: str
) -> None:
    rich_store(tmp_path / "data")
    done = mcplive("migrate", "--from", str(tmp_path / "data"), "--to", target, cwd=tmp_path)
    assert done.returncode == status
    line = one_line(done)
    assert said in line
    assert "sekret" not in done.stdout + done.stderr


def test_a_missing_store_is_a_bad_argument(tmp_path: Path) -> None:
    done = mcplive("migrate", "--from", "nowhere", "--to", "postgresql://h/db", cwd=tmp_path)
    assert done.returncode == 2
    assert "no store at" in one_line(done)
    assert not (tmp_path / "nowhere").exists()


def test_row_bytes_tell_types_apart() -> None:
    values = [None, 1, 1.0, "1", b"1", True, "", b""]
    encoded = [mig.row_bytes([v]) for v in values]
    assert len(set(encoded)) == len(values) - 1  # True is the whole number 1
    assert mig.row_bytes(["a", "bc"]) != mig.row_bytes(["ab", "c"])


def test_the_target_may_come_from_a_variable(
    tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rich_store(tmp_path / "data")
    args = ("--from", str(tmp_path / "data"), "--to-env", "TARGET_DSN")
    status, out, err = run_migrate(capsys, *args)
    assert (status, out, err) == (
        2,
        "",
        "mcplive: migrate: --to-env TARGET_DSN: that variable is not set\n",
    )
    monkeypatch.setenv("TARGET_DSN", pg_dsn)
    status, out, err = run_migrate(capsys, *args)
    assert status == 0, err
    assert "every table matches" in out
