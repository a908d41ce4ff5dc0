"""The fleet example (``examples/fleet``, shown in ``docs/guide/fleet.md``): its compose file runs
PostgreSQL, one lobby and three hosts sharing one store, and each host's config loads, naming the
store by its variable, the lobby by its url alone and the same six agents. Parsed and loaded
here; never run by the tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from actors.config import HostConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "examples" / "fleet"
HOSTS = ("host-a", "host-b", "host-c")
DSN = "postgresql://mcplive:secret@postgres:5432/mcplive"
AGENTS = ["Ada", "Grace", "Alan", "Barbara", "Edsger", "Frances"]


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((FLEET / "compose.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def config_path(service: dict[str, Any]) -> Path:
    """The host config a host service runs (``mcplive run /fleet/<file>``), in the source tree."""
    command = service["command"]
    assert command[0] == "run" and len(command) == 2, command
    mounted = Path(command[1])
    assert mounted.parent == Path("/fleet"), command
    assert "./:/fleet:ro" in service["volumes"]
    return FLEET / mounted.name


def load(path: Path, monkeypatch: pytest.MonkeyPatch) -> HostConfig:
    monkeypatch.setenv("MCPLIVE_STORE", DSN)
    monkeypatch.setenv("MCPLIVE_CONSOLE_TOKEN", "token")
    return load_config(path)


def test_the_compose_file_runs_postgresql_one_lobby_and_three_hosts_on_one_store() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "lobby", *HOSTS}
    postgres = services["postgres"]
    assert postgres["image"].startswith("postgres:")
    assert int(postgres["image"].split(":")[1]) >= 15
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    lobby = services["lobby"]
    assert lobby["entrypoint"][-1] == "actors.cli.lobby.server"
    assert lobby["command"] == ["--port", "8765", "--host", "lobby"]

    # one DSN variable, the same value in every host; one data volume and host id each
    stores = {services[h]["environment"]["MCPLIVE_STORE"] for h in HOSTS}
    assert len(stores) == 1 and stores.pop().endswith("@postgres:5432/mcplive")
    data = [v for h in HOSTS for v in services[h]["volumes"] if v.endswith(":/var/lib/mcplive")]
    assert len(set(data)) == len(HOSTS)
    ids = [load_config_id(config_path(services[h])) for h in HOSTS]
    assert ids == list(HOSTS)
    for h in HOSTS:
        depends = services[h]["depends_on"]
        assert depends["postgres"]["condition"] == "service_healthy"
        assert services[h]["build"]["args"]["EXTRAS"] == "[postgresql]"
        assert config_path(services[h]).name in " ".join(services[h]["healthcheck"]["test"])


def load_config_id(path: Path) -> str:
    with pytest.MonkeyPatch.context() as monkeypatch:
        host_id = load(path, monkeypatch).host_id
    assert host_id is not None
    return host_id


@pytest.mark.parametrize("host", HOSTS)
def test_each_host_config_names_the_store_the_lobby_and_six_agents(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load(FLEET / f"{host}.toml", monkeypatch)
    assert cfg.host_id == host
    assert cfg.store == DSN and cfg.store_env == "MCPLIVE_STORE"
    [lobby] = cfg.servers
    assert lobby.id == "lobby" and lobby.url == "ws://lobby:8765/"
    assert lobby.command is None  # the lobby runs once for the fleet, no host starts it
    assert [a.name for a in cfg.agents] == AGENTS
    for agent in cfg.agents:
        model = Path(agent.model.removeprefix("scripted:"))
        assert model.parent == ROOT / "examples" / "lobby" and model.is_file()


def test_the_host_configs_differ_in_their_host_id_alone() -> None:
    def rest(host: str) -> list[str]:
        lines = (FLEET / f"{host}.toml").read_text(encoding="utf-8").splitlines()
        return [line for line in lines if not line.startswith(("host_id =", f"# {host}:"))]

    assert rest("host-a") == rest("host-b") == rest("host-c")
