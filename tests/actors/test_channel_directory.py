"""The host's channel directory: label history, open/closed resolution, the snapshots listings
read and the views a turn resolves targets with, registrations of channels without an actor,
and the saved open/closed states read once from a real store."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors import directory as channel_directory
from actors.directory import (
    OPEN_STATE_NS,
    ChannelDirectory,
    SavedOpen,
    is_open,
    open_state_key,
    with_label,
)
from actors.kernel import Work
from actors.storage import StoreClient
from protocol.lanes import ChannelDescriptor
from protocol.routes import LEGACY
from store import PutState

labels = st.text(alphabet="ab", max_size=2)


@given(st.lists(labels, max_size=60))
def test_label_history_is_the_newest_distinct_labels_in_order(names: list[str]) -> None:
    history: list[str] = []
    for name in names:
        before = list(history)
        history = with_label(history, name)
        if not name or (before and before[-1] == name):
            assert history == before  # an empty or unchanged label adds nothing
        else:
            assert history == [*before, name][-channel_directory.MAX_LABELS :]
        assert len(history) <= channel_directory.MAX_LABELS
        assert all(a != b for a, b in itertools.pairwise(history))


@given(
    st.dictionaries(st.sampled_from(["Ada", "Bo"]), st.booleans()),
    st.sampled_from(["Ada", "Bo"]),
    st.sampled_from([None, True, False]),
)
def test_a_saved_choice_wins_over_the_descriptor(
    saved: dict[str, bool], agent: str, initially: bool | None
) -> None:
    desc = ChannelDescriptor(id="c", initially_open=initially)
    expected = saved[agent] if agent in saved else initially is not False
    assert is_open(saved, agent, desc) is expected
    assert is_open(saved, agent, None) is saved.get(agent, True)


class Config:
    """The part of a HostConfig the directory reads."""

    def __init__(self, undeclared: set[str] | None = None) -> None:
        self.undeclared = undeclared or set()

    def publish_undeclared(self, sid: str) -> bool:
        return sid in self.undeclared


def desc(cid: str, label: str = "", place: str | None = "root", **more: Any) -> ChannelDescriptor:
    caps = {"publish": {"target": place}} if place is not None else None
    return ChannelDescriptor(id=cid, type="chat", label=label, capabilities=caps, **more)


channel_ids = st.text(alphabet="xyz", min_size=1, max_size=3)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["s1", "s2", "s3"]),
            channel_ids,
            st.booleans(),  # registered (False: removed since)
            st.sampled_from([None, "root", "exact"]),
        ),
        max_size=20,
    )
)
def test_views_are_the_registered_snapshots_in_order(
    entries: list[tuple[str, str, bool, str | None]],
) -> None:
    directory = ChannelDirectory()
    config = Config(undeclared={"s2"})
    for sid, cid, registered, place in entries:
        directory.register(sid, desc(cid, f"#{cid}", place), {"Ada": True}, False)
        if not registered:
            assert directory.unregister(sid, cid)
    views, places = directory.views(["s2", "s1"], config)
    infos = directory.infos(["s1", "s2"], config)
    assert [(v.server_id, v.channel_id) for v in views] == [
        (i.server_id, i.channel_id) for i in infos if i.registered
    ]
    assert [(v.server_id, v.channel_id) for v in views] == sorted(
        (v.server_id, v.channel_id) for v in views
    )
    for info in infos:
        assert info.server_id in ("s1", "s2")
        expected = info.declared or (LEGACY if info.server_id == "s2" else None)
        assert info.place == expected
        if info.registered:
            assert places[(info.server_id, info.channel_id)] == expected
    # the views a turn is handed are its own: changing them changes no later answer
    views.clear()
    places.clear()
    again, _ = directory.views(["s1", "s2"], config)
    assert len(again) == sum(1 for i in infos if i.registered)


def test_a_reload_of_publish_undeclared_shows_in_the_next_read() -> None:
    directory = ChannelDirectory()
    directory.register("s1", desc("plain", "plain", None), {}, False)
    assert directory.views(["s1"], Config())[1] == {("s1", "plain"): None}
    assert directory.views(["s1"], Config({"s1"}))[1] == {("s1", "plain"): LEGACY}
    info = directory.get("s1", "plain", True)
    assert info is not None and info.place == LEGACY


def test_a_registration_is_handed_over_once_and_keeps_its_labels() -> None:
    directory = ChannelDirectory()
    directory.register("s1", desc("c", "one"), {}, False)
    directory.register("s1", desc("c", "two"), {}, False)
    assert directory.count("s1") == 1
    taken = directory.take("s1", "c")
    assert taken is not None and taken.labels == ("one", "two") and taken.registered
    assert directory.take("s1", "c") is None  # the actor owns it now
    assert not directory.unregister("s1", "c")  # so a removal goes to the actor
    info = directory.get("s1", "c", False)
    assert info is not None and info.labels == ("one", "two")
    directory.forget("s1", "c")
    assert directory.count("s1") == 0 and directory.get("s1", "c", False) is None


def test_a_removed_channel_stays_listed_as_not_registered() -> None:
    directory = ChannelDirectory()
    directory.register("s1", desc("c", "c"), {}, False)
    assert directory.unregister("s1", "c")
    (info,) = directory.infos(["s1"], Config())
    assert info.registered is False
    assert directory.views(["s1"], Config()) == ([], {})
    taken = directory.take("s1", "c")
    assert taken is not None and taken.registered is False


async def saved_open(tmp_path: Path, states: dict[tuple[str, str, str], bool]) -> SavedOpen:
    store = StoreClient(tmp_path / "data", Work())
    store.start()
    for (agent, sid, cid), value in states.items():
        key = open_state_key(agent, sid, cid)
        await store.write(PutState(namespace=OPEN_STATE_NS, key=key, value=value))
    return SavedOpen(store, {"s1": ("Ada", "Bo"), "s2": ("Ada",)})


STATES = {
    ("Ada", "s1", "a"): False,
    ("Bo", "s1", "a"): True,
    ("Ada", "s1", "b\x1fwith a separator"): False,
    ("Ada", "s2", "c"): False,
    ("Bo", "s2", "c"): False,  # Bo does not hear s2: not kept
    ("Cy", "s1", "a"): False,  # nor an agent no longer configured
}


@pytest.mark.parametrize("cap", [50_000, 1])
async def test_saved_states_are_each_channels_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int
) -> None:
    monkeypatch.setattr(channel_directory, "MAX_SAVED_CHANNELS", cap)
    saved = await saved_open(tmp_path, STATES)
    try:
        assert await saved.of_channel("s1", "a") == {"Ada": False, "Bo": True}
        assert await saved.of_channel("s1", "b\x1fwith a separator") == {"Ada": False}
        assert await saved.of_channel("s2", "c") == {"Ada": False}
        assert await saved.of_channel("s1", "none") == {}
        # a change written since is what a channel starting later gets
        await saved.store.write(
            PutState(namespace=OPEN_STATE_NS, key=open_state_key("Ada", "s2", "c"), value=True)
        )
        saved.note("Ada", "s2", "c", True)
        assert await saved.of_channel("s2", "c") == {"Ada": True}
    finally:
        await saved.store.aclose()


async def test_the_store_is_read_once_below_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = await saved_open(tmp_path, STATES)
    reads: list[str] = []
    state = saved.store.reader.state

    def counted(namespace: str) -> dict[str, Any]:
        reads.append(namespace)
        return state(namespace)

    monkeypatch.setattr(saved.store.reader, "state", counted)
    try:
        for cid in ("a", "none", "a", "other"):
            await saved.of_channel("s1", cid)
        assert reads == [OPEN_STATE_NS]
    finally:
        await saved.store.aclose()
