"""A fleet of three ``mcplive run`` hosts on one PostgreSQL database (``tests/fleet.py``), all
dialing one websocket test lobby: the agents are spread over the hosts, one host holds the lobby's
connection and hears for all, agents on different hosts hear each other; a ``kill -9`` of the
connection's holder in a burst of 2,000 messages loses and duplicates none of them and moves the
connection and the agents within bounds; no agent's turn ever runs on two hosts at once; and a
host paused past its lease, woken with a model answer in hand, neither stores nor publishes it.

Real PostgreSQL (a fresh database per test), real processes, loopback sockets, the real clock.
Waits are bounded and wake on events (the lease table is read every ``POLL_S``); the one timing
assertions are the stated bounds of a move (generous against a loaded machine), and the times
measured are printed (``pytest -s``)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.leases import LEASE_S, RENEW_S
from store.leases import Fleet
from tests.fake_openai import FakeScript, Held, Reply, serve_fake_openai
from tests.fleet import (
    GENERAL,
    SERVER_ID,
    FleetRun,
    LobbySessions,
    Session,
    Turn,
    agents_by_host,
    describe_leases,
    epochs_going_back,
    fleet_run,
    held,
    holder_of,
    lobby_sessions,
    overlapping_turns,
    scripted_agent,
    stored_messages,
    turns,
)

pytestmark = pytest.mark.slow

AGENTS = ("Ada", "Grace", "Linus", "Barbara", "Edsger", "Margaret")
HOSTS = ("host-a", "host-b", "host-c")
SERVER = f"server:{SERVER_ID}"
#: How long the connection may take to be held and ready on another host after its holder is
#: killed: the lease, a renewal interval and the link's reconnect backoff, with room for load.
CONNECTION_MOVE_S = 40.0
assert CONNECTION_MOVE_S >= LEASE_S + RENEW_S
#: How long a killed host's agents may take to run elsewhere (15 s is the aim; room for load).
AGENTS_MOVE_S = 20.0
BURST = 2_000
KILL_AFTER = 300


def agent_entries(folder: Path, names: Sequence[str]) -> list[dict[str, Any]]:
    """Scripted agents woken only by a message that names them (the ``community`` gate).
    ``NAME: relay-K ping-X`` makes NAME say ``OTHER: relay ping-X`` to the agent ``AGENTS[K]``
    (the request names no other agent, so only NAME's reply can wake OTHER); any other
    ``NAME: … ping-X`` makes NAME say ``name-pong ping-X`` (naming no agent)."""
    folder.mkdir(parents=True, exist_ok=True)
    return [
        scripted_agent(
            folder,
            name,
            [
                *(
                    (rf"^{name}: relay-{k} (ping-\S+)$", f"{other}: relay {{1}}")
                    for k, other in enumerate(AGENTS)
                    if other != name
                ),
                (rf"^{name}: (?:.* )?(ping-\S+)$", f"{name.lower()}-pong {{1}}"),
            ],
            gate="community",
        )
        for name in names
    ]


def spread_over(fleet: Fleet, hosts: Sequence[str], agents: Sequence[str]) -> bool:
    """Every agent is held, by ``hosts`` only, evenly."""
    leases = held(fleet)
    by_host = agents_by_host(fleet)
    most = -(-len(agents) // len(hosts))
    return (
        all(f"agent:{a}" in leases for a in agents)
        and set(by_host) <= set(hosts)
        and all(len(by_host.get(h, [])) in (most, len(agents) // len(hosts)) for h in hosts)
        and sum(map(len, by_host.values())) == len(agents)
    )


async def settled(run: FleetRun, hosts: Sequence[str], agents: Sequence[str]) -> Fleet:
    """The lease table once the agents are spread over ``hosts``, one of them holds the lobby's
    connection, and every host's trace agrees (each agent runs, per its ``agent-lease`` events,
    on the host holding it)."""
    await run.until_fleet(
        lambda f: spread_over(f, hosts, agents), f"agents spread over {list(hosts)}"
    )
    fleet = await run.until_fleet(
        lambda f: spread_over(f, hosts, agents) and holder_of(f, SERVER) in hosts,
        f"lease of {SERVER} (the lobby's connection) held by one of {list(hosts)}",
    )

    def traces_agree() -> bool:
        by_host = agents_by_host(fleet)
        running = run.running()
        return all(sorted(running.get(h, {})) == sorted(by_host.get(h, [])) for h in hosts)

    await run.until(traces_agree, f"traces agreeing with {describe_leases(fleet)}")
    again = await run.fleet()
    assert agents_by_host(again) == agents_by_host(fleet), "the agents moved once spread"
    return fleet


def answered(lobby: LobbySessions, text: str) -> bool:
    return (GENERAL, text) in lobby.publishes()


async def every_answer(lobby: LobbySessions, run: FleetRun, texts: list[str], what: str) -> None:
    """Until the lobby received a publish of each of ``texts``; the missing ones are named."""
    try:
        await lobby.until(lambda: all(answered(lobby, t) for t in texts), what)
    except AssertionError as exc:
        missing = [t for t in texts if not answered(lobby, t)]
        raise AssertionError(
            f"{exc}\nmissing: {missing}\nlast published: {lobby.publishes()[-8:]}\n"
            f"hosts:\n{run.describe()}"
        ) from None


async def answer_heard(lobby: LobbySessions, run: FleetRun, pong: str, what: str) -> None:
    """Until the lobby received ``pong`` and the host holding its connection stored the
    lobby's echo of it: the next line then comes after it in every agent's history (a scripted
    agent answers the newest line it reads, so an echo stored after the next line would hide
    that line from it)."""
    await every_answer(lobby, run, [pong], what)

    def echoed() -> bool:
        return any(m.role == "user" and pong.casefold() in m.text for m in stored_messages(run.dsn))

    await run.until(echoed, f"the echo of {pong!r} stored")


async def barrier(lobby: LobbySessions, session: Session) -> None:
    """Until ``session`` has reported every event it had before this call (its events keep
    their order: once the answer to a ping sent now is in, so is everything before it)."""
    ping = f"fleet-barrier-{time.monotonic_ns()}"
    session.ctl.send({"cmd": "ping", "id": ping})

    def ponged() -> bool:
        return any(e.get("event") == "pong" and e.get("id") == ping for e in session.events)

    await lobby.until(ponged, "the lobby's pong")


def check_turns(run: FleetRun) -> dict[str, list[Turn]]:
    """No agent's turns on two hosts overlap, and its epochs only grow across hosts."""
    by_agent = turns(run)
    overlaps = overlapping_turns(by_agent)
    assert not overlaps, "turns of one agent ran on two hosts at once:\n" + "\n".join(
        f"  {a} / {b}" for a, b in overlaps[:10]
    )
    back = epochs_going_back(by_agent)
    assert not back, "lease epochs did not grow across hosts:\n" + "\n".join(
        f"  {a} then {b}" for a, b in back[:10]
    )
    return by_agent


async def test_three_hosts_spread_six_agents_over_one_connection_and_hear_each_other(
    tmp_path: Path, pg_dsn: str
) -> None:
    with trio.fail_after(240):
        async with lobby_sessions() as lobby, fleet_run(tmp_path, pg_dsn, lobby) as run:
            agents = agent_entries(tmp_path / "models", AGENTS)
            for host_id in HOSTS:
                await run.start(host_id, agents)
            fleet = await settled(run, HOSTS, AGENTS)

            # every agent on exactly one host, two on each
            by_host = agents_by_host(fleet)
            assert sorted(by_host) == sorted(HOSTS), describe_leases(fleet)
            assert all(len(names) == 2 for names in by_host.values()), by_host
            assert sorted(a for names in by_host.values() for a in names) == sorted(AGENTS)
            for host_id, names in by_host.items():
                assert sorted(run.hosts[host_id].running()) == sorted(names)
            host_of = {a: h for h, names in by_host.items() for a in names}

            # one host holds the lobby's connection, and only it connected
            holder = holder_of(fleet, SERVER)
            assert holder in HOSTS
            session = await lobby.sole_ready()
            assert len(lobby.sessions) == 1, lobby.describe()
            readies = {h for h, e in run.events("ready") if e.get("server_id") == SERVER_ID}
            assert readies == {holder}, f"connected: {readies}, holder: {holder}"
            leased = [(h, e["data"]) for h, e in run.events("server-lease")]
            assert [h for h, d in leased if d.get("state") == "runs"] == [holder], leased

            # a person's message wakes each agent, wherever it runs (one at a time: a scripted
            # agent answers the newest line it reads)
            for name in AGENTS:
                session.send_incoming(GENERAL, f"p-{name}", f"{name}: ping-{name}")
                pong = f"{name.lower()}-pong ping-{name}"
                await answer_heard(lobby, run, pong, f"{name}'s answer (spread: {by_host})")

            # Ada's reply, sent by the connection's holder, is heard by an agent on another
            # host: stored in its history (the host's own posts wake no agent, on one host as
            # on many), and its next turn reads it
            other = next(
                a for a in ("Grace", *AGENTS) if a != "Ada" and host_of[a] != host_of["Ada"]
            )
            relay = f"Ada: relay-{AGENTS.index(other)} ping-r1"
            session.send_incoming(GENERAL, "relay-1", relay)
            said = f"{other}: relay ping-r1"
            await lobby.until(lambda: answered(lobby, said), "Ada's reply")

            def heard() -> bool:
                return any(
                    m.agent == other and said.casefold() in m.text for m in stored_messages(run.dsn)
                )

            await run.until(heard, f"{other} hearing Ada ({host_of['Ada']} → {host_of[other]})")
            session.send_incoming(GENERAL, "p-after", f"{other}: ping-after")
            pong = f"{other.lower()}-pong ping-after"
            await every_answer(lobby, run, [pong], f"{other}'s next turn")
            for name in ("Ada", other):  # each turned on the host holding it
                hosts = {h for h, e in run.events("turn-start", name)}
                assert hosts == {host_of[name]}, (name, hosts, host_of)
            assert len(lobby.sessions) == 1, lobby.describe()
    check_turns(run)


async def test_killing_the_connections_holder_in_a_burst_loses_and_doubles_nothing(
    tmp_path: Path, pg_dsn: str
) -> None:
    names = AGENTS[:3]  # one on each host
    ids = [f"burst-{i:04d}" for i in range(BURST)]
    text = {mid: f"chatter {mid}." for mid in ids}
    with trio.fail_after(420):
        async with lobby_sessions() as lobby, fleet_run(tmp_path, pg_dsn, lobby) as run:
            agents = agent_entries(tmp_path / "models", names)
            for host_id in HOSTS:
                await run.start(host_id, agents)
            fleet = await settled(run, HOSTS, names)
            first = await lobby.sole_ready()
            holder = holder_of(fleet, SERVER)
            assert holder is not None
            moving = agents_by_host(fleet)[holder]

            for mid in ids:
                first.send_incoming(GENERAL, mid, text[mid])
            await first.ctl.flush()
            await lobby.until(
                lambda: len(first.acked) >= KILL_AFTER,
                f"{KILL_AFTER} acknowledged",
                timeout=120,
            )
            killed_at = run.kill(holder)
            print(f"\nkilled {holder} after {len(first.acked)} acknowledged")

            # the connection is taken, and ready, on another host
            def ready_elsewhere() -> dict[str, Any] | None:
                return next(
                    (
                        e
                        for h, e in run.events("ready")
                        if h != holder and e.get("server_id") == SERVER_ID and e["at"] > killed_at
                    ),
                    None,
                )

            ready = await run.until(ready_elsewhere, "the connection ready on another host")
            took = ready["at"] - killed_at
            print(
                f"connection ready elsewhere {took:.1f}s after the kill "
                f"(bound {CONNECTION_MOVE_S:g}s)"
            )
            assert took <= CONNECTION_MOVE_S, took

            # the killed host's agents run on the others
            def moved() -> dict[str, float] | None:
                at: dict[str, float] = {}
                for name in moving:
                    runs = [
                        e["at"]
                        for h, e in run.events("agent-lease", name)
                        if h != holder and e["data"].get("state") == "runs" and e["at"] > killed_at
                    ]
                    if not runs:
                        return None
                    at[name] = min(runs) - killed_at
                return at

            moves = await run.until(moved, f"{moving} running on another host")
            print(f"agents moved after the kill: {moves} (bound {AGENTS_MOVE_S:g}s)")
            assert max(moves.values()) <= AGENTS_MOVE_S, moves

            # what the killed host had not acknowledged is sent again, as a server would
            await lobby.until(lambda: not first.live, "the killed host's session closed")
            second = await lobby.until(
                lambda: next((s for s in lobby.live() if s.ready), None), "a new ready session"
            )
            assert lobby.live() == [second], lobby.describe()
            acknowledged_first = first.acknowledged()
            again = [mid for mid in ids if mid not in acknowledged_first]
            print(
                f"{len(acknowledged_first)} acknowledged before the kill; {len(again)} sent again"
            )
            for mid in again:
                second.send_incoming(GENERAL, mid, text[mid])
            await second.ctl.flush()
            resent = set(again)
            await lobby.until(
                lambda: resent <= second.acked, "every message sent again acknowledged", timeout=180
            )
            assert lobby.acknowledged() >= set(ids)
            assert lobby.live() == [second], lobby.describe()

            # the store holds each message exactly once for each agent
            stored = await trio.to_thread.run_sync(stored_messages, pg_dsn)
            marker = re.compile(r"chatter (burst-\d{4})\.")
            counts: dict[str, Counter[str]] = {name: Counter() for name in names}
            for m in stored:
                found = marker.search(m.text)
                if found and m.role == "user" and m.agent in counts:
                    counts[m.agent][found.group(1)] += 1
            for name in names:
                lost = [mid for mid in ids if counts[name][mid] == 0]
                doubled = {mid: n for mid, n in counts[name].items() if n > 1}
                assert not lost and not doubled, (
                    f"{name}: {len(lost)} lost (first {lost[:5]}), {len(doubled)} duplicated "
                    f"(first {list(doubled.items())[:5]})"
                )
    check_turns(run)


async def test_no_turn_runs_on_two_hosts_at_once(tmp_path: Path, pg_dsn: str) -> None:
    with trio.fail_after(360):
        async with lobby_sessions() as lobby, fleet_run(tmp_path, pg_dsn, lobby) as run:
            agents = agent_entries(tmp_path / "models", AGENTS)
            for host_id in HOSTS[:2]:
                await run.start(host_id, agents)
            await settled(run, HOSTS[:2], AGENTS)
            rounds = iter(range(1, 100))

            async def ping_all(session: Session, what: str | None) -> None:
                """A ping for every agent; with ``what``, each answered before the next is sent
                (a scripted agent answers the newest line it reads)."""
                n = next(rounds)
                for name in AGENTS:
                    session.send_incoming(GENERAL, f"r{n}-{name}", f"{name}: ping-{n}-{name}")
                    if what is not None:
                        pong = f"{name.lower()}-pong ping-{n}-{name}"
                        await answer_heard(lobby, run, pong, f"{name}'s answer {what}")

            # a round on two hosts; another while a third joins and the agents are spread again
            await ping_all(await lobby.sole_ready(), "on two hosts")
            await run.start(HOSTS[2], agents)
            await ping_all(await lobby.sole_ready(), None)  # during the move: not required
            fleet = await settled(run, HOSTS, AGENTS)
            await ping_all(await lobby.sole_ready(), "on three hosts")

            # kill a host that does not hold the connection, with turns running
            victim = next(h for h in HOSTS if h != holder_of(fleet, SERVER))
            await ping_all(await lobby.sole_ready(), None)
            run.kill(victim)
            survivors = [h for h in HOSTS if h != victim]
            await settled(run, survivors, AGENTS)
            await ping_all(await lobby.sole_ready(), "after the kill")

    by_agent = check_turns(run)
    assert sorted(by_agent) == sorted(AGENTS), sorted(by_agent)
    moved = [name for name, spans in by_agent.items() if len({t.host for t in spans}) > 1]
    assert moved, "no agent turned on two hosts: nothing was checked"
    print(f"\nagents that turned on more than one host: {moved}")


async def test_a_host_paused_past_its_lease_neither_stores_nor_publishes_its_answer(
    tmp_path: Path, pg_dsn: str
) -> None:
    marker = "held-answer-7f3k"
    hold = Held(reply=Reply(text=f"{marker} from the paused host"))
    script = FakeScript([hold, *(Reply(text=f"ada answers again {i}") for i in range(8))])
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            base_url = await nursery.start(serve_fake_openai, script)
            async with lobby_sessions() as lobby, fleet_run(tmp_path, pg_dsn, lobby) as run:
                ada = {"name": "Ada", "model": "openai:gpt-test", "base_url": base_url}
                agents = [
                    {**ada, "gate": "community"},
                    *agent_entries(tmp_path / "models", ("Grace", "Linus")),
                ]
                for host_id in HOSTS:
                    await run.start(host_id, agents)
                fleet = await settled(run, HOSTS, ("Ada", "Grace", "Linus"))
                session = await lobby.sole_ready()
                first = held(fleet)["agent:Ada"]
                paused = first.holder
                assert paused is not None
                print(
                    f"\nAda on {paused} (epoch {first.epoch}); the connection on "
                    f"{holder_of(fleet, SERVER)}"
                )

                # Ada's turn is in its model call when her host is paused
                session.send_incoming(GENERAL, "wake-ada", "Ada: are you there?")
                with trio.move_on_after(60):
                    await hold.entered.wait()
                assert hold.entered.is_set(), f"Ada's model was never called:\n{run.describe()}"
                await run.until(
                    lambda: run.hosts[paused].of("turn-start", "Ada"), "Ada's turn on her host"
                )
                run.pause(paused)

                # another host takes Ada under a higher epoch
                def taken(f: Fleet) -> bool:
                    lease = held(f).get("agent:Ada")
                    return (
                        lease is not None and lease.holder != paused and lease.epoch > first.epoch
                    )

                later = await run.until_fleet(taken, "Ada taken by another host")
                print(f"Ada taken over: {describe_leases(later)}")

                # the paused host's model call is answered, then the host wakes
                hold.release.set()
                await hold.sent.wait()
                resumed_at = run.resume(paused)
                host = run.hosts[paused]
                await run.until(
                    lambda: [
                        e
                        for e in host.of("agent-lease", "Ada", state="moved")
                        if e["at"] >= resumed_at
                    ],
                    f"{paused} letting Ada go",
                )
                # its loop goes on: a heartbeat after it woke
                await run.until_fleet(
                    lambda f: any(
                        h.host_id == paused and h.heartbeat_at > later.now for h in f.hosts
                    ),
                    f"a heartbeat of {paused} after it woke",
                )
                for live in lobby.live():  # every event each connection sent until now
                    await barrier(lobby, live)

                published = [t for _, t in lobby.publishes() if marker in t]
                assert not published, f"the paused host's answer was published: {published}"
                stored = await trio.to_thread.run_sync(stored_messages, pg_dsn)
                kept = [m for m in stored if marker in m.text]
                assert not kept, f"the paused host's answer was stored: {kept}"
            nursery.cancel_scope.cancel()
