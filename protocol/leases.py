"""Leases: which host of a fleet runs each agent and holds each server's connection.

A *resource* (an agent, ``agent:Ada``, or a server's connection, ``server:lobby``) has at most
one lease: its *holder* (a host id), an *epoch* and an *expiry*. The rules, decided here and
carried out by the store in one transaction per step:

* **Take.** A host takes a resource that has no lease, or whose lease has expired; the epoch
  grows by one, so every write made under the old lease can be told apart (and refused).
* **Renew.** The holder renews before expiry: the expiry moves on, the epoch stays.
* **Fence.** A write for a resource carries the epoch its writer holds; it is taken only while
  that epoch is the resource's current one (:func:`fenced`). A host that was paused past its
  lease comes back with an old epoch and can change nothing.
* **Spread.** Agents are spread evenly over the live hosts: a host takes free agents only up to
  its fair share (:func:`fair_share`), and a host holding more than its share lets the extra go
  at its next step (released, not expired: another host takes them at once). Servers are spread
  the same way, counted apart from agents.
* **Leave.** A host that stops cleanly releases its leases at once.
* **Stop in time.** A holder that cannot renew stops its turns and publishes when its lease has
  :data:`SAFETY_S` left (:func:`must_stop`), before another host can take it.

Pure: the leases, the live hosts and the time are parameters; nothing here reads a clock or a
database. :func:`plan` says what one host does at one step; :func:`apply` applies a step to a
table of leases, which is what the store does in its transaction (and what the tests check the
rules against).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

__all__ = [
    "AGENT",
    "LEASE_S",
    "RENEW_S",
    "SAFETY_S",
    "SERVER",
    "Lease",
    "Step",
    "agent_resource",
    "apply",
    "fair_share",
    "fenced",
    "kind_of",
    "must_stop",
    "name_of",
    "plan",
    "server_resource",
]

#: The kinds of resource, each name's prefix before its colon.
AGENT = "agent"
SERVER = "server"
#: How long a lease lasts from its last renewal (seconds).
LEASE_S = 10.0
#: How often a holder renews its leases.
RENEW_S = 3.0
#: A holder that could not renew stops acting this long before its lease expires.
SAFETY_S = 3.0


@attrs.frozen
class Lease:
    """A resource's lease: held by ``holder`` under ``epoch`` until ``expires_at`` (None: free,
    released by its last holder)."""

    resource: str
    holder: str | None
    epoch: int
    expires_at: float

    def held(self, now: float) -> bool:
        """Someone holds it at ``now``."""
        return self.holder is not None and now < self.expires_at


@attrs.frozen
class Step:
    """What one host does at one step: renew the leases it holds, take free ones, and let go
    of extras (each resource named once)."""

    renew: tuple[str, ...] = ()
    take: tuple[str, ...] = ()
    release: tuple[str, ...] = ()


def agent_resource(name: str) -> str:
    """The resource an agent is leased under (``agent:Ada``)."""
    return f"{AGENT}:{name}"


def server_resource(server_id: str) -> str:
    """The resource a server's connection is leased under (``server:lobby``)."""
    return f"{SERVER}:{server_id}"


def kind_of(resource: str) -> str:
    """``agent`` or ``server`` (the part before the first colon)."""
    return resource.partition(":")[0]


def name_of(resource: str) -> str:
    """The agent's name or the server's id (all after the first colon)."""
    return resource.partition(":")[2]


def fair_share(resources: int, hosts: int) -> int:
    """The most resources of one kind a host holds when ``resources`` are spread evenly over
    ``hosts`` live hosts (at least one host: the one asking)."""
    return math.ceil(resources / max(1, hosts))


def fenced(current_epoch: int, writer_epoch: int) -> bool:
    """Whether a write made under ``writer_epoch`` may land while the lease's epoch is
    ``current_epoch``: only the current holder's writes do."""
    return writer_epoch == current_epoch


def must_stop(lease: Lease, host: str, renewed_at: float, now: float) -> bool:
    """Whether ``host`` must stop acting for ``lease`` at ``now``: it does not hold it, or its
    last renewal (``renewed_at``) leaves less than :data:`SAFETY_S` before its expiry."""
    if lease.holder != host:
        return True
    return now >= min(lease.expires_at, renewed_at + LEASE_S) - SAFETY_S


def plan(
    host: str,
    now: float,
    leases: Mapping[str, Lease],
    resources: Iterable[str],
    live_hosts: Iterable[str],
) -> Step:
    """What ``host`` does now, given the leases of every resource (a resource with none is
    free), the resources to run and the live hosts (``host`` counts as live).

    Per kind: renew what it holds up to its fair share, release the rest (the most recently
    taken, i.e. the highest epochs, go first, so a long-held one stays put), and take free or
    expired resources (in name order) while under its share."""
    hosts = set(live_hosts) | {host}
    by_kind: dict[str, list[str]] = {}
    for resource in sorted(set(resources)):
        by_kind.setdefault(kind_of(resource), []).append(resource)
    renew: list[str] = []
    take: list[str] = []
    release: list[str] = []
    for names in by_kind.values():
        share = fair_share(len(names), len(hosts))
        mine = [r for r in names if (lease := leases.get(r)) is not None and lease.holder == host]
        mine = [r for r in mine if leases[r].held(now)]
        mine.sort(key=lambda r: leases[r].epoch)
        renew += mine[:share]
        release += mine[share:]
        room = share - len(mine[:share])
        for resource in names:
            if room <= 0:
                break
            lease = leases.get(resource)
            if lease is None or not lease.held(now):
                take.append(resource)
                room -= 1
    return Step(renew=tuple(renew), take=tuple(take), release=tuple(release))


def apply(
    host: str, now: float, leases: Mapping[str, Lease], step: Step, lease_s: float = LEASE_S
) -> tuple[dict[str, Lease], tuple[str, ...]]:
    """``leases`` after ``host``'s ``step`` at ``now``, as the store applies it in one
    transaction (each row checked under its lock), and the resources it took. A renewal of a
    lease another host now holds, or a take of one held, changes nothing (the row is checked,
    not trusted)."""
    out = dict(leases)
    taken: list[str] = []
    for resource in step.renew:
        lease = out.get(resource)
        if lease is not None and lease.holder == host and lease.held(now):
            out[resource] = attrs.evolve(lease, expires_at=now + lease_s)
    for resource in step.release:
        lease = out.get(resource)
        if lease is not None and lease.holder == host:
            out[resource] = attrs.evolve(lease, holder=None, expires_at=now)
    for resource in step.take:
        lease = out.get(resource)
        if lease is not None and lease.held(now):
            continue
        epoch = 1 if lease is None else lease.epoch + 1
        out[resource] = Lease(resource, host, epoch, now + lease_s)
        taken.append(resource)
    return out, tuple(taken)


def holders(leases: Mapping[str, Lease], now: float) -> dict[str, str]:
    """Who holds each resource at ``now`` (free and expired ones left out)."""
    return {r: lease.holder for r, lease in leases.items() if lease.held(now) and lease.holder}


def spread(leases: Mapping[str, Lease], now: float, hosts: Sequence[str]) -> dict[str, int]:
    """How many resources each of ``hosts`` holds at ``now``."""
    counts = dict.fromkeys(hosts, 0)
    for holder in holders(leases, now).values():
        if holder in counts:
            counts[holder] += 1
    return counts
