"""What the host knows of its channels as a whole, read without asking each channel actor.

``ChannelDirectory`` holds each known channel's latest ``ChannelInfo``, per server: an immutable
snapshot replaced only by the channel's owner. Listings (``channels/list``, the ``channel_list``
tool, the channels a turn may speak to) read these instead of asking every channel. The place
prose may go (RFC-011) is worked out when read, from the config in force, since a reload may
change a server's ``publish_undeclared``.

A registered channel gets its actor (a task, a mailbox) only when something needs it: an item
arrives on it, an agent speaks to it, opens or closes it. Until then the directory owns its
``Registration`` (descriptor, label history, registered or removed) and publishes its snapshot;
the actor takes the registration over when it starts. So a server may register many channels
that stay quiet at the cost of a few small objects each. At most one entry per channel, and at
most ``MAX_CHANNELS_PER_SERVER`` channels per server (``actors.context``).

``SavedOpen`` holds the agents' saved open/closed state of the channels (the store's
``channel_open`` namespace): read from the store once, when the first channel needs it, and kept
in step with every change written since. It keeps at most ``MAX_SAVED_CHANNELS`` channels; for a
channel left out at that cap (a store holding more), the store is read again when it is needed
(slower, never wrong).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from protocol.lanes import ChannelDescriptor
from protocol.prose import ChannelView
from protocol.routes import declared_target, speech_place

from .messages import ChannelInfo
from .storage import StoreClient

OPEN_STATE_NS = "channel_open"
MAX_SAVED_CHANNELS = 50_000  # channels whose saved open/closed state is kept in memory
MAX_LABELS = 32  # label history of a channel; oldest forgotten first

Places = dict[tuple[str, str], str | None]


def open_state_key(agent: str, server_id: str, channel_id: str | None) -> str:
    """The store key of one agent's open/closed state of one channel."""
    return f"{agent}\x1f{server_id}\x1f{channel_id}"


def with_label(labels: Sequence[str], label: str) -> list[str]:
    """The label history after a descriptor naming ``label`` (newest last, at most
    ``MAX_LABELS``; an empty label or the current one adds nothing)."""
    out = list(labels)
    if label and (not out or out[-1] != label):
        out.append(label)
        del out[:-MAX_LABELS]
    return out


def is_open(saved: Mapping[str, bool], agent: str, desc: ChannelDescriptor | None) -> bool:
    """Whether a channel is open for ``agent``: its saved choice, else the descriptor's
    ``initiallyOpen`` (open unless it says false)."""
    if agent in saved:
        return saved[agent]
    return not (desc is not None and desc.initially_open is False)


def wire_of(channel_id: str, desc: ChannelDescriptor | None) -> dict[str, Any]:
    """What a snapshot shows of a channel's descriptor (``ChannelInfo.descriptor``)."""
    wire: dict[str, Any] = {"id": channel_id}
    if desc is not None:
        wire.update({"type": desc.type, "label": desc.label, "direction": desc.direction})
        if desc.address is not None:
            wire["address"] = desc.address
    return wire


def describe(
    server_id: str,
    channel_id: str,
    desc: ChannelDescriptor | None,
    labels: Sequence[str],
    registered: bool,
    open_for: Mapping[str, bool],
    publish_undeclared: bool,
) -> ChannelInfo:
    """A channel's snapshot; ``open_for`` has every agent hearing its server."""
    wire = wire_of(channel_id, desc)
    declared = None if desc is None else declared_target(desc.capabilities)
    return ChannelInfo(
        server_id=server_id,
        channel_id=channel_id,
        label=labels[-1] if labels else "",
        labels=tuple(labels),
        type=desc.type if desc else "",
        registered=registered,
        open_for=dict(open_for),
        descriptor=wire,
        place=speech_place(declared, publish_undeclared),
        declared=declared,
    )


@attrs.frozen
class Registration:
    """A channel whose actor has not started: what its server registered."""

    descriptor: ChannelDescriptor
    labels: tuple[str, ...]
    registered: bool = True


class ChannelDirectory:
    def __init__(self) -> None:
        self._infos: dict[str, dict[str, ChannelInfo]] = {}
        self._idle: dict[tuple[str, str], Registration] = {}  # channels without an actor
        # per server: (publish_undeclared it was built with, its registered channels' views
        # sorted by id, their places); dropped whenever one of its channels changes
        self._views: dict[str, tuple[bool, tuple[ChannelView, ...], Places]] = {}

    def publish(self, info: ChannelInfo) -> None:
        """Replace a channel's snapshot (by its owner only)."""
        if info.channel_id is None:
            return
        self._infos.setdefault(info.server_id, {})[info.channel_id] = info
        self._views.pop(info.server_id, None)

    def forget(self, server_id: str, channel_id: str | None) -> None:
        """A channel's actor ended: what is known of the channel goes with it."""
        infos = self._infos.get(server_id)
        if infos is None or channel_id is None:
            return
        infos.pop(channel_id, None)
        self._idle.pop((server_id, channel_id), None)
        if not infos:
            del self._infos[server_id]
        self._views.pop(server_id, None)

    def count(self, server_id: str) -> int:
        """The server's known channels (with an actor or not)."""
        return len(self._infos.get(server_id, ()))

    def knows(self, server_id: str, channel_id: str) -> bool:
        return channel_id in self._infos.get(server_id, ())

    # -- channels without an actor -------------------------------------------------------------
    def register(
        self,
        server_id: str,
        desc: ChannelDescriptor,
        open_for: Mapping[str, bool],
        publish_undeclared: bool,
    ) -> None:
        """Put a descriptor in force for a channel that has no actor; ``open_for`` says whether
        it is open for each agent hearing its server."""
        key = (server_id, desc.id)
        old = self._idle.get(key)
        labels = tuple(with_label(old.labels if old is not None else (), desc.label))
        self._idle[key] = Registration(descriptor=desc, labels=labels)
        self.publish(describe(server_id, desc.id, desc, labels, True, open_for, publish_undeclared))

    def unregister(self, server_id: str, channel_id: str) -> bool:
        """Mark a channel without an actor removed; False if it has one (tell the actor)."""
        old = self._idle.get((server_id, channel_id))
        info = self._infos.get(server_id, {}).get(channel_id)
        if old is None or info is None:
            return False
        self._idle[(server_id, channel_id)] = attrs.evolve(old, registered=False)
        self.publish(attrs.evolve(info, registered=False))
        return True

    def take(self, server_id: str, channel_id: str | None) -> Registration | None:
        """Hand a channel's registration to its actor, which owns it from now on."""
        if channel_id is None:
            return None
        return self._idle.pop((server_id, channel_id), None)

    # -- reading -------------------------------------------------------------------------------
    def get(self, server_id: str, channel_id: str, publish_undeclared: bool) -> ChannelInfo | None:
        info = self._infos.get(server_id, {}).get(channel_id)
        return None if info is None else _current(info, publish_undeclared)

    def infos(self, servers: Iterable[str], config: Any) -> list[ChannelInfo]:
        """The snapshots of every channel of ``servers``, by server, then channel id."""
        out: list[ChannelInfo] = []
        for sid in sorted(set(servers)):
            infos = self._infos.get(sid)
            if infos:
                flag = bool(config.publish_undeclared(sid))
                out.extend(_current(infos[cid], flag) for cid in sorted(infos))
        return out

    def first(self, server_id: str, config: Any, limit: int) -> tuple[list[ChannelInfo], int]:
        """The snapshots of a server's first ``limit`` channels by id, and how many it has."""
        infos = self._infos.get(server_id)
        if not infos:
            return [], 0
        flag = bool(config.publish_undeclared(server_id))
        ids = heapq.nsmallest(limit, infos) if len(infos) > limit else sorted(infos)
        return [_current(infos[cid], flag) for cid in ids], len(infos)

    def views(self, servers: Iterable[str], config: Any) -> tuple[list[ChannelView], Places]:
        """The registered channels of ``servers`` as a turn resolves targets (by server, then
        channel id) and the place prose may go in each; rebuilt for a server only after one
        of its channels changed."""
        views: list[ChannelView] = []
        places: Places = {}
        for sid in sorted(set(servers)):
            if sid not in self._infos:
                continue
            flag = bool(config.publish_undeclared(sid))
            cached = self._views.get(sid)
            if cached is None or cached[0] != flag:
                cached = self._views[sid] = self._build(sid, flag)
            views.extend(cached[1])
            places.update(cached[2])
        return views, places

    def _build(self, sid: str, flag: bool) -> tuple[bool, tuple[ChannelView, ...], Places]:
        infos = self._infos[sid]
        views: list[ChannelView] = []
        places: Places = {}
        for cid in sorted(infos):
            info = infos[cid]
            if not info.registered:
                continue
            view = ChannelView(server_id=sid, channel_id=cid, label=info.label, type=info.type)
            views.append(view)
            places[(sid, cid)] = speech_place(info.declared, flag)
        return flag, tuple(views), places


def _current(info: ChannelInfo, publish_undeclared: bool) -> ChannelInfo:
    """``info`` with the place prose may go as the config in force says."""
    place = speech_place(info.declared, publish_undeclared)
    return info if place == info.place else attrs.evolve(info, place=place)


class SavedOpen:
    def __init__(self, store: StoreClient, hearing: Mapping[str, tuple[str, ...]]) -> None:
        self.store = store
        self._hearing = hearing  # server -> the agents hearing it (the saved keys worth keeping)
        self._saved: dict[tuple[str, str], dict[str, bool]] = {}
        self._complete = True  # False once a channel's state was left out at the cap
        self._loaded = False
        self._lock = trio.Lock()

    async def of_channel(self, server_id: str, channel_id: str) -> dict[str, bool]:
        """Each agent's saved open/closed state of a channel (agents without one left out);
        the first call reads the store, later ones only when the channel was left out."""
        if not self._loaded:
            async with self._lock:
                if not self._loaded:
                    self._take(await self._read())
                    self._loaded = True
        found = self._saved.get((server_id, channel_id))
        if found is not None:
            return dict(found)
        if self._complete:
            return {}
        saved = await self._read()  # left out at the cap: read again, for this channel only
        out: dict[str, bool] = {}
        for agent in self._hearing.get(server_id, ()):
            value = saved.get(open_state_key(agent, server_id, channel_id))
            if isinstance(value, bool):
                out[agent] = value
        return out

    def note(self, agent: str, server_id: str, channel_id: str, value: bool) -> None:
        """An agent's state of a channel was written (and is durable)."""
        self._keep(server_id, channel_id, agent, value)

    async def _read(self) -> dict[str, Any]:
        return await self.store.read(self.store.reader.state, OPEN_STATE_NS)

    def _take(self, saved: Mapping[str, Any]) -> None:
        for key, value in saved.items():
            parts = key.split("\x1f", 2)
            if len(parts) != 3 or not isinstance(value, bool):
                continue
            agent, sid, cid = parts
            if agent in self._hearing.get(sid, ()):
                self._keep(sid, cid, agent, value, overwrite=False)

    def _keep(self, sid: str, cid: str, agent: str, value: bool, *, overwrite: bool = True) -> None:
        states = self._saved.get((sid, cid))
        if states is None:
            if len(self._saved) >= MAX_SAVED_CHANNELS:
                self._complete = False
                return
            states = self._saved[(sid, cid)] = {}
        if overwrite or agent not in states:
            states[agent] = value
