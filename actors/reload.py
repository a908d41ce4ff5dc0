"""Config reload (SIGHUP, ``Host.reload``): what can change while the host runs, and applying it.

:func:`plan_reload` compares the running config with a new one (pure). Only the *live* keys
are taken: each agent's ``system_prompt``, ``gate``, ``max_tokens``, ``temperature``,
``images`` (read at its next turn), ``budget_daily_tokens`` and ``budget_daily_usd`` (counted
from its next turn's end), each server's capability and feature-set masks and its
``publish_undeclared`` (read where it is used). Everything else that differs (a server or agent
added or removed, a server's command, url, token or limits, an agent's model, endpoint, key
variable, servers or prose mode, ``data_dir``, the store, the host's inference model) is listed
as needing a restart and left as it runs. The config put in force is the running one with the
new live keys, so every reader of ``ctx.config`` sees one consistent picture.

:func:`apply_plan` hands each agent its new config (it takes the prompt for its next turn and
re-reads its gate file now) and each server whose masks changed its new config (a live link gets
them as a manifest change is applied: host-first revocation, then ``featureSets/update`` with the
new grant), then resumes the agents that were paused after their model refused the credential,
and reports it all in one ``config-reloaded`` trace event.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from .config import AgentConfig, HostConfig, ServerConfig
from .errors import ConfigError
from .messages import Reconfigure

SERVER_LIVE = (
    "enabled_capabilities",
    "disabled_capabilities",
    "enabled_feature_sets",
    "disabled_feature_sets",
)
#: Server keys read where they are used, from the config in force: taken, nothing to re-apply.
SERVER_READ = ("publish_undeclared",)
AGENT_LIVE = (
    "system_prompt",
    "gate",
    "max_tokens",
    "temperature",
    "images",
    "budget_daily_tokens",
    "budget_daily_usd",
)
#: ``[host]`` keys taken at once: the prices and the budgets' zone and limits.
HOST_LIVE = ("prices", "timezone", "budget_daily_tokens", "budget_daily_usd")
#: Derived from another key (``endpoint`` from ``url``, ``gate_policy`` from the ``gate`` file):
#: never reported on its own.
_DERIVED = frozenset({"endpoint", "gate_policy"})
#: How long a reload waits for one actor to take its new config, beyond the server's own
#: request deadline (a live link's ``featureSets/update``).
RECONFIGURE_GRACE_S = 10.0


@attrs.frozen(kw_only=True)
class ReloadPlan:
    config: HostConfig  # what comes into force
    servers: tuple[ServerConfig, ...]  # servers whose masks changed, with their new config
    agents: tuple[AgentConfig, ...]  # every running agent, with its live keys from the new one
    changed: tuple[str, ...]  # "Ada.system_prompt", "lobby.disabled_capabilities", …
    restart: tuple[str, ...]  # what differs but needs a restart to apply


def _differing(old: Any, new: Any, skip: tuple[str, ...]) -> list[str]:
    return [
        f.name
        for f in attrs.fields(type(old))
        if f.name not in skip and f.name not in _DERIVED
        if getattr(old, f.name) != getattr(new, f.name)
    ]


def plan_reload(old: HostConfig, new: HostConfig) -> ReloadPlan:
    changed: list[str] = []
    restart: list[str] = []
    for key in ("data_dir", "inference_model", "web", "web_token_env", "store", "store_env"):
        if getattr(old, key) != getattr(new, key):
            restart.append(key)
    # a config that names no host_id keeps the running one (the data dir's)
    if new.host_id is not None and new.host_id != old.host_id:
        restart.append("host_id")
    new_servers = {s.id: s for s in new.servers}
    old_ids = {s.id for s in old.servers}
    restart += [f"server {s.id} added" for s in new.servers if s.id not in old_ids]
    servers: list[ServerConfig] = []
    reconfigured: list[ServerConfig] = []
    for s in old.servers:
        n = new_servers.get(s.id)
        if n is None:
            restart.append(f"server {s.id} removed")
            servers.append(s)
            continue
        restart += [f"{s.id}.{k}" for k in _differing(s, n, SERVER_LIVE + SERVER_READ)]
        live = [k for k in SERVER_LIVE if getattr(s, k) != getattr(n, k)]
        changed += [
            f"{s.id}.{k}" for k in (*SERVER_LIVE, *SERVER_READ) if getattr(s, k) != getattr(n, k)
        ]
        taken = attrs.evolve(s, **{k: getattr(n, k) for k in (*SERVER_LIVE, *SERVER_READ)})
        servers.append(taken)
        if live:
            reconfigured.append(taken)
    new_agents = {a.name: a for a in new.agents}
    old_names = {a.name for a in old.agents}
    restart += [f"agent {a.name} added" for a in new.agents if a.name not in old_names]
    agents: list[AgentConfig] = []
    for a in old.agents:
        n_agent = new_agents.get(a.name)
        if n_agent is None:
            restart.append(f"agent {a.name} removed")
            agents.append(a)
            continue
        restart += [f"{a.name}.{k}" for k in _differing(a, n_agent, AGENT_LIVE)]
        changed += [f"{a.name}.{k}" for k in AGENT_LIVE if getattr(a, k) != getattr(n_agent, k)]
        taken_agent = {k: getattr(n_agent, k) for k in AGENT_LIVE}
        agents.append(attrs.evolve(a, gate_policy=n_agent.gate_policy, **taken_agent))
    changed += [k for k in HOST_LIVE if getattr(old, k) != getattr(new, k)]
    host_live = {k: getattr(new, k) for k in HOST_LIVE}
    config = attrs.evolve(old, servers=tuple(servers), agents=tuple(agents), **host_live)
    return ReloadPlan(
        config=config,
        servers=tuple(reconfigured),
        agents=tuple(agents),
        changed=tuple(changed),
        restart=tuple(restart),
    )


async def apply_plan(
    ctx: Any, plan: ReloadPlan, resume: Callable[[str], Awaitable[bool]]
) -> dict[str, Any]:
    """Put ``plan`` in force (see the module); the report is also the ``config-reloaded``
    trace event's data: ``changed``, ``restart``, ``resumed`` and each re-applied server's
    ``grants`` (None: not connected; it negotiates under the new masks when it is)."""
    ctx.config = plan.config
    changed = list(plan.changed)
    grants: dict[str, list[str] | None] = {}

    async def server(cfg: ServerConfig) -> None:
        ref = ctx.connections.get(cfg.id)
        if ref is not None:
            timeout = cfg.request_timeout_s + RECONFIGURE_GRACE_S
            grants[cfg.id] = await ref.ask(Reconfigure(cfg=cfg), timeout=timeout)

    async def agent(cfg: AgentConfig) -> None:
        ref = ctx.agents.get(cfg.name)
        if ref is not None and await ref.ask(Reconfigure(cfg=cfg), timeout=RECONFIGURE_GRACE_S):
            if f"{cfg.name}.gate" not in changed:
                changed.append(f"{cfg.name}.gate (file)")

    async with trio.open_nursery() as nursery:
        for s in plan.servers:
            nursery.start_soon(server, s)
        for a in plan.agents:
            nursery.start_soon(agent, a)
    resumed = []
    for a in plan.agents:
        if getattr(ctx.agent_statuses.get(a.name), "paused", None) and await resume(a.name):
            resumed.append(a.name)
    report = {
        "changed": changed,
        "restart": list(plan.restart),
        "resumed": resumed,
        "grants": grants,
    }
    ctx.trace.emit("config-reloaded", data=report)
    return report


def one_line(problems: Any) -> str:
    return "; ".join(" ".join(str(p).split()) for p in problems)


#: How long a reload waits for the config (and gate) files to be read: a FIFO or a file on a
#: hung mount is given up on, and the running config stays.
READ_LIMIT_S = 5.0


class SlowRead(ConfigError):
    """A file read given up on: it took longer than its limit, or the last one has not ended."""


class OffLoop:
    """Blocking file reads (config, gate files) off the loop, one at a time.

    :meth:`read` runs the read in a daemon thread of its own (not one of trio's worker threads,
    which a hung read would hold for good) and waits for it, in a trio worker thread, for at most
    ``limit_s`` seconds of wall-clock time, whatever clock the loop runs on (a mock clock's
    jumps never cut a read short). A FIFO or a file on a hung mount holds that one thread, never
    the loop; while it still hangs, the next read is refused at once rather than piling threads
    up behind it."""

    def __init__(self, what: str, limit_s: float | None = None) -> None:
        self.what = what  # "the config file", "the gate file": for the one-line refusal
        self.limit_s = READ_LIMIT_S if limit_s is None else limit_s
        self.busy = False

    async def read(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.busy:
            raise SlowRead(f"the last read of {self.what} has not ended yet")
        self.busy = True
        done = threading.Event()
        result: list[Any] = []

        def work() -> None:
            try:
                result.append(fn(*args))
            except Exception as exc:  # raised where the caller awaits
                result.append(exc)
            finally:
                self.busy = False  # plain assignments, read once ``done`` is set
                done.set()

        threading.Thread(target=work, name=f"mcplive-read {self.what}", daemon=True).start()
        if not await trio.to_thread.run_sync(done.wait, self.limit_s, abandon_on_cancel=True):
            raise SlowRead(f"{self.what} could not be read within {self.limit_s:g} s")
        [outcome] = result
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


async def reload_on_sighup(
    host: Any,
    load: Callable[[], Any] | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """On every SIGHUP, one at a time: read the config again with ``load`` (it returns the new
    ``HostConfig``, or raises ``ConfigError``) off the loop, and put it in force with
    ``host.reload``; the outcome is a line of the transcript, and each agent it resumes is
    recorded as a ``resume`` from ``SIGHUP``. With no config file (``load`` is
    None: the bundled example), a SIGHUP only says so."""
    reader = OffLoop("the config file")

    def refuse(reason: str) -> None:
        host.ctx.trace.emit("reload-refused", data={"reason": reason})

    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            if load is None:
                text = "SIGHUP: no config file to reload (the bundled example)"
                host.ctx.trace.emit("note", data={"text": text})
                continue
            try:
                config = await reader.read(load)
            except ConfigError as exc:
                refuse(one_line(getattr(exc, "problems", None) or [str(exc)]))
                continue
            try:
                await host.reload(config, source="SIGHUP")
            except ConfigError:
                pass  # the host said why in the transcript; the running config stays
