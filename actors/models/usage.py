"""The usage ledger's sums as rows: grouped by day, agent, model or channel, and priced.

The store sums its usage ledger by UTC day, agent, model and wake place
(:class:`store.UsageTotal`); :func:`rows_of` puts those sums into the rows asked for and prices
them (:mod:`protocol.prices`). A row with any model of unknown price has an unknown cost (None),
never 0. ``mcplive usage`` prints these rows, and the console's Usage page draws them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import attrs

from protocol.prices import Price, cost, price_of
from store import UsageTotal

#: What ``--by`` groups on; without it a row is one day, agent and model.
GROUPINGS = ("day", "agent", "model", "channel")
#: The token counts of a row, in ``--json`` order.
TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def cost_of(total: UsageTotal, price: Price | None) -> Decimal | None:
    """What a ledger sum's tokens cost at ``price``; None when the price is unknown."""
    return cost(price, **{key: getattr(total, key) for key in TOKENS})


def tokens_of(total: UsageTotal) -> int:
    """Every token of a ledger sum, of every kind a call is billed for."""
    return sum(getattr(total, key) for key in TOKENS)


@attrs.define
class Row:
    """One printed row: its group and its sums (``cost`` None when a price is unknown)."""

    day: str | None
    agent: str | None
    model: str | None
    channel: str | None = None
    calls: int = 0
    silent_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: Decimal | None = Decimal(0)

    def add(self, total: UsageTotal, price: Price | None) -> None:
        self.calls += total.calls
        self.silent_turns += total.silent_turns
        for key in TOKENS:
            setattr(self, key, getattr(self, key) + getattr(total, key))
        spent = cost_of(total, price)
        self.cost = None if spent is None or self.cost is None else self.cost + spent

    def as_json(self, by: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"day": self.day, "agent": self.agent, "model": self.model}
        if by == "channel":
            out["channel"] = self.channel
        out["calls"] = self.calls
        out["silent_turns"] = self.silent_turns
        for key in TOKENS:
            out[key] = getattr(self, key)
        out["cost_usd"] = None if self.cost is None else float(round(self.cost, 6))
        return out


def _key(total: UsageTotal, by: str | None) -> tuple[str | None, ...]:
    """The row a sum belongs to: (day, agent, model, channel)."""
    if by is None:
        return (total.day, total.agent, total.model, None)
    if by == "day":
        return (total.day, None, None, None)
    if by == "agent":
        return (None, total.agent, None, None)
    if by == "model":
        return (None, None, total.model, None)
    place = None if total.channel is None else f"{total.server}/{total.channel}"
    return (None, None, None, place)


def rows_of(totals: Iterable[UsageTotal], by: str | None, table: Mapping[str, Price]) -> list[Row]:
    """The printed rows of the ledger's sums, grouped ``by`` (None: day, agent and model)."""
    rows: dict[tuple[str | None, ...], Row] = {}
    for total in totals:
        key = _key(total, by)
        row = rows.get(key)
        if row is None:
            row = rows[key] = Row(day=key[0], agent=key[1], model=key[2], channel=key[3])
        row.add(total, price_of(total.model, table))
    return sorted(rows.values(), key=lambda r: tuple(v or "" for v in _key_of(r)))


def _key_of(row: Row) -> tuple[str | None, ...]:
    return (row.day, row.agent, row.model, row.channel)
