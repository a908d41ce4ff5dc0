"""The transcript's lines: one human-readable line per trace event, and each kind's level (the
printing, and the loop that prints them while the host runs, are in :mod:`.printer`).

Every kind has one case in :func:`format_event` (or none: not shown) and a level in
:data:`LEVELS` (a kind not listed is ``info``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from actors.models.base import Usage
from actors.trace import TraceEvent
from protocol.display import one_line

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR
LEVEL_NAMES = {"debug": DEBUG, "info": INFO, "warning": WARNING, "error": ERROR}

#: Each kind's level; a kind not listed is INFO. ``-q`` shows WARNING and up, ``-v`` DEBUG too.
LEVELS: dict[str, int] = {
    # what a server writes on its stderr, streamed model text, and the host's inner workings
    "server-log": DEBUG,
    "tokens": DEBUG,
    "typing": DEBUG,
    "connecting": DEBUG,
    "turn-start": DEBUG,
    "wake-parked": DEBUG,
    "wake-withdrawn": DEBUG,
    "wake-withheld": DEBUG,
    "route-suspended": DEBUG,
    "header-notice": DEBUG,
    "coalesce-compacted": DEBUG,
    # something went wrong, or was refused, and the host went on
    "diagnostic": WARNING,
    "mcp-only": WARNING,
    "disconnected": WARNING,
    "request-timeout": WARNING,
    "injection-dropped": WARNING,
    "hook-failed": WARNING,
    "turn-aborted": WARNING,
    "trace-dropped": WARNING,
    "model-retry": WARNING,
    "refused": WARNING,
    "declaration-mismatch": WARNING,
    "publish-undeclared": WARNING,
    "reload-refused": WARNING,
    "status-unwritten": WARNING,
    "heartbeat-failed": WARNING,
    "record-skipped": WARNING,
    "error": ERROR,
    "agent-paused": ERROR,
    "budget-paused": WARNING,
    "budget-warning": WARNING,
    "budget-unpriced": WARNING,
    "loop-stall": WARNING,
    "wakes-deferred": WARNING,
}

#: How an ``operator-action`` line says each action (``abort`` an agent's turn: "aborted the turn
#: of Ada").
ACTED = {
    "pause": "paused",
    "release": "released",
    "resume": "resumed",
    "reconnect": "reconnected",
    "resend": "resent drafts of",
    "dismiss": "dismissed drafts of",
    "abort": "aborted the turn of",
    "rollback": "rolled back",
}

#: Why an item did not wake its agent (``wake-withheld``), and why a deferral ended.
WITHHELD = {"own": "its own post", "repeat": "a repeat of its post", "loop": "deferred"}
RESUMED = {
    "another voice": "someone else spoke",
    "quiet": "the channel was quiet",
    "cool-down": "the cool-down is over",
}


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _usd(value: Any) -> str:
    return f"${value:,.2f}" if isinstance(value, int | float) else str(value)


def _seconds(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def level_of(e: TraceEvent) -> int:
    """The event's level: its kind's, or for a ``collapsed`` summary the level it stands for."""
    if e.kind == "collapsed":
        return LEVEL_NAMES.get(str(e.data.get("level")), WARNING)
    if e.kind == "disconnected" and e.data.get("requested"):
        return INFO  # the operator asked for it: no failure
    return LEVELS.get(e.kind, INFO)


def level_name(level: int) -> str:
    return logging.getLevelName(level).lower()


def _source_label(e: TraceEvent) -> str:
    if e.server_id is not None:
        return e.server_id
    if e.agent is not None:
        return e.agent
    return "other sources" if e.data.get("other_sources") else "the host"


def _excerpt(text: Any, limit: int = 240) -> str:
    return one_line(str(text), limit)


def format_event(e: TraceEvent) -> str | None:
    """One transcript line for a trace event, or None for events the transcript leaves out."""
    d = e.data
    where = f"{e.server_id}" + (f" {e.channel_id}" if e.channel_id else "")
    k = e.kind
    if k == "host-started":
        servers = ", ".join(d.get("servers", []))
        agents = ", ".join(d.get("agents", []))
        host = f" (host {d['host_id']})" if d.get("host_id") else ""
        return (
            f"· host started{host}: servers {servers}; agents {agents}; data in {d.get('data_dir')}"
        )
    if k == "ready":
        mode = "MCP-only (tools only)" if d.get("mcp_only") else "MCPL"
        tools = ", ".join(t for t in d.get("tools", []) if t) or "no tools"
        outside = (d.get("policy") or {}).get("outside_sets")
        allowed = (
            f"; {', '.join(outside)} allowed outside its feature sets (allow_unlisted_uses)"
            if outside
            else ""
        )
        return f"· {e.server_id} ready: {mode}; {tools}{allowed}"
    if k == "tools-changed":
        change = [f"+{n}" for n in d.get("added", [])] + [f"-{n}" for n in d.get("removed", [])]
        tools = ", ".join(d.get("tools", [])) or "no tools"
        return f"· {e.server_id} tools now: {tools} ({' '.join(change) or 'changed'})"
    if k == "manifest-changed":
        grant = ", ".join(d.get("grant", [])) or "nothing"
        return f"· {e.server_id} manifest changed ({d.get('digest')}); granted: {grant}"
    if k == "mcp-only":
        return f"! {e.server_id} runs MCP-only: {d.get('reason')}"
    if k == "incoming":
        return f"{where} | {_excerpt(d.get('author'), 80)}: {_excerpt(d.get('text'))}"
    if k == "push":
        by = f"{_excerpt(d['author'], 80)}: " if d.get("author") else ""
        return f"{where} | (push) {by}{_excerpt(d.get('text'))}"
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
    if k == "wakes-deferred":
        return (
            f"! {e.agent}: wakes from {where} deferred: {d.get('answers')} of its posts there "
            f"were answered within {_seconds(d.get('window_s'))} s (a loop?); stored, not waking"
        )
    if k == "wakes-resumed":
        why = RESUMED.get(str(d.get("reason")), d.get("reason"))
        return f"· {e.agent}: wakes from {where} resumed ({why}; {d.get('held')} deferred)"
    if k == "wake-withheld":
        why = WITHHELD.get(str(d.get("reason")), d.get("reason"))
        return f"  {e.agent} not woken by {d.get('author') or '?'} in {where}: {why}"
    if k == "gate-batch":
        return f"· {e.agent}: {d.get('count')} events batched by gate policy {d.get('policy')}"
    if k == "local":
        return f"operator → {e.agent}: {_excerpt(d.get('text'))}"
    if k == "local-reply":
        return f"{e.agent} → operator: {_excerpt(d.get('text'))}"
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
    if k == "operator-action":
        verb = ACTED.get(str(d.get("action")), d.get("action"))
        detail = f": {d['detail']}" if d.get("detail") else ""
        same = "" if d.get("changed") else " (nothing changed)"
        return f"· operator ({d.get('source')}): {verb} {d.get('target')}{detail}{same}"
    if k == "disconnected" and d.get("requested"):  # no failure, and no stderr lines
        retry = d.get("retry_in_s")
        when = f"in {_seconds(retry)}s" if retry else "now"
        return f"· {e.server_id} link closed as the operator asked; reconnecting {when}"
    if k == "disconnected":
        retry, attempt = d.get("retry_in_s"), d.get("attempt")
        line = f"! {e.server_id} disconnected ({d.get('reason')}); reconnecting in {retry}s"
        if attempt is not None:  # the number of this retry in a row of failed links
            line += f" (attempt {attempt})"
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
    if k == "agent-paused":
        reason, remedy = d.get("reason"), d.get("remedy")
        return f"! {e.agent} paused: {reason}; no model calls until resumed: {remedy}"
    if k == "budget-warning":
        whose = "the host's" if d.get("scope") == "host" else "its"
        if d.get("unit") == "usd":
            spent = f"{_usd(d.get('used'))} of {whose} {_usd(d.get('budget'))} a day spent"
        else:
            spent = (
                f"{_count(d.get('used'))} of {whose} {_count(d.get('budget'))} daily tokens used"
            )
        return f"? {e.agent}: {spent} (80 %)"
    if k == "budget-paused":
        usd = d.get("unit") == "usd"
        show = _usd if usd else _count
        whose = "host-wide daily" if d.get("scope") == "host" else "daily"
        return (
            f"! {e.agent} paused: {whose} {'cost' if usd else 'token'} budget reached "
            f"({show(d.get('used'))} of {show(d.get('budget'))}); no turns until "
            f"{d.get('resumes_at')} (or resume it: raise the budget and SIGHUP, or the console)"
        )
    if k == "budget-unpriced":
        return f"? {e.agent}: {d.get('line')}"
    if k == "agent-resumed":
        return f"· {e.agent} resumed ({d.get('waiting')} waiting wakes)"
    if k == "model-retry":
        return f"? {e.agent}: {d.get('line')}"
    if k == "context-fold" and d.get("summaries"):
        return (
            f"· {e.agent}: merged {d.get('summaries')} older summaries ({d.get('messages')} "
            f"messages, ~{_count(d.get('folded_tokens'))} tokens) into one; "
            f"{d.get('summary_model')} used {Usage.of(d).describe()} tokens"
        )
    if k == "context-fold":
        n = d.get("messages")
        return (
            f"· {e.agent}: folded {n} older message{'' if n == 1 else 's'} "
            f"(~{_count(d.get('folded_tokens'))} tokens) into a summary; "
            f"{d.get('summary_model')} used {Usage.of(d).describe()} tokens"
        )
    if k == "turn-usage":
        end = "" if d.get("phase") == "completed" else f" ({d.get('phase')})"
        return f"· {e.agent}: turn used {Usage.of(d).describe()} tokens{end}"
    if k == "config-reloaded":
        changed = ", ".join(d.get("changed") or ()) or "nothing"
        resumed = ", ".join(d.get("resumed") or ())
        restart = ", ".join(d.get("restart") or ())
        return (
            f"· config reloaded: changed {changed}"
            + (f"; resumed {resumed}" if resumed else "")
            + (f"; needs a restart to apply: {restart}" if restart else "")
        )
    if k == "loop-stall":
        return f"! the host's loop was held {_count(d.get('held_ms'))} ms by task {d.get('task')}"
    if k == "reload-refused":
        return f"! config not reloaded, the running one stays: {d.get('reason')}"
    if k == "record-skipped":
        record = f"stored {d.get('what')} {d.get('key')!r}" if d.get("key") else "stored records"
        return f"! skipped {record}: {_excerpt(d.get('reason'))}"
    if k == "status-unwritten":
        return f"! status file {d.get('path')} not written: {d.get('error')}"
    if k == "heartbeat-failed":
        return f"! heartbeat into the store {d.get('store')} failed: {_excerpt(d.get('error'))}"
    if k == "refused":
        code = f" ({d['code']})" if d.get("code") is not None else ""
        what = d.get("method") if code else f"an item of {d.get('method')}"
        return f"! {where}: refused {what}{code}: {_excerpt(d.get('reason'))}"
    if k == "duplicates-skipped":
        n = d.get("count")
        return f"· {n} already-stored item{'' if n == 1 else 's'} skipped from {e.server_id}"
    if k == "publish-undeclared":
        return f"? {d.get('text')}"
    if k == "declaration-mismatch":
        return f"? {e.server_id}: {_excerpt(d.get('text'), 1000)}"
    if k == "trace-dropped":
        count = d.get("count")
        shown = f"{count:,}" if isinstance(count, int) else count
        return f"! transcript fell behind: {shown} events from {_source_label(e)} not shown"
    if k == "collapsed":
        count = d.get("count")
        shown = f"{count:,}" if isinstance(count, int) else count
        like = "other lines" if d.get("other_shapes") else "like this"
        sample = f" ({_excerpt(d.get('sample'), 120)})" if d.get("sample") else ""
        seconds = d.get("seconds")
        return f"… {shown} more {like} from {_source_label(e)} in the last {seconds} s{sample}"
    if k == "note":
        return f"· {d.get('text')}"
    if k == "host-stopping":
        return "· host stopping"
    if k == "agent-lease":
        if d.get("state") == "runs":
            return f"· {e.agent} runs here (lease epoch {d.get('epoch')})"
        return f"· {e.agent} moved: {_lease_gone(d)}"
    if k == "server-lease":
        if d.get("state") == "runs":
            return f"· {e.server_id}: this host holds its connection (lease epoch {d.get('epoch')})"
        return f"· {e.server_id}: its connection moved: {_lease_gone(d)}"
    if k == "connecting":
        return f"· {e.server_id} connecting ({d.get('transport')}, attempt {d.get('attempt')})"
    if k == "server-log":
        return f"  {e.server_id} stderr: {_excerpt(d.get('line'), 1000)}"
    if k == "tokens":
        return f"  {e.agent} streams: {_excerpt(d.get('delta'), 1000)}"
    if k == "turn-start":
        return f"· {e.agent} starts a turn ({d.get('wakes')} wake(s), {d.get('model')})"
    if k == "request-timeout":
        return f"! {e.server_id}: no answer to {d.get('method')} within {d.get('timeout_s')} s"
    return None


def _lease_gone(d: Mapping[str, Any]) -> str:
    """Why a lease left this host (an ``agent-lease`` or ``server-lease`` event of state
    ``moved``)."""
    reason = d.get("reason")
    if reason == "released":
        return "its lease was handed on (the work is spread over the hosts)"
    if reason == "expired":
        return "its lease expired (not renewed in time)"
    return "its lease was lost"
