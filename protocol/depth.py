"""How deeply a wire value nests, and the bound every server value the host stores is kept under.

The store's CBOR decoder refuses values nested past a few hundred levels, so a value a server
sends is refused at its lane when it nests deeper than :data:`MAX_DEPTH`: what the host
acknowledges can always be read back. Walks are iterative (a value can nest as deep as the JSON
parser allows, near Python's recursion limit).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

#: The deepest nesting accepted in one member of a server's params: an array or object counts
#: one level, a scalar none. Far under the store codec's limit (400), leaving room for the
#: levels the host wraps a stored value in.
MAX_DEPTH = 32


def _children(value: Any) -> Iterable[Any] | None:
    kind = type(value)
    if kind is dict:  # what JSON decodes to, without the abstract checks
        mapping: dict[Any, Any] = value
        return mapping.values()
    if kind is list:
        items: list[Any] = value
        return items
    if kind in _SCALARS:
        return None
    if isinstance(value, Mapping):
        return value.values()
    if isinstance(value, list | tuple):
        return value
    return None


def _levels(value: Any) -> Iterator[int]:
    """The level of each array and object in ``value`` (``value`` itself at 1), depth first;
    lazily, so a caller that stops early walks no deeper than it looked."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        children = _children(item)
        if children is not None:
            yield level + 1
            stack.extend((child, level + 1) for child in children)


def depth(value: Any) -> int:
    """Levels of arrays and objects in ``value``: a scalar 0, ``[]`` or ``{}`` 1, ``[[]]`` 2."""
    return max(_levels(value), default=0)


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``depth(value) > limit``, without walking below ``limit + 1`` levels (so the
    recursion is at most ``limit + 1`` calls deep, whatever the value)."""
    children = _children(value)
    if children is None:
        return False
    if limit <= 0:
        return True
    for child in children:
        if type(child) in _SCALARS:  # the common case, without the calls
            continue
        if deeper_than(child, limit - 1):
            return True
    return False


_SCALARS = frozenset({str, int, float, bool, type(None)})


def too_deep_member(params: Mapping[str, Any], limit: int = MAX_DEPTH) -> str | None:
    """The name of the first member of ``params`` nested deeper than ``limit``, or None."""
    for name, value in params.items():
        if _children(value) is not None and deeper_than(value, limit):
            return str(name)
    return None
