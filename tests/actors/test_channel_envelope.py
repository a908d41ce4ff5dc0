"""What a channel freezes of an item (``actors.channel.envelope``): who gets a copy of it and
whom it wakes, for any hearers, echo author, invitations and open states."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.channel.envelope import BatchView, Envelope, copies, incoming_envelope, wakes_of
from protocol.lanes import Author, IncomingMessage

NAMES = st.sampled_from(["Ada", "Grace", "Lin", "Mo", "Noor"])
HEARERS = st.lists(NAMES, unique=True, max_size=5).map(tuple)
STORED = ({"type": "text", "text": "[header]"}, {"type": "text", "text": "hi"})


def envelope(author_agent: str | None, tags: tuple[str, ...] = ()) -> Envelope:
    msg = IncomingMessage(
        channel_id="c", message_id="m1", author=Author(id="u1", name="Uma"), content=()
    )
    return incoming_envelope(msg, "lobby", "c", tags, author_agent, None)


@given(HEARERS, st.none() | NAMES, st.sets(NAMES))
def test_every_hearer_but_the_author_gets_one_copy(
    hearers: tuple[str, ...], author_agent: str | None, invited: set[str]
) -> None:
    env = envelope(author_agent)
    records = copies(hearers, env, STORED, frozenset(invited), ("lobby", "c", "#c"), 1.0)
    assert [r.agent for r in records] == [a for a in hearers if a != author_agent]
    assert len({r.id for r in records}) == len(records)
    plain = [r for r in records if r.agent not in invited]
    for r in records:
        if r.agent in invited:  # the item, then its invitation
            assert r.blocks[: len(STORED)] == STORED and len(r.blocks) == len(STORED) + 1
            assert r.metadata["kind"] == "channel-invitation"
    # the plain copies share one blocks and metadata object: stored as one item
    assert len({id(r.blocks) for r in plain}) <= 1
    assert len({id(r.metadata) for r in plain}) <= 1


@given(HEARERS, st.sets(NAMES), st.booleans(), st.booleans())
def test_wakes_follow_echo_address_and_open_state(
    hearers: tuple[str, ...], open_for: set[str], echo: bool, addressed: bool
) -> None:
    view = BatchView(label="#c", place="exact", registered=True, open=frozenset(open_for))
    env = envelope(None, ("chat:addressed",) if addressed else ())
    blocks = [{"type": "text", "text": "x" * 3000}]
    wakes = wakes_of(
        hearers,
        view,
        env,
        server_id="lobby",
        channel_id="c",
        echo=echo,
        addressed=addressed,
        blocks=blocks,
    )
    expected = [] if echo else [a for a in hearers if addressed or a in open_for]
    assert [agent for agent, _ in wakes] == expected
    for _, wake in wakes:
        assert (wake.message_id, wake.author, wake.addressed) == ("m1", "Uma", addressed)
        assert len(wake.text) == 2000  # cut short for the gate's filters


def test_an_echo_known_by_its_receipt_is_from_self() -> None:
    assert envelope("Ada").from_self
    assert envelope(None, ("chat:from-self",)).from_self
    assert not envelope(None).from_self
