"""Configuration: defaults (DESIGN section 6), one line per problem naming the key, all at once."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.config import ConfigErrors, load_config, load_gate
from actors.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lobby"


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The configs here name anthropic models; their credential is set (its absence is a
    problem of its own, tested in ``test_config_checks``)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")


def base() -> dict[str, Any]:
    return {
        "host": {"data_dir": "data"},
        "servers": [{"id": "lobby", "command": ["python", "-m", "lobby"]}],
        "agents": [{"name": "Ada", "model": "anthropic:claude-test"}],
    }


def problems_of(raw: Any) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load_config(raw)
    err = info.value
    assert isinstance(err, ConfigError)
    assert str(err) == "; ".join(err.problems)
    for line in err.problems:
        assert "\n" not in line
    return err.problems


# -- defaults ---------------------------------------------------------------------------------


def test_defaults_of_a_minimal_dict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config({"agents": [{"name": "Ada", "model": "anthropic:claude-test"}]})
    assert cfg.data_dir == (tmp_path / "mcplive-data").resolve()
    assert cfg.base_dir == tmp_path
    assert cfg.servers == ()
    (agent,) = cfg.agents
    assert agent.name == "Ada"
    assert agent.model == "anthropic:claude-test"
    assert agent.system_prompt is None
    assert agent.servers is None
    assert agent.hears("anything")
    assert agent.prose_mode == "locus"
    assert agent.gate is None


def test_server_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (server,) = load_config(base()).servers
    assert server.id == "lobby"
    assert server.command == ("python", "-m", "lobby")
    assert server.url is None
    assert dict(server.env) == {}
    assert server.token is None
    assert server.request_timeout_s == 60
    assert server.max_line_bytes == 4_194_304
    assert server.enabled_capabilities is None
    assert server.disabled_capabilities == ()
    assert server.enabled_feature_sets is None
    assert server.disabled_feature_sets == ()
    assert server.eager_limit_bytes == 262_144
    assert server.fetch_ceiling_bytes == 268_435_456
    assert server.fetch_budget_bytes == 1_073_741_824
    assert server.publish_undeclared is False
    assert server.cwd == tmp_path


def test_every_documented_key_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MCPLIVE_TEST_TOKEN", "s3cret")
    (tmp_path / "gate.toml").write_text("")
    raw = {
        "host": {"data_dir": "store"},
        "servers": [
            {
                "id": "chat.example",
                "url": "wss://chat.example:8443/mcpl?room=1",
                "token_env": "MCPLIVE_TEST_TOKEN",
                "request_timeout_s": 2.5,
                "max_line_bytes": 1024,
                "enabled_capabilities": ["a"],
                "disabled_capabilities": ["b"],
                "enabled_feature_sets": ["c.*"],
                "disabled_feature_sets": ["c.x"],
                "eager_limit_bytes": 1,
                "fetch_ceiling_bytes": 2,
                "fetch_budget_bytes": 3,
                "publish_undeclared": True,
            },
            {"id": "local", "command": ["srv"], "env": {"A": "1"}, "token": "s3cret-local"},
        ],
        "agents": [
            {
                "name": "Ada",
                "model": "anthropic:claude-test",
                "system_prompt": "Be brief.",
                "servers": ["local"],
                "prose_mode": "hybrid",
                "gate": "gate.toml",
                "context_tokens": 1000,
            }
        ],
    }
    monkeypatch.chdir(tmp_path)
    cfg = load_config(raw)
    remote, local = cfg.servers
    assert remote.url == "wss://chat.example:8443/mcpl?room=1"
    assert remote.command is None
    assert remote.token == "s3cret"
    assert remote.request_timeout_s == 2.5
    assert (remote.max_line_bytes, remote.eager_limit_bytes) == (1024, 1)
    assert (remote.fetch_ceiling_bytes, remote.fetch_budget_bytes) == (2, 3)
    assert remote.enabled_capabilities == ("a",)
    assert remote.disabled_capabilities == ("b",)
    assert remote.enabled_feature_sets == ("c.*",)
    assert remote.disabled_feature_sets == ("c.x",)
    assert remote.publish_undeclared is True
    assert cfg.publish_undeclared("chat.example") and not cfg.publish_undeclared("local")
    assert not cfg.publish_undeclared("nobody")
    assert dict(local.env) == {"A": "1"}
    assert local.token == "s3cret-local"
    assert "s3cret" not in repr(local)  # a credential is never shown
    assert "s3cret" not in repr(cfg)
    (agent,) = cfg.agents
    assert agent.system_prompt == "Be brief."
    assert agent.servers == ("local",)
    assert agent.hears("local")
    assert not agent.hears("chat.example")
    assert agent.prose_mode == "hybrid"
    assert agent.gate == tmp_path / "gate.toml"
    assert agent.context_tokens == 1000


@pytest.mark.parametrize("mode", ["locus", "explicit", "hybrid", "disabled"])
def test_every_prose_mode_is_accepted(mode: str):
    raw = base()
    raw["agents"][0]["prose_mode"] = mode
    assert load_config(raw).agents[0].prose_mode == mode


@pytest.mark.parametrize("url", ["ws://h", "wss://h:1", "ws://127.0.0.1:8765/path"])
def test_websocket_addresses_are_accepted(url: str):
    raw = base()
    raw["servers"][0] = {"id": "lobby", "url": url}
    assert load_config(raw).servers[0].url == url


# -- TOML files and relative paths ------------------------------------------------------------


def test_relative_paths_resolve_from_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    folder = tmp_path / "conf"
    (folder / "models").mkdir(parents=True)
    (folder / "models" / "ada.toml").write_text("")
    (folder / "gates").mkdir()
    (folder / "gates" / "ada.toml").write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    path = folder / "mcplive.toml"
    path.write_text(
        """
[host]
data_dir = "../data"

[[servers]]
id = "lobby"
command = ["python", "-m", "lobby"]

[[agents]]
name = "Ada"
model = "scripted:models/ada.toml"
gate = "gates/ada.toml"
"""
    )
    for source in (path, str(path)):
        cfg = load_config(source)
        assert cfg.base_dir == folder
        assert cfg.data_dir == tmp_path / "data"
        assert cfg.servers[0].cwd == folder
        assert cfg.agents[0].model == f"scripted:{folder / 'models' / 'ada.toml'}"
        assert cfg.agents[0].gate == folder / "gates" / "ada.toml"


def test_absolute_data_dir_is_kept(tmp_path: Path):
    raw = base()
    raw["host"]["data_dir"] = str(tmp_path / "abs")
    assert load_config(raw).data_dir == tmp_path / "abs"


def test_the_bundled_example_loads():
    cfg = load_config(EXAMPLES / "lobby.toml")
    assert [s.id for s in cfg.servers] == ["lobby"]
    assert [a.name for a in cfg.agents] == ["Ada", "Grace"]
    assert all(a.model.startswith(f"scripted:{EXAMPLES}") for a in cfg.agents)


def test_a_missing_file_is_one_line(tmp_path: Path):
    (line,) = problems_of(tmp_path / "nope.toml")
    assert "nope.toml" in line


def test_bad_toml_is_one_line(tmp_path: Path):
    path = tmp_path / "bad.toml"
    path.write_text('[host]\ndata_dir = "x\n')
    (line,) = problems_of(path)
    assert "bad.toml" in line
    assert "TOML" in line


# -- one problem, one line, naming the key ----------------------------------------------------


def server(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        raw["servers"][0].update(fields)
        for k, v in fields.items():
            if v is DELETE:
                del raw["servers"][0][k]

    return mutate


def agent(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        raw["agents"][0].update(fields)
        for k, v in fields.items():
            if v is DELETE:
                del raw["agents"][0][k]

    return mutate


def top(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        raw.update(fields)

    return mutate


def host(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        raw["host"].update(fields)

    return mutate


def twice(key: str) -> Callable[[dict[str, Any]], None]:
    def mutate(raw: dict[str, Any]) -> None:
        raw[key].append(dict(raw[key][0]))

    return mutate


DELETE = object()
URL_ONLY = {"command": DELETE, "url": "ws://h"}

CASES: list[tuple[str, Callable[[dict[str, Any]], None], tuple[str, ...]]] = [
    ("unknown top-level key", top(hosts={}), ("hosts",)),
    ("unknown host key", host(data_dri="x"), ("host.data_dri",)),
    ("host not a table", top(host="x"), ("host",)),
    ("empty data_dir", host(data_dir=""), ("host.data_dir",)),
    ("data_dir not a string", host(data_dir=5), ("host.data_dir",)),
    ("servers not an array of tables", top(servers={"id": "x"}), ("servers",)),
    ("servers holding a number", top(servers=[1]), ("servers",)),
    ("unknown server key", server(comand=["x"]), ("servers[lobby].comand",)),
    ("cwd is not a server key", server(cwd="/tmp"), ("servers[lobby].cwd",)),
    ("missing server id", server(id=DELETE), ("servers[0].id",)),
    ("server id with --", server(id="a--b"), ("servers[a--b].id",)),
    ("server id with a space", server(id="a b"), (".id",)),
    ("server id too long", server(id="a" * 65), (".id",)),
    ("neither command nor url", server(command=DELETE), ("servers[lobby]", "command", "url")),
    ("empty command", server(command=[]), ("servers[lobby].command",)),
    ("command as a string", server(command="python x"), ("servers[lobby].command",)),
    ("command with a number", server(command=["x", 1]), ("servers[lobby].command",)),
    ("http url", server(**URL_ONLY | {"url": "http://h"}), ("servers[lobby].url",)),
    ("url without a host", server(**URL_ONLY | {"url": "ws://"}), ("servers[lobby].url",)),
    ("url with a space", server(**URL_ONLY | {"url": "ws://h ost"}), ("servers[lobby].url",)),
    ("url not a string", server(**URL_ONLY | {"url": 5}), ("servers[lobby].url",)),
    ("env with a number", server(env={"A": 1}), ("servers[lobby].env",)),
    ("env not a table", server(env="A=1"), ("servers[lobby].env",)),
    ("token not a string", server(token=5), ("servers[lobby].token",)),
    ("token_env not a string", server(token_env=5), ("servers[lobby].token_env",)),
    (
        "token_env unset",
        server(token_env="MCPLIVE_TEST_UNSET"),
        ("servers[lobby].token_env", "MCPLIVE_TEST_UNSET"),
    ),
    ("zero timeout", server(request_timeout_s=0), ("servers[lobby].request_timeout_s",)),
    ("negative timeout", server(request_timeout_s=-1), ("servers[lobby].request_timeout_s",)),
    ("timeout as a string", server(request_timeout_s="60"), ("servers[lobby].request_timeout_s",)),
    ("timeout as a bool", server(request_timeout_s=True), ("servers[lobby].request_timeout_s",)),
    ("nan timeout", server(request_timeout_s=math.nan), ("servers[lobby].request_timeout_s",)),
    ("fractional max_line_bytes", server(max_line_bytes=1.5), ("servers[lobby].max_line_bytes",)),
    ("zero eager_limit_bytes", server(eager_limit_bytes=0), ("servers[lobby].eager_limit_bytes",)),
    ("negative ceiling", server(fetch_ceiling_bytes=-1), ("servers[lobby].fetch_ceiling_bytes",)),
    ("budget as a string", server(fetch_budget_bytes="1"), ("servers[lobby].fetch_budget_bytes",)),
    ("capabilities as a string", server(enabled_capabilities="x"), ("enabled_capabilities",)),
    ("capabilities with a number", server(disabled_capabilities=[1]), ("disabled_capabilities",)),
    ("feature sets as a table", server(enabled_feature_sets={}), ("enabled_feature_sets",)),
    ("feature sets as a string", server(disabled_feature_sets="a"), ("disabled_feature_sets",)),
    ("publish_undeclared a string", server(publish_undeclared="yes"), ("publish_undeclared",)),
    ("publish_undeclared a number", server(publish_undeclared=1), ("publish_undeclared",)),
    ("duplicate server ids", twice("servers"), ("servers.id", "'lobby'")),
    ("agents not an array of tables", top(agents="Ada"), ("agents",)),
    ("no agents", top(agents=[]), ("agents",)),
    ("missing agent name", agent(name=DELETE), ("agents[0].name",)),
    ("agent name with a space", agent(name="A da"), (".name",)),
    ("unknown agent key", agent(modle="x"), ("agents[Ada].modle",)),
    ("missing model", agent(model=DELETE), ("agents[Ada].model",)),
    ("unknown provider", agent(model="openai:gpt"), ("agents[Ada].model",)),
    ("model without a name", agent(model="anthropic:"), ("agents[Ada].model",)),
    ("missing scripted file", agent(model="scripted:nope.toml"), ("agents[Ada].model", "nope")),
    ("system_prompt not a string", agent(system_prompt=5), ("agents[Ada].system_prompt",)),
    ("servers as a string", agent(servers="lobby"), ("agents[Ada].servers",)),
    ("unknown server", agent(servers=["nope"]), ("agents[Ada].servers", "'nope'")),
    ("unknown prose mode", agent(prose_mode="loud"), ("agents[Ada].prose_mode",)),
    ("gate not a string", agent(gate=5), ("agents[Ada].gate",)),
    ("zero context_tokens", agent(context_tokens=0), ("agents[Ada].context_tokens",)),
    ("zero budget", agent(budget_daily_tokens=0), ("agents[Ada].budget_daily_tokens",)),
    ("budget as text", agent(budget_daily_tokens="2k"), ("agents[Ada].budget_daily_tokens",)),
    ("zero cost budget", agent(budget_daily_usd=0), ("agents[Ada].budget_daily_usd",)),
    ("cost budget as text", agent(budget_daily_usd="$5"), ("agents[Ada].budget_daily_usd",)),
    ("duplicate agent names", twice("agents"), ("agents.name", "'Ada'")),
]


@pytest.mark.parametrize(("mutate", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_problem_is_one_line_naming_the_key(
    mutate: Callable[[dict[str, Any]], None],
    expected: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MCPLIVE_TEST_UNSET", raising=False)
    raw = base()
    load_config(raw)  # the base is valid
    mutate(raw)
    (line,) = problems_of(raw)
    for part in expected:
        assert part in line


def test_token_env_reads_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MCPLIVE_TEST_TOKEN", "from-env")
    raw = base()
    raw["servers"][0]["token_env"] = "MCPLIVE_TEST_TOKEN"
    assert load_config(raw).servers[0].token == "from-env"


def test_all_problems_are_reported_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MCPLIVE_TEST_UNSET", raising=False)
    raw = {
        "extra": 1,
        "host": {"data_dir": 3},
        "servers": [
            {"id": "lobby"},  # neither command nor url
            {"command": ["y"], "colour": "red"},  # no id, and an unknown key
            {"id": "lobby", "url": "http://h", "token_env": "MCPLIVE_TEST_UNSET"},
        ],
        "agents": [
            {"model": "anthropic:x", "prose_mode": "loud"},  # no name, and a bad mode
            {"name": "Ada", "servers": ["nope"], "size": 1},  # no model
        ],
    }
    problems = problems_of(raw)
    expected = [
        "extra",
        "host.data_dir",
        "servers[lobby]: set command",
        "servers[1].id",
        "servers[1].colour",
        "servers[lobby].url",
        "servers[lobby].token_env",
        "servers.id",
        "agents[0].name",
        "agents[0].prose_mode",
        "agents[Ada].model",
        "agents[Ada].size",
        "agents[Ada].servers",
    ]
    for key in expected:
        assert any(key in line for line in problems), key
    assert len(problems) == len(expected)


# -- numbers: a property ----------------------------------------------------------------------

INTEGER_KEYS = ("max_line_bytes", "eager_limit_bytes", "fetch_ceiling_bytes", "fetch_budget_bytes")
numbers = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_infinity=False),
    st.booleans(),
    st.text(max_size=3),
)


AGENT_NUMBERS = ("context_tokens", "budget_daily_tokens")


@given(st.sampled_from((*INTEGER_KEYS, "request_timeout_s", *AGENT_NUMBERS)), numbers)
def test_a_number_is_taken_exactly_when_it_follows_the_rule(key: str, value: Any):
    integer = key != "request_timeout_s"
    raw = base()
    (raw["agents"] if key in AGENT_NUMBERS else raw["servers"])[0][key] = value
    good = (
        not isinstance(value, bool | str)
        and (isinstance(value, int) or not integer)
        and not math.isnan(value)
        and value > 0
    )
    if good:
        cfg = load_config(raw)
        taken = getattr(cfg.agents[0] if key in AGENT_NUMBERS else cfg.servers[0], key)
        assert taken == value
    else:
        (line,) = problems_of(raw)
        assert f".{key}:" in line


def test_a_server_url_may_be_an_mcpl_uri_and_dials_its_resolved_transport() -> None:
    cfg = load_config(
        {
            "servers": [
                {"id": "a", "url": "mcpl://chat.example:8443/v1/mcpl"},
                {"id": "b", "url": "ws://127.0.0.1:9000/x"},
            ],
            "agents": [{"name": "Ada", "model": "anthropic:m"}],
        }
    )
    a, b = cfg.servers
    assert a.url == "mcpl://chat.example:8443/v1/mcpl"  # kept as configured
    assert a.endpoint == "wss://chat.example:8443/v1/mcpl"
    assert b.endpoint == "ws://127.0.0.1:9000/x"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("mcpl://h/a/../b", "dot_segment"),
        ("mcpl://user:pw@h/x", "userinfo"),
        ("mcpl://h/x#frag", "fragment"),
        ("http://h/x", "unsupported_scheme"),
    ],
)
def test_a_bad_server_url_is_one_line_naming_the_reason(url: str, reason: str) -> None:
    with pytest.raises(ConfigErrors) as caught:
        load_config(
            {
                "servers": [{"id": "a", "url": url}],
                "agents": [{"name": "Ada", "model": "anthropic:m"}],
            }
        )
    (line,) = [p for p in caught.value.problems if "url" in p]
    assert line.startswith("servers[a].url: must be an mcpl://, wss:// or ws:// address")
    assert reason in line


def test_command_and_url_together_name_a_websocket_server_the_host_starts(tmp_path: Path) -> None:
    cfg = load_config(
        {
            "servers": [{"id": "lobby", "command": ["python", "-m", "x"], "url": "ws://h:1/m"}],
            "agents": [{"name": "Ada", "model": "anthropic:claude-test"}],
        }
    )
    (server,) = cfg.servers
    assert server.command == ("python", "-m", "x") and server.endpoint == "ws://h:1/m"


def test_the_documented_gate_example_loads_as_a_gate_file(tmp_path: Path):
    page = Path(__file__).resolve().parents[2] / "docs" / "guide" / "gate.md"
    section = page.read_text(encoding="utf-8").split("## The gate file", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "gate.toml"
    path.write_text(example, encoding="utf-8")
    gate = load_gate(path)
    assert [p.name for p in gate.policies] == ["clock", "busy-channel"]


def test_a_broken_gate_file_is_one_problem_naming_the_agent(tmp_path: Path):
    (tmp_path / "gate.toml").write_text('[[policies]]\nname = "x"\nbehavior = "sometimes"\n')
    (tmp_path / "ada.toml").write_text("")
    path = tmp_path / "mcplive.toml"
    path.write_text(
        '[[servers]]\nid = "lobby"\ncommand = ["x"]\n\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:ada.toml"\ngate = "gate.toml"\n'
    )
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert problem.startswith("agents[Ada].gate:") and "behavior" in problem
    assert "\n" not in problem
