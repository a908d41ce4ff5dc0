"""Event tags (MCPL §16): validation and the normative ``chat:*`` closure.

Tags describe; they never authorize. The closure is applied transitively and additively without
consulting any producer ontology; then ``chat:ambient`` is dropped when ``chat:addressed`` is
present.
"""

from __future__ import annotations

from collections.abc import Iterable

import regex

#: ``namespace:value`` or ``namespace:key=value``; the namespace is required and non-empty.
_TAG = regex.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*:[^\s]+")

CORE_IMPLIES: dict[str, tuple[str, ...]] = {
    "chat:mention": ("chat:addressed",),
    "chat:reply": ("chat:addressed",),
    "chat:dm": ("chat:addressed", "chat:private"),
}

MAX_TAGS = 64
MAX_TAG_LENGTH = 256


def valid_tag(tag: object) -> bool:
    return isinstance(tag, str) and len(tag) <= MAX_TAG_LENGTH and _TAG.fullmatch(tag) is not None


def expand_tags(tags: Iterable[object]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return ``(expanded, refused)``: the closed, deduplicated, sorted set and what was dropped.

    At most ``MAX_TAGS`` valid tags are kept (the rest are refused): a tag set is a hint, and an
    unbounded one would be a way to bloat every stored item.
    """
    if type(tags) is tuple and not tags:  # most items carry no tags
        return (), ()
    kept: set[str] = set()
    refused: list[str] = []
    for tag in tags:
        if valid_tag(tag) and (tag in kept or len(kept) < MAX_TAGS):
            assert isinstance(tag, str)
            kept.add(tag)
        else:
            refused.append(str(tag)[:MAX_TAG_LENGTH])
    todo = list(kept)
    while todo:
        for implied in CORE_IMPLIES.get(todo.pop(), ()):
            if implied not in kept:
                kept.add(implied)
                todo.append(implied)
    if "chat:addressed" in kept:
        kept.discard("chat:ambient")
    return tuple(sorted(kept)), tuple(refused)


def is_addressed(tags: Iterable[str]) -> bool:
    if not isinstance(tags, tuple | list | set | frozenset):
        tags = tuple(tags)
    return "chat:addressed" in tags or "chat:mention" in tags
