"""``mcplive history``: print an agent's stored messages from the store in a data dir."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def cmd_history(args: argparse.Namespace) -> int:
    from store import Reader

    path = Path(args.data_dir) / "store.sqlite3"
    if not path.is_file():
        print(f"mcplive: no store at {path}; give --data-dir", file=sys.stderr)
        return 1
    reader = Reader(path)
    try:
        if args.search is not None:
            try:
                messages = reader.search(args.search, agent=args.agent, regex=args.regex)
            except Exception as exc:  # a bad regular expression
                print(f"mcplive: --search: {exc}", file=sys.stderr)
                return 2
        else:
            messages = reader.history(args.agent)
    finally:
        reader.close()
    for m in messages:
        if args.json:
            print(json.dumps(m, ensure_ascii=False, default=str))
        else:
            print(_history_line(m))
    return 0


def _history_line(m: Mapping[str, Any]) -> str:
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
    author = (meta.get("author") or {}).get("name")
    where = ""
    if src:
        where = f" {src.get('server')}" + (f" {src.get('channel')}" if src.get("channel") else "")
        where += f" {author}:" if author else ":"
    return f"{m['agent']} {m['role']}{where} " + " ".join(" ".join(parts).split())
