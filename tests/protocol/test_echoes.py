"""protocol.echoes: which items may be the echo of a post still waiting for its answer."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.echoes import FROM_SELF, EchoWatch, body_text
from protocol.lanes import Author, IncomingMessage, PushEvent

texts = st.text(min_size=1, max_size=20).filter(lambda t: t.strip() != "")
ids = st.text(alphabet="abcdefgh0123456789", min_size=1, max_size=6)


def blocks(text: str) -> tuple[dict[str, Any], ...]:
    return ({"type": "text", "text": text},)


def message(text: str, author: str = "u1", tags: tuple[str, ...] = ()) -> IncomingMessage:
    return IncomingMessage(
        channel_id="c", message_id="m", author=Author(id=author), content=blocks(text), tags=tags
    )


@given(texts, ids)
def test_nothing_pending_and_no_own_account_holds_nothing_untagged(text: str, author: str) -> None:
    assert not EchoWatch(4).may_be_echo(message(text, author))


@given(texts, texts, ids)
def test_an_item_waits_exactly_when_its_text_is_a_pending_posts(
    posted: str, said: str, author: str
) -> None:
    watch = EchoWatch(4)
    token = watch.begin(blocks(posted))
    assert watch.pending == 1
    assert watch.may_be_echo(message(said, author)) == (posted.strip() == said.strip())
    watch.end(token)
    assert watch.pending == 0
    assert not watch.may_be_echo(message(said, author))  # settled: nothing left to catch


@given(st.lists(texts, max_size=8), st.randoms())
def test_every_publish_ended_leaves_nothing_pending(posted: list[str], rnd: Any) -> None:
    watch = EchoWatch(4)
    tokens = [watch.begin(blocks(t)) for t in posted]
    assert watch.pending == len(posted)
    rnd.shuffle(tokens)
    for n, token in enumerate(tokens, 1):
        watch.end(token)
        assert watch.pending == len(posted) - n
    assert not any(watch.may_be_echo(message(t)) for t in posted)


@given(texts, ids)
def test_a_message_tagged_from_self_may_always_be_the_echo(text: str, author: str) -> None:
    assert EchoWatch(4).may_be_echo(message(text, author, tags=(FROM_SELF,)))


@given(texts, texts)
def test_a_push_event_is_never_held(text: str, posted: str) -> None:
    watch = EchoWatch(4)
    watch.begin(blocks(posted))
    event = PushEvent(
        feature_set="f",
        event_id="e",
        timestamp="",
        payload_content=blocks(posted),
        tags=(FROM_SELF,),
    )
    assert not watch.may_be_echo(event)
    assert watch.may_hold([event, message(posted)])
    assert not watch.may_hold([event])


@given(st.lists(ids, min_size=1, max_size=30), st.integers(min_value=1, max_value=5), texts)
def test_own_accounts_keep_the_most_recent_up_to_the_cap(
    seen: list[str], cap: int, text: str
) -> None:
    watch = EchoWatch(cap)
    watch.seen("stranger", own=False)
    for author in seen:
        watch.seen(author, own=True)
    recent = list(dict.fromkeys(reversed(seen)))[:cap]
    held = {a for a in set(seen) | {"stranger"} if watch.may_be_echo(message(text, a))}
    assert held == set(recent)


def test_an_empty_body_never_matches_an_empty_post() -> None:
    watch = EchoWatch(4)
    watch.begin(blocks("  "))
    assert not watch.may_be_echo(message(" "))
    assert body_text([{"type": "image"}, {"type": "text", "text": " a "}, "x"]) == "a"
