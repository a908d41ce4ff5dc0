"""The ``recall`` host tool: an agent searches its own stored history.

``recall {query}`` finds the agent's newest stored messages whose body text holds ``query``
(case-insensitive, through the store's text index); ``recall {around: message_id}`` gives the
messages stored just before and after one of its messages. Either way at most ``limit`` messages
(default ``DEFAULT_LIMIT``, at most ``MAX_LIMIT``), oldest first, each with its id, its source
header and author line as the host wrote them, and its body cut at ``MAX_CHARS`` characters.
Messages folded out of the agent's view (:mod:`actors.agent.folding`) are found like any other; the
summaries themselves are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from actors.models.base import ToolSpec
from actors.models.scripted import body_of
from protocol.folds import is_summary
from store import Reader

from .folding import host_lines
from .history import render_for_model

DEFAULT_LIMIT = 10
MAX_LIMIT = 50
#: The most characters of one message's body a result shows.
MAX_CHARS = 1500
MAX_QUERY_CHARS = 500

RECALL_TOOL = ToolSpec(
    name="recall",
    description="Search your own stored history, including what has left your context "
    "(older messages are folded into [summary: …] lines). With query: your newest messages "
    "holding that text. With around (a message id from an earlier recall): the messages just "
    "before and after it. Each comes with its id, its source header and its author.",
    input_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "around": {"type": "string"},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
        },
    },
)


def _result(is_error: bool, text: str) -> dict[str, Any]:
    return {"is_error": is_error, "content": [{"type": "text", "text": text}]}


async def recall(ctx: Any, agent: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """Run one ``recall`` call for ``agent`` (a refusal is an error result)."""
    query, around, limit = args.get("query"), args.get("around"), args.get("limit", DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        return _result(True, f"recall: limit must be a whole number from 1 to {MAX_LIMIT}")
    if (query is None) == (around is None):
        return _result(True, "recall: give either query (text to find) or around (a message id)")
    if query is not None:
        if not isinstance(query, str) or not query.strip() or len(query) > MAX_QUERY_CHARS:
            return _result(True, f"recall: query must be text of 1 to {MAX_QUERY_CHARS} characters")
        found = await ctx.store.read(_search, ctx.store.reader, agent, query, limit)
        what = f"matching {query!r}"
    else:
        if not isinstance(around, str) or not around:
            return _result(True, "recall: around must be a message id")
        found = await ctx.store.read(_around, ctx.store.reader, agent, around, limit)
        if found is None:
            return _result(True, f"recall: you have no stored message {around!r}")
        what = f"around {around}"
    if not found:
        return _result(False, f"recall: no message {what}")
    head = f"recall: {len(found)} message{'' if len(found) == 1 else 's'} {what}, oldest first"
    return _result(False, "\n".join([head, *(_shown(m) for m in found)]))


def _search(reader: Reader, agent: str, query: str, limit: int) -> list[dict[str, Any]]:
    # the summaries are passed over: however many quote the text, the messages are found
    return reader.search(query, agent=agent, limit=limit, keep=lambda m: not is_summary(m))


def _around(reader: Reader, agent: str, message_id: str, limit: int) -> list[dict[str, Any]] | None:
    seq = reader.seq_of(message_id, agent)
    if seq is None:
        return None
    before = max(0, (limit - 1) // 2)
    older = reader.rows(agent=agent, before_seq=seq, newest_first=True, limit=before)
    rest = reader.rows(agent=agent, after_seq=seq - 1, limit=limit - len(older))
    rows = [*reversed(older), *rest]
    return [r.message for r in rows if not is_summary(r.message)]


def _shown(message: Mapping[str, Any]) -> str:
    rendered = render_for_model(message)
    role = message.get("role")
    blocks: Sequence[Mapping[str, Any]] = rendered.get("blocks", ())
    lines = host_lines(rendered)
    body = body_of(rendered) if role == "user" else _plain(blocks)
    if len(body) > MAX_CHARS:
        body = body[:MAX_CHARS] + f" … ({len(body) - MAX_CHARS} more characters)"
    who = {"assistant": "you", "tool": "tool results", "system": "host notice"}.get(str(role))
    title = f"--- message {message.get('id')}" + (f" ({who})" if who else "")
    return "\n".join([title, *lines, body])


def _plain(blocks: Sequence[Mapping[str, Any]]) -> str:
    out = []
    for b in blocks:
        if b.get("type") == "text":
            out.append(str(b.get("text", "")))
        elif b.get("type") == "tool_use":
            out.append(f"[called {b.get('name')}]")
        elif b.get("type") == "tool_result":
            out.append("[tool result]")
    return "\n".join(out)
