"""``mcplive rollback AGENT --to MESSAGE_ID``: start the host on the config, wait for the servers
whose state the agent checkpointed, roll the agent back, and print what each server did."""

from __future__ import annotations

import sys

import trio

from actors.agent.rollback import checkpointing_servers
from actors.config import HostConfig
from actors.host import Host


async def roll_back(cfg: HostConfig, agent: str, to: str) -> int:
    """Start the host, wait for the servers whose state the agent checkpointed, roll back."""
    if agent not in {a.name for a in cfg.agents}:
        print(f"mcplive: no agent named {agent!r} in the config", file=sys.stderr)
        return 2
    async with Host.open(cfg) as host:
        pending = await checkpointing_servers(host.ctx, agent, [s.id for s in cfg.servers])
        deadline = max((s.request_timeout_s for s in cfg.servers), default=10) + 10
        if pending:
            with trio.move_on_after(deadline):
                async for event in host.trace(kinds={"ready", "disconnected"}):
                    if event.kind != "trace-dropped":
                        pending.discard(event.server_id)
                    if not pending:
                        break
        try:
            report = await host.rollback(agent, to, source="cli")
        except Exception as exc:
            print(f"mcplive: rollback refused: {exc}", file=sys.stderr)
            return 1
    print(f"· {agent}: rolled back to {to}; {report['set_aside']} later messages set aside")
    status = 0
    for entry in report["state"]:
        where = f"{entry['server']} / {entry['feature_set']}"
        if "error" in entry or not entry.get("success"):
            status = 1
            why = entry.get("error") or entry.get("reason") or "the server reported no success"
            print(f"  {where}: not rolled back to {entry['requested']}: {why}")
        elif entry.get("rolled_forward"):
            print(f"  {where}: rolled forward to {entry['checkpoint']} from {entry['requested']}")
        else:
            print(f"  {where}: back at {entry['checkpoint']}")
    return status
