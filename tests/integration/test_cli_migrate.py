"""``mcplive migrate``: an embedded store copied into a real PostgreSQL store (the ``pg_dsn``
fixture, a fresh database per test), made by the backend's own schema: the copy is the store
the backend writes from the same ops, its numbers go on after the store's, a host started on it
goes on with the agents' history; the counts and digests it prints are checked against both
sides; a target holding rows refused without ``--force``; a bad target said in one line, without
its password."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from actors.agent.history import read_history
from actors.cli import main
from actors.cli import migrate as mig
from store import (
    Append,
    Database,
    JournalEntry,
    Op,
    PutState,
    Reader,
    RecordAudit,
    RecordUsage,
    TrimJournal,
    db_path,
    postgres,
)
from tests import pgcluster
from tests.cli_helpers import mcplive, one_line, stored
from tests.helpers import publish_received, running_lobby, send_incoming, texts
from tests.integration.test_example_rerun import ALICE, SHARED
from tests.integration.test_server_failures import run_until
from tests.integration.test_store_postgresql import HELLO

pytestmark = pytest.mark.slow


def rich_ops() -> list[Op]:
    """Ops leaving a row in every table: a body shared by two agents' copies, a message with a
    source header (a fact), dedupe keys and state keys holding NULs (sorted otherwise once
    escaped), a journal trimmed at its start and end, a usage row with no server (NULLs), an
    audit row, text beyond ASCII and bytes with a NUL."""
    shared = [
        stored(f"lobby-1-{a}", "héllo ✓ every one", agent=a, server="lobby", channel="#general")
        for a in ("Ada", "Bo")
    ]
    return [
        Append(
            records=tuple(shared),
            dedupe=("message", "lobby", "#general\x00m1"),
            journal=(JournalEntry(stream="coalesce:Ada", record={"n": 1}),),
        ),
        Append(
            records=(stored("a1", "reply", role="assistant"),),
            dedupe=("message", "lobby", "#general-x\x00m2"),
        ),
        Append(records=(stored("h1", "x", metadata={"source_header": "from: lobby"}),)),
        Append(
            records=(stored("b2", "second\x00part", agent="Bo"),),
            journal=(
                JournalEntry(stream="coalesce:Ada", record={"n": 2}),
                JournalEntry(stream="coalesce:Bo", record={"n": 3, "f": 0.1}),
            ),
        ),
        Append(records=(stored("c1", "Ünïcode NAME", agent="Çé"),)),
        TrimJournal(stream="coalesce:Ada", before_seq=2),
        TrimJournal(stream="coalesce:Bo", before_seq=4),  # the last seq given: 3
        PutState(namespace="links", key="lobby", value={"cursor": b"\x00\xff", "n": 7}),
        PutState(namespace="links", key="k\x00", value=1),
        PutState(namespace="links", key="k\x01", value=2),
        RecordUsage(
            at=1_800_000_000.25, agent="Ada", model="scripted:x", turn=1, turn_id="t1",
            phase="completed", calls=1, input_tokens=12, output_tokens=3,
        ),
        RecordAudit(
            at=1_800_000_001.5, action="pause", target="Ada", source="cli", changed=True,
            detail="paused",
        ),
    ]  # fmt: skip


def apply(location: Path | str, ops: list[Op]) -> None:
    with Database(location) as db:
        outcomes = db.apply(ops)
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes


def rich_store(data_dir: Path) -> Path:
    """The store :func:`rich_ops` leave."""
    path = db_path(data_dir)
    apply(path, rich_ops())
    return path


@contextmanager
def backend(dsn: str) -> Iterator[postgres.PgConnection]:
    """A read-only connection of the PostgreSQL store (its text read back unescaped)."""
    conn = postgres.connect_read_only(dsn)
    try:
        yield conn
    finally:
        conn.close()


#: The physical tables of a PostgreSQL store, each with the key its rows are read in.
PHYSICAL = {
    "meta": "key",
    "dedupe": "kind, server, key",
    "state": "namespace, key",
    "journal": "seq",
    "agent_facts": "agent, fact",
    "items": "num",
    "names": "num",
    "message_refs": "seq",
    "item_text": "num",
    "usage": "num",
    "audit": "num",
}


def physical_rows(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with backend(dsn) as conn:
        return {
            name: [tuple(row) for row in conn.execute(f"SELECT * FROM {name} ORDER BY {key}")]
            for name, key in PHYSICAL.items()
        }


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
    tmp_path: Path,
    pg_dsn: str,
    pg_cluster: pgcluster.Cluster,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = rich_store(tmp_path / "data")
    status, out, err = run_migrate(capsys, "--from", str(tmp_path / "data"), "--to", pg_dsn)
    assert status == 0, err
    assert f"(store schema version {postgres.PG_SCHEMA_VERSION})" in out
    expected = sqlite_counts(path)
    assert all(expected.values()), expected  # a row in every table
    assert pg_counts(pg_dsn) == expected
    table = printed_table(out)
    assert list(table) == [t.name for t in mig.TABLES]
    for name, (rows_from, rows_to, digest_from, digest_to, verdict) in table.items():
        assert int(rows_from) == int(rows_to) == expected[name]
        assert digest_from == digest_to and verdict == "ok"
    assert "every table matches" in out
    # the copy is the store the backend itself writes from the same ops: every table, the
    # names' numbers and the text index included
    written = pg_cluster.create_database()
    apply(written, rich_ops())
    assert physical_rows(pg_dsn) == physical_rows(written)
    with backend(pg_dsn) as conn:
        # the digest printed is the one of the rows as PostgreSQL holds them, read back
        for t in mig.TABLES:
            assert mig.target_tally(conn.raw(), t).hexdigest[:16] == table[t.name][3]
        # the values themselves: the shared body once per copy, the NULs, the NULLs
        copies = "SELECT agent, body FROM messages WHERE id LIKE 'lobby-1-%' ORDER BY agent"
        bodies = conn.execute(copies).fetchall()
        assert [a for a, _ in bodies] == ["Ada", "Bo"] and bodies[0][1] == bodies[1][1]
        keys = conn.execute("SELECT key FROM dedupe ORDER BY key").fetchall()
        assert {k for (k,) in keys} == {"#general\x00m1", "#general-x\x00m2"}
        usage = conn.execute("SELECT server, channel, at FROM usage").fetchall()
        assert usage == [(None, None, 1_800_000_000.25)]
    # the numbers go on after the largest the store gave, the trimmed journal's too
    apply(
        pg_dsn,
        [
            Append(
                records=(stored("n1", "new", agent="Dee"),),
                journal=(JournalEntry(stream="s", record={}),),
            ),
            RecordUsage(
                at=1.0, agent="Dee", model="m", turn=1, turn_id="t", phase="completed", calls=1
            ),
            RecordAudit(at=2.0, action="resume", target="Dee", source="cli", changed=False),
        ],
    )
    with backend(pg_dsn) as conn:
        assert conn.execute("SELECT max(seq) FROM journal").fetchone() == (4,)
        assert conn.execute("SELECT seq, agent FROM messages WHERE id = 'n1'").fetchone() == (
            7,
            "Dee",
        )
        assert conn.execute("SELECT num FROM names WHERE name = 'Dee'").fetchone() == (4,)
        assert conn.execute("SELECT max(num) FROM usage").fetchone() == (2,)
        assert conn.execute("SELECT max(num) FROM audit").fetchone() == (2,)


async def test_a_host_on_the_copy_of_the_bundled_examples_store_goes_on_with_its_history(
    tmp_path: Path, pg_dsn: str
) -> None:
    data = tmp_path / "data"
    # run the example until its people have spoken and Alice's photo is stored, then stop it
    run = ["run", "--data-dir", str(data), "--duration", "120"]
    await run_until(run, [ALICE, SHARED], tmp_path)
    done = mcplive("migrate", "--from", str(data), "--to", pg_dsn, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    expected = sqlite_counts(db_path(data))
    assert expected["messages"] > 0 and expected["dedupe"] > 0
    assert pg_counts(pg_dsn) == expected
    table = printed_table(done.stdout)
    assert {name: int(cells[0]) for name, cells in table.items()} == expected
    assert all(cells[2] == cells[3] and cells[4] == "ok" for cells in table.values())

    with Reader(db_path(data), read_only=True) as reader:
        before = read_history(reader, "Ada")
        top = reader.last_message_seq()
    assert before and "hello everyone! hi Ada!" in " ".join(texts(before, "user"))
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    with trio.fail_after(60):
        async with running_lobby(host_dir, {"Ada": HELLO}, host_keys={"store": pg_dsn}) as lb:
            migrated = lb.host.history("Ada")
            assert [summary(m) for m in migrated[: len(before)]] == [summary(m) for m in before]
            assert migrated[: len(before)] == before
            send_incoming(lb.ctl, "lobby:#random", "after-1", "hello after the move")
            await lb.ctl.wait_for(publish_received(), "Ada's reply")
            await lb.host.run_until_idle()
            after = lb.host.history("Ada")
            assert after[: len(before)] == before
            assert texts(after[len(before) :], "user")[-1] == "hello after the move"
            assert texts(after[len(before) :], "assistant") == ["Hi there, hello to you!"]
    assert not (host_dir / "data" / "store.sqlite3").exists()
    with backend(pg_dsn) as conn:
        new = conn.execute(
            "SELECT seq FROM messages WHERE agent = 'Ada' AND seq > ? ORDER BY seq", (top,)
        ).fetchall()
        (highest,) = conn.execute("SELECT max(seq) FROM messages").fetchone()  # type: ignore[misc]
    # the messages stored on the copy have seqs above every migrated one
    assert len(new) >= 2 and int(highest) == int(new[-1][0])


def summary(message: dict[str, Any]) -> tuple[Any, ...]:
    """A stored message's id, role and text."""
    metadata = message.get("metadata") or {}
    return (metadata.get("message_id"), message["role"], texts([message]))


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
    assert "is not empty: messages (6 rows)" in err and "--force" in err
    assert pg_counts(pg_dsn) == before  # nothing written
    status, out, err = run_migrate(capsys, *args, "--force")
    assert status == 0, err
    assert pg_counts(pg_dsn) == before
    assert "every table matches" in out


def test_rows_changed_on_the_way_are_caught(
    tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rich_store(tmp_path / "data")
    postgres.connect(pg_dsn).close()  # the store's schema, made by the backend
    with psycopg.connect(pg_dsn) as conn:  # a target that alters what it is given
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
    assert table["state"][0] == table["state"][1] == "3"
    assert table["state"][2] != table["state"][3] and table["state"][4] == "DIFFERS"
    assert table["messages"][4] == "ok"
    assert err == "mcplive: migrate: the copy differs in state\n"


@pytest.mark.parametrize(
    ("target", "status", "said"),
    [
        ("mysql://u:sekret@127.0.0.1/x", 2, "--to: not a PostgreSQL URL"),
        ("postgresql://u:sekret@127.0.0.1/x?nonsense=1", 2, "--to: the URL does not parse"),
        (
            "postgresql://u:sekret@127.0.0.1:1/x",
            1,
            "cannot connect to the store postgresql://u@127.0.0.1:1/x",
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
