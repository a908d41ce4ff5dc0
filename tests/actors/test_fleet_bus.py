"""The fleet's wake notices (``actors.fleet.bus``): a batch of wakes for an agent on another host
fits PostgreSQL's payload limit whatever it holds, and what arrives is read back as the wakes
that were sent (texts cut, the oldest folded into a count when they do not all fit); a notice
that is not one of ours is a ValueError, never a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.fleet.bus import MAX_PAYLOAD, WAKE_TEXT_CHARS, read_notice, wakes_payload
from actors.messages import Wake
from actors.trace import TraceEvent
from actors.transcript.lines import format_event

names = st.text(min_size=1, max_size=40)
wakes = st.builds(
    Wake,
    lane=st.sampled_from(["incoming", "push"]),
    server_id=st.one_of(st.none(), names),
    channel_id=st.one_of(st.none(), names),
    message_id=st.one_of(st.none(), names),
    thread_id=st.one_of(st.none(), names),
    count=st.integers(1, 50),
    addressed=st.booleans(),
    text=st.text(max_size=3000),
    tags=st.lists(names, max_size=20).map(tuple),
    author=st.one_of(st.none(), names),
    author_id=st.one_of(st.none(), names),
    own_of=st.frozensets(names, max_size=5),
    replies_to=st.frozensets(names, max_size=5),
    direct=st.booleans(),
    place=st.one_of(st.none(), st.sampled_from(["root", "thread", "legacy"])),
    registered=st.booleans(),
)


@given(st.lists(wakes, min_size=1, max_size=40), names, names)
def test_a_notice_fits_and_reads_back_as_the_wakes_sent(
    batch: list[Wake], host: str, agent: str
) -> None:
    payload = wakes_payload(host, agent, batch)
    assert len(payload.encode()) <= MAX_PAYLOAD
    notice = read_notice(payload)
    got_host, got_agent, got = notice.host, notice.agent, notice.wakes
    assert (got_host, got_agent) == (host, agent)
    assert 1 <= len(got) <= len(batch)
    # the newest wakes are kept; the ones folded away are counted in the first kept
    kept = batch[len(batch) - len(got) :]
    assert sum(w.count for w in got) == sum(w.count for w in batch) or len(got) == 1
    for sent, read in zip(kept[1:], got[1:], strict=True):
        assert read.text == sent.text[:WAKE_TEXT_CHARS]
        assert (read.server_id, read.channel_id, read.message_id) == (
            sent.server_id,
            sent.channel_id,
            sent.message_id,
        )
        assert (read.tags, read.own_of, read.replies_to) == (
            sent.tags,
            sent.own_of,
            sent.replies_to,
        )
        assert (read.addressed, read.direct, read.place) == (
            sent.addressed,
            sent.direct,
            sent.place,
        )


@given(st.text(min_size=1, max_size=5000), st.text(max_size=20_000))
def test_a_wake_of_any_size_still_fits(name: str, text: str) -> None:
    wake = Wake(lane="incoming", server_id=name, channel_id=name, message_id=name, text=text)
    channels = [(name, {"id": name, "label": text[:100]})]
    payload = wakes_payload(name, name, [wake, wake], channels)
    assert len(payload.encode()) <= MAX_PAYLOAD
    read = read_notice(payload).wakes
    assert sum(w.count for w in read) == 2 and {w.lane for w in read} == {"incoming"}


def test_a_small_batch_is_carried_whole() -> None:
    batch = [
        Wake(
            lane="incoming", server_id="lobby", channel_id="general", message_id=f"m{i}", text="hi"
        )
        for i in range(3)
    ]
    notice = read_notice(wakes_payload("h1", "Ada", batch))
    assert (notice.host, notice.agent, notice.wakes) == ("h1", "Ada", tuple(batch))


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "not json",
        "[]",
        json.dumps({"host": "h", "agent": "a"}),
        json.dumps({"host": "h", "agent": "a", "wakes": [{"lane": "incoming", "bogus": 1}]}),
        json.dumps({"host": "h", "agent": "a", "wakes": [{"lane": "incoming", "count": "x" * 3}]})
        .replace('"x', "[" * 5000 + '"x')
        .replace('xx"', 'xx"' + "]" * 5000),
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"host": 1, "agent": "a", "wakes": []}),
        json.dumps({"host": "h", "agent": "a", "wakes": [{"lane": "incoming", "count": "3"}]}),
        json.dumps({"host": "h", "agent": "a", "wakes": [{"lane": "incoming", "tags": [1]}]}),
        json.dumps({"host": "h", "agent": "a", "wakes": [{"lane": "push", "text": {"a": 1}}]}),
    ],
)
def test_what_is_not_a_wake_notice_is_a_value_error(payload: str) -> None:
    with pytest.raises(ValueError, match=r"not a wake notice|nested|Expecting|Extra|JSON|value"):
        read_notice(payload)


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({"state": "runs", "epoch": 3}, "· lobby: this host holds its connection (lease epoch 3)"),
        (
            {"state": "moved", "reason": "released", "epoch": 3},
            "· lobby: its connection moved: its lease was handed on (the work is spread over the"
            " hosts)",
        ),
        (
            {"state": "moved", "reason": "expired", "epoch": 3},
            "· lobby: its connection moved: its lease expired (not renewed in time)",
        ),
    ],
)
def test_a_server_lease_is_one_transcript_line(data: dict[str, object], line: str) -> None:
    assert format_event(TraceEvent(kind="server-lease", server_id="lobby", data=data)) == line


def test_a_notice_carries_the_descriptors_of_its_channels() -> None:
    wake = Wake(lane="incoming", server_id="lobby", channel_id="lobby:#general", text="hi")
    wire = {
        "id": "lobby:#general",
        "type": "chat",
        "label": "general",
        "capabilities": {"publish": {"target": "root"}},
    }
    notice = read_notice(wakes_payload("h1", "Ada", [wake], [("lobby", wire)]))
    ((sid, desc),) = notice.channels
    assert (sid, desc.id, desc.label, desc.capabilities) == (
        "lobby",
        "lobby:#general",
        "general",
        {"publish": {"target": "root"}},
    )
    # a descriptor that cannot be read costs the channels, never the wakes
    unreadable = [("lobby", {"id": ["not", "a", "name"]})]
    broken = read_notice(wakes_payload("h1", "Ada", [wake], unreadable))
    assert broken.channels == () and broken.wakes == (wake,)
