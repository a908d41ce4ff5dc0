"""The wake gate: whether an event (a push event or a stored chat message) wakes an agent.

A gate policy file (TOML or JSON, same structure) lists policies; the first policy whose
``match`` fits the event decides, otherwise the file's ``default``. A policy's behavior is
``always``, ``defer``, ``skip`` (no wake), a debounce (events are batched; the batch is due
``debounce_ms`` after the last one), a token-bucket rate limit, or a passive sample (the first
event of a key wakes, then one in ``every``). The gate can be put to sleep: until the sleep ends
only events by a privileged author are evaluated; the rest do not wake.

Also here: ``WakeBuffer``, the bounded buffer of wakes an agent keeps while a turn runs.

Pure: time is always passed in as ``now`` (seconds); policy files are passed in as text.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final, Generic, NoReturn, TypeVar

import attrs

T = TypeVar("T")

Conversation = tuple[str, str | None, str | None]

#: A debounce batch keeps at most this many snippets (the oldest are dropped).
MAX_BATCH: Final = 100
#: Each snippet in a batch is cut to this many characters.
MAX_SNIPPET: Final = 200
#: A rate limit or passive sample keeps at most this many keys (least recently used dropped).
MAX_KEYS: Final = 1024
#: A policy file holds at most this many policies.
MAX_POLICIES: Final = 200
MAX_POLICY_NAME: Final = 100
#: A debounce batch remembers at most this many withdrawable items (RFC-006: an occurrence
#: replaced or retracted before it was read no longer counts); older ones stay counted.
MAX_BATCH_ITEMS: Final = 1024
#: ``WakeBuffer`` defaults.
MAX_BUFFERED: Final = 100
MAX_CONVERSATIONS: Final = 32

DEBOUNCE_MS: Final = (100, 300_000)
TOKENS: Final = (1, 10_000)
REFILL_INTERVAL_MS: Final = (100, 86_400_000)
EVERY: Final = (1, 10_000)

SIMPLE_BEHAVIORS: Final = ("always", "defer", "skip")
KEY_BY: Final = ("server", "channel", "conversation", "author")
KINDS: Final = ("push", "incoming")
_KIND_ALIASES: Final = {
    "push": "push",
    "incoming": "incoming",
    "mcpl:push-event": "push",
    "mcpl:channel-incoming": "incoming",
}
_EPSILON: Final = 1e-9


class GateConfigError(ValueError):
    """A gate policy file that cannot be used; the message is one line naming the place."""


# --- globs --------------------------------------------------------------------------------


def glob_match(pattern: str, text: str) -> bool:
    """Whole-string match: ``*`` is any run, ``?`` one character, anything else itself.

    Two pointers with backtracking to the last ``*`` only: O(len(pattern) * len(text)) at
    worst, never exponential. Case-sensitive; ``[`` and ``\\`` are ordinary characters.
    """
    p = t = 0
    star = -1
    mark = 0
    plen, tlen = len(pattern), len(text)
    while t < tlen:
        if p < plen and (pattern[p] == "?" or pattern[p] == text[t]):
            p += 1
            t += 1
        elif p < plen and pattern[p] == "*":
            star = p
            mark = t
            p += 1
        elif star >= 0:
            p = star + 1
            mark += 1
            t = mark
        else:
            return False
    while p < plen and pattern[p] == "*":
        p += 1
    return p == plen


# --- configuration values -----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Simple:
    """``always`` wakes; ``defer`` and ``skip`` do not."""

    kind: str

    @property
    def name(self) -> str:
        return self.kind


@attrs.frozen(kw_only=True)
class Debounce:
    """Batch matching events; the batch is due ``ms`` after the last one."""

    ms: int

    @property
    def name(self) -> str:
        return "debounce"


@attrs.frozen(kw_only=True)
class RateLimit:
    """Token bucket per key: ``tokens`` capacity, refilled at ``tokens`` per interval."""

    tokens: int
    refill_interval_ms: int
    key_by: str | None = None

    @property
    def name(self) -> str:
        return "rate_limit"


@attrs.frozen(kw_only=True)
class PassiveSample:
    """Counter per key: the first event wakes, then one in ``every``."""

    every: int
    key_by: str | None = None

    @property
    def name(self) -> str:
        return "passive_sample"


Behavior = Simple | Debounce | RateLimit | PassiveSample


@attrs.frozen(kw_only=True)
class Filter:
    """``text``: case-insensitive substring; ``regex``: ``re.search`` with IGNORECASE."""

    type: str
    pattern: str
    compiled: re.Pattern[str] | None = attrs.field(default=None, eq=False, repr=False)

    def matches(self, text: str) -> bool:
        if self.compiled is not None:
            return self.compiled.search(text) is not None
        return self.pattern.casefold() in text.casefold()


@attrs.frozen(kw_only=True)
class Match:
    """Every given field must match; empty tuples and None mean "not given"."""

    scope: frozenset[str] = frozenset()
    source: str | None = None
    channel: str | None = None
    filter: Filter | None = None
    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    tags_none: tuple[str, ...] = ()
    metadata_true: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class Policy:
    name: str
    behavior: Behavior
    match: Match = Match()
    resets: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class GateConfig:
    policies: tuple[Policy, ...] = ()
    default: str = "always"
    privileged_authors: tuple[str, ...] = ()


# --- events and matching ------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class GateEvent:
    """What the gate sees of one event; ``text`` is the body, without any header."""

    kind: str
    server_id: str
    channel_id: str | None = None
    thread_id: str | None = None
    text: str = ""
    tags: tuple[str, ...] = ()
    author: str | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    item: str | None = None  # an id the event can be withdrawn by (an RFC-006 occurrence)

    @property
    def conversation(self) -> Conversation:
        return (self.server_id, self.channel_id, self.thread_id)


def _any_glob(patterns: tuple[str, ...], values: tuple[str, ...]) -> bool:
    return any(glob_match(p, v) for p in patterns for v in values)


def matches(match: Match, event: GateEvent) -> bool:
    """Whether ``event`` fits every field given in ``match``.

    An event without a channel never matches a ``channel`` pattern.
    """
    if match.scope and _KIND_ALIASES.get(event.kind, event.kind) not in match.scope:
        return False
    if match.source is not None and not glob_match(match.source, event.server_id):
        return False
    if match.channel is not None and (
        event.channel_id is None or not glob_match(match.channel, event.channel_id)
    ):
        return False
    if match.tags_any and not _any_glob(match.tags_any, event.tags):
        return False
    if match.tags_all and not all(_any_glob((p,), event.tags) for p in match.tags_all):
        return False
    if match.tags_none and _any_glob(match.tags_none, event.tags):
        return False
    if match.metadata_true and not any(bool(event.metadata.get(k)) for k in match.metadata_true):
        return False
    return match.filter is None or match.filter.matches(event.text)


# --- parsing ------------------------------------------------------------------------------


def _show(key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return key
    return repr(key)[:60]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _fail(path: str, message: str) -> NoReturn:
    raise GateConfigError(f"{path}: {message}" if path else message)


def _table(value: Any, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(path or "(top level)", "must be a table")
    for key in value:
        if key not in allowed:
            _fail(_join(path, _show(key)), f"unknown key (expected one of: {', '.join(allowed)})")
    return value


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        _fail(path, "must be a string")
    return value


def _strings(value: Any, path: str, *, non_empty: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list):
        _fail(path, "must be a list of strings")
    if non_empty and not value:
        _fail(path, "must not be empty")
    return tuple(_str(v, f"{path}[{i}]") for i, v in enumerate(value))


def _int(value: Any, path: str, bounds: tuple[int, int]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(path, "must be an integer")
    lo, hi = bounds
    if not lo <= value <= hi:
        _fail(path, f"must be from {lo} to {hi}")
    return value


def _key_by(table: dict[str, Any], path: str) -> str | None:
    if "key_by" not in table:
        return None
    value = table["key_by"]
    if value not in KEY_BY:
        _fail(_join(path, "key_by"), f"must be one of: {', '.join(KEY_BY)}")
    assert isinstance(value, str)
    return value


_BEHAVIOR_KEYS: Final = ("debounce_ms", "rate_limit", "passive_sample")


def _behavior(value: Any, path: str) -> Behavior:
    if isinstance(value, str):
        if value not in SIMPLE_BEHAVIORS:
            _fail(path, 'must be "always", "defer", "skip" or a table')
        return Simple(kind=value)
    table = _table(value, path, _BEHAVIOR_KEYS)
    if len(table) != 1:
        _fail(path, f"must hold exactly one of: {', '.join(_BEHAVIOR_KEYS)}")
    if "debounce_ms" in table:
        return Debounce(ms=_int(table["debounce_ms"], _join(path, "debounce_ms"), DEBOUNCE_MS))
    if "rate_limit" in table:
        sub = _join(path, "rate_limit")
        rl = _table(table["rate_limit"], sub, ("tokens", "refill_interval_ms", "key_by"))
        for required in ("tokens", "refill_interval_ms"):
            if required not in rl:
                _fail(_join(sub, required), "is required")
        return RateLimit(
            tokens=_int(rl["tokens"], _join(sub, "tokens"), TOKENS),
            refill_interval_ms=_int(
                rl["refill_interval_ms"], _join(sub, "refill_interval_ms"), REFILL_INTERVAL_MS
            ),
            key_by=_key_by(rl, sub),
        )
    sub = _join(path, "passive_sample")
    ps = _table(table["passive_sample"], sub, ("every", "key_by"))
    if "every" not in ps:
        _fail(_join(sub, "every"), "is required")
    return PassiveSample(
        every=_int(ps["every"], _join(sub, "every"), EVERY), key_by=_key_by(ps, sub)
    )


_MATCH_KEYS: Final = (
    "scope",
    "source",
    "channel",
    "filter",
    "tags_any",
    "tags_all",
    "tags_none",
    "metadata_true",
)


def _filter(value: Any, path: str) -> Filter:
    table = _table(value, path, ("type", "pattern"))
    for required in ("type", "pattern"):
        if required not in table:
            _fail(_join(path, required), "is required")
    kind = table["type"]
    if kind not in ("text", "regex"):
        _fail(_join(path, "type"), 'must be "text" or "regex"')
    pattern = _str(table["pattern"], _join(path, "pattern"))
    if kind == "text":
        return Filter(type="text", pattern=pattern)
    try:
        compiled = re.compile(pattern, re.IGNORECASE)
    except re.error as e:
        _fail(_join(path, "pattern"), f"invalid regex: {e}")
    return Filter(type="regex", pattern=pattern, compiled=compiled)


def _match(value: Any, path: str) -> Match:
    table = _table(value, path, _MATCH_KEYS)
    scope: set[str] = set()
    if "scope" in table:
        sub = _join(path, "scope")
        for i, kind in enumerate(_strings(table["scope"], sub, non_empty=True)):
            if kind not in _KIND_ALIASES:
                _fail(f"{sub}[{i}]", f"must be one of: {', '.join(_KIND_ALIASES)}")
            scope.add(_KIND_ALIASES[kind])
    source = _str(table["source"], _join(path, "source")) if "source" in table else None
    channel = _str(table["channel"], _join(path, "channel")) if "channel" in table else None
    flt = _filter(table["filter"], _join(path, "filter")) if "filter" in table else None

    def strings(key: str, non_empty: bool) -> tuple[str, ...]:
        if key not in table:
            return ()
        return _strings(table[key], _join(path, key), non_empty=non_empty)

    return Match(
        scope=frozenset(scope),
        source=source,
        channel=channel,
        filter=flt,
        tags_any=strings("tags_any", True),
        tags_all=strings("tags_all", False),
        tags_none=strings("tags_none", False),
        metadata_true=strings("metadata_true", True),
    )


def _policy(value: Any, path: str) -> Policy:
    table = _table(value, path, ("name", "behavior", "resets", "match"))
    for required in ("name", "behavior"):
        if required not in table:
            _fail(_join(path, required), "is required")
    name = _str(table["name"], _join(path, "name"))
    if not name or len(name) > MAX_POLICY_NAME:
        _fail(_join(path, "name"), f"must be 1 to {MAX_POLICY_NAME} characters")
    return Policy(
        name=name,
        behavior=_behavior(table["behavior"], _join(path, "behavior")),
        match=_match(table["match"], _join(path, "match")) if "match" in table else Match(),
        resets=_strings(table["resets"], _join(path, "resets")) if "resets" in table else (),
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise GateConfigError(f"json: duplicate key {_show(key)}")
        out[key] = value
    return out


def _no_constant(name: str) -> NoReturn:
    raise GateConfigError(f"json: {name} is not allowed")


def _load(text: str, fmt: str) -> Any:
    if fmt == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise GateConfigError(f"toml: {e}".replace("\n", " ")) from None
        except RecursionError:
            raise GateConfigError("toml: nested too deeply") from None
    if fmt == "json":
        try:
            return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        except json.JSONDecodeError as e:
            raise GateConfigError(f"json: {e.msg} (line {e.lineno}, column {e.colno})") from None
        except RecursionError:
            raise GateConfigError("json: nested too deeply") from None
    raise GateConfigError(f'format must be "toml" or "json", not {fmt!r}')


def parse_gate(text: str, fmt: str) -> GateConfig:
    """Parse a gate policy file; ``fmt`` is ``"toml"`` or ``"json"``.

    Raises ``GateConfigError`` naming the place of the first problem found.
    """
    top = _table(_load(text, fmt), "", ("default", "privileged_authors", "policies"))
    default = top.get("default", "always")
    if default not in SIMPLE_BEHAVIORS:
        _fail("default", 'must be "always", "defer" or "skip"')
    authors = (
        _strings(top["privileged_authors"], "privileged_authors")
        if "privileged_authors" in top
        else ()
    )
    raw = top.get("policies", [])
    if not isinstance(raw, list):
        _fail("policies", "must be a list of tables")
    if len(raw) > MAX_POLICIES:
        _fail("policies", f"at most {MAX_POLICIES} policies")
    policies = tuple(_policy(p, f"policies[{i}]") for i, p in enumerate(raw))
    index: dict[str, int] = {}
    for i, policy in enumerate(policies):
        if policy.name in index:
            _fail(f"policies[{i}].name", f"duplicate of policies[{index[policy.name]}].name")
        index[policy.name] = i
    for i, policy in enumerate(policies):
        for j, target in enumerate(policy.resets):
            if target == policy.name:
                _fail(f"policies[{i}].resets[{j}]", "a policy cannot reset itself")
            if target not in index:
                _fail(f"policies[{i}].resets[{j}]", f"no policy named {target!r}")
    return GateConfig(policies=policies, default=default, privileged_authors=authors)


# --- runtime ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Decision:
    """The gate's answer for one event; ``due`` is when a debounce batch fires."""

    wake: bool
    policy: str | None
    behavior: str
    due: float | None = None


@attrs.frozen(kw_only=True)
class Batch:
    """A debounce batch that is due: ``count`` events, the newest ``MAX_BATCH`` snippets."""

    policy: str
    count: int
    snippets: tuple[str, ...]
    conversations: tuple[Conversation, ...]


class _Pending:
    """A debounce batch being gathered: how many events it holds, the newest ``MAX_BATCH``
    snippets, and the newest ``MAX_BATCH_ITEMS`` item ids (past that, an older item can no
    longer be withdrawn and stays counted)."""

    def __init__(self) -> None:
        self.count = 0
        self.due = 0.0
        self.entries: deque[tuple[str | None, str, Conversation]] = deque(maxlen=MAX_BATCH)
        self.items: OrderedDict[str, int] = OrderedDict()  # item id -> its events here

    def add(self, event: GateEvent) -> None:
        self.count += 1
        self.entries.append((event.item, event.text[:MAX_SNIPPET], event.conversation))
        if event.item is not None:
            self.items[event.item] = self.items.get(event.item, 0) + 1
            self.items.move_to_end(event.item)
            if len(self.items) > MAX_BATCH_ITEMS:
                self.items.popitem(last=False)

    def withdraw(self, item: str) -> bool:
        """Every event of ``item`` leaves the batch."""
        events = self.items.pop(item, 0)
        if not events:
            return False
        self.count -= events
        kept = [e for e in self.entries if e[0] != item]
        self.entries.clear()
        self.entries.extend(kept)
        return True

    def batch(self, policy: str) -> Batch:
        conversations = dict.fromkeys(c for _, _, c in self.entries)
        return Batch(
            policy=policy,
            count=self.count,
            snippets=tuple(s for _, s, _ in self.entries),
            conversations=tuple(conversations),
        )


class _Bucket:
    def __init__(self, level: float, stamp: float) -> None:
        self.level = level
        self.stamp = stamp


class _State:
    """Per-policy runtime state; ``matched`` and ``woke`` are statistics."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.matched = 0
        self.woke = 0
        self.buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()
        self.counters: OrderedDict[Hashable, int] = OrderedDict()
        self.pending: _Pending | None = None

    def clear(self) -> None:
        self.buckets.clear()
        self.counters.clear()
        self.pending = None


def _key(key_by: str | None, event: GateEvent) -> Hashable:
    if key_by == "server":
        return event.server_id
    if key_by == "channel":
        return event.channel_id
    if key_by == "conversation":
        return event.conversation
    if key_by == "author":
        return event.author
    return None


def _touch(table: OrderedDict[Hashable, Any], key: Hashable) -> None:
    """Mark ``key`` most recently used; beyond ``MAX_KEYS`` drop the least recently used."""
    table.move_to_end(key)
    while len(table) > MAX_KEYS:
        table.popitem(last=False)


class Gate:
    """Decides wakes for one agent; holds its debounce batches, buckets, counters and sleep."""

    def __init__(self, config: GateConfig | None = None) -> None:
        self._config = GateConfig() if config is None else config
        self._states: dict[str, _State] = {p.name: _State(p) for p in self._config.policies}
        self._privileged = frozenset(a.casefold() for a in self._config.privileged_authors)
        self._sleep_until: float | None = None
        self._loaded_at: float | None = None
        self._totals = {"events": 0, "woke": 0, "asleep": 0, "default": 0, "batches": 0}

    @property
    def config(self) -> GateConfig:
        return self._config

    # sleep

    def sleep(self, until: float) -> None:
        """Sleep until ``until``; a later call replaces the end."""
        self._sleep_until = until

    def wake_up(self) -> None:
        self._sleep_until = None

    def asleep(self, now: float) -> bool:
        return self._sleep_until is not None and now < self._sleep_until

    def _privileged_author(self, event: GateEvent) -> bool:
        return event.author is not None and event.author.casefold() in self._privileged

    # decisions

    def wakes_plainly(self, now: float) -> bool:
        """True when any event wakes the agent at ``now`` without looking at it (no policy, the
        default ``always``, awake); the decision is then counted as :meth:`decide` counts it.
        False says nothing: ask :meth:`decide`."""
        if self._config.policies or self._config.default != "always" or self.asleep(now):
            return False
        totals = self._totals
        totals["events"] += 1
        totals["default"] += 1
        totals["woke"] += 1
        return True

    def decide(self, event: GateEvent, now: float) -> Decision:
        """Whether ``event`` wakes the agent at ``now``; updates the matching policy's state."""
        self._totals["events"] += 1
        if self.asleep(now) and not self._privileged_author(event):
            self._totals["asleep"] += 1
            return Decision(wake=False, policy=None, behavior="asleep")
        for policy in self._config.policies:
            if matches(policy.match, event):
                decision = self._apply(self._states[policy.name], event, now)
                break
        else:
            self._totals["default"] += 1
            decision = Decision(
                wake=self._config.default == "always", policy=None, behavior="default"
            )
        if decision.wake:
            self._totals["woke"] += 1
        return decision

    def _apply(self, state: _State, event: GateEvent, now: float) -> Decision:
        state.matched += 1
        behavior = state.policy.behavior
        name = state.policy.name
        due: float | None = None
        if isinstance(behavior, Simple):
            wake = behavior.kind == "always"
        elif isinstance(behavior, Debounce):
            if state.pending is None:
                state.pending = _Pending()
            state.pending.add(event)
            state.pending.due = due = now + behavior.ms / 1000
            wake = False
        elif isinstance(behavior, RateLimit):
            wake = self._take_token(state, behavior, _key(behavior.key_by, event), now)
        else:
            wake = self._sample(state, behavior, _key(behavior.key_by, event))
        if wake:
            state.woke += 1
            self._reset(state.policy)
        return Decision(wake=wake, policy=name, behavior=behavior.name, due=due)

    @staticmethod
    def _take_token(state: _State, behavior: RateLimit, key: Hashable, now: float) -> bool:
        bucket = state.buckets.get(key)
        if bucket is None:
            bucket = state.buckets[key] = _Bucket(float(behavior.tokens), now)
        else:
            elapsed = max(0.0, now - bucket.stamp)
            refill = elapsed * behavior.tokens / (behavior.refill_interval_ms / 1000)
            bucket.level = min(float(behavior.tokens), bucket.level + refill)
            bucket.stamp = max(bucket.stamp, now)
        _touch(state.buckets, key)
        if bucket.level >= 1 - _EPSILON:
            bucket.level = max(0.0, bucket.level - 1)
            return True
        return False

    @staticmethod
    def _sample(state: _State, behavior: PassiveSample, key: Hashable) -> bool:
        seen = state.counters.get(key, 0)
        state.counters[key] = (seen + 1) % behavior.every
        _touch(state.counters, key)
        return seen == 0

    def _reset(self, policy: Policy) -> None:
        for target in policy.resets:
            state = self._states.get(target)
            if state is not None:
                state.clear()

    # debounce batches

    def withdraw(self, item: str) -> bool:
        """The events of ``item`` no longer count (RFC-006: replaced or retracted before it was
        read): they leave the debounce batch that holds them, and a batch left with no event is
        dropped, so it wakes nobody. False when no batch remembers ``item``."""
        for state in self._states.values():
            pending = state.pending
            if pending is not None and pending.withdraw(item):
                if pending.count == 0:
                    state.pending = None
                return True
        return False

    def due(self, now: float) -> list[Batch]:
        """Pop every debounce batch due by ``now`` (oldest due first); then apply their resets."""
        ready = sorted(
            (s for s in self._states.values() if s.pending is not None and s.pending.due <= now),
            key=lambda s: s.pending.due if s.pending is not None else 0.0,
        )
        batches: list[Batch] = []
        for state in ready:
            assert state.pending is not None
            batches.append(state.pending.batch(state.policy.name))
            state.pending = None
            state.woke += 1
        for state in ready:
            self._reset(state.policy)
        self._totals["batches"] += len(batches)
        return batches

    def next_due(self) -> float | None:
        dues = [s.pending.due for s in self._states.values() if s.pending is not None]
        return min(dues) if dues else None

    # reload

    def reload(self, config: GateConfig, now: float) -> list[Batch]:
        """Install ``config``; return the pending batches it ends.

        A policy (by name) whose behavior is unchanged keeps its state. A policy removed or
        whose behavior changed loses it; its pending batch, if any, is returned to be delivered
        now. Match statistics are kept by name; sleep is kept.
        """
        flushed: list[Batch] = []
        states: dict[str, _State] = {}
        for policy in config.policies:
            old = self._states.get(policy.name)
            if old is not None and old.policy.behavior == policy.behavior:
                old.policy = policy
                states[policy.name] = old
                continue
            state = states[policy.name] = _State(policy)
            if old is not None:
                state.matched, state.woke = old.matched, old.woke
        for name, old in self._states.items():
            if old.pending is not None and states.get(name) is not old:
                flushed.append(old.pending.batch(name))
        self._config = config
        self._states = states
        self._privileged = frozenset(a.casefold() for a in config.privileged_authors)
        self._loaded_at = now
        self._totals["batches"] += len(flushed)
        return flushed

    # status

    def status(self, now: float) -> dict[str, Any]:
        """A JSON-able summary of the gate at ``now``."""
        policies = []
        pending = []
        for policy in self._config.policies:
            state = self._states[policy.name]
            policies.append(
                {
                    "name": policy.name,
                    "behavior": policy.behavior.name,
                    "matched": state.matched,
                    "woke": state.woke,
                    "keys": len(state.buckets) + len(state.counters),
                }
            )
            if state.pending is not None:
                pending.append(
                    {"policy": policy.name, "count": state.pending.count, "due": state.pending.due}
                )
        return {
            "default": self._config.default,
            "policies": policies,
            "pending": pending,
            "next_due": self.next_due(),
            "asleep": self.asleep(now),
            "sleep_until": self._sleep_until if self.asleep(now) else None,
            "privileged_authors": list(self._config.privileged_authors),
            "loaded_at": self._loaded_at,
            "totals": dict(self._totals),
        }


# --- the wake buffer ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Drained(Generic[T]):
    """What a ``WakeBuffer`` held: the items kept (oldest first) and what was evicted."""

    items: tuple[T, ...]
    dropped: int
    evicted: frozenset[Conversation]
    overflow: bool


class WakeBuffer(Generic[T]):
    """Wakes that arrive while the agent is busy, bounded in items and in bookkeeping.

    Past ``cap`` items the oldest is evicted and counted; its conversation is recorded in a set
    of at most ``conversation_cap`` entries. Recording one more clears the set and sets
    ``overflow`` (meaning "several conversations"); nothing more is recorded until ``drain``.
    """

    def __init__(self, cap: int = MAX_BUFFERED, conversation_cap: int = MAX_CONVERSATIONS) -> None:
        if cap < 1 or conversation_cap < 0:
            raise ValueError("cap must be at least 1 and conversation_cap at least 0")
        self._cap = cap
        self._conversation_cap = conversation_cap
        self._items: deque[tuple[T, Conversation | None]] = deque()
        self._dropped = 0
        self._evicted: set[Conversation] = set()
        self._overflow = False

    def add(self, item: T, conversation: Conversation | None) -> None:
        self._items.append((item, conversation))
        while len(self._items) > self._cap:
            _, lost = self._items.popleft()
            self._dropped += 1
            if lost is None or self._overflow or lost in self._evicted:
                continue
            if len(self._evicted) >= self._conversation_cap:
                self._evicted.clear()
                self._overflow = True
            else:
                self._evicted.add(lost)

    def remove(self, unwanted: Callable[[T], bool]) -> int:
        """Take out the buffered items ``unwanted`` names (they no longer count, nor do their
        conversations); how many went."""
        kept = [(item, c) for item, c in self._items if not unwanted(item)]
        removed = len(self._items) - len(kept)
        if removed:
            self._items = deque(kept)
        return removed

    def drain(self) -> Drained[T]:
        out = Drained(
            items=tuple(item for item, _ in self._items),
            dropped=self._dropped,
            evicted=frozenset(self._evicted),
            overflow=self._overflow,
        )
        self._items.clear()
        self._dropped = 0
        self._evicted = set()
        self._overflow = False
        return out

    def __len__(self) -> int:
        return len(self._items)

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def evicted_count(self) -> int:
        """How many conversations are recorded now (at most ``conversation_cap``)."""
        return len(self._evicted)

    @property
    def overflow(self) -> bool:
        return self._overflow


# --- presets ------------------------------------------------------------------------------

#: The ``community`` preset (``gate = "community"`` in an agent's config), in the policy
#: language: pushes wake, except those their server tags ``chat:ambient``; a channel item wakes
#: only when it addresses the agent (the host sets the event's ``addressed`` metadata: a mention
#: of its name or an alias, a reply to one of its messages, a server's ``chat:addressed`` tag, or
#: a direct message channel). Everything else is stored without a wake and read at the agent's
#: next turn.
COMMUNITY_GATE_TOML: Final = """\
default = "skip"

[[policies]]
name = "ambient-pushes"
match = { scope = ["push"], tags_any = ["chat:ambient"] }
behavior = "skip"

[[policies]]
name = "pushes"
match = { scope = ["push"] }
behavior = "always"

[[policies]]
name = "addressed"
match = { metadata_true = ["addressed"] }
behavior = "always"
"""

#: The built-in presets by name, as their policy files read.
PRESETS: Final = {"community": COMMUNITY_GATE_TOML}


def preset(name: str) -> GateConfig | None:
    """The built-in preset called ``name``, or None when there is none."""
    text = PRESETS.get(name)
    return None if text is None else parse_gate(text, "toml")
