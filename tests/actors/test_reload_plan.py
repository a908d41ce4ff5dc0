"""``actors.reload.plan_reload``: which keys a reload takes and which need a restart (pure)."""

from __future__ import annotations

from pathlib import Path

import attrs
from hypothesis import given
from hypothesis import strategies as st

from actors.config import AgentConfig, HostConfig, ServerConfig
from actors.reload import AGENT_LIVE, SERVER_LIVE, SERVER_READ, plan_reload

masks = st.none() | st.lists(st.sampled_from(["tools", "channels.*", "pushEvents"]), max_size=2)
server_st = st.builds(
    ServerConfig,
    id=st.sampled_from(["lobby", "clock", "gallery"]),
    command=st.sampled_from([("python", "-m", "lobby"), ("lobby-server",)]),
    token=st.none() | st.just("tok-123456"),
    request_timeout_s=st.sampled_from([60.0, 30.0]),
    enabled_capabilities=masks.map(lambda m: None if m is None else tuple(m)),
    disabled_capabilities=st.lists(st.sampled_from(["tools", "pushEvents"]), max_size=2).map(tuple),
    enabled_feature_sets=masks.map(lambda m: None if m is None else tuple(m)),
    publish_undeclared=st.booleans(),
)
agent_st = st.builds(
    AgentConfig,
    name=st.sampled_from(["Ada", "Grace", "Bob"]),
    model=st.sampled_from(["scripted:/a.toml", "anthropic:claude"]),
    system_prompt=st.none() | st.sampled_from(["be brief", "be kind"]),
    gate=st.none() | st.sampled_from([Path("/g1.toml"), Path("/g2.toml")]),
    prose_mode=st.sampled_from(["locus", "hybrid"]),
    max_tokens=st.sampled_from([1024, 4096]),
    temperature=st.none() | st.sampled_from([0.2, 1.0]),
    base_url=st.none() | st.just("http://127.0.0.1:11434/v1"),
)


def unique(items: list, key: str) -> tuple:
    seen: dict = {}
    for item in items:
        seen.setdefault(getattr(item, key), item)
    return tuple(seen.values())


host_st = st.builds(
    HostConfig,
    data_dir=st.sampled_from([Path("/d1"), Path("/d2")]),
    servers=st.lists(server_st, max_size=3).map(lambda s: unique(s, "id")),
    agents=st.lists(agent_st, min_size=1, max_size=3).map(lambda a: unique(a, "name")),
    base_dir=st.just(Path("/")),
)


@given(host_st)
def test_the_same_config_changes_nothing(cfg: HostConfig) -> None:
    plan = plan_reload(cfg, cfg)
    assert plan.config == cfg
    assert plan.changed == () and plan.restart == () and plan.servers == ()
    assert plan.agents == cfg.agents  # every agent still re-reads its gate file


@given(host_st, host_st)
def test_only_live_keys_come_into_force(old: HostConfig, new: HostConfig) -> None:
    plan = plan_reload(old, new)
    got = plan.config
    # what runs stays: the same servers and agents, the same data_dir and models
    assert [s.id for s in got.servers] == [s.id for s in old.servers]
    assert [a.name for a in got.agents] == [a.name for a in old.agents]
    assert (got.data_dir, got.inference_model) == (old.data_dir, old.inference_model)
    new_servers = {s.id: s for s in new.servers}
    for before, after in zip(old.servers, got.servers, strict=True):
        source = new_servers.get(before.id, before)
        taken = (*SERVER_LIVE, *SERVER_READ)
        assert after == attrs.evolve(before, **{k: getattr(source, k) for k in taken})
    new_agents = {a.name: a for a in new.agents}
    for before, after in zip(old.agents, got.agents, strict=True):
        source = new_agents.get(before.name, before)
        assert after == attrs.evolve(before, **{k: getattr(source, k) for k in AGENT_LIVE})
    # the servers to reconfigure are exactly those whose masks changed
    assert {s.id for s in plan.servers} == {
        s.id
        for s, g in zip(old.servers, got.servers, strict=True)
        if any(getattr(s, k) != getattr(g, k) for k in SERVER_LIVE)
    }
    # a second reload of the same file has nothing live left to change
    again = plan_reload(got, new)
    assert again.changed == () and again.servers == ()
    assert again.restart == plan.restart


def _by_key(cfg: HostConfig) -> tuple:
    return (
        cfg.data_dir,
        cfg.inference_model,
        {s.id: s for s in cfg.servers},
        {a.name: a for a in cfg.agents},
    )


@given(host_st, host_st)
def test_every_difference_is_reported_once_as_changed_or_restart(
    old: HostConfig, new: HostConfig
) -> None:
    plan = plan_reload(old, new)
    assert len(set(plan.changed)) == len(plan.changed)
    assert len(set(plan.restart)) == len(plan.restart)
    assert not set(plan.changed) & set(plan.restart)
    # nothing reported exactly when nothing differs (the order of the tables aside)
    assert (not plan.changed and not plan.restart) == (_by_key(old) == _by_key(new))


def test_a_restart_list_names_keys_never_values() -> None:
    lobby = ServerConfig(id="lobby", command=("a",), token="tok-old-123456")
    old = HostConfig(
        data_dir=Path("/d"),
        servers=(lobby,),
        agents=(AgentConfig(name="Ada", model="scripted:/a"),),
        base_dir=Path("/"),
    )
    new = attrs.evolve(
        old,
        data_dir=Path("/e"),
        store="postgresql://ada:pw-secret-1@db/mcplive",
        servers=(
            attrs.evolve(lobby, token="tok-new-654321", disabled_capabilities=("tools",)),
            ServerConfig(id="clock", command=("c",)),
        ),
        agents=(
            AgentConfig(name="Ada", model="anthropic:x", system_prompt="hi"),
            AgentConfig(name="Bob", model="scripted:/b"),
        ),
    )
    plan = plan_reload(old, new)
    assert plan.changed == ("lobby.disabled_capabilities", "Ada.system_prompt")
    assert plan.restart == (
        "data_dir",
        "store",
        "server clock added",
        "lobby.token",
        "agent Bob added",
        "Ada.model",
    )
    assert "tok-" not in repr(plan.changed + plan.restart)
    assert "pw-secret" not in repr(plan.changed + plan.restart)
    assert plan.config.store is None  # the running store stays
    assert plan.config.servers[0].token == "tok-old-123456"  # the running token stays
    assert plan.config.servers[0].disabled_capabilities == ("tools",)


def test_publish_undeclared_is_taken_without_reconfiguring_the_server() -> None:
    lobby = ServerConfig(id="lobby", command=("a",))
    old = HostConfig(
        data_dir=Path("/d"),
        servers=(lobby,),
        agents=(AgentConfig(name="Ada", model="scripted:/a"),),
        base_dir=Path("/"),
    )
    new = attrs.evolve(old, servers=(attrs.evolve(lobby, publish_undeclared=True),))
    plan = plan_reload(old, new)
    assert plan.changed == ("lobby.publish_undeclared",) and plan.restart == ()
    assert plan.config.publish_undeclared("lobby") and plan.servers == ()
