"""A stored message as one line of text, as ``mcplive history`` and the console's History page
show it: local time, id, agent, role, where it came from, and its text."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from protocol.authors import shown_author, stored_author
from protocol.folds import covered_ends, is_summary, summary_header


def history_line(
    m: Mapping[str, Any], *, created_at: float | None = None, set_aside: bool = False
) -> str:
    """One message as one line: local time, id, agent, role, where it came from, its text."""
    meta = m.get("metadata") or {}
    parts = []
    for b in m.get("blocks", []):
        t = b.get("type")
        if t == "text":
            parts.append(b.get("text", ""))
        elif t == "tool_use":
            parts.append(
                f"[calls {b.get('name')} {json.dumps(b.get('input'), ensure_ascii=False)}]"
            )
        elif t == "tool_result":
            inner = " ".join(
                x.get("text", "") for x in b.get("content", []) if isinstance(x, Mapping)
            )
            parts.append(f"[result{' (error)' if b.get('is_error') else ''}: {inner}]")
        else:
            parts.append(f"[{t}]")
    src = meta.get("inbound_source") or {}
    author = stored_author(meta)
    where = ""
    if src:
        where = f" {src.get('server')}" + (f" {src.get('channel')}" if src.get("channel") else "")
        # the name (or id) as the model is shown it: one value, never a line of its own
        where += f" {shown_author(author)}:" if author is not None else ":"
    stamp = ""
    if created_at is not None:
        stamp = dt.datetime.fromtimestamp(created_at).strftime("%Y-%m-%d %H:%M:%S ")
    mark = " (set aside)" if set_aside else ""
    if is_summary(m):
        covers = meta["summarizes"]
        first, last = covered_ends(covers)
        first_last = f"{first} … {last}" if first != last else str(first or "")
        where = f" {summary_header(covers)} (covers {first_last}):"
    text = " ".join(" ".join(parts).split())
    return f"{stamp}{m['id']} {m['agent']} {m['role']}{mark}{where} {text}"
