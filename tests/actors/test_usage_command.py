"""``mcplive usage`` over a ledger written through the store's own writer (real SQLite in a temp
dir): grouping, filters, prices from the config, and one-line errors."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from actors.cli.command import main
from actors.config import ConfigErrors, load_config
from store import Database, Reader, RecordUsage, db_path

DAY1 = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC).timestamp()
DAY2 = dt.datetime(2026, 3, 2, 9, tzinfo=dt.UTC).timestamp()
SONNET = "anthropic:claude-sonnet-4-5"


def turn(at: float, agent: str, model: str, n: int, **kw: Any) -> RecordUsage:
    figures: dict[str, Any] = {
        "calls": 1,
        "phase": "completed",
        "input_tokens": 1000,
        "output_tokens": 100,
        "server": "lobby",
        "channel": "lobby:#general",
    }
    figures.update(kw)
    return RecordUsage(
        at=at, agent=agent, model=model, turn=n, turn_id=f"inf_{agent}{n}", **figures
    )


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    with Database(db_path(data)) as db:
        outcomes = db.apply(
            [
                turn(DAY1, "Ada", SONNET, 0, cache_read_tokens=2000, cache_write_tokens=500),
                turn(DAY1, "Ada", SONNET, 1, silent=True, output_tokens=0),
                turn(DAY1, "Bea", "scripted:bea.toml", 0, channel="lobby:#dev"),
                turn(DAY2, "Ada", SONNET, 2, calls=2),
                turn(
                    DAY2,
                    "Bea",
                    "scripted:bea.toml",
                    1,
                    phase="failed",
                    calls=0,
                    input_tokens=0,
                    output_tokens=0,
                ),
            ]
        )
    assert outcomes == [None] * 5
    return data


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["usage", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, Any]]:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_without_by_a_row_is_a_day_an_agent_and_a_model(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = rows(capsys, "--data-dir", str(data_dir))
    assert [(r["day"], r["agent"], r["model"]) for r in got] == [
        ("2026-03-01", "Ada", SONNET),
        ("2026-03-01", "Bea", "scripted:bea.toml"),
        ("2026-03-02", "Ada", SONNET),
        ("2026-03-02", "Bea", "scripted:bea.toml"),
    ]
    first = got[0]
    assert first == {
        "day": "2026-03-01",
        "agent": "Ada",
        "model": SONNET,
        "calls": 2,
        "silent_turns": 1,
        "input_tokens": 2000,
        "output_tokens": 100,
        "cache_read_tokens": 2000,
        "cache_write_tokens": 500,
        # list prices: 3 in, 15 out, 0.30 cache read, 3.75 cache write per million
        "cost_usd": pytest.approx((2000 * 3 + 100 * 15 + 2000 * 0.3 + 500 * 3.75) / 1e6),
    }
    assert got[1]["cost_usd"] is None  # no price for a scripted model: unknown, not 0
    assert got[3]["calls"] == 0 and got[3]["input_tokens"] == 0


def test_by_groups_and_agent_and_since_filter(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_day = rows(capsys, "--data-dir", str(data_dir), "--by", "day")
    assert [(r["day"], r["calls"], r["agent"], r["model"]) for r in by_day] == [
        ("2026-03-01", 3, None, None),
        ("2026-03-02", 2, None, None),
    ]
    assert all(r["cost_usd"] is None for r in by_day)  # each day holds an unpriced model
    by_agent = rows(capsys, "--data-dir", str(data_dir), "--by", "agent")
    assert [(r["agent"], r["calls"], r["silent_turns"]) for r in by_agent] == [
        ("Ada", 4, 1),
        ("Bea", 1, 0),
    ]
    assert by_agent[0]["cost_usd"] is not None
    by_model = rows(capsys, "--data-dir", str(data_dir), "--by", "model")
    assert [r["model"] for r in by_model] == [SONNET, "scripted:bea.toml"]
    by_channel = rows(capsys, "--data-dir", str(data_dir), "--by", "channel")
    assert [(r["channel"], r["calls"]) for r in by_channel] == [
        ("lobby/lobby:#dev", 1),
        ("lobby/lobby:#general", 4),
    ]
    only_bea = rows(capsys, "--data-dir", str(data_dir), "--agent", "Bea")
    assert {r["agent"] for r in only_bea} == {"Bea"} and len(only_bea) == 2
    since = rows(capsys, "--data-dir", str(data_dir), "--since", "2026-03-02")
    assert {r["day"] for r in since} == {"2026-03-02"}
    assert rows(capsys, "--data-dir", str(data_dir), "--since", "2026-03-03") == []


def test_the_config_prices_a_model_and_overrides_a_built_in_price(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text(
        f'[host]\ndata_dir = "{data_dir}"\n[[agents]]\nname = "Ada"\nmodel = "{SONNET}"\n'
        '[prices."scripted:bea.toml"]\ninput = 1\noutput = 1\ncache_read = 1\ncache_write = 1\n'
        '[prices."claude-sonnet-4-5"]\ninput = 0\noutput = 0\ncache_read = 0\ncache_write = 0\n',
        encoding="utf-8",
    )
    got = {r["agent"]: r for r in rows(capsys, str(cfg), "--by", "agent")}
    assert got["Bea"]["cost_usd"] == pytest.approx(1100 / 1e6)
    assert got["Ada"]["cost_usd"] == 0


def test_the_table_has_a_total_and_shows_an_unknown_cost_as_unknown(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--data-dir", str(data_dir), "--by", "agent")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["agent", "calls", "silent"]
    assert lines[1].startswith("Ada") and "$" in lines[1]
    assert lines[2].startswith("Bea") and lines[2].endswith("?")
    assert lines[3].startswith("total") and lines[3].endswith("?")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--since", "yesterday"], "--since: 'yesterday' is not a date (YYYY-MM-DD)"),
        (["--data-dir", "{missing}"], "no store at"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    argv = [a.replace("{missing}", str(tmp_path / "none")) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and says in err and err.startswith("mcplive: ")


def test_a_bad_price_in_the_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "host.toml"
    cfg.write_text(
        '[[agents]]\nname = "Ada"\nmodel = "anthropic:x"\n'
        '[prices."anthropic:x"]\ninput = -1\noutput = 1\ncache_read = 1\n',
        encoding="utf-8",
    )
    code, _, err = run(capsys, str(cfg))
    assert code == 2 and len(err.splitlines()) == 1
    said = (
        'prices."anthropic:x": input must be a number >= 0, got -1 (USD per million tokens: '
        "input, output, cache_read, cache_write)"
    )
    assert err == f"mcplive: {said}\n"
    with pytest.raises(ConfigErrors) as caught:  # the host's own config check says the same
        load_config(cfg)
    assert said in caught.value.problems


def test_a_store_from_before_the_ledger_has_no_usage_and_gains_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = db_path(tmp_path / "data")
    Database(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE usage")
    conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with Reader(path, read_only=True) as reader:
        assert reader.usage() == []  # read as it is: no ledger yet
    before = path.read_bytes()
    assert rows(capsys, "--data-dir", str(tmp_path / "data")) == []
    assert path.read_bytes() == before  # read-only: not even upgraded
    with Database(path) as db:  # the writer upgrades it in place
        assert db.apply([turn(DAY1, "Ada", SONNET, 0)]) == [None]
    with Reader(path, read_only=True) as reader:
        assert [t.calls for t in reader.usage()] == [1]


def test_the_host_config_keeps_its_prices(tmp_path: Path) -> None:
    (tmp_path / "ada.toml").write_text('[[rules]]\nwhen = "."\nsay = "ok"\n', encoding="utf-8")
    cfg = load_config(
        {
            "agents": [{"name": "Ada", "model": f"scripted:{tmp_path / 'ada.toml'}"}],
            "prices": {
                "local:qwen3": {"input": 0.5, "output": 1, "cache_read": 0, "cache_write": 0}
            },
        }
    )
    assert cfg.prices["local:qwen3"].input == Decimal("0.5")
    with pytest.raises(ConfigErrors) as caught:
        load_config({"agents": cfg_agents(tmp_path), "prices": {"m": 3}})
    assert caught.value.problems == [
        'prices."m": must be a table with input, output, cache_read, cache_write'
    ]


def cfg_agents(tmp_path: Path) -> list[dict[str, str]]:
    return [{"name": "Ada", "model": f"scripted:{tmp_path / 'ada.toml'}"}]
