"""Two hosts of a fleet over one PostgreSQL store, for the tests of fenced writes: ``h1`` holds
``agent:Ada`` at epoch 2, then ``h2`` takes it over (epoch 3).

The hosts' lease tables run on a clock the test moves; the writer checks a fence on the
database's clock. So the test's clock stays near the real time: ``h1``'s lease at epoch 2 runs
until well after the test (a fence under it passes), and ``h2`` takes over by stepping at a time
past that expiry. ``h1``, paused, would still think itself the holder: only the epoch tells."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from store import Append, Fence, JournalEntry, PutState, RecordUsage
from store.leases import LeaseTable

from .conftest import record

ADA = "agent:Ada"
#: Long enough that a lease taken at the real time outlives the test.
LEASE_S = 120.0


class Clock:
    """The lease tables' clock, set by the test."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


class Fleet:
    """Two hosts' lease tables over the store at ``dsn``."""

    def __init__(self, dsn: str) -> None:
        self.clock = Clock()
        self.h1 = LeaseTable(dsn, lease_s=LEASE_S, clock=self.clock)
        self.h2 = LeaseTable(dsn, lease_s=LEASE_S, clock=self.clock)

    def close(self) -> None:
        self.h1.close()
        self.h2.close()

    def h1_holds_epoch_2(self) -> Fence:
        """``h1`` takes Ada, lets the lease expire, and takes it again: epoch 2, running until
        half a lease from now (real time)."""
        self.clock.t = time.time() - 3 * LEASE_S
        assert self.h1.step("h1", [ADA]).held[ADA].epoch == 1
        self.clock.t = time.time() - LEASE_S / 2  # the first lease expired long ago
        held = self.h1.step("h1", [ADA]).held[ADA]
        assert held.epoch == 2 and held.expires_at > time.time()
        return Fence(ADA, "h1", 2)

    def h2_takes_over(self) -> Fence:
        """``h2`` steps past ``h1``'s expiry (on the lease tables' clock) and takes Ada: epoch 3.
        On the database's clock ``h1``'s lease has not run out: only the epoch is stale."""
        self.clock.t = time.time() + LEASE_S
        result = self.h2.step("h2", [ADA])
        assert result.taken == (ADA,) and result.held[ADA].epoch == 3
        return Fence(ADA, "h2", 3)


def message(id: str) -> Any:
    return record(id, id=id, agent="Ada")


def usage(turn_id: str, fence: Fence | None) -> RecordUsage:
    return RecordUsage(
        at=1_700_000_000.0,
        agent="Ada",
        model="m",
        turn=0,
        turn_id=turn_id,
        phase="completed",
        calls=1,
        fence=fence,
    )


STALE_DEDUPE = ("chat", "lobby", "stale-key")


def mixed_batch(old: Fence, new: Fence) -> Sequence[tuple[str, Any]]:
    """One batch, tagged: every kind of fenced op under the stale fence ``old``, one unfenced
    op, and ops under the current fence ``new``."""
    return [
        (
            "stale-append",
            Append(
                records=(message("stale"),),
                dedupe=STALE_DEDUPE,
                journal=(JournalEntry("Ada", {"n": 1}),),
                fence=old,
            ),
        ),
        ("stale-state", PutState(namespace=ADA, key="old", value="stale", fence=old)),
        ("stale-usage", usage("t-stale", old)),
        ("plain", Append(records=(message("plain"),))),
        ("current-append", Append(records=(message("current"),), fence=new)),
        ("current-state", PutState(namespace=ADA, key="new", value="current", fence=new)),
        ("current-usage", usage("t-current", new)),
        ("stale-again", Append(records=(message("stale-2"),), fence=old)),
    ]


STALE_TAGS = ("stale-append", "stale-state", "stale-usage", "stale-again")
