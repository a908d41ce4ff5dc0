"""The lease rules of a fleet: a stateful machine of hosts that step, pause, die and come
back, over one table of leases, checking that no two hosts may act for one resource at once,
that a stale epoch's writes are fenced, and that the live hosts end up holding everything,
evenly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from protocol.leases import (
    AGENT,
    LEASE_S,
    RENEW_S,
    SAFETY_S,
    SERVER,
    Lease,
    Step,
    agent_resource,
    apply,
    fair_share,
    fenced,
    kind_of,
    must_stop,
    name_of,
    plan,
    server_resource,
    spread,
)

HOSTS = ("h1", "h2", "h3")
RESOURCES = (*(f"agent:a{i}" for i in range(6)), "server:lobby", "server:discord")


class Fleet(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.leases: dict[str, Lease] = {}
        self.alive = set(HOSTS)  # a host that is not alive neither steps nor renews
        # what each host believes it holds: resource -> (epoch, time of its last renewal)
        self.views: dict[str, dict[str, tuple[int, float]]] = {h: {} for h in HOSTS}
        # the table as each host last read it: a plan made on it may be out of date
        self.reads: dict[str, dict[str, Lease]] = {h: {} for h in HOSTS}

    def step(self, host: str, stale: bool = False) -> None:
        seen = self.reads[host] if stale else self.leases
        self.reads[host] = dict(self.leases)
        step = plan(host, self.now, seen, RESOURCES, self.alive)
        self.leases, taken = apply(host, self.now, self.leases, step)
        view = self.views[host]
        for resource in step.release:
            view.pop(resource, None)
        for resource in (*step.renew, *taken):
            lease = self.leases[resource]
            if lease.holder == host:
                view[resource] = (lease.epoch, self.now)
        for resource in list(view):  # a renewal that did not land: no longer its own
            lease = self.leases.get(resource)
            if lease is None or lease.holder != host or lease.epoch != view[resource][0]:
                view.pop(resource)

    def may_act(self, host: str, resource: str) -> bool:
        """The host believes it may act: its last renewal leaves more than the safety margin."""
        seen = self.views[host].get(resource)
        return seen is not None and self.now < seen[1] + LEASE_S - SAFETY_S

    @rule(host=st.sampled_from(HOSTS))
    def a_live_host_steps(self, host: str) -> None:
        if host in self.alive:
            self.step(host)

    @rule(host=st.sampled_from(HOSTS))
    def a_live_host_steps_on_what_it_read_before(self, host: str) -> None:
        """Its plan is made on an old read of the table; the table's rows decide."""
        if host in self.alive:
            self.step(host, stale=True)

    @rule(seconds=st.floats(0.1, 2 * LEASE_S))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(host=st.sampled_from(HOSTS))
    def a_host_pauses_or_dies(self, host: str) -> None:
        self.alive.discard(host)  # it keeps its beliefs: a paused host comes back with them

    @rule(host=st.sampled_from(HOSTS))
    def a_host_comes_back(self, host: str) -> None:
        self.alive.add(host)

    @precondition(lambda self: bool(self.alive))
    @rule()
    def the_dead_expire_and_every_live_host_steps_twice(self) -> None:
        """Once the leases of the hosts that stopped have expired, two rounds of steps within
        a renewal period: afterwards every resource is held by a live host, each holding at
        most its fair share."""
        self.now += LEASE_S
        for _ in range(2):
            for host in sorted(self.alive):
                self.step(host)
            self.now += RENEW_S / 10
        live = sorted(self.alive)
        holders = {lease.holder for lease in self.leases.values() if lease.held(self.now)}
        assert holders <= set(live)
        for kind in ("agent", "server"):
            names = [r for r in RESOURCES if r.startswith(kind)]
            held = {r: self.leases[r] for r in names if r in self.leases}
            assert all(held[r].held(self.now) for r in names if r in held)
            assert len(held) == len(names)
            share = fair_share(len(names), len(live))
            assert max(spread(held, self.now, live).values()) <= share

    @invariant()
    def no_resource_has_two_actors(self) -> None:
        for resource in RESOURCES:
            acting = [h for h in HOSTS if self.may_act(h, resource)]
            assert len(acting) <= 1, (resource, acting, self.leases.get(resource))

    @invariant()
    def a_stale_epoch_is_fenced(self) -> None:
        for host in HOSTS:
            for resource, (epoch, _) in self.views[host].items():
                lease = self.leases[resource]
                assert fenced(lease.epoch, epoch) == (lease.epoch == epoch)
                if lease.holder != host:
                    assert not fenced(lease.epoch, epoch)


TestFleet = Fleet.TestCase
TestFleet.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@given(st.integers(0, 50), st.integers(1, 10))
def test_the_fair_share_covers_every_resource(resources: int, hosts: int) -> None:
    share = fair_share(resources, hosts)
    assert share * hosts >= resources
    assert (share - 1) * hosts < resources or resources == 0


def test_a_new_host_takes_half_of_what_one_host_held() -> None:
    agents = [f"agent:a{i}" for i in range(6)]
    leases, _ = apply("h1", 0.0, {}, plan("h1", 0.0, {}, agents, ["h1"]))
    assert spread(leases, 0.0, ["h1"]) == {"h1": 6}
    step = plan("h1", 1.0, leases, agents, ["h1", "h2"])
    assert len(step.release) == 3 and len(step.renew) == 3
    # the most recently taken go: every lease here has epoch 1, so the order is by name
    leases, _ = apply("h1", 1.0, leases, step)
    leases, taken = apply("h2", 1.0, leases, plan("h2", 1.0, leases, agents, ["h1", "h2"]))
    assert len(taken) == 3 and spread(leases, 1.0, ["h1", "h2"]) == {"h1": 3, "h2": 3}
    assert all(leases[r].epoch == 2 for r in taken)  # a new epoch for each one taken


def test_a_host_must_stop_before_its_lease_can_be_taken() -> None:
    lease = Lease("agent:a0", "h1", 4, LEASE_S)  # renewed at 0
    assert not must_stop(lease, "h1", 0.0, LEASE_S - SAFETY_S - 0.01)
    assert must_stop(lease, "h1", 0.0, LEASE_S - SAFETY_S)
    assert must_stop(lease, "h2", 0.0, 0.0)  # not its lease at all
    # another host can take it only at expiry, after the holder stopped
    leases, taken = apply("h2", LEASE_S - 0.01, {"agent:a0": lease}, Step(take=("agent:a0",)))
    assert taken == ()
    leases, taken = apply("h2", LEASE_S, {"agent:a0": lease}, Step(take=("agent:a0",)))
    assert taken == ("agent:a0",) and leases["agent:a0"].epoch == 5
    assert not fenced(5, 4)  # the old holder's late write is refused


@given(st.text(min_size=1))
def test_a_resource_name_gives_back_its_kind_and_name(name: str) -> None:
    """An agent's or a server's resource says which it is and whose, whatever the name holds
    (colons too)."""
    for kind, resource in ((AGENT, agent_resource(name)), (SERVER, server_resource(name))):
        assert (kind_of(resource), name_of(resource)) == (kind, name)
    assert agent_resource(name) != server_resource(name)
