"""``mcplive audit`` over an audit record written through the store's own writer (real SQLite in
a temp dir): lines, ``--json``, ``--since``/``--limit``, read-only, and one-line errors."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from actors.cli.command import main
from actors.transcript.printer import local_stamp
from store import Database, RecordAudit, db_path

DAY1 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC).timestamp()
DAY2 = dt.datetime(2026, 3, 2, 9, tzinfo=dt.UTC).timestamp()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with Database(db_path(data)) as db:
        db.apply(
            [
                RecordAudit(
                    at=DAY1, action="pause", target="Ada", source="console 127.0.0.1", changed=True
                ),
                RecordAudit(
                    at=DAY2,
                    action="reconnect",
                    target="lobby",
                    source="cli",
                    changed=True,
                    detail="dialling now",
                ),
            ]
        )
    return data


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_record_is_printed_oldest_first_and_left_as_it_is(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = db_path(data_dir).read_bytes()
    code, out, err = run(capsys, "--data-dir", str(data_dir))
    assert code == 0 and err == ""
    assert out.splitlines() == [
        f"{local_stamp(DAY1)}  console 127.0.0.1  pause Ada  (changed)",
        f"{local_stamp(DAY2)}  cli  reconnect lobby  (changed): dialling now",
    ]
    code, out, _ = run(capsys, "--data-dir", str(data_dir), "--json", "--since", "2026-03-02")
    [row] = [json.loads(line) for line in out.splitlines()]
    assert row["ts"] == "2026-03-02T09:00:00.000Z" and row["action"] == "reconnect"
    assert row["source"] == "cli" and row["changed"] is True and row["detail"] == "dialling now"
    code, out, _ = run(capsys, "--data-dir", str(data_dir), "--limit", "1")
    assert len(out.splitlines()) == 1 and "reconnect" in out
    assert db_path(data_dir).read_bytes() == before  # read-only


def test_the_config_names_the_data_dir(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text('[host]\ndata_dir = "data"\n', encoding="utf-8")
    code, out, _ = run(capsys, str(cfg))
    assert code == 0 and len(out.splitlines()) == 2


def test_no_store_and_bad_arguments_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "--data-dir", str(tmp_path / "none"))
    assert code == 2 and err.count("\n") == 1 and "no store at" in err
    code, _, err = run(capsys, "--data-dir", str(tmp_path), "--since", "yesterday")
    assert code == 2 and err.count("\n") == 1
    empty = tmp_path / "empty"
    Database(db_path(empty)).close()
    code, out, _ = run(capsys, "--data-dir", str(empty))
    assert code == 0 and out == "no operator actions recorded\n"
