"""Per-agent model settings: the provider, its endpoint and credential, ``max_tokens`` and
``temperature`` — checked by the config (and so by ``mcplive check``), turned into models by the
provider factory, and sent with each request."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.config import ConfigErrors, host_secrets, load_config
from actors.models.anthropic import AnthropicModel
from actors.models.openai import DEFAULT_BASE_URL, NO_KEY, OpenAIModel
from actors.models.providers import make_model, model_from_spec
from tests.cli_helpers import child_env, mcplive


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-anthropic")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


def agent(**keys: Any) -> dict[str, Any]:
    return {"agents": [{"name": "Ada", "model": "openai:gpt-test", **keys}]}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load_config(raw)
    return info.value.problems


def test_defaults() -> None:
    [ada] = load_config(agent()).agents
    assert (ada.max_tokens, ada.temperature, ada.base_url, ada.api_key_env) == (
        1024,
        None,
        None,
        None,
    )


def test_settings_are_read() -> None:
    raw = agent(max_tokens=4096, temperature=1.5, base_url="http://127.0.0.1:11434/v1")
    [ada] = load_config(raw).agents
    assert (ada.max_tokens, ada.temperature, ada.base_url) == (
        4096,
        1.5,
        "http://127.0.0.1:11434/v1",
    )
    assert isinstance(ada.temperature, float)
    [whole] = load_config(agent(temperature=1)).agents
    assert whole.temperature == 1.0 and isinstance(whole.temperature, float)


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=1_000_001), st.booleans()))
def test_max_tokens_out_of_range(value: int) -> None:
    assert problems(agent(max_tokens=value)) == [
        "agents[Ada].max_tokens: must be a whole number from 1 to 1,000,000"
    ]


@pytest.mark.parametrize("value", [1.5, "100", math.inf])
def test_max_tokens_must_be_whole(value: Any) -> None:
    assert problems(agent(max_tokens=value)) == [
        "agents[Ada].max_tokens: must be a whole number from 1 to 1,000,000"
    ]


@given(
    st.one_of(
        st.floats(max_value=-0.001),
        st.floats(min_value=2.001),
        st.just(math.nan),
        st.booleans(),
        st.just("0.5"),
    )
)
def test_temperature_out_of_range(value: Any) -> None:
    assert problems(agent(temperature=value)) == [
        "agents[Ada].temperature: must be a number from 0 to 2"
    ]


@pytest.mark.parametrize("value", ["no", 0, 1, None.__class__.__name__])
def test_images_is_true_or_false(value: Any) -> None:
    assert problems(agent(images=value)) == ["agents[Ada].images: must be true or false"]
    assert load_config(agent()).agents[0].images is True
    assert load_config(agent(images=False)).agents[0].images is False


def test_an_anthropic_temperature_stops_at_one() -> None:
    raw = {"agents": [{"name": "Ada", "model": "anthropic:claude-test", "temperature": 1.2}]}
    assert problems(raw) == [
        "agents[Ada].temperature: must be a number from 0 to 1 for anthropic: models"
    ]
    raw["agents"][0]["temperature"] = 1.0
    assert load_config(raw).agents[0].temperature == 1.0


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        ({"base_url": "ftp://x"}, "agents[Ada].base_url: must be an http:// or https:// address"),
        ({"base_url": "localhost:11434"}, "agents[Ada].base_url: must be an http:// or https://"),
        ({"base_url": 5}, "agents[Ada].base_url: must be an http:// or https:// address"),
        ({"api_key_env": "MY KEY"}, "agents[Ada].api_key_env: must be the name of an environment"),
        ({"api_key_env": "NOT_SET_ANYWHERE"}, "agents[Ada].model: openai:gpt-test needs an API key;"
         " environment variable NOT_SET_ANYWHERE is not set"),
    ],
)  # fmt: skip
def test_endpoint_problems(keys: dict[str, Any], line: str) -> None:
    assert any(p.startswith(line) for p in problems(agent(**keys)))


def test_a_scripted_model_takes_no_endpoint(tmp_path: Path) -> None:
    rules = tmp_path / "r.toml"
    rules.write_text("", encoding="utf-8")
    raw = {
        "agents": [
            {"name": "Ada", "model": f"scripted:{rules}", "base_url": "http://x", "max_tokens": 9}
        ]
    }
    assert problems(raw) == ["agents[Ada].base_url: a scripted model calls no provider; remove it"]


def test_a_configured_endpoint_needs_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    assert problems(agent()) == [
        "agents[Ada].model: openai:gpt-test needs an API key; environment variable "
        "OPENAI_API_KEY is not set"
    ]
    local = load_config(agent(base_url="http://127.0.0.1:11434/v1"))
    model = make_model(local.agents[0])
    assert isinstance(model, OpenAIModel)
    assert model.base_url == "http://127.0.0.1:11434/v1"
    assert model.credential.startswith("none is configured")
    claude = {
        "agents": [{"name": "Ada", "model": "anthropic:c", "base_url": "https://proxy.example"}]
    }
    assert isinstance(make_model(load_config(claude).agents[0]), AnthropicModel)


@pytest.mark.parametrize(
    ("model", "base_url", "variable"),
    [
        ("anthropic:claude", "https://api.anthropic.com", "ANTHROPIC_API_KEY"),
        ("anthropic:claude", "https://API.anthropic.com/", "ANTHROPIC_API_KEY"),
        ("openai:gpt-test", "https://api.openai.com/v1", "OPENAI_API_KEY"),
        ("openai:gpt-test", "https://api.anthropic.com/v1", "ANTHROPIC_API_KEY"),
    ],
)
def test_a_providers_own_endpoint_without_a_key_variable_is_a_problem(
    model: str, base_url: str, variable: str
) -> None:
    """With a ``base_url`` and no ``api_key_env`` no key is sent: to a provider's public
    endpoint that can only fail, so it is refused (by ``check`` and ``run``) with the fix."""
    raw = {"agents": [{"name": "Ada", "model": model, "base_url": base_url}]}
    [line] = problems(raw)
    assert line.startswith(f"agents[Ada].base_url: {base_url} is ")
    assert "no key is sent" in line and f"the key in {variable}" in line
    raw["agents"][0]["api_key_env"] = variable
    assert load_config(raw).agents[0].api_key_env == variable


def test_the_factory_follows_the_credential_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    default = model_from_spec("openai:gpt-test")
    assert isinstance(default, OpenAIModel)
    assert (default.base_url, default.credential) == (DEFAULT_BASE_URL, "OPENAI_API_KEY")
    named = model_from_spec("openai:m", base_url="https://openrouter.ai/api/v1", api_key_env="OR")
    assert isinstance(named, OpenAIModel)
    assert (named.base_url, named.credential) == ("https://openrouter.ai/api/v1", "OR")
    # the environment may move the default endpoint; its key goes with it
    monkeypatch.setenv("OPENAI_BASE_URL", "http://gateway.internal/v1")
    moved = model_from_spec("openai:gpt-test")
    assert isinstance(moved, OpenAIModel)
    assert (moved.base_url, moved.credential) == ("http://gateway.internal/v1", "OPENAI_API_KEY")


def test_inference_routes_accept_openai() -> None:
    raw = {
        "host": {"inference_model": "openai:gpt-mini"},
        "servers": [
            {"id": "lobby", "command": ["x"], "inference_models": {"lobby.*": "openai:gpt-big"}}
        ],
        **agent(),
    }
    cfg = load_config(raw)
    assert cfg.inference_model == "openai:gpt-mini"
    assert cfg.servers[0].inference_models == {"lobby.*": "openai:gpt-big"}
    assert problems({**raw, "host": {"inference_model": "gpt:x"}}) == [
        "host.inference_model: must be 'scripted:PATH', 'anthropic:MODEL' or 'openai:MODEL'"
    ]


def test_check_reports_the_settings_problems_one_line_each(tmp_path: Path) -> None:
    cfg = tmp_path / "mcplive.toml"
    cfg.write_text(
        '[[agents]]\nname = "Ada"\nmodel = "openai:gpt-test"\nmax_tokens = 0\n'
        'temperature = 3\nbase_url = "ollama"\n\n'
        '[[agents]]\nname = "Bo"\nmodel = "openai:llama3"\nbase_url = "http://127.0.0.1:1/v1"\n',
        encoding="utf-8",
    )
    env = child_env(OPENAI_API_KEY=None)
    result = mcplive("check", str(cfg), cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{cfg}: agents[Ada].base_url: must be an http:// or https:// address",
        f"{cfg}: agents[Ada].max_tokens: must be a whole number from 1 to 1,000,000",
        f"{cfg}: agents[Ada].temperature: must be a number from 0 to 2",
    ]
    cfg.write_text(
        '[[agents]]\nname = "Bo"\nmodel = "openai:llama3"\nbase_url = "http://127.0.0.1:1/v1"\n'
        "max_tokens = 2048\ntemperature = 0.2\n",
        encoding="utf-8",
    )
    ok = mcplive("check", str(cfg), cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "agent Bo: openai:llama3 at http://127.0.0.1:1/v1; hears all servers" in ok.stdout


def test_check_says_which_key_each_agent_sends(tmp_path: Path) -> None:
    (tmp_path / "quiet.toml").write_text("", encoding="utf-8")
    cfg = tmp_path / "mcplive.toml"
    cfg.write_text(
        '[[agents]]\nname = "Ada"\nmodel = "anthropic:claude"\nsummary_model = "openai:mini"\n'
        '[[agents]]\nname = "Bo"\nmodel = "openai:llama3"\nbase_url = "http://127.0.0.1:1/v1"\n'
        '[[agents]]\nname = "Cy"\nmodel = "openai:m"\nbase_url = "https://openrouter.ai/api/v1"\n'
        'api_key_env = "ROUTER_KEY"\n'
        '[[agents]]\nname = "Di"\nmodel = "scripted:quiet.toml"\n',
        encoding="utf-8",
    )
    env = child_env(OPENAI_API_KEY="sk-o", ANTHROPIC_API_KEY="sk-a", ROUTER_KEY="sk-r")
    ok = mcplive("check", str(cfg), cwd=tmp_path, env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    keys = [line for line in ok.stdout.splitlines() if " sends " in line]
    assert keys == [
        "  agent Ada: sends the API key in $ANTHROPIC_API_KEY to anthropic's own endpoint; its "
        "summary model sends the API key in $OPENAI_API_KEY",
        "  agent Bo: sends no API key to http://127.0.0.1:1/v1 (no api_key_env)",
        "  agent Cy: sends the API key in $ROUTER_KEY to https://openrouter.ai/api/v1",
        "  agent Di: sends no API key (its scripted model calls no provider)",
    ]
    cfg.write_text(
        '[[agents]]\nname = "Ada"\nmodel = "anthropic:claude"\n'
        'base_url = "https://api.anthropic.com"\n',
        encoding="utf-8",
    )
    refused = mcplive("check", str(cfg), cwd=tmp_path, env=env)
    assert refused.returncode == 1
    [line] = refused.stdout.splitlines()
    assert line.startswith(f"{cfg}: agents[Ada].base_url: https://api.anthropic.com is anthropic's")


def test_the_documented_provider_examples_load(monkeypatch: pytest.MonkeyPatch) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "guide" / "models.md"
    section = page.read_text(encoding="utf-8").split("## Choosing each agent's model", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or")
    cfg = load_config(tomllib.loads(example))
    models = [make_model(a) for a in cfg.agents]
    assert all(isinstance(m, OpenAIModel) for m in models)
    assert [(m.base_url, m.credential) for m in models if isinstance(m, OpenAIModel)] == [
        (DEFAULT_BASE_URL, "OPENAI_API_KEY"),
        ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
        ("http://127.0.0.1:11434/v1", NO_KEY),
    ]
    # the local one needs no key at all
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENROUTER_API_KEY")
    assert [p.split(":")[0] for p in problems(tomllib.loads(example))] == [
        "agents[Ada].model",
        "agents[Bea].model",
    ]


def test_model_keys_are_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_KEY", "sk-router-secret")
    cfg = load_config(agent(base_url="https://openrouter.ai/api/v1", api_key_env="ROUTER_KEY"))
    assert {"sk-openai", "sk-router-secret"} <= set(host_secrets(cfg))
