"""The scripted model (``scripted:PATH``): deterministic rules in a TOML file.

On each wake the first rule whose ``when`` matches the newest incoming body (header excluded)
fires once: its ``calls`` run, then its ``say`` is spoken, and the turn ends. No match: silence.
An empty file is a valid model that never speaks. ``{0}`` is the whole match and ``{1}``, ``{2}``…
its groups, in ``say`` and in any string inside ``calls`` arguments; in ``say``, ``{result}`` is
the text of the rule's tool results (empty when it made no calls); ``{author}`` is who wrote
that message, exactly as the host's author line shows it to every model
(:func:`protocol.authors.shown_author`: the name, quoted when it holds anything a line could be
forged with; else the id; empty when its server named no one).

A ``[summary]`` table makes the model a summarizer too (``summary_model``, see
:mod:`actors.agent.folding`): asked for a summary, it answers deterministically with ``say``
(default ``"{count} earlier items:\n{items}"``), where ``{count}`` is the number of items and
``{items}`` their lines, one per item: each item's host-written lines and body joined on one
line by ``" / "``, cut at ``item_chars`` characters (default 200). Without it the model does
not fold its agent's context (what leaves the context is dropped).

Usage is an estimate, a token per four characters of what a reply read (the system prompt and the
message bodies) and wrote (its text, or its tool calls as JSON); a silent reply reports what it
read and no output, and the cache counts are always zero.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from actors.errors import ConfigError
from protocol.authors import shown_author, stored_author
from protocol.folds import SUMMARY_KIND
from protocol.hooks import ModelInfo
from store.bodytext import without_header

from .base import DeltaSink, ModelReply, ModelRequest

_FIELD = re.compile(r"\{(\d+|author|result)\}")
_RULE_KEYS = frozenset({"when", "say", "calls"})
_CALL_KEYS = frozenset({"tool", "arguments"})
_SUMMARY_KEYS = frozenset({"say", "item_chars"})
_ITEM = re.compile(r"^--- item \d+\n", re.MULTILINE)
DEFAULT_SUMMARY = "{count} earlier items:\n{items}"


@attrs.frozen(kw_only=True)
class SummaryRule:
    say: str = DEFAULT_SUMMARY
    item_chars: int = 200

    def summarize(self, span: str) -> str:
        """The summary of a span as :func:`actors.agent.folding.span_text` writes it."""
        items = [" / ".join(p.strip().splitlines()) for p in _ITEM.split(span) if p.strip()]
        lines = [i if len(i) <= self.item_chars else i[: self.item_chars] + "…" for i in items]
        return self.say.replace("{count}", str(len(items))).replace("{items}", "\n".join(lines))


@attrs.frozen(kw_only=True)
class Rule:
    when: re.Pattern[str]
    say: str = ""
    calls: tuple[Mapping[str, Any], ...] = ()


def load_rules(path: Path) -> tuple[Rule, ...]:
    return load_script(path)[0]


def _summary_rule(path: Path, raw: Any) -> SummaryRule | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: summary must be a table ([summary])")
    for key in raw:
        if key not in _SUMMARY_KEYS:
            raise ConfigError(f"{path}: summary.{key}: unknown key; [summary] has say, item_chars")
    say = raw.get("say", DEFAULT_SUMMARY)
    if not isinstance(say, str) or not say.strip():
        raise ConfigError(f"{path}: summary.say: must be a non-empty string")
    chars = raw.get("item_chars", 200)
    if not isinstance(chars, int) or isinstance(chars, bool) or chars < 1:
        raise ConfigError(f"{path}: summary.item_chars: must be a whole number of 1 or more")
    return SummaryRule(say=say, item_chars=chars)


def load_script(path: Path) -> tuple[tuple[Rule, ...], SummaryRule | None]:
    """A scripted model file's rules and its summary rule (None without ``[summary]``)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the scripted model ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; save the scripted model as UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply (arrays or tables in each other)") from None
    for key in raw:
        if key not in ("rules", "summary"):
            raise ConfigError(
                f"{path}: {key}: unknown key; a scripted model holds [[rules]] and [summary]"
            )
    rules = raw.get("rules", [])
    if not isinstance(rules, list):
        raise ConfigError(f"{path}: rules must be an array of tables ([[rules]])")
    out = []
    for i, r in enumerate(rules, 1):
        where = f"{path}: rules[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"{where}: must be a table")
        for key in r:
            if key not in _RULE_KEYS:
                raise ConfigError(f"{where}.{key}: unknown key; a rule has when, say and calls")
        when = r.get("when")
        if not isinstance(when, str):
            raise ConfigError(f"{where}.when: required, a regular expression string")
        try:
            pattern = re.compile(when)
        except re.error as exc:
            raise ConfigError(f"{where}.when: not a valid regular expression ({exc})") from None
        say = r.get("say", "")
        if not isinstance(say, str):
            raise ConfigError(f"{where}.say: must be a string")
        calls = r.get("calls", [])
        if not isinstance(calls, list) or not all(
            isinstance(c, Mapping)
            and set(c) <= _CALL_KEYS
            and isinstance(c.get("tool"), str)
            and isinstance(c.get("arguments", {}), Mapping)
            for c in calls
        ):
            raise ConfigError(
                f"{where}.calls: must be a list of {{ tool = NAME, arguments = {{...}} }}"
            )
        out.append(Rule(when=pattern, say=say, calls=tuple(calls)))
    return tuple(out), _summary_rule(path, raw.get("summary"))


def fill(
    template: Any, match: re.Match[str], author: str | None = None, result: str | None = None
) -> Any:
    """Substitute ``{n}`` with group n (empty when the group did not take part) and, when
    ``author`` (``result``) is given, ``{author}`` (``{result}``) with it; what is substituted
    is not filled again."""
    if isinstance(template, str):

        def field(m: re.Match[str]) -> str:
            name = m.group(1)
            if name == "author":
                return m.group(0) if author is None else author
            if name == "result":
                return m.group(0) if result is None else result
            return _group(match, int(name))

        return _FIELD.sub(field, template)
    if isinstance(template, Mapping):
        return {k: fill(v, match, author) for k, v in template.items()}
    if isinstance(template, list):
        return [fill(v, match, author) for v in template]
    return template


def _results(message: Mapping[str, Any]) -> str:
    """The text of a stored tool message's results, in order."""
    texts = []
    for block in message.get("blocks", ()):
        content = block.get("content") if block.get("type") == "tool_result" else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, Sequence):
            texts += [str(i.get("text", "")) for i in content if isinstance(i, Mapping)]
    return "\n".join(texts)


def _group(match: re.Match[str], n: int) -> str:
    if n > (match.re.groups or 0):
        return ""
    return match.group(n) or ""


def body_of(message: Mapping[str, Any]) -> str:
    """The body of a stored message as the sender wrote it: no header, no context prefix."""
    skip = int(message.get("prefix", 0) or 0)
    meta = message.get("metadata") or {}
    blocks = list(message.get("blocks", ()))
    # a rendered message's prefix holds every line the host wrote, its header included: a
    # body block that happens to equal the header is the sender's
    blocks = blocks[skip:] if skip else without_header(blocks, meta)
    return "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")


#: What a scripted model says of its context window (it reads only the newest message).
SCRIPTED_CONTEXT_WINDOW = 200_000
_PIECES = re.compile(r"\s*\S+\s*|\s+")


def _tokens(text: str) -> int:
    return len(text) // 4 + 1


def _is_inbound(message: Mapping[str, Any]) -> bool:
    """A user message that was stored, not context a server injected for this turn."""
    meta = message.get("metadata")
    return message.get("role") == "user" and not (
        isinstance(meta, Mapping) and ("injection" in meta or meta.get("kind") == SUMMARY_KIND)
    )


#: Body lengths kept (:func:`_body_length`); the oldest go first. Enough for every agent's
#: context at once (the agents hearing a channel mostly read the same items), and no more: an
#: entry keeps its message's objects alive, for the collector to walk.
BODY_LENGTHS = 1024
_body_lengths: OrderedDict[int, tuple[object, object, object, int]] = OrderedDict()


def _body_length(message: Mapping[str, Any]) -> int:
    """``len(body_of(message))``, counted once for a message's blocks, metadata and prefix:
    the agents hearing one item are shown copies of one rendering, which share those objects,
    so every scripted agent of the host finds the count made for the first. An entry holds its
    objects, so the identity it is found by is not given to another object while it is kept."""
    blocks, meta, prefix = message.get("blocks"), message.get("metadata"), message.get("prefix")
    entry = _body_lengths.get(id(blocks))
    if entry is None or entry[0] is not blocks or entry[1] is not meta or entry[2] != prefix:
        if len(_body_lengths) >= BODY_LENGTHS:
            _body_lengths.popitem(last=False)
        entry = _body_lengths[id(blocks)] = (blocks, meta, prefix, len(body_of(message)))
    return entry[3]


class ScriptedModel:
    #: It runs in the host's own interpreter: a turn keeps the turn token while it answers.
    local = True

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = f"scripted:{path.name}"
        self.info = ModelInfo(
            id=self.name,
            vendor="mcplive",
            context_window=SCRIPTED_CONTEXT_WINDOW,
            capabilities=("tools",),
        )
        self.rules, self.summary = load_script(path)
        #: Whether it can fold its agent's context (it has a ``[summary]`` rule).
        self.can_summarize = self.summary is not None

    def _usage(self, request: ModelRequest, output: str) -> dict[str, int]:
        """An estimate (a token per four characters read and written), so lifecycle,
        inference answers and the turn's usage carry numbers; no cache is ever used."""
        seen = len(request.system) + sum(_body_length(m) for m in request.messages)
        return {"input_tokens": seen // 4 + 1, "output_tokens": _tokens(output) if output else 0}

    def _summarize(self, request: ModelRequest) -> ModelReply:
        if self.summary is None:
            return ModelReply(blocks=(), model=self.name)
        span = "\n".join(body_of(m) for m in request.messages)
        text = self.summary.summarize(span)
        return ModelReply(
            blocks=({"type": "text", "text": text},),
            model=self.name,
            usage=self._usage(request, text),
        )

    def _match(
        self, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[Rule, re.Match[str], str] | None:
        """The rule that fires, its match, and who wrote the newest incoming message as the
        host shows every model (empty when its server named no one)."""
        newest = next((m for m in reversed(messages) if _is_inbound(m)), None)
        if newest is None:
            return None
        body = body_of(newest)
        for rule in self.rules:
            found = rule.when.search(body)
            if found is not None:
                author = stored_author(newest.get("metadata"))
                return rule, found, "" if author is None else shown_author(author)
        return None

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> ModelReply:
        messages = request.messages
        request.sent({"model": self.name, "system": request.system, "messages": list(messages)})
        if request.purpose == "summary":
            return self._summarize(request)
        # the host's own notices (a delivery receipt after a reply) do not count as new input
        last = next((r for m in reversed(messages) if (r := m.get("role")) != "system"), None)
        hit = None if last == "assistant" else self._match(messages)  # it already spoke
        if hit is None:
            # saying nothing, it still read its context: the usage counts what it read
            return ModelReply(blocks=(), model=self.name, usage=self._usage(request, ""))
        rule, found, author = hit
        if rule.calls and last != "tool":
            uses = tuple(
                {
                    "type": "tool_use",
                    "id": f"call_{i}",
                    "name": fill(c["tool"], found, author),
                    "input": fill(dict(c.get("arguments", {})), found, author),
                }
                for i, c in enumerate(rule.calls, 1)
            )
            return ModelReply(
                blocks=uses,
                stop_reason="tool_use",
                model=self.name,
                usage=self._usage(request, json.dumps(uses)),
            )
        text = fill(rule.say, found, author, _results(messages[-1]) if last == "tool" else "")
        if text and on_delta is not None:
            for piece in _PIECES.findall(text):  # word by word, as a provider streams
                await on_delta(piece)
        return ModelReply(
            blocks=({"type": "text", "text": text},) if text else (),
            model=self.name,
            usage=self._usage(request, text),
        )
