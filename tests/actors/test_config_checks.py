"""Config checks an operator meets first: near-miss keys, numbers that are not finite, model
credentials, and where the data goes (``--data-dir``)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.config import ConfigErrors, data_dir_problem, load_config

SERVER_NUMBERS = (
    "request_timeout_s",
    "max_line_bytes",
    "eager_limit_bytes",
    "fetch_ceiling_bytes",
    "fetch_budget_bytes",
    "hook_timeout_s",
    "inference_requests_per_hour",
)


def scripted(tmp_path: Path) -> str:
    path = tmp_path / "quiet.toml"
    path.write_text("", encoding="utf-8")
    return f"scripted:{path}"


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load_config(raw)
    return info.value.problems


@pytest.mark.parametrize(
    ("raw", "line"),
    [
        ({"host": {"datadir": "x"}}, "host.datadir: unknown key; did you mean data_dir?"),
        ({"host": {"colour": "x"}}, "host.colour: unknown key; [host] takes "
         "budget_daily_tokens, budget_daily_usd, data_dir, host_id, inference_model, store, "
         "store_env, timezone, web and web_token_env"),
        ({"server": []}, "server: unknown key; did you mean servers?"),
        ({"servers": [{"id": "a", "command": ["x"], "request_timeout": 5}]},
         "servers[a].request_timeout: unknown key; did you mean request_timeout_s?"),
        ({"servers": [{"id": "a", "command": ["x"], "tokenenv": "T"}]},
         "servers[a].tokenenv: unknown key; did you mean token_env?"),
        ({"agents": [{"name": "Ada", "model": "scripted:x", "system-prompt": "hi"}]},
         "agents[Ada].system-prompt: unknown key; did you mean system_prompt?"),
        ({"agents": [{"name": "Ada", "modle": "scripted:x"}]},
         "agents[Ada].modle: unknown key; did you mean model?"),
        ({"agents": [{"name": "Ada", "model": "scripted:x", "colour": "red"}]},
         "agents[Ada].colour: unknown key; see the README for agent keys"),
    ],
)  # fmt: skip
def test_unknown_keys_suggest_the_nearest_known_one(raw: dict[str, Any], line: str) -> None:
    assert line in problems(raw)


@given(
    key=st.sampled_from(SERVER_NUMBERS),
    value=st.sampled_from([math.inf, -math.inf, math.nan])
    | st.floats(allow_nan=False).filter(lambda v: v <= 0),
)
def test_every_server_number_must_be_positive_and_finite(key: str, value: float) -> None:
    raw = {"servers": [{"id": "a", "command": ["x"], key: value}]}
    assert any(line.startswith(f"servers[a].{key}: must be a positive") for line in problems(raw))


@given(value=st.sampled_from([math.inf, -math.inf, math.nan]))
def test_context_tokens_must_be_finite(value: float) -> None:
    raw = {"agents": [{"name": "Ada", "model": "scripted:x", "context_tokens": value}]}
    assert "agents[Ada].context_tokens: must be a positive integer" in problems(raw)


# -- model credentials ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, ""])
def test_an_anthropic_model_without_its_key_is_a_problem_wherever_it_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_API_KEY", value)
    raw = {
        "host": {"inference_model": "anthropic:claude-a"},
        "servers": [
            {"id": "lobby", "command": ["x"], "inference_models": {"lobby.*": "anthropic:claude-b"}}
        ],
        "agents": [{"name": "Ada", "model": "anthropic:claude-c"}],
    }
    why = "needs an API key; environment variable ANTHROPIC_API_KEY is not set"
    assert problems(raw) == [
        f"host.inference_model: anthropic:claude-a {why}",
        f"servers[lobby].inference_models.lobby.*: anthropic:claude-b {why}",
        f"agents[Ada].model: anthropic:claude-c {why}",
    ]
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    cfg = load_config(raw)
    assert cfg.agents[0].model == "anthropic:claude-c"
    # a scripted model needs nothing
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert load_config({"agents": [{"name": "Ada", "model": scripted(tmp_path)}]})


# -- where the data goes ----------------------------------------------------------------------


def test_data_dir_from_the_command_line_applies_when_the_config_sets_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "conf"
    folder.mkdir()
    cfg = folder / "host.toml"
    cfg.write_text(f'[[agents]]\nname = "Ada"\nmodel = "{scripted(tmp_path)}"\n', encoding="utf-8")
    assert load_config(cfg).data_dir == folder / "mcplive-data"
    # relative to where the command runs, as a command-line path is
    assert load_config(cfg, data_dir=Path("elsewhere")).data_dir == tmp_path / "elsewhere"
    cfg.write_text('[host]\ndata_dir = "mine"\n' + cfg.read_text(), encoding="utf-8")
    with pytest.raises(ConfigErrors) as info:
        load_config(cfg, data_dir=Path("elsewhere"))
    assert info.value.problems == [
        "host.data_dir: the config sets it ('mine') and so does --data-dir ('elsewhere'); give "
        "only one"
    ]


def test_data_dir_problems(tmp_path: Path) -> None:
    assert data_dir_problem(tmp_path / "new" / "deeper") is None  # made when missing
    (tmp_path / "file").write_text("", encoding="utf-8")
    assert data_dir_problem(tmp_path / "file") == (
        f"data_dir {tmp_path / 'file'}: is a file, not a folder; give a folder (made when missing)"
    )
    assert data_dir_problem(tmp_path / "file" / "below") == (
        f"data_dir {tmp_path / 'file' / 'below'}: {tmp_path / 'file'} is a file, so the folder "
        "cannot be made there"
    )
    if os.geteuid() != 0:  # root may write anywhere; the CLI tests drop that right
        tmp_path.chmod(0o555)
        try:
            assert "is not writable by this user" in str(data_dir_problem(tmp_path / "x"))
        finally:
            tmp_path.chmod(0o755)
