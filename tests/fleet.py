"""A fleet of ``mcplive`` hosts on one PostgreSQL database, run as an operator runs one, for the
fleet's integration tests (``tests/integration/test_fleet.py``).

* :func:`lobby_sessions`: one websocket test lobby (``python -m tests.lobby --ws``), its process
  started once; every host that connects to it opens a session of its own, with a control
  connection of its own (:class:`Session`). Each session's events are read in a background
  task into an unbounded list, so that a test can count what every host connection received
  and acknowledged.
* :class:`FleetRun`: ``mcplive run --json --log-level debug CONFIG`` per host, each in a
  process group of its own (its store's child processes are signalled with it), with its own
  data dir and ``[host] host_id``, all on one ``[host] store`` and dialing the lobby by ``url``.
  Each host's trace (one JSON event per line) is read in a background task into
  :attr:`FleetHost.events`. A host can be killed (``SIGKILL``), paused (``SIGSTOP``) and resumed
  (``SIGCONT``); :meth:`FleetRun.aclose` stops every host (``SIGINT``, then ``SIGKILL``).
* Bounded waits: :meth:`FleetRun.until` and :meth:`LobbySessions.until` wake on each new event
  and check a condition (no polling); :meth:`FleetRun.until_fleet` polls
  :func:`store.leases.read_fleet` every :data:`POLL_S`. Each raises an ``AssertionError`` that
  describes the fleet when its time is up.
* What the tests read afterwards: :func:`turns` (each agent's turns, by host and lease epoch,
  from the ``turn-start`` / ``turn-end`` / ``turn-aborted`` / ``agent-lease`` events),
  :func:`overlapping_turns` and :func:`epochs_going_back`, and :func:`stored_messages` (the
  store's messages with their search text, read from PostgreSQL directly).

Times in events (``at``, from each line's ``ts``, to the millisecond) are each process's wall
clock; every process runs on this machine, so they compare. A host's JSON trace is one of its
trace's subscribers: one that falls behind loses the events of its busiest source first (a
``trace-dropped`` event says how many), so a test counting events should keep its hosts' load
light where it counts them. The printer also collapses repeats of the kinds that are not the
agents' own work (three of a shape per source in ten seconds, then a ``collapsed`` count):
``turn-start`` and ``turn-end`` are never collapsed; ``agent-lease``, ``ready`` and
``turn-aborted`` are, which a test that moves one agent more than three times in ten seconds
would have to allow for.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from protocol.leases import Lease
from store.errors import StoreError
from store.leases import Fleet, read_fleet
from tests.cli_helpers import MCPLIVE, child_env
from tests.helpers import ws_lobby
from tests.lobby.control import ControlClosed, LobbyControl, open_control_listener

T = TypeVar("T")

#: The lobby's server id in every host's config, and its channel the tests talk in.
SERVER_ID = "lobby"
GENERAL = "lobby:#general"
#: The default bound of a wait (generous: the machine may be loaded).
WAIT_S = 60.0
#: How often :meth:`FleetRun.until_fleet` reads the lease table.
POLL_S = 0.1
#: How long a clean stop of the hosts may take before they are killed.
STOP_WAIT_S = 20.0
#: The kinds of events that end a turn on its host.
TURN_ENDS = frozenset({"turn-end", "turn-aborted"})


# -- configs -------------------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    raise TypeError(f"no TOML for {value!r}")


def toml_text(cfg: Mapping[str, Any]) -> str:
    """A config of ``[host]`` keys and ``[[servers]]`` / ``[[agents]]`` entries as TOML."""
    lines = ["[host]", *(f"{k} = {toml_value(v)}" for k, v in cfg["host"].items())]
    for table in ("servers", "agents"):
        for entry in cfg.get(table, ()):
            lines += ["", f"[[{table}]]", *(f"{k} = {toml_value(v)}" for k, v in entry.items())]
    return "\n".join(lines) + "\n"


def scripted_agent(folder: Path, name: str, rules: Sequence[tuple[str, str]], **keys: Any) -> dict:
    """An agent entry with a scripted model whose rules are ``(when, say)`` pairs."""
    text = "".join(
        f"[[rules]]\nwhen = {toml_value(when)}\nsay = {toml_value(say)}\n\n" for when, say in rules
    )
    path = folder / f"{name.lower()}.toml"
    path.write_text(text, encoding="utf-8")
    return {"name": name, "model": f"scripted:{path}", **keys}


# -- the lobby and its sessions --------------------------------------------------------------------


def _incoming_id(event: Mapping[str, Any]) -> str | None:
    """The message id of a ``channels/incoming`` request a ``response`` event reports."""
    if event.get("event") != "response" or event["request"].get("method") != "channels/incoming":
        return None
    messages = event["request"]["params"].get("messages") or [{}]
    return messages[0].get("messageId")


async def _until(
    changed: Callable[[], trio.Event],
    check: Callable[[], T | None],
    what: str,
    timeout: float,
    describe: Callable[[], str],
) -> T:
    """``check()`` once it is truthy, checked again each time the event ``changed()`` gives is
    set; an AssertionError naming ``what`` and ``describe()`` after ``timeout``."""
    with trio.move_on_after(timeout):
        while True:
            event = changed()
            found = check()
            if found:
                return found
            await event.wait()
    raise AssertionError(f"no {what}; {describe()}")


@attrs.define(eq=False)
class Session:
    """One host connection to the lobby: its control connection and every event it sent."""

    ctl: LobbyControl
    accepted_at: float
    events: list[dict[str, Any]] = attrs.Factory(list)
    closed_at: float | None = None
    ready: bool = False  # the host's link is ready and the lobby's channels are registered
    #: the message ids of the ``channels/incoming`` requests the host answered with a result
    #: (not an error, not cut off by the end of the connection)
    acked: set[str] = attrs.Factory(set)
    #: each ``channels/publish`` the host sent: (channel, its text)
    published: list[tuple[str, str]] = attrs.Factory(list)

    @property
    def live(self) -> bool:
        return self.closed_at is None

    def add(self, e: dict[str, Any]) -> None:
        """Keep one event (and what it says)."""
        self.events.append(e)
        if e.get("event") == "response":
            method = e["request"].get("method")
            if method == "channels/register":
                self.ready = True
            mid = _incoming_id(e)
            if (
                mid is not None
                and isinstance(e.get("response"), dict)
                and "result" in e["response"]
            ):
                self.acked.add(mid)
        message = e.get("message") if e.get("event") == "received" else None
        if isinstance(message, dict) and message.get("method") == "channels/publish":
            params = message.get("params") or {}
            text = " ".join(b.get("text", "") for b in params.get("content") or [])
            self.published.append((str(params.get("channelId")), text))

    def acknowledged(self) -> set[str]:
        return set(self.acked)

    def publishes(self) -> list[tuple[str, str]]:
        return list(self.published)

    def send_incoming(self, channel: str, message_id: str, text: str) -> None:
        cmd = {"cmd": "incoming", "channelId": channel, "messageId": message_id, "text": text}
        self.ctl.send(cmd)

    def describe(self) -> str:
        state = "live" if self.live else "closed"
        return (
            f"session accepted at {self.accepted_at:.3f} ({state}, ready={self.ready}, "
            f"{len(self.events)} events, {len(self.acked)} acknowledged)"
        )


class LobbySessions:
    """The sessions of one lobby process (see the module), in the order they connected."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sessions: list[Session] = []
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def live(self) -> list[Session]:
        return [s for s in self.sessions if s.live]

    def publishes(self) -> list[tuple[str, str]]:
        """Every publish any host connection sent, session after session."""
        return [p for s in self.sessions for p in s.published]

    def acknowledged(self) -> set[str]:
        return set().union(*(s.acked for s in self.sessions))

    def server_config(self) -> dict[str, Any]:
        return {"id": SERVER_ID, "url": self.url}

    async def until(self, check: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
        """``check()`` once it is truthy, checked again at each event of any session."""
        return await _until(
            lambda: self._changed,
            check,
            f"{what} within {timeout:g}s",
            timeout,
            lambda: f"lobby: {self.describe()}",
        )

    async def sole_ready(self, timeout: float = WAIT_S) -> Session:
        """The one live session, once it is ready (asserting no other is live)."""

        def ready() -> Session | None:
            live = self.live()
            return live[0] if len(live) == 1 and live[0].ready else None

        await self.until(lambda: any(s.ready for s in self.live()), "ready session", timeout)
        found = ready()
        assert found is not None, f"more than one host connected to the lobby: {self.describe()}"
        return found

    def describe(self) -> str:
        return "; ".join(s.describe() for s in self.sessions) or "no session"

    async def _pump(self, session: Session) -> None:
        seen = 0
        try:
            while True:
                event = await session.ctl.wait_for(
                    lambda e: True, "an event", timeout=None, since=seen
                )
                seen += 1
                session.add(event)
                self._notify()
        except ControlClosed:
            pass
        finally:
            session.closed_at = time.time()
            self._notify()

    async def _accept(self, listener: Any, nursery: trio.Nursery) -> None:
        while True:
            ctl = await listener.accept(timeout=None)
            session = Session(ctl, time.time())
            self.sessions.append(session)
            nursery.start_soon(self._pump, session)
            self._notify()


@asynccontextmanager
async def lobby_sessions(*extra: str) -> AsyncIterator[LobbySessions]:
    """A websocket lobby started once; every session a host opens is accepted and read."""
    async with (
        open_control_listener() as listener,
        ws_lobby("--control-connect", listener.address, *extra) as url,
        trio.open_nursery() as nursery,
    ):
        sessions = LobbySessions(url)
        nursery.start_soon(sessions._accept, listener, nursery)
        try:
            yield sessions
        finally:
            nursery.cancel_scope.cancel()
            for session in sessions.sessions:
                with trio.CancelScope(shield=True):
                    await session.ctl.aclose()


# -- the hosts -----------------------------------------------------------------------------------


def parse_event(raw: bytes) -> dict[str, Any]:
    """One line of ``mcplive run --json``, with ``at``: its ``ts`` in seconds since the epoch
    (a line that is not an event is kept as an ``unparsed`` one)."""
    try:
        event = json.loads(raw)
        event["at"] = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()
    except (ValueError, TypeError, KeyError, AttributeError):
        line = raw.decode(errors="replace")
        return {"kind": "unparsed", "at": time.time(), "data": {"line": line}}
    return event


@attrs.define(eq=False)
class FleetHost:
    """One host process and the trace events it printed, in order."""

    host_id: str
    config: Path
    data_dir: Path
    stderr: Path
    proc: trio.Process
    events: list[dict[str, Any]] = attrs.Factory(list)
    ended: trio.Event = attrs.Factory(trio.Event)
    killed_at: float | None = None
    paused: bool = False

    def of(self, kind: str, agent: str | None = None, **data: Any) -> list[dict[str, Any]]:
        """Its events of ``kind`` (about ``agent``, whose ``data`` has the given values)."""
        return [
            e
            for e in self.events
            if e.get("kind") == kind
            and (agent is None or e.get("agent") == agent)
            and all(e.get("data", {}).get(k) == v for k, v in data.items())
        ]

    def running(self) -> dict[str, int]:
        """The agents its ``agent-lease`` events say run here, with their epochs."""
        out: dict[str, int] = {}
        for e in self.of("agent-lease"):
            if e["data"].get("state") == "runs":
                out[e["agent"]] = e["data"].get("epoch")
            else:
                out.pop(e["agent"], None)
        return out

    def signal(self, sig: int) -> None:
        """``sig`` to the host's process group (it and its store's children)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stderr_tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe(self) -> str:
        if self.killed_at is not None:
            state = "killed"
        elif self.ended.is_set():
            state = f"exited {self.proc.returncode}"
        else:
            state = "paused" if self.paused else "running"
        kinds = [e.get("kind") for e in self.events[-8:]]
        tail = self.stderr_tail(5)
        return (
            f"{self.host_id} ({state}; agents {self.running()}; {len(self.events)} events, "
            f"last {kinds})" + (f"\n  stderr: {tail}" if tail else "")
        )


class FleetRun:
    """Hosts started with :meth:`start` in ``nursery`` (see the module)."""

    def __init__(self, nursery: trio.Nursery, folder: Path, dsn: str, lobby: LobbySessions):
        self.nursery = nursery
        self.folder = folder
        self.dsn = dsn
        self.lobby = lobby
        self.hosts: dict[str, FleetHost] = {}
        self._changed = trio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def start(
        self, host_id: str, agents: Sequence[Mapping[str, Any]], **host_keys: Any
    ) -> FleetHost:
        """Start host ``host_id`` running ``agents`` (entries of ``[[agents]]``)."""
        folder = self.folder / host_id
        folder.mkdir(parents=True, exist_ok=True)
        data_dir = folder / "data"
        cfg = {
            "host": {
                "data_dir": str(data_dir),
                "store": self.dsn,
                "host_id": host_id,
                **host_keys,
            },
            "servers": [self.lobby.server_config()],
            "agents": list(agents),
        }
        config = folder / "mcplive.toml"
        config.write_text(toml_text(cfg), encoding="utf-8")
        stderr = folder / "stderr.log"
        with stderr.open("wb") as err:
            proc = await trio.lowlevel.open_process(
                [*MCPLIVE, "run", "--json", "--log-level", "debug", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=folder,
                env=child_env(),
                start_new_session=True,
            )
        host = FleetHost(host_id, config, data_dir, stderr, proc)
        self.hosts[host_id] = host
        self.nursery.start_soon(self._read, host)
        return host

    async def _read(self, host: FleetHost) -> None:
        stdout = host.proc.stdout
        assert stdout is not None
        buf = b""
        try:
            while chunk := await stdout.receive_some(1 << 16):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for raw in lines:
                    if not raw.strip():
                        continue
                    host.events.append(parse_event(raw))
                if lines:
                    self._notify()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await host.proc.wait()
            host.ended.set()
            self._notify()

    # -- what the hosts said -------------------------------------------------------------------

    def events(self, kind: str | None = None, agent: str | None = None) -> list[tuple[str, dict]]:
        """Every host's events (of ``kind``, about ``agent``) as (host id, event), host by host."""
        return [
            (h.host_id, e)
            for h in self.hosts.values()
            for e in h.events
            if (kind is None or e.get("kind") == kind)
            and (agent is None or e.get("agent") == agent)
        ]

    def running(self) -> dict[str, dict[str, int]]:
        """Per live host, the agents its trace says run there."""
        return {
            h.host_id: h.running()
            for h in self.hosts.values()
            if h.killed_at is None and not h.ended.is_set()
        }

    def describe(self) -> str:
        return "\n".join(h.describe() for h in self.hosts.values())

    async def until(self, check: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
        """``check()`` once it is truthy, checked again at each new event of any host."""
        return await _until(
            lambda: self._changed,
            check,
            f"{what} within {timeout:g}s",
            timeout,
            lambda: f"hosts:\n{self.describe()}",
        )

    # -- the lease table -----------------------------------------------------------------------

    async def fleet(self) -> Fleet:
        return await trio.to_thread.run_sync(read_fleet, self.dsn)

    async def until_fleet(
        self, ok: Callable[[Fleet], bool], what: str, timeout: float = WAIT_S
    ) -> Fleet:
        """The lease table once ``ok`` holds of it (read every :data:`POLL_S`; a store the hosts
        have not made yet is read again)."""
        last: Fleet | None = None
        error: StoreError | None = None
        with trio.move_on_after(timeout):
            while True:
                try:
                    last = await self.fleet()
                except StoreError as exc:
                    error = exc
                else:
                    if ok(last):
                        return last
                await trio.sleep(POLL_S)
        raise AssertionError(
            f"no {what} within {timeout:g}s; leases: {describe_leases(last)}"
            + (f" (last error: {error})" if error is not None else "")
            + f"\nhosts:\n{self.describe()}"
        )

    # -- signals -------------------------------------------------------------------------------

    def kill(self, host_id: str) -> float:
        """``kill -9`` the host (its whole process group); the wall-clock time it was sent."""
        host = self.hosts[host_id]
        host.killed_at = time.time()
        host.signal(signal.SIGKILL)
        return host.killed_at

    def pause(self, host_id: str) -> float:
        host = self.hosts[host_id]
        host.paused = True
        host.signal(signal.SIGSTOP)
        return time.time()

    def resume(self, host_id: str) -> float:
        host = self.hosts[host_id]
        host.signal(signal.SIGCONT)
        host.paused = False
        return time.time()

    async def aclose(self) -> None:
        """Stop every host: resumed if paused, ``SIGINT`` (a clean stop), and after
        :data:`STOP_WAIT_S` ``SIGKILL`` for what is left (the whole process group each time)."""
        with trio.CancelScope(shield=True):
            hosts = list(self.hosts.values())
            for host in hosts:
                if host.paused:
                    self.resume(host.host_id)
                if not host.ended.is_set():
                    host.signal(signal.SIGINT)
            with trio.move_on_after(STOP_WAIT_S):
                for host in hosts:
                    await host.ended.wait()
            for host in hosts:
                host.signal(signal.SIGKILL)  # the host, or children it left behind
                if not host.ended.is_set():
                    await host.proc.wait()
                    await host.ended.wait()


@asynccontextmanager
async def fleet_run(folder: Path, dsn: str, lobby: LobbySessions) -> AsyncIterator[FleetRun]:
    """A :class:`FleetRun` whose hosts are all stopped at the end, however it ends."""
    async with trio.open_nursery() as nursery:
        run = FleetRun(nursery, folder, dsn, lobby)
        try:
            yield run
        finally:
            await run.aclose()


# -- leases --------------------------------------------------------------------------------------


def held(fleet: Fleet) -> dict[str, Lease]:
    """The leases someone holds at the time the fleet was read, by resource."""
    return {lease.resource: lease for lease in fleet.leases if lease.held(fleet.now)}


def holder_of(fleet: Fleet, resource: str) -> str | None:
    lease = held(fleet).get(resource)
    return None if lease is None else lease.holder


def agents_by_host(fleet: Fleet) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for resource, lease in sorted(held(fleet).items()):
        if resource.startswith("agent:") and lease.holder is not None:
            out.setdefault(lease.holder, []).append(resource.removeprefix("agent:"))
    return out


def describe_leases(fleet: Fleet | None) -> str:
    if fleet is None:
        return "not read"
    rows = [
        f"{x.resource} → {x.holder} (epoch {x.epoch}, {x.expires_at - fleet.now:+.1f}s)"
        for x in fleet.leases
    ]
    return ", ".join(rows) or "none"


# -- turns ---------------------------------------------------------------------------------------


@attrs.frozen
class Turn:
    agent: str
    host: str
    epoch: int | None
    start: float
    end: float  # inf: never seen to end on a host still running


def turns(run: FleetRun) -> dict[str, list[Turn]]:
    """Each agent's turns on every host, by start time. A turn ends at its ``turn-end`` or
    ``turn-aborted``, or when its host stops running the agent (``agent-lease`` moved); one still
    open ends when its host was killed, or never (infinity)."""
    out: dict[str, list[Turn]] = {}
    for host in run.hosts.values():
        open_: dict[str, tuple[int | None, float]] = {}
        for e in host.events:
            agent, kind = e.get("agent"), e.get("kind")
            if agent is None:
                continue
            ended = kind in TURN_ENDS or (
                kind == "agent-lease" and e.get("data", {}).get("state") == "moved"
            )
            if kind == "turn-start":
                if agent in open_:  # two starts in a row: the first ended unseen
                    epoch, start = open_.pop(agent)
                    out.setdefault(agent, []).append(
                        Turn(agent, host.host_id, epoch, start, e["at"])
                    )
                open_[agent] = (e.get("data", {}).get("epoch"), e["at"])
            elif ended and agent in open_:
                epoch, start = open_.pop(agent)
                out.setdefault(agent, []).append(Turn(agent, host.host_id, epoch, start, e["at"]))
        end = host.killed_at if host.killed_at is not None else float("inf")
        for agent, (epoch, start) in open_.items():
            out.setdefault(agent, []).append(Turn(agent, host.host_id, epoch, start, end))
    for spans in out.values():
        spans.sort(key=lambda t: t.start)
    return out


def overlapping_turns(by_agent: Mapping[str, Sequence[Turn]]) -> list[tuple[Turn, Turn]]:
    """Pairs of one agent's turns on two different hosts whose times overlap."""
    found = []
    for spans in by_agent.values():
        for i, a in enumerate(spans):
            for b in spans[i + 1 :]:
                if a.host != b.host and a.start < b.end and b.start < a.end:
                    found.append((a, b))
    return found


def epochs_going_back(by_agent: Mapping[str, Sequence[Turn]]) -> list[tuple[Turn, Turn]]:
    """Consecutive turns of one agent (by start) whose epochs do not grow across hosts: a turn
    without an epoch, a later turn under a smaller epoch, or another host under the same one."""
    found = []
    for spans in by_agent.values():
        for a, b in itertools.pairwise(spans):
            if a.epoch is None or b.epoch is None:
                found.append((a, b))
            elif b.epoch < a.epoch or (b.host != a.host and b.epoch == a.epoch):
                found.append((a, b))
    return found


# -- the store -----------------------------------------------------------------------------------


@attrs.frozen
class StoredMessage:
    agent: str
    role: str
    id: str
    text: str  # the search text: the body's text without its header, case-folded


def stored_messages(dsn: str) -> list[StoredMessage]:
    """Every message in the store at ``dsn``, oldest first, read from PostgreSQL directly."""
    from store import postgres

    conn = postgres.connect_read_only(dsn)
    try:
        rows = conn.execute(
            "SELECT n.name, i.role, r.id, COALESCE(t.text, '') FROM message_refs r"
            " JOIN names n ON n.num = r.agent JOIN items i ON i.num = r.item"
            " LEFT JOIN item_text t ON t.num = r.item ORDER BY r.seq"
        ).fetchall()
    finally:
        conn.close()
    return [StoredMessage(str(a), str(role), str(i), str(text)) for a, role, i, text in rows]
