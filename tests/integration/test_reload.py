"""``Host.reload``: a running host takes new masks, gates and prompts; reports what needs a
restart; keeps its config when the new one is invalid; resumes paused agents. Over the lobby as
a real stdio subprocess: real clock, generous deadlines, order-only assertions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors import Host
from actors.config import HostConfig
from actors.errors import ConfigError
from tests.fake_anthropic import FakeScript, HttpError, Reply, serve_fake_anthropic, text_block
from tests.helpers import (
    RecordingModel,
    answered,
    barrier,
    config,
    incoming_answered,
    install,
    received,
    running_lobby,
    scripted,
    send_incoming,
    wait_trace,
)

pytestmark = pytest.mark.slow


def with_server(cfg: HostConfig, **keys: Any) -> HostConfig:
    return attrs.evolve(cfg, servers=(attrs.evolve(cfg.servers[0], **keys), *cfg.servers[1:]))


def with_agent(cfg: HostConfig, **keys: Any) -> HostConfig:
    return attrs.evolve(cfg, agents=(attrs.evolve(cfg.agents[0], **keys), *cfg.agents[1:]))


async def test_a_mask_change_reaches_the_live_link_both_ways(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            running = lb.host.config
            assert "pushEvents" in lb.host.ctx.statuses["lobby"].grant
            report = await lb.host.reload(
                with_server(running, disabled_capabilities=("pushEvents",))
            )
            assert report["changed"] == ["lobby.disabled_capabilities"]
            assert report["restart"] == []
            assert "pushEvents" not in report["grants"]["lobby"]
            await barrier(lb.ctl)
            update = received(lb.ctl, "featureSets/update")[-1]["params"]
            assert "pushEvents" not in update["effectiveCapabilities"]
            assert "channels.incoming" in update["effectiveCapabilities"]
            assert "pushEvents" not in lb.host.ctx.statuses["lobby"].grant
            # in force: a push is refused as ungranted
            lb.ctl.send({"cmd": "push", "eventId": "e1", "text": "refused now"})
            refused = await lb.ctl.wait_for(answered("push/event", "eventId", "e1"), "refusal")
            assert refused["response"]["error"]["code"] == -32002
            # an operator's addition is granted at once (no enabled_capabilities needed)
            back = await lb.host.reload(running)
            assert "pushEvents" in back["grants"]["lobby"]
            lb.ctl.send({"cmd": "push", "eventId": "e2", "text": "welcome back"})
            taken = await lb.ctl.wait_for(answered("push/event", "eventId", "e2"), "accepted")
            assert taken["response"]["result"] == {"accepted": True}


async def test_a_gate_and_a_prompt_change_take_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RecordingModel()
    install(monkeypatch, model)
    always = tmp_path / "always.toml"
    always.write_text('default = "always"\n', encoding="utf-8")
    skip = tmp_path / "skip.toml"
    skip.write_text('default = "skip"\n', encoding="utf-8")
    ada = {"model": scripted(tmp_path, "ada", ""), "gate": str(always)}
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ada}) as lb:
            cfg = lb.host.config
            send_incoming(lb.ctl, "lobby:#general", "m-a", "first")
            await lb.ctl.wait_for(incoming_answered("m-a"), "m-a stored")
            await lb.host.run_until_idle()
            assert len(model.calls("Ada")) == 1
            assert "You are Ada" in model.calls("Ada")[0].system
            terse = with_agent(cfg, gate=skip, system_prompt="Be terse, Ada.")
            report = await lb.host.reload(terse)
            assert report["changed"] == ["Ada.system_prompt", "Ada.gate"]
            send_incoming(lb.ctl, "lobby:#general", "m-b", "skipped by the new gate")
            await lb.ctl.wait_for(incoming_answered("m-b"), "m-b stored")
            decision = await wait_trace(
                lb.stream, lambda e: e.kind == "gate-decision" and e.agent == "Ada", "a skip"
            )
            assert decision.data["wake"] is False
            await lb.host.run_until_idle()
            assert len(model.calls("Ada")) == 1
            # the same file changed on disk, its mtime kept: a reload re-reads it all the same
            stat = skip.stat()
            skip.write_text('default = "always"\n', encoding="utf-8")
            os.utime(skip, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            again = await lb.host.reload(terse)
            assert again["changed"] == ["Ada.gate (file)"]
            send_incoming(lb.ctl, "lobby:#general", "m-c", "heard again")
            await lb.ctl.wait_for(incoming_answered("m-c"), "m-c stored")
            await lb.host.run_until_idle()
            assert len(model.calls("Ada")) == 2
            assert model.calls("Ada")[1].system == "Be terse, Ada."
            # no gate any more: everything wakes her again
            skip.write_text('default = "skip"\n', encoding="utf-8")
            assert (await lb.host.reload(terse))["changed"] == ["Ada.gate (file)"]
            ungated = await lb.host.reload(with_agent(terse, gate=None))
            assert ungated["changed"] == ["Ada.gate"]
            send_incoming(lb.ctl, "lobby:#general", "m-d", "no gate")
            await lb.ctl.wait_for(incoming_answered("m-d"), "m-d stored")
            await lb.host.run_until_idle()
            assert len(model.calls("Ada")) == 3


async def test_what_needs_a_restart_is_reported_and_left_alone(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            running = lb.host.config
            new = with_server(running, command=("elsewhere",), token="tok-never-shown-1")
            new = attrs.evolve(
                new,
                agents=(
                    attrs.evolve(running.agents[0], prose_mode="explicit"),
                    attrs.evolve(running.agents[0], name="Bob"),
                ),
            )
            stream = lb.host.trace(kinds={"config-reloaded"})
            report = await lb.host.reload(new)
            assert report["changed"] == []
            assert report["restart"] == [
                "lobby.command",
                "lobby.token",
                "agent Bob added",
                "Ada.prose_mode",
            ]
            event = await stream.__anext__()
            assert event.data["restart"] == report["restart"]
            assert "tok-never-shown" not in repr(event)
            assert lb.host.config == running
            assert list(lb.host.ctx.agents) == ["Ada"]


async def test_an_invalid_config_keeps_the_running_one(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with running_lobby(tmp_path, {"Ada": ""}) as lb:
            running = lb.host.config
            stream = lb.host.trace(kinds={"reload-refused", "config-reloaded"})
            bad = {"agents": [{"name": "Ada", "model": "scripted:/nowhere.toml", "colour": 1}]}
            with pytest.raises(ConfigError):
                await lb.host.reload(bad)
            event = await stream.__anext__()
            assert event.kind == "reload-refused"
            assert "agents[Ada].colour: unknown key" in event.data["reason"]
            assert "\n" not in event.data["reason"]
            assert lb.host.config is running
            with pytest.raises(ConfigError, match="not opened from a config file"):
                await lb.host.reload()


async def test_a_reload_resumes_the_paused_agents_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ada's model refuses her credential (a 401 from the fake Messages API on loopback): she
    pauses. A reload resumes her, and only her: her waiting wake runs one turn."""
    script = FakeScript([HttpError(status=401, error_type="authentication_error", message="no")])
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_anthropic, script)
            monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url)
            monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
            ada = {"name": "Ada", "model": "anthropic:claude-test"}
            grace = {"name": "Grace", "model": scripted(tmp_path, "grace", "")}
            async with Host.open(config(tmp_path, [], [ada, grace])) as host:
                stream = host.trace()
                await host.post_local("Ada", "hello")
                await wait_trace(stream, lambda e: e.kind == "agent-paused", "the pause")
                await host.run_until_idle()
                assert host.ctx.agent_statuses["Ada"].paused
                script.add(Reply(blocks=[text_block("back again")]))
                report = await host.reload(host.config)
                assert report["resumed"] == ["Ada"]
                resumed = await wait_trace(stream, lambda e: e.kind == "agent-resumed", "resume")
                assert resumed.agent == "Ada"
                await wait_trace(stream, lambda e: e.kind == "turn-end", "Ada's turn")
                await host.run_until_idle()
                assert len(script.requests) == 2
                assert host.ctx.agent_statuses["Ada"].paused is None
            nursery.cancel_scope.cancel()
