"""The fleet as ``mcplive status`` and the console show it: each host with its last heartbeat,
and each lease with its holder, read from a PostgreSQL store (:func:`store.leases.read_fleet`).

:func:`read` is blocking (a worker thread's call on a loop) and never raises for the store: a
fleet that cannot be read is one line, ``error``. Ages and expiries are on the database's clock,
so a host whose clock is off still reads them right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.status import describe_age, iso
from store.dbapi import describe
from store.errors import StoreError
from store.leases import READ_TIMEOUT_S, Fleet, read_fleet

#: Hosts and leases a readable report lists (the JSON carries every row read).
SHOWN_ROWS = 100


def read(dsn: str, *, timeout_s: float = READ_TIMEOUT_S) -> dict[str, Any]:
    """The fleet on the store at ``dsn`` as JSON (:func:`as_json`), or ``{"store", "error"}``
    with one line saying why it could not be read."""
    try:
        fleet = read_fleet(dsn, timeout_s=timeout_s)
    except StoreError as exc:
        return {"store": describe(dsn), "error": " ".join(str(exc).split())}
    return as_json(fleet, describe(dsn))


def as_json(fleet: Fleet, store: str) -> dict[str, Any]:
    """``{"store", "read_at", "hosts": [...], "leases": [...]}``. A host: ``host_id``,
    ``started_at``, ``heartbeat_at`` (ISO 8601, UTC), ``heartbeat_age_s``, ``leaving``. A lease:
    ``resource``, ``holder`` (None: free), ``epoch``, ``state`` (``held``, ``expired`` or
    ``free``), ``expires_in_s`` (negative once expired; None when free)."""
    now = fleet.now
    hosts = [
        {
            "host_id": h.host_id,
            "started_at": iso(h.started_at),
            "heartbeat_at": iso(h.heartbeat_at),
            "heartbeat_age_s": round(now - h.heartbeat_at, 3),
            "leaving": h.leaving,
        }
        for h in fleet.hosts
    ]
    leases = []
    for lease in fleet.leases:
        if lease.holder is None:
            state, expires_in = "free", None
        else:
            expires_in = round(lease.expires_at - now, 3)
            state = "held" if expires_in > 0 else "expired"
        leases.append(
            {
                "resource": lease.resource,
                "holder": lease.holder,
                "epoch": lease.epoch,
                "state": state,
                "expires_in_s": expires_in,
            }
        )
    return {"store": store, "read_at": iso(now), "hosts": hosts, "leases": leases}


def lines(fleet: dict[str, Any]) -> list[str]:
    """The readable report of :func:`read`'s answer: a ``fleet:`` line, then each host and each
    lease (at most :data:`SHOWN_ROWS` of each), or the one line saying why it was not read."""
    if fleet.get("error"):
        return [f"fleet: not read: {fleet['error']}"]
    return [
        "fleet:",
        *_section("hosts", fleet.get("hosts") or [], "none has beaten yet", host_line),
        *_section("leases", fleet.get("leases") or [], "none taken yet", lease_line),
    ]


def _section(
    title: str, rows: list[dict[str, Any]], empty: str, line: Callable[[dict[str, Any]], str]
) -> list[str]:
    """One part of :func:`lines`: its title, then a line per row (at most
    :data:`SHOWN_ROWS`, and how many more), or ``(empty)``."""
    out = [f"  {title}:"]
    if not rows:
        out.append(f"    ({empty})")
    out.extend(f"    {line(row)}" for row in rows[:SHOWN_ROWS])
    if len(rows) > SHOWN_ROWS:
        out.append(f"    … and {len(rows) - SHOWN_ROWS} more")
    return out


def host_line(host: dict[str, Any]) -> str:
    """``alpha: last heartbeat 3 s ago`` (``, leaving`` once it left cleanly)."""
    age = describe_age(float(host.get("heartbeat_age_s") or 0.0))
    return f"{host.get('host_id')}: last heartbeat {age} ago" + (
        ", leaving" if host.get("leaving") else ""
    )


def lease_line(lease: dict[str, Any]) -> str:
    """``agent:Ada → alpha, epoch 3, expires in 12 s`` (``… expired 4 s ago``), or
    ``server:lobby: free (epoch 2)``."""
    if lease.get("state") == "free" or lease.get("holder") is None:
        return f"{lease.get('resource')}: free (epoch {lease.get('epoch')})"
    left = float(lease.get("expires_in_s") or 0.0)
    when = f"expires in {describe_age(left)}" if left > 0 else f"expired {describe_age(-left)} ago"
    return f"{lease.get('resource')} → {lease.get('holder')}, epoch {lease.get('epoch')}, {when}"
