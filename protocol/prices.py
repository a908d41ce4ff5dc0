"""What model calls cost: a price table and the cost of a count of tokens.

A :class:`Price` is in US dollars per million tokens, for each of the four kinds of tokens a
call is billed for: input not read from the prompt cache, output, input read from the cache
(``cache_read``) and input written to it (``cache_write``). :data:`BUILT_IN_PRICES` holds the
models the README names; a host's config overrides and extends it (``[prices."model-name"]``).

A model is looked up by its full name (``anthropic:claude-sonnet-4-5``), then by the name after
its provider (``claude-sonnet-4-5``). A model with no price has an unknown cost (``None``),
never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

#: Tokens per unit of a price.
PER = 1_000_000
#: The keys of a price in config, in order.
PRICE_KEYS = ("input", "output", "cache_read", "cache_write")


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens of each kind."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal

    @classmethod
    def of(cls, figures: Mapping[str, float | int | str | Decimal]) -> Price:
        """A price from its four figures (each a number >= 0); raises :class:`ValueError`."""
        values: dict[str, Decimal] = {}
        for key in PRICE_KEYS:
            if key not in figures:
                raise ValueError(f"missing {key!r}")
            raw = figures[key]
            if isinstance(raw, bool):
                raise ValueError(f"{key} must be a number, got {raw!r}")
            try:
                value = Decimal(str(raw))
            except ArithmeticError:
                raise ValueError(f"{key} must be a number, got {raw!r}") from None
            if not value.is_finite() or value < 0:
                raise ValueError(f"{key} must be a number >= 0, got {raw!r}")
            values[key] = value
        extra = sorted(set(figures) - set(PRICE_KEYS))
        if extra:
            raise ValueError(f"unknown key {extra[0]!r} (known: {', '.join(PRICE_KEYS)})")
        return cls(**values)


def _price(input: str, output: str, cache_read: str, cache_write: str) -> Price:
    return Price(Decimal(input), Decimal(output), Decimal(cache_read), Decimal(cache_write))


#: Published list prices as of 2026 (USD per million tokens), for the models the README names;
#: a host's ``[prices."model-name"]`` overrides any of them and adds others. Anthropic's cache
#: write is its five-minute cache; OpenAI bills no cache write apart from input, so its cache
#: write is its input price.
BUILT_IN_PRICES: Mapping[str, Price] = {
    "claude-sonnet-4-5": _price("3", "15", "0.30", "3.75"),
    "gpt-4.1-mini": _price("0.40", "1.60", "0.10", "0.40"),
}


def price_of(model: str, table: Mapping[str, Price]) -> Price | None:
    """The price of ``model`` in ``table``: by its full name, then by its name after the
    provider (``provider:name``); None when it has none."""
    found = table.get(model)
    if found is None and ":" in model:
        found = table.get(model.split(":", 1)[1])
    return found


def prices(overrides: Mapping[str, Price] | None = None) -> dict[str, Price]:
    """The built-in table with ``overrides`` over it."""
    return {**BUILT_IN_PRICES, **(overrides or {})}


def cost(
    price: Price | None,
    *,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_write_tokens: int,
) -> Decimal | None:
    """What these tokens cost in US dollars at ``price``; None when the price is unknown."""
    if price is None:
        return None
    total = (
        price.input * input_tokens
        + price.output * output_tokens
        + price.cache_read * cache_read_tokens
        + price.cache_write * cache_write_tokens
    )
    return total / PER
