"""Stored messages → OpenAI chat-completions ``messages`` and ``tools`` (pure).

The chat-completions interface differs from the Messages API in three ways that shape this
module:

* the system prompt is a leading ``system`` message;
* an assistant message carries its tool calls in ``tool_calls`` (``function.arguments`` is a
  JSON *string*), and each call is answered by its own ``tool`` message (``tool_call_id``),
  which must come right after the assistant message (or after the other answers to it);
* a ``tool`` message holds text only: images a tool returned go in a ``user`` message right
  after the answers, as ``image_url`` parts with a ``data:`` URL (the one place, with user
  messages, where the interface takes images).

Everything else follows :func:`actors.models.anthropic.to_messages_api`'s rules, so both providers
see one conversation alike: host notices become user text prefixed ``[host notice] ``, empty text
is dropped, a result that answers no pending call becomes user text, a call with no stored result
gets one saying so, a user placeholder goes first when needed, uri-form media and resources
become ``[resource: <uri>]``, and lone surrogates become U+FFFD.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from protocol.display import scrub_surrogates

from .base import ToolSpec, tool_result_items

__all__ = ["EMPTY_RESULT", "MISSING_RESULT", "NOTICE_PREFIX", "to_chat_messages", "to_chat_tools"]

NOTICE_PREFIX = "[host notice] "
EMPTY_RESULT = "(no output)"
START_PLACEHOLDER = "[earlier conversation omitted]"
MISSING_RESULT = "[no result was recorded for this tool call]"
#: Put before the text of a tool result that reports an error (the interface has no flag).
ERROR_PREFIX = "[tool error] "

_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})

Part = dict[str, Any]


def to_chat_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Tool specs as chat-completions ``function`` tools."""
    return cast(
        list[dict[str, Any]],
        scrub_surrogates(
            [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": {"type": "object", **dict(t.input_schema)},
                    },
                }
                for t in tools
            ]
        ),
    )


def to_chat_messages(system: str, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat ``messages`` for ``system`` and the stored ``messages`` (oldest first).

    A user message is one string when it holds only text, else a list of ``text`` and
    ``image_url`` parts. Each assistant message with tool calls is followed by one ``tool``
    message per call, in call order, before anything else; user content stored between a call
    and its result waits until the answers are in.
    """
    out = _Builder()
    if system:
        out.messages.append({"role": "system", "content": system})
    for message in messages:
        role = str(message.get("role", "user"))
        blocks = [b for b in message.get("blocks") or () if isinstance(b, Mapping)]
        if role == "assistant":
            out.assistant(blocks)
        elif role == "tool":
            for block in blocks:
                if block.get("type") == "tool_result":
                    out.result(block)
                else:
                    out.user(_user_parts(block, notice=False))
        else:
            for block in blocks:
                out.user(_user_parts(block, notice=role == "system"))
    out.close_calls()
    first = 1 if system else 0
    if len(out.messages) == first or out.messages[first]["role"] != "user":
        # chat templates of many open models expect a user message first
        out.messages.insert(first, {"role": "user", "content": [_text(START_PLACEHOLDER)]})
    for message in out.messages:
        content = message["content"]
        if message["role"] == "user" and all(p["type"] == "text" for p in content):
            # plain text as one string: every compatible server takes that form
            message["content"] = "\n".join(p["text"] for p in content)
    return cast(list[dict[str, Any]], scrub_surrogates(out.messages))


class _Builder:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._asked: list[str] = []  # the open assistant message's call ids, in order
        self._answers: dict[str, tuple[str, list[Part]]] = {}  # id -> (text, images)
        self._held: list[Part] = []  # user parts waiting for the answers

    def assistant(self, blocks: Sequence[Mapping[str, Any]]) -> None:
        self.close_calls()
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in blocks:
            btype = block.get("type")
            if btype == "text":
                text = str(block.get("text") or "")
                if text.strip():
                    texts.append(text)
            elif btype == "tool_use":
                raw = block.get("input")
                call_id = str(block.get("id", ""))
                if any(c["id"] == call_id for c in calls):  # an id answers one call only
                    texts.append(f"[tool call {block.get('name', '')} ({call_id})]")
                    continue
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": str(block.get("name", "")),
                            "arguments": json.dumps(
                                dict(raw) if isinstance(raw, Mapping) else {},
                                ensure_ascii=False,
                            ),
                        },
                    }
                )
            elif btype == "tool_result":
                texts.append(_result_text(block, str(block.get("tool_use_id", ""))))
            else:
                texts.extend(p["text"] for p in _media(block, images=False))
        if not texts and not calls:
            return
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
        if calls:
            message["tool_calls"] = calls
            self._asked = [c["id"] for c in calls]
        self.messages.append(message)

    def result(self, block: Mapping[str, Any]) -> None:
        call_id = str(block.get("tool_use_id", ""))
        if call_id in self._asked and call_id not in self._answers:
            text, images = _result_content(block)
            self._answers[call_id] = (text, images)
            if len(self._answers) == len(self._asked):
                self.close_calls()
        else:
            self.user([_text(_result_text(block, call_id))])

    def user(self, parts: list[Part]) -> None:
        if not parts:
            return
        if self._asked:
            self._held.extend(parts)
        else:
            self._append_user(parts)

    def close_calls(self) -> None:
        """Answer every open call (a made-up error for one with no stored result), then let
        the held user content through."""
        images: list[Part] = []
        for call_id in self._asked:
            text, found = self._answers.get(call_id, (ERROR_PREFIX + MISSING_RESULT, []))
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            if found:
                images += [_text(f"[images returned by tool call {call_id}]"), *found]
        self._asked, self._answers = [], {}
        held, self._held = images + self._held, []
        if held:
            self._append_user(held)

    def _append_user(self, parts: list[Part]) -> None:
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "user" and isinstance(last["content"], list):
            last["content"].extend(parts)
        else:
            self.messages.append({"role": "user", "content": list(parts)})


def _text(text: str) -> Part:
    return {"type": "text", "text": text}


def _user_parts(block: Mapping[str, Any], *, notice: bool) -> list[Part]:
    btype = block.get("type")
    if btype == "text":
        text = str(block.get("text") or "")
        if not text.strip():
            return []
        return [_text(NOTICE_PREFIX + text if notice else text)]
    if btype == "tool_use":
        return [_text(f"[tool call {block.get('name', '')} ({block.get('id', '')})]")]
    if btype == "tool_result":
        return [_text(_result_text(block, str(block.get("tool_use_id", ""))))]
    return _media(block, images=True)


def _media(block: Mapping[str, Any], *, images: bool) -> list[Part]:
    """Image, audio, resource and unknown blocks: an ``image_url`` part where one is taken,
    else a short bracketed text."""
    btype = block.get("type")
    if btype in ("image", "audio"):
        mime = str(block.get("mimeType") or "")
        data = block.get("data")
        if btype == "image" and isinstance(data, str) and data:
            if images and mime in _IMAGE_TYPES:
                return [{"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}]
            return [_text(f"[image ({mime or 'unknown type'}) omitted]")]
        if block.get("uri"):
            return [_text(f"[resource: {block['uri']}]")]
        return [_text(f"[{btype} ({mime or 'unknown type'}) omitted]")]
    if btype == "resource":
        resource = block.get("resource")
        uri = resource.get("uri") if isinstance(resource, Mapping) else None
        return [_text(f"[resource: {uri if uri else block.get('uri', '?')}]")]
    if btype == "resource_link":
        return [_text(f"[resource: {block.get('uri', '?')}]")]
    return [_text(f"[{btype} block omitted]")]


def _result_content(block: Mapping[str, Any]) -> tuple[str, list[Part]]:
    """A tool result's text (the error marker first when it reports one) and its images."""
    texts: list[str] = []
    images: list[Part] = []
    for item in tool_result_items(block):
        if item.get("type") == "text":
            text = str(item.get("text") or "")
            if text.strip():
                texts.append(text)
        elif item.get("type") in ("tool_use", "tool_result"):
            texts.append(f"[{item.get('type')} block omitted]")
        else:
            for part in _media(item, images=True):
                if part["type"] == "text":
                    texts.append(part["text"])
                else:
                    images.append(part)
    text = "\n".join(texts) or (f"[{len(images)} image(s)]" if images else EMPTY_RESULT)
    if block.get("is_error"):
        text = ERROR_PREFIX + text
    return text, images


def _result_text(block: Mapping[str, Any], call_id: str) -> str:
    """A tool result that answers no open call, as text (its images named, not sent)."""
    text, images = _result_content(block)
    head = f"[result of tool call {call_id}]"
    more = f"\n[{len(images)} image(s) omitted]" if images else ""
    return f"{head}\n{text}{more}"
