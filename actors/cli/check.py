"""``mcplive check``: validate a config, and report what servers would be (or are) granted."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from actors.config import (
    PROVIDER_KEYS,
    AgentConfig,
    ConfigErrors,
    ServerConfig,
    data_dir_problem,
    key_variable,
    load_config,
)
from actors.datadir import holder
from actors.errors import ConfigError
from protocol.display import one_line
from protocol.errors import RpcError


def cmd_check(args: argparse.Namespace) -> int:
    """Report every problem ``run`` would refuse (and a server command that cannot start) in
    one pass: the config's own problems, then those of the parts that had none."""
    problems: list[str] = []
    try:
        cfg = load_config(args.config)
    except ConfigErrors as exc:
        problems.extend(exc.problems)
        if exc.partial is None:  # the file itself could not be read
            _print_problems(args.config, problems)
            return 1
        cfg = exc.partial
    from actors.agent.folding import summary_model
    from actors.models.providers import make_model
    from actors.web.auth import console_token

    folds: dict[str, str] = {}  # each agent's folding, as its line tells it
    for a in cfg.agents:
        try:
            model = make_model(a)
        except ConfigError as exc:
            problems.append(f"agents[{a.name}].model: {exc}")
            continue
        try:
            summarizer = summary_model(a, model)
        except ConfigError as exc:
            problems.append(f"agents[{a.name}].summary_model: {exc}")
            continue
        folds[a.name] = (
            "drops older context (its scripted model has no [summary])"
            if summarizer is None
            else f"folds older context with {summarizer.name}"
        )
    for s in cfg.servers:
        problem = command_problem(s)
        if problem is not None:
            problems.append(f"servers[{s.id}].command: {problem}")
    problem = data_dir_problem(cfg.data_dir)
    if problem is not None:
        problems.append(f"host.{problem}")
    try:
        console_token(cfg.web_token_env)  # as ``run`` reads it before it serves the console
    except ConfigError as exc:
        problems.append(str(exc))
    manifests: dict[str, Path] = {}
    ids = {s.id for s in cfg.servers}
    for item in args.manifest:
        sid, sep, path = item.partition("=")
        if not sep or sid not in ids:
            problems.append(f"--manifest {item}: give SERVER=FILE with a configured server id")
        else:
            manifests[sid] = Path(path)
    if problems:
        _print_problems(args.config, problems)
        return 1
    print(
        f"{args.config}: ok — {len(cfg.servers)} server(s), {len(cfg.agents)} agent(s); "
        f"data in {cfg.data_dir}"
    )
    pid = holder(cfg.data_dir)
    if pid is not None:
        print(f"  data_dir in use by a running host (pid {pid or 'unknown'})")
    for s in cfg.servers:
        how = " ".join(s.command) if s.command else s.url
        print(f"  server {s.id}: {how}")
    for a in cfg.agents:
        hears = ", ".join(a.servers) if a.servers is not None else "all servers"
        endpoint = f" at {a.base_url}" if a.base_url else ""
        print(
            f"  agent {a.name}: {a.model}{endpoint}; hears {hears}; "
            f"{a.context_tokens:,} context tokens, {folds[a.name]}"
        )
        print(f"  agent {a.name}: {wakes_line(a)}")
        print(f"  agent {a.name}: {key_line(a)}")
    status = 0
    for sid, path in manifests.items():
        server = next(s for s in cfg.servers if s.id == sid)
        status |= _report_manifest_file(server, path)
    if args.connect:
        status |= trio.run(_report_connect, cfg)
    return status


def _print_problems(config: str, problems: list[str]) -> None:
    for p in problems:
        print(p if p.startswith(str(config)) else f"{config}: {p}")


def key_line(a: AgentConfig) -> str:
    """Which API key the agent's model calls send, and where: the variable it is read from, or
    none (a scripted model, or an endpoint of the operator's own without ``api_key_env``)."""
    provider = a.model.partition(":")[0]
    if provider not in PROVIDER_KEYS:
        return "sends no API key (its scripted model calls no provider)"
    where = a.base_url or f"{provider}'s own endpoint"
    variable = key_variable(provider, a.base_url, a.api_key_env)
    line = (
        f"sends no API key to {where} (no api_key_env)"
        if variable is None
        else f"sends the API key in ${variable} to {where}"
    )
    summary = a.summary_model.partition(":")[0] if a.summary_model else provider
    if summary != provider and summary in PROVIDER_KEYS:
        line += f"; its summary model sends the API key in ${PROVIDER_KEYS[summary]}"
    return line


def wakes_line(a: AgentConfig) -> str:
    """What wakes the agent, in one line: its gate preset, its gate file, or everything."""
    if a.gate_preset == "community":
        aliases = f", aliases: {', '.join(a.aliases)}" if a.aliases else ""
        return (
            "wakes on pushes, direct messages and messages addressing it "
            f"({a.name}, @{a.name}{aliases}, replies to it); "
            "other chatter is stored for its next turn"
        )
    if a.gate is not None:
        policy = a.gate_policy
        if policy is None:
            return f"wakes as its gate file {a.gate} says"
        return (
            f"wakes as its gate file {a.gate} says ({len(policy.policies)} "
            f"polic{'y' if len(policy.policies) == 1 else 'ies'}, default {policy.default})"
        )
    return 'wakes on every item it hears (no gate; gate = "community" wakes on less)'


def command_problem(server: ServerConfig) -> str | None:
    """Why the server's command could not start, as the host would run it ("python" is this
    interpreter; a relative path starts from the config's folder; a bare name is looked up on
    the server's PATH), or None. A ``python SCRIPT`` command also needs the script."""
    if not server.command:
        return None
    from actors.link.transport import server_argv, server_env

    argv = server_argv(server)
    program = argv[0]
    cwd = server.cwd or Path.cwd()
    if os.sep in program:
        path = cwd / program
        if not path.is_file():
            return f"{program} not found (looked for {path})"
        if not os.access(path, os.X_OK):
            return f"{path} is not executable"
    else:
        search = os.pathsep.join(os.get_exec_path(server_env(server)))
        if shutil.which(program, path=search) is None:
            return f"program {program!r} not found on PATH"
    script = argv[1] if len(argv) > 1 and Path(program).name.startswith("python") else None
    if script is not None and not script.startswith("-") and not (cwd / script).is_file():
        return f"python script {script} not found (looked for {cwd / script})"
    return None


def _print_policy(sid: str, source: str, policy: Mapping[str, Any]) -> None:
    print(f"  server {sid} ({source}):")
    print(f"    granted: {', '.join(policy.get('granted', [])) or 'nothing'}")
    if policy.get("denied"):
        print(f"    advertised but not granted: {', '.join(policy['denied'])}")
    for name, state in policy.get("feature_sets", {}).items():
        print(f"    feature set {name}: {state}")
    for text in policy.get("mismatches", []):
        print(f"    declaration mismatch: {one_line(text, 1000)}")
    if policy.get("outside_sets"):
        allowed = ", ".join(policy["outside_sets"])
        print(f"    used outside its feature sets (allow_unlisted_uses): {allowed}")


def _report_manifest_file(server: Any, path: Path) -> int:
    from actors.link.connection import policy_report
    from protocol import mcpl
    from protocol.declarations import declaration_mismatches
    from protocol.manifest import ManifestError, manifest_digest

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"  server {server.id}: cannot read {path}: {exc}")
        return 1
    # Either an initialize result ({capabilities: {experimental: {mcpl}}}) or a bare manifest.
    caps = doc.get("capabilities") if isinstance(doc, dict) and "capabilities" in doc else {}
    manifest = (caps.get("experimental") or {}).get("mcpl") if caps else doc
    if not isinstance(manifest, dict):
        print(f"  server {server.id}: {path} holds no MCPL manifest: it would run MCP-only")
        return 0
    advertised = mcpl.advertised_paths(manifest, caps)
    grant = server.grant_for(advertised)
    declared = mcpl.declared_feature_sets(manifest)
    state = server.feature_sets_for(declared.sets, grant)
    allowed = server.allow_unlisted_uses
    found = declaration_mismatches(manifest, advertised, state, grant, allowed)
    try:
        digest = manifest_digest(manifest)
    except ManifestError as exc:
        digest = f"refused ({exc.code})"
    report = policy_report(advertised, grant, state, found, frozenset(allowed) & grant)
    _print_policy(server.id, f"manifest {path}, digest {digest}", report)
    return 0


async def _report_connect(cfg: Any) -> int:
    """Connect to every server (no agent runs), report what the handshake decided."""
    import attrs

    from actors.host import Host

    pending = {s.id for s in cfg.servers}
    deadline = max((s.request_timeout_s for s in cfg.servers), default=10) + 10
    status = 0
    with tempfile.TemporaryDirectory() as scratch:  # a check leaves the real store alone
        quiet = attrs.evolve(cfg, agents=(), data_dir=Path(scratch))
        status = await _await_reports(Host, quiet, pending, deadline)
    for sid in sorted(pending):
        status = 1
        print(f"  server {sid} (live): no answer within {deadline:g}s")
    return status


#: After the last server is ready, how long the check listens for nothing new before it reports
#: the channels: a server may register its channels right after the handshake.
SETTLE_S = 1.0


async def _await_reports(host_cls: Any, quiet: Any, pending: set[str], deadline: float) -> int:
    status = 0
    mcpl: list[str] = []  # servers ready as MCPL servers, in the order they were
    undeclared: dict[str, dict[str, str]] = {}  # server -> channel -> the operator's line
    async with host_cls.open(quiet) as host:
        with trio.move_on_after(deadline):
            events = host.trace()
            while True:
                with trio.move_on_after(SETTLE_S if not pending else math.inf) as settled:
                    event = await events.__anext__()
                if settled.cancelled_caught:
                    break  # every server answered, and nothing more came for a while
                sid = event.server_id
                if sid is not None and event.kind == "publish-undeclared":
                    lines = undeclared.setdefault(sid, {})
                    lines.setdefault(str(event.channel_id), str(event.data.get("text")))
                if sid is None or sid not in pending:
                    continue
                if event.kind == "ready":
                    pending.discard(sid)
                    if event.data.get("mcp_only"):
                        tools = ", ".join(event.data.get("tools", [])) or "no tools"
                        print(f"  server {sid} (live): MCP-only; {tools}")
                    else:
                        _print_policy(sid, "live", event.data.get("policy", {}))
                        mcpl.append(sid)
                elif event.kind == "disconnected":
                    pending.discard(sid)
                    status = 1
                    print(f"  server {sid} (live): could not connect: {event.data.get('reason')}")
        for sid in mcpl:
            lines = undeclared.setdefault(sid, {})
            with trio.move_on_after(deadline):
                await _listed_undeclared(host, sid, lines)
            _held_channels(host, sid, lines)
            _print_undeclared(sid, lines)
    return status


def _held_channels(host: Any, sid: str, lines: dict[str, str]) -> None:
    """Print every channel the host holds for ``sid`` (registered during or right after the
    handshake, listed or not), and add to ``lines`` those that declare no publish target."""
    from protocol.receipts import undeclared_channel_line

    config = host.ctx.config
    held = [i for i in host.ctx.channel_directory.infos([sid], config) if i.registered]
    print(f"    channels: {len(held)}")
    for info in held:
        target = info.declared or "none declared"
        print(f"    {info.channel_id} ({info.label or '-'}): publish target {target}")
        if info.declared is None and info.channel_id not in lines:
            flag = bool(config.publish_undeclared(sid))
            lines[str(info.channel_id)] = undeclared_channel_line(
                sid, str(info.channel_id), info.label, flag
            )


async def _listed_undeclared(host: Any, sid: str, lines: dict[str, str]) -> None:
    """Add to ``lines`` the channels the server lists (``channels/list``) that declare no
    publish target: a server may register its channels after the handshake. A server that
    does not answer the listing leaves what its registrations showed."""
    from actors.errors import ActorDied, AskTimeout, NotConnected
    from actors.messages import Call
    from protocol.receipts import undeclared_channel_line
    from protocol.routes import declared_target

    conn = host.ctx.connections.get(sid)
    if conn is None:
        return
    timeout = host.ctx.config.request_timeout(sid)
    try:
        result = await conn.ask(Call(method="channels/list", params={}), timeout=timeout + 5)
    except (RpcError, NotConnected, AskTimeout, ActorDied):
        return
    listed = result.get("channels") if isinstance(result, Mapping) else None
    flag = host.ctx.config.publish_undeclared(sid)
    for desc in listed if isinstance(listed, list) else ():
        cid = desc.get("id") if isinstance(desc, Mapping) else None
        if not isinstance(cid, str) or not cid or cid in lines:
            continue
        if declared_target(desc.get("capabilities")) is None:
            label = desc.get("label")
            label = label if isinstance(label, str) else ""
            lines[cid] = undeclared_channel_line(sid, cid, label, flag)


def _print_undeclared(sid: str, lines: Mapping[str, str]) -> None:
    if lines:
        print(f"    channels without a publish target: {len(lines)}")
    for line in lines.values():
        print(f"    {line}")
