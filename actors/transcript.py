"""The transcript: one human-readable line per trace event, and the loop that prints them
while the host runs (``mcplive run``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .trace import TraceEvent


def _excerpt(text: Any, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_event(e: TraceEvent) -> str | None:
    """One transcript line for a trace event, or None for events the transcript leaves out."""
    d = e.data
    where = f"{e.server_id}" + (f" {e.channel_id}" if e.channel_id else "")
    k = e.kind
    if k == "host-started":
        servers = ", ".join(d.get("servers", []))
        agents = ", ".join(d.get("agents", []))
        return f"· host started: servers {servers}; agents {agents}; data in {d.get('data_dir')}"
    if k == "ready":
        mode = "MCP-only (tools only)" if d.get("mcp_only") else "MCPL"
        tools = ", ".join(t for t in d.get("tools", []) if t) or "no tools"
        return f"· {e.server_id} ready: {mode}; {tools}"
    if k == "mcp-only":
        return f"! {e.server_id} runs MCP-only: {d.get('reason')}"
    if k == "incoming":
        return f"{where} | {d.get('author')}: {_excerpt(d.get('text'))}"
    if k == "push":
        return f"{where} | (push) {_excerpt(d.get('text'))}"
    if k == "published":
        outcome = d.get("outcome")
        note = "" if outcome in (None, "delivered") else f" ({outcome}: {d.get('reason')})"
        return f"{where} | {e.agent} → {_excerpt(d.get('text'))}{note}"
    if k == "speech-held":
        draft = f" [{d['draft']}]" if d.get("draft") else ""
        return f"{e.agent} (kept as a draft{draft}: {d.get('reason')}): {_excerpt(d.get('text'))}"
    if k == "asleep":
        return f"· {e.agent} sleeps for {d.get('seconds')}s"
    if k == "awake":
        return f"· {e.agent} wakes: {d.get('reason')}"
    if k == "gate-batch":
        return f"· {e.agent}: {d.get('count')} events batched by gate policy {d.get('policy')}"
    if k == "local":
        return f"operator → {e.agent}: {_excerpt(d.get('text'))}"
    if k == "tool-call":
        arguments = json.dumps(d.get("arguments"), ensure_ascii=False)
        return f"  {e.agent} calls {d.get('tool')} {arguments}"
    if k == "tool-result":
        text = " ".join(b.get("text", "") for b in d.get("content", []) if isinstance(b, Mapping))
        flag = " (error)" if d.get("is_error") else ""
        return f"  {d.get('tool')}{flag} → {_excerpt(text)}"
    if k == "context-injected":
        parts = "; ".join(f"{i['position']}: {i['text']}" for i in d.get("injections", []))
        return f"  {e.server_id} adds context for {e.agent} ({_excerpt(parts)})"
    if k == "injection-dropped":
        return f"! {e.server_id}: an injection for {e.agent} dropped: {d.get('reason')}"
    if k == "hook-failed":
        return f"? {e.server_id}: context hook for {e.agent} skipped: {d.get('error')}"
    if k == "turn-aborted":
        return f"! {e.agent}: turn aborted"
    if k == "inference-request":
        return f"· {e.server_id} asked {d.get('model')} for an inference ({d.get('feature_set')})"
    if k == "rolled-back":
        return f"· {e.agent}: rolled back to {d.get('to')}"
    if k == "error":
        return f"! {e.agent or e.server_id}: {d.get('error')}"
    if k == "disconnected":
        retry = d.get("retry_in_s")
        line = f"! {e.server_id} disconnected ({d.get('reason')}); reconnecting in {retry}s"
        return "\n    | ".join([line, *d.get("stderr_tail", ())])  # its last stderr lines
    if k == "diagnostic":
        return f"? {e.server_id or e.agent}: {_excerpt(d.get('text'))}"
    if k == "channel-registered":
        return f"· {e.server_id} registered {e.channel_id} ({d.get('label') or '-'})"
    if k == "coalesce-audit":
        scope = where if e.server_id else "coalescer"
        bits = [f"key {d['key']}"] if d.get("key") else []
        if d.get("event_ids"):
            bits.append("event " + ", ".join(str(i) for i in d["event_ids"]))
        if d.get("batch"):
            bits.append(f"batch {d['batch']}")
        detail = f" ({'; '.join(bits)})" if bits else ""
        return f"· {scope}: {d.get('reason')}{detail}"
    if k == "refused":
        code = f" ({d['code']})" if d.get("code") is not None else ""
        what = d.get("method") if code else f"an item of {d.get('method')}"
        return f"! {where}: refused {what}{code}: {_excerpt(d.get('reason'))}"
    if k == "duplicates-skipped":
        n = d.get("count")
        return f"· {n} already-stored item{'' if n == 1 else 's'} skipped from {e.server_id}"
    if k == "declaration-mismatch":
        return f"? {e.server_id}: {d.get('text')}"
    if k == "trace-dropped":
        return f"! transcript fell behind: {d.get('count')} events not shown"
    return None


async def print_transcript(stream: Any, out: Any) -> None:
    """Print a line for every event of ``stream`` that has one, until the stream ends."""
    last_context: dict[tuple[str | None, str | None], str] = {}  # one per server, agent
    async for event in stream:
        line = format_event(event)
        if event.kind == "context-injected" and line is not None:
            # the same status line before every turn is shown once, until it changes
            key = (event.server_id, event.agent)
            if last_context.get(key) == line or len(last_context) >= 1024:
                continue
            last_context[key] = line
        if line is not None:
            print(line, file=out, flush=True)
