"""``[host] store`` and ``store_env``: the embedded store by default, a PostgreSQL DSN from the
config or from a variable; each problem one line that never holds the DSN; the password in the
host's redactor. And a host whose database cannot be reached stops with one line, no password."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.config import ConfigErrors, host_redactor, load_config
from tests.cli_helpers import child_env, mcplive, one_line

DSN = "postgresql://ada:pa55word-x@db.example:5432/mcplive"


def base(**host: Any) -> dict[str, Any]:
    return {
        "host": {"data_dir": "data", **host},
        "agents": [{"name": "Ada", "model": "anthropic:claude-test", "api_key_env": "MCPLIVE_KEY"}],
    }


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCPLIVE_KEY", "a-model-key")


def problems_of(raw: Any) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load_config(raw)
    for line in info.value.problems:
        assert "\n" not in line and "pa55word" not in line
    return info.value.problems


def test_the_embedded_store_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(base())
    assert cfg.store is None and cfg.store_env is None
    assert cfg.store_location == tmp_path / "data" / "store.sqlite3"


def test_a_dsn_in_the_config_or_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(base(store=DSN))
    assert cfg.store == cfg.store_location == DSN
    assert "pa55word" not in repr(cfg)
    monkeypatch.setenv("MCPLIVE_DSN", DSN)
    cfg = load_config(base(store_env="MCPLIVE_DSN"))
    assert (cfg.store, cfg.store_env) == (DSN, "MCPLIVE_DSN")
    redact = host_redactor(cfg)
    assert "pa55word" not in redact.text(f"could not reach {DSN}")


@pytest.mark.parametrize(
    ("host", "said"),
    [
        ({"store": "sqlite:///x"}, "host.store: must be a PostgreSQL DSN"),
        ({"store": 5}, "host.store: must be a PostgreSQL DSN"),
        ({"store": "postgresql://ada:pa55word-x@db:notaport/x"}, "host.store: not a valid DSN"),
        ({"store": "postgresql://ada:pa55word-x@db"}, "host.store: names no database"),
        ({"store": DSN, "store_env": "X"}, "host.store, host.store_env: give only one"),
        ({"store_env": "not a name"}, "host.store_env: must be the name of an environment"),
        ({"store_env": "MCPLIVE_UNSET_DSN"}, "host.store_env: environment variable"),
        ({"store_env": "MCPLIVE_BAD_DSN"}, "host.store_env: the variable MCPLIVE_BAD_DSN: must"),
        ({"stroe": DSN}, "host.stroe: unknown key; did you mean store?"),
    ],
)
def test_each_problem_is_one_line_without_the_dsn(
    host: dict[str, Any], said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MCPLIVE_UNSET_DSN", raising=False)
    monkeypatch.setenv("MCPLIVE_BAD_DSN", "mysql://ada:pa55word-x@db/x")
    (problem,) = problems_of(base(**host))
    assert problem.startswith(said), problem


def test_a_host_whose_database_cannot_be_reached_stops_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "host.toml"
    config.write_text(
        '[host]\ndata_dir = "data"\nstore_env = "MCPLIVE_TEST_DSN"\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:rules.toml"\n',
        encoding="utf-8",
    )
    (tmp_path / "rules.toml").write_text("", encoding="utf-8")
    dsn = "postgresql://ada:pa55word-x@127.0.0.1:1/mcplive"
    result = mcplive("run", str(config), cwd=tmp_path, env=child_env(MCPLIVE_TEST_DSN=dsn))
    line = one_line(result)
    assert "cannot connect to the store postgresql://ada:…@127.0.0.1:1/mcplive" in line
    assert "pa55word" not in result.stderr + result.stdout
