"""A server's connection on a fleet: leased to one host, which alone connects, ingests and stores;
an agent on another host is woken through PostgreSQL's ``NOTIFY`` after the commit, and its
reply reaches the server through the store's outbox, sent by the connection's holder. When the
holder leaves, another host takes the connection, and the lobby's agents go on.

Two hosts in one process on a real PostgreSQL, one websocket test lobby; order only, bounded
waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors.host import Host
from actors.trace import TraceEvent
from protocol.leases import SAFETY_S
from store.leases import LeaseTable
from tests.helpers import (
    agent_configs,
    config,
    incoming_answered,
    publish_received,
    ready,
    send_incoming,
    texts,
    ws_lobby,
)
from tests.integration.test_agent_leases import RunningHost
from tests.lobby.control import open_control_listener

pytestmark = pytest.mark.slow

RULES = {
    "Ada": '[[rules]]\nwhen = "ada (\\\\d+)"\nsay = "ada answers {1}"\n',
    "Grace": '[[rules]]\nwhen = "grace (\\\\d+)"\nsay = "grace answers {1}"\n',
}


def fleet_config(tmp_path: Path, host_id: str, dsn: str, url: str) -> dict[str, Any]:
    cfg = config(tmp_path / host_id, [{"id": "lobby", "url": url}], agent_configs(tmp_path, RULES))
    cfg["host"].update(host_id=host_id, store=dsn)
    return cfg


async def spread(hosts: list[Host]) -> None:
    """Step every host until each runs one agent and one host holds the lobby's connection."""
    for _ in range(20):
        for host in hosts:
            assert host.lease_keeper is not None
            await host.lease_keeper.step_now()
        if (
            all(len(h.ctx.agents) == 1 for h in hosts)
            and sum("lobby" in h.ctx.connections for h in hosts) == 1
        ):
            return
    raise AssertionError(
        {h.ctx.host_id: (sorted(h.ctx.agents), sorted(h.ctx.connections)) for h in hosts}
    )


@attrs.define
class TwoHosts:
    """A host ``a`` on one database and one websocket lobby, started and ready with it
    (``ctl``: the lobby's control of its session); :meth:`start_second` starts ``b``."""

    tmp_path: Path
    pg_dsn: str
    url: str
    nursery: trio.Nursery
    listener: Any
    ctl: Any
    first: RunningHost
    a: Host
    log: list[tuple[str, TraceEvent]]
    second: RunningHost | None = None

    async def start_second(self) -> Host:
        cfg = fleet_config(self.tmp_path, "host-b", self.pg_dsn, self.url)
        self.second = RunningHost(cfg, self.log)
        host: Host = await self.nursery.start(self.second.run)
        return host


@asynccontextmanager
async def two_hosts(tmp_path: Path, pg_dsn: str) -> AsyncIterator[TwoHosts]:
    log: list[tuple[str, TraceEvent]] = []
    async with open_control_listener() as listener, trio.open_nursery() as nursery:
        async with ws_lobby("--control-connect", listener.address) as url:
            first = RunningHost(fleet_config(tmp_path, "host-a", pg_dsn, url), log)
            a = await nursery.start(first.run)
            ctl = await listener.accept()
            await ready(ctl, a)
            fleet = TwoHosts(tmp_path, pg_dsn, url, nursery, listener, ctl, first, a, log)
            yield fleet
            if fleet.second is not None:
                await fleet.second.close()
            await first.close()
            nursery.cancel_scope.cancel()


async def test_an_agent_on_another_host_is_woken_and_speaks_through_the_outbox(
    tmp_path: Path, pg_dsn: str
) -> None:
    with trio.fail_after(120):
        async with two_hosts(tmp_path, pg_dsn) as fleet:
            a, ctl = fleet.a, fleet.ctl
            # the first host alone holds the lobby's connection and both agents
            assert a.lease_keeper is not None
            assert a.lease_keeper.connected == {"lobby": 1}
            assert sorted(a.ctx.agents) == ["Ada", "Grace"]
            b = await fleet.start_second()
            await spread([a, b])
            assert "lobby" in a.ctx.connections and "lobby" not in b.ctx.connections
            (remote,) = b.ctx.agents  # runs where the lobby is not connected
            (local,) = a.ctx.agents
            assert b.ctx.statuses.get("lobby") is None  # the second host never dialled
            with pytest.raises(KeyError, match="connected from another host"):
                await b.reconnect("lobby")

            # a line for the remote agent: stored by the holder, woken by a notice,
            # answered through the outbox
            mark = ctl.mark()
            send_incoming(ctl, "lobby:#general", "m1", f"{remote.lower()} 1")
            await ctl.wait_for(
                publish_received(f"{remote.lower()} answers 1"), "the remote reply", since=mark
            )
            # the lobby's echo of it is stored before the next line (the scripted agents
            # answer the newest line they read)
            while True:
                if any(f"{remote.lower()} answers 1" in t for t in texts(a.history(local))):
                    break
                await trio.sleep(0.05)
            # and the holder's own agent answers as on one host
            send_incoming(ctl, "lobby:#general", "m2", f"{local.lower()} 2")
            await ctl.wait_for(
                publish_received(f"{local.lower()} answers 2"), "the local reply", since=mark
            )
            assert b.ctx.connections == {}  # so the reply went through the outbox


async def test_the_connection_moves_when_its_holder_leaves(tmp_path: Path, pg_dsn: str) -> None:
    with trio.fail_after(120):
        async with two_hosts(tmp_path, pg_dsn) as fleet:
            b = await fleet.start_second()
            await spread([fleet.a, b])
            await fleet.first.close()  # a clean leave releases the connection and the agent
            assert b.lease_keeper is not None
            for _ in range(10):
                await b.lease_keeper.step_now()
                if "lobby" in b.ctx.connections and len(b.ctx.agents) == 2:
                    break
            assert b.lease_keeper.connected == {"lobby": 2}  # a new epoch
            assert sorted(b.ctx.agents) == ["Ada", "Grace"]
            ctl = await fleet.listener.accept()  # the second host's session
            await ready(ctl, b)
            mark = ctl.mark()
            send_incoming(ctl, "lobby:#general", "m3", "grace 3")
            await ctl.wait_for(publish_received("grace answers 3"), "the reply", since=mark)


async def test_an_agent_that_starts_late_answers_what_came_while_it_ran_nowhere(
    tmp_path: Path, pg_dsn: str
) -> None:
    """A wake sent while an agent runs on no host reaches no one; the host that then takes the
    agent wakes it with what it missed (a host that died held it here: a lease that is left to
    expire). That host does not hold the lobby's connection: it knows where a post lands from
    the channels the holder shared in the store, and the reply goes through the outbox."""
    ghost = LeaseTable(pg_dsn, lease_s=SAFETY_S + 1.0)
    try:
        assert "agent:Grace" in ghost.step("ghost", ["agent:Grace"]).taken
        with trio.fail_after(120):
            async with two_hosts(tmp_path, pg_dsn) as fleet:
                a, ctl = fleet.a, fleet.ctl
                assert sorted(a.ctx.agents) == ["Ada"]  # Grace's lease is the ghost's
                b = await fleet.start_second()
                assert b.ctx.agents == {} and b.ctx.connections == {}
                mark = ctl.mark()
                send_incoming(ctl, "lobby:#general", "m5", "grace 5")
                await ctl.wait_for(incoming_answered("m5"), "m5 stored", since=mark)
                assert a.lease_keeper is not None and b.lease_keeper is not None
                while "Grace" not in b.ctx.agents:  # the ghost's lease and beat run out
                    await a.lease_keeper.step_now()
                    await b.lease_keeper.step_now()
                    await trio.sleep(0.2)
                await ctl.wait_for(publish_received("grace answers 5"), "the late reply")
                assert b.ctx.connections == {}  # so the reply went through the outbox
    finally:
        ghost.close()
