"""The outbox's claiming rule: which rows a server's holder may claim.

An agent's speech to a server whose connection another host holds goes through a durable outbox
(:mod:`store.outbox`): a row per utterance, *queued* when put, *claimed* by the host holding the
server's lease (its holder and epoch written on the row) while it publishes it, and *done* once
the outcome is recorded. A row's claim outlives a holder that failed over: the next holder, under
a newer epoch, claims it again and publishes it under the same idempotency key.

A holder (``holder`` under ``epoch``, its fence on ``server:<id>`` passed) may claim a row when:

* it is queued; or
* it is claimed, under an older epoch (the holder that claimed it lost the lease), or under the
  same epoch by another holder (a row written by hand, or a clock gone wrong: never left stuck).

It never claims a done row, a row it already claims (``holder`` under ``epoch``: it is
publishing it), or a row claimed under a newer epoch than its own (it is the one that is stale).
So each row is claimed at most once per epoch by its holder, and a holder that lost the lease can
take no row from the one that took it over.

Pure: the store's ``claim`` carries out the same rule in SQL (:data:`CLAIMABLE_SQL`).
"""

from __future__ import annotations

__all__ = ["CLAIMABLE_SQL", "STATES", "claimable"]

#: The states of a row: put, being published, outcome recorded.
STATES = ("queued", "claimed", "done")

#: :func:`claimable` as a condition on an ``outbox`` row, with three parameters: the claiming
#: epoch, that epoch again, the claiming holder.
CLAIMABLE_SQL = (
    "(state = 'queued' OR (state = 'claimed' AND (claim_epoch < ?::bigint"
    " OR (claim_epoch = ?::bigint AND claimed_by IS DISTINCT FROM ?))))"
)


def claimable(
    state: str, claimed_by: str | None, claim_epoch: int | None, holder: str, epoch: int
) -> bool:
    """Whether ``holder``, under ``epoch``, may claim a row in ``state``, claimed (when it is)
    by ``claimed_by`` under ``claim_epoch`` (see the module's docstring)."""
    if state == "queued":
        return True
    if state != "claimed" or claim_epoch is None:
        return False
    return claim_epoch <= epoch and (claim_epoch, claimed_by) != (epoch, holder)
