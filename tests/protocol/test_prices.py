"""The price table and the cost of a count of tokens (:mod:`protocol.prices`)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.prices import BUILT_IN_PRICES, PER, Price, cost, price_of, prices

counts = st.integers(min_value=0, max_value=10**12)
figures = st.decimals(min_value=0, max_value=1000, places=4, allow_nan=False)
price_values = st.builds(Price, figures, figures, figures, figures)


def spend(price: Price | None, i: int, o: int, r: int, w: int) -> Decimal | None:
    return cost(price, input_tokens=i, output_tokens=o, cache_read_tokens=r, cache_write_tokens=w)


@given(price_values, counts, counts, counts, counts, counts, counts, counts, counts)
def test_cost_adds_up_over_calls(
    price: Price, i1: int, o1: int, r1: int, w1: int, i2: int, o2: int, r2: int, w2: int
) -> None:
    one, two = spend(price, i1, o1, r1, w1), spend(price, i2, o2, r2, w2)
    both = spend(price, i1 + i2, o1 + o2, r1 + r2, w1 + w2)
    assert one is not None and two is not None
    assert both == one + two


@given(price_values, counts, counts, counts, counts)
def test_cost_is_never_negative_and_is_each_kind_at_its_own_price(
    price: Price, i: int, o: int, r: int, w: int
) -> None:
    total = spend(price, i, o, r, w)
    assert total is not None and total >= 0
    parts = [
        spend(price, i, 0, 0, 0),
        spend(price, 0, o, 0, 0),
        spend(price, 0, 0, r, 0),
        spend(price, 0, 0, 0, w),
    ]
    assert total == sum(p for p in parts if p is not None)
    assert parts[0] == price.input * i / PER and parts[3] == price.cache_write * w / PER


@given(counts, counts, counts, counts)
def test_an_unknown_price_is_an_unknown_cost_never_zero(i: int, o: int, r: int, w: int) -> None:
    assert spend(None, i, o, r, w) is None


def test_a_million_tokens_cost_the_price() -> None:
    price = Price.of({"input": 3, "output": "15", "cache_read": 0.3, "cache_write": 3.75})
    assert spend(price, PER, PER, PER, PER) == Decimal("22.05")


def test_models_are_found_by_full_name_then_by_the_name_after_the_provider() -> None:
    table = prices()
    assert price_of("anthropic:claude-sonnet-4-5", table) == BUILT_IN_PRICES["claude-sonnet-4-5"]
    assert price_of("openai:gpt-4.1-mini", table) == BUILT_IN_PRICES["gpt-4.1-mini"]
    assert price_of("scripted:ada.toml", table) is None
    assert price_of("anthropic:claude-unheard-of", table) is None
    own = Price.of({"input": 1, "output": 1, "cache_read": 1, "cache_write": 1})
    mine = prices({"openai:gpt-4.1-mini": own, "local:qwen3": own})
    assert price_of("openai:gpt-4.1-mini", mine) == own  # the full name first
    assert price_of("local:qwen3", mine) == own
    assert price_of("anthropic:claude-sonnet-4-5", mine) == BUILT_IN_PRICES["claude-sonnet-4-5"]


@pytest.mark.parametrize(
    ("figures", "says"),
    [
        ({"input": 1, "output": 1, "cache_read": 1}, "missing 'cache_write'"),
        ({"input": -1, "output": 1, "cache_read": 1, "cache_write": 1}, "input must be"),
        ({"input": "x", "output": 1, "cache_read": 1, "cache_write": 1}, "input must be"),
        ({"input": True, "output": 1, "cache_read": 1, "cache_write": 1}, "input must be"),
        ({"input": 1, "output": float("inf"), "cache_read": 1, "cache_write": 1}, "output"),
        ({"input": 1, "output": 1, "cache_read": 1, "cache_write": 1, "extra": 1}, "'extra'"),
    ],
)
def test_a_bad_price_is_refused(figures: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Price.of(figures)  # type: ignore[arg-type]
