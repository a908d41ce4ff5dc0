"""``mcplive`` options as a user gives them: ``--version``, ``run --data-dir`` with a config,
and ``check`` of a model whose credential is missing."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from tests.cli_helpers import child_env, mcplive, one_line

pytestmark = pytest.mark.slow


def config(folder: Path, head: str = "", model: str = "scripted:quiet.toml") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "quiet.toml").write_text("", encoding="utf-8")
    cfg = folder / "host.toml"
    cfg.write_text(f'{head}[[agents]]\nname = "Ada"\nmodel = "{model}"\n', encoding="utf-8")
    return cfg


def test_version(tmp_path: Path) -> None:
    result = mcplive("--version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout == f"mcplive {version('mcplive')}\n"


def test_run_data_dir_applies_to_a_config_that_sets_none(tmp_path: Path) -> None:
    cfg = config(tmp_path / "conf")
    result = mcplive("run", str(cfg), "--data-dir", "here", "--duration", "0.5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "here" / "store.sqlite3").is_file()
    assert not (tmp_path / "conf" / "mcplive-data").exists()


def test_run_data_dir_with_a_config_that_sets_one_is_an_error(tmp_path: Path) -> None:
    cfg = config(tmp_path / "conf", head='[host]\ndata_dir = "mine"\n\n')
    for command in (["run", str(cfg)], ["rollback", "Ada", "--to", "m1", "--config", str(cfg)]):
        result = mcplive(*command, "--data-dir", "here", cwd=tmp_path)
        assert result.returncode == 2
        assert one_line(result) == (
            "mcplive: host.data_dir: the config sets it ('mine') and so does --data-dir "
            "('here'); give only one"
        )
    assert not (tmp_path / "here").exists() and not (tmp_path / "conf" / "mine").exists()


def test_check_names_a_missing_model_key(tmp_path: Path) -> None:
    cfg = config(tmp_path, model="anthropic:claude-sonnet-4-5")
    missing = mcplive("check", str(cfg), cwd=tmp_path, env=child_env(ANTHROPIC_API_KEY=None))
    assert missing.returncode == 1
    assert missing.stdout.splitlines() == [
        f"{cfg}: agents[Ada].model: anthropic:claude-sonnet-4-5 needs an API key; environment "
        "variable ANTHROPIC_API_KEY is not set"
    ]
    given = mcplive("check", str(cfg), cwd=tmp_path, env=child_env(ANTHROPIC_API_KEY="sk-x"))
    assert given.returncode == 0, given.stdout
    run = mcplive("run", str(cfg), cwd=tmp_path, env=child_env(ANTHROPIC_API_KEY=None))
    assert run.returncode == 2 and "ANTHROPIC_API_KEY is not set" in one_line(run)
