"""The wake gate: policy files, matching, debounce, rate limits, samples, sleep; the wake buffer."""

from __future__ import annotations

import fnmatch
import json
import math
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol.gate import (
    MAX_BATCH,
    MAX_BATCH_ITEMS,
    MAX_BUFFERED,
    MAX_CONVERSATIONS,
    MAX_KEYS,
    MAX_POLICIES,
    MAX_SNIPPET,
    Batch,
    Debounce,
    Decision,
    Filter,
    Gate,
    GateConfig,
    GateConfigError,
    GateEvent,
    Match,
    PassiveSample,
    Policy,
    RateLimit,
    Simple,
    WakeBuffer,
    glob_match,
    parse_gate,
)

# --- helpers --------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    assert isinstance(value, dict)
    body = ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items())
    return "{ " + body + " }"


def to_toml(doc: dict[str, Any]) -> str:
    """A test-only TOML writer: top-level keys, then ``[[policies]]`` tables."""
    lines = [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items() if k != "policies"]
    policies = doc.get("policies", [])
    if isinstance(policies, list) and policies and all(isinstance(p, dict) for p in policies):
        for policy in policies:
            lines.append("[[policies]]")
            lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in policy.items())
    elif "policies" in doc:
        lines.insert(0, f"policies = {_toml_value(policies)}")
    return "\n".join(lines) + "\n"


def parse(doc: dict[str, Any], fmt: str = "json") -> GateConfig:
    return parse_gate(json.dumps(doc) if fmt == "json" else to_toml(doc), fmt)


def pol(name: str = "p", behavior: Any = "always", **extra: Any) -> dict[str, Any]:
    return {"name": name, "behavior": behavior, **extra}


def gate_of(*policies: dict[str, Any], **top: Any) -> Gate:
    return Gate(parse({**top, "policies": list(policies)}))


def ev(text: str = "hello", **over: Any) -> GateEvent:
    base: dict[str, Any] = {
        "kind": "incoming",
        "server_id": "lobby",
        "channel_id": "lobby:#general",
    }
    base.update(over)
    return GateEvent(text=text, **base)


def wakes(gate: Gate, events: list[GateEvent], now: float = 0.0) -> list[bool]:
    return [gate.decide(e, now).wake for e in events]


FORMATS = ("toml", "json")
RL = {"rate_limit": {"tokens": 1, "refill_interval_ms": 86_400_000}}

# --- parsing --------------------------------------------------------------------------------

FULL_TOML = """
default = "defer"
privileged_authors = ["Alice", "u-42"]

[[policies]]
name = "mentions"
behavior = "always"
resets = ["ambient", "quiet-chime"]
[policies.match]
scope = ["incoming"]
tags_any = ["chat:mention", "chat:dm"]

[[policies]]
name = "quiet-chime"
behavior = "skip"
[policies.match]
scope = ["mcpl:push-event"]
source = "lobby*"
channel = "lobby:#random"
filter = { type = "text", pattern = "chime" }
tags_all = ["a", "b*"]
tags_none = ["chat:bot"]
metadata_true = ["addressed"]

[[policies]]
name = "ambient"
behavior = { rate_limit = { tokens = 3, refill_interval_ms = 60000, key_by = "channel" } }
[policies.match]
filter = { type = "regex", pattern = "^deploy (start|done)" }

[[policies]]
name = "batch"
behavior = { debounce_ms = 2000 }

[[policies]]
name = "sample"
behavior = { passive_sample = { every = 3, key_by = "server" } }
"""

FULL_JSON = {
    "default": "defer",
    "privileged_authors": ["Alice", "u-42"],
    "policies": [
        {
            "name": "mentions",
            "behavior": "always",
            "resets": ["ambient", "quiet-chime"],
            "match": {"scope": ["incoming"], "tags_any": ["chat:mention", "chat:dm"]},
        },
        {
            "name": "quiet-chime",
            "behavior": "skip",
            "match": {
                "scope": ["push"],
                "source": "lobby*",
                "channel": "lobby:#random",
                "filter": {"type": "text", "pattern": "chime"},
                "tags_all": ["a", "b*"],
                "tags_none": ["chat:bot"],
                "metadata_true": ["addressed"],
            },
        },
        {
            "name": "ambient",
            "behavior": {
                "rate_limit": {"tokens": 3, "refill_interval_ms": 60000, "key_by": "channel"}
            },
            "match": {"filter": {"type": "regex", "pattern": "^deploy (start|done)"}},
        },
        {"name": "batch", "behavior": {"debounce_ms": 2000}},
        {"name": "sample", "behavior": {"passive_sample": {"every": 3, "key_by": "server"}}},
    ],
}


def test_toml_and_json_give_equal_configs() -> None:
    from_toml = parse_gate(FULL_TOML, "toml")
    from_json = parse_gate(json.dumps(FULL_JSON), "json")
    assert from_toml == from_json
    assert from_toml.default == "defer"
    assert from_toml.privileged_authors == ("Alice", "u-42")
    assert [p.name for p in from_toml.policies] == [
        "mentions",
        "quiet-chime",
        "ambient",
        "batch",
        "sample",
    ]
    mentions, chime, ambient, batch, sample = from_toml.policies
    assert mentions == Policy(
        name="mentions",
        behavior=Simple(kind="always"),
        resets=("ambient", "quiet-chime"),
        match=Match(scope=frozenset({"incoming"}), tags_any=("chat:mention", "chat:dm")),
    )
    assert chime.match == Match(
        scope=frozenset({"push"}),
        source="lobby*",
        channel="lobby:#random",
        filter=Filter(type="text", pattern="chime"),
        tags_all=("a", "b*"),
        tags_none=("chat:bot",),
        metadata_true=("addressed",),
    )
    assert ambient.behavior == RateLimit(tokens=3, refill_interval_ms=60000, key_by="channel")
    assert ambient.match.filter is not None and ambient.match.filter.type == "regex"
    assert batch.behavior == Debounce(ms=2000)
    assert batch.match == Match()
    assert sample.behavior == PassiveSample(every=3, key_by="server")


def test_the_test_toml_writer_round_trips_the_full_example() -> None:
    assert parse(FULL_JSON, "toml") == parse_gate(FULL_TOML, "toml")


def test_an_empty_file_means_wake_on_everything() -> None:
    for fmt, text in (("toml", ""), ("json", "{}")):
        config = parse_gate(text, fmt)
        assert config == GateConfig()
        assert config.default == "always"


LIMITS = [
    (
        lambda v: {"debounce_ms": v},
        "policies[0].behavior.debounce_ms",
        100,
        300_000,
        lambda b: b.ms,
    ),
    (
        lambda v: {"rate_limit": {"tokens": v, "refill_interval_ms": 1000}},
        "policies[0].behavior.rate_limit.tokens",
        1,
        10_000,
        lambda b: b.tokens,
    ),
    (
        lambda v: {"rate_limit": {"tokens": 1, "refill_interval_ms": v}},
        "policies[0].behavior.rate_limit.refill_interval_ms",
        100,
        86_400_000,
        lambda b: b.refill_interval_ms,
    ),
    (
        lambda v: {"passive_sample": {"every": v}},
        "policies[0].behavior.passive_sample.every",
        1,
        10_000,
        lambda b: b.every,
    ),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("build", "path", "lo", "hi", "read"), LIMITS)
def test_each_limit_is_accepted_at_its_edges_and_rejected_one_past(
    fmt: str, build: Any, path: str, lo: int, hi: int, read: Any
) -> None:
    for ok in (lo, hi):
        config = parse({"policies": [pol(behavior=build(ok))]}, fmt)
        assert read(config.policies[0].behavior) == ok
    for bad in (lo - 1, hi + 1):
        with pytest.raises(GateConfigError) as info:
            parse({"policies": [pol(behavior=build(bad))]}, fmt)
        assert str(info.value) == f"{path}: must be from {lo} to {hi}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_at_most_200_policies(fmt: str) -> None:
    many = [pol(f"p{i}") for i in range(MAX_POLICIES)]
    assert len(parse({"policies": many}, fmt).policies) == MAX_POLICIES
    with pytest.raises(GateConfigError, match=r"^policies: at most 200 policies$"):
        parse({"policies": [*many, pol("one-more")]}, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_policy_names_are_at_most_100_characters(fmt: str) -> None:
    assert parse({"policies": [pol("n" * 100)]}, fmt).policies[0].name == "n" * 100
    for bad in ("n" * 101, ""):
        with pytest.raises(GateConfigError) as info:
            parse({"policies": [pol("ok"), pol(bad)]}, fmt)
        assert str(info.value) == "policies[1].name: must be 1 to 100 characters"


UNKNOWN_KEYS = [
    ({"colour": 1}, "colour"),
    ({"policies": [pol(colour=1)]}, "policies[0].colour"),
    ({"policies": [pol(match={"server": "x"})]}, "policies[0].match.server"),
    ({"policies": [pol(behavior={"debounce": 200})]}, "policies[0].behavior.debounce"),
    (
        {
            "policies": [
                pol(behavior={"rate_limit": {"tokens": 1, "refill_interval_ms": 100, "burst": 2}})
            ]
        },
        "policies[0].behavior.rate_limit.burst",
    ),
    (
        {"policies": [pol(behavior={"passive_sample": {"every": 2, "keyBy": "server"}})]},
        "policies[0].behavior.passive_sample.keyBy",
    ),
    (
        {"policies": [pol(match={"filter": {"type": "text", "pattern": "x", "flags": "i"}})]},
        "policies[0].match.filter.flags",
    ),
    ({"policies": [pol("a"), pol("b", match={"Scope": ["push"]})]}, "policies[1].match.Scope"),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("doc", "path"), UNKNOWN_KEYS)
def test_unknown_keys_are_rejected_naming_the_place(
    fmt: str, doc: dict[str, Any], path: str
) -> None:
    with pytest.raises(GateConfigError) as info:
        parse(doc, fmt)
    assert str(info.value).startswith(f"{path}: unknown key (expected one of: ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pattern", ["(", "a{2,1}", "[z-a]", "(?P<x>a)(?P<x>b)"])
def test_a_bad_regex_is_a_config_error(fmt: str, pattern: str) -> None:
    doc = {"policies": [pol(match={"filter": {"type": "regex", "pattern": pattern}})]}
    with pytest.raises(GateConfigError) as info:
        parse(doc, fmt)
    assert str(info.value).startswith("policies[0].match.filter.pattern: invalid regex: ")
    assert "\n" not in str(info.value)


BAD = [
    ({"default": "never"}, 'default: must be "always", "defer" or "skip"'),
    ({"default": 1}, 'default: must be "always", "defer" or "skip"'),
    ({"privileged_authors": "alice"}, "privileged_authors: must be a list of strings"),
    ({"privileged_authors": ["alice", 3]}, "privileged_authors[1]: must be a string"),
    ({"policies": {"name": "x"}}, "policies: must be a list of tables"),
    ({"policies": [1]}, "policies[0]: must be a table"),
    ({"policies": [{"behavior": "always"}]}, "policies[0].name: is required"),
    ({"policies": [{"name": "x"}]}, "policies[0].behavior: is required"),
    ({"policies": [{"name": 7, "behavior": "always"}]}, "policies[0].name: must be a string"),
    (
        {"policies": [pol(behavior="sometimes")]},
        'policies[0].behavior: must be "always", "defer", "skip" or a table',
    ),
    (
        {"policies": [pol(behavior={})]},
        "policies[0].behavior: must hold exactly one of: debounce_ms, rate_limit, passive_sample",
    ),
    (
        {"policies": [pol(behavior={"debounce_ms": 200, "passive_sample": {"every": 2}})]},
        "policies[0].behavior: must hold exactly one of: debounce_ms, rate_limit, passive_sample",
    ),
    (
        {"policies": [pol(behavior={"debounce_ms": True})]},
        "policies[0].behavior.debounce_ms: must be an integer",
    ),
    (
        {"policies": [pol(behavior={"debounce_ms": 200.0})]},
        "policies[0].behavior.debounce_ms: must be an integer",
    ),
    (
        {"policies": [pol(behavior={"debounce_ms": "200"})]},
        "policies[0].behavior.debounce_ms: must be an integer",
    ),
    (
        {"policies": [pol(behavior={"rate_limit": {"tokens": 2}})]},
        "policies[0].behavior.rate_limit.refill_interval_ms: is required",
    ),
    (
        {"policies": [pol(behavior={"passive_sample": {}})]},
        "policies[0].behavior.passive_sample.every: is required",
    ),
    (
        {"policies": [pol(behavior={"passive_sample": {"every": 2, "key_by": "thread"}})]},
        "policies[0].behavior.passive_sample.key_by: "
        "must be one of: server, channel, conversation, author",
    ),
    (
        {"policies": [pol(behavior={"passive_sample": 3})]},
        "policies[0].behavior.passive_sample: must be a table",
    ),
    ({"policies": [pol(match=["push"])]}, "policies[0].match: must be a table"),
    (
        {"policies": [pol(match={"scope": ["chat"]})]},
        "policies[0].match.scope[0]: must be one of: "
        "push, incoming, mcpl:push-event, mcpl:channel-incoming",
    ),
    (
        {"policies": [pol(match={"scope": "push"})]},
        "policies[0].match.scope: must be a list of strings",
    ),
    ({"policies": [pol(match={"scope": []})]}, "policies[0].match.scope: must not be empty"),
    ({"policies": [pol(match={"tags_any": []})]}, "policies[0].match.tags_any: must not be empty"),
    (
        {"policies": [pol(match={"metadata_true": []})]},
        "policies[0].match.metadata_true: must not be empty",
    ),
    ({"policies": [pol(match={"source": ["a"]})]}, "policies[0].match.source: must be a string"),
    (
        {"policies": [pol(match={"tags_none": [1]})]},
        "policies[0].match.tags_none[0]: must be a string",
    ),
    (
        {"policies": [pol(match={"filter": {"type": "glob", "pattern": "x"}})]},
        'policies[0].match.filter.type: must be "text" or "regex"',
    ),
    (
        {"policies": [pol(match={"filter": {"type": "text"}})]},
        "policies[0].match.filter.pattern: is required",
    ),
    (
        {"policies": [pol("a"), pol("b"), pol("a")]},
        "policies[2].name: duplicate of policies[0].name",
    ),
    (
        {"policies": [pol("a", resets=["b", "c"]), pol("b")]},
        "policies[0].resets[1]: no policy named 'c'",
    ),
    ({"policies": [pol("a", resets=["a"])]}, "policies[0].resets[0]: a policy cannot reset itself"),
    (
        {"policies": [pol("a", resets="b"), pol("b")]},
        "policies[0].resets: must be a list of strings",
    ),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("doc", "message"), BAD)
def test_bad_values_are_rejected_with_one_readable_line(
    fmt: str, doc: dict[str, Any], message: str
) -> None:
    with pytest.raises(GateConfigError) as info:
        parse(doc, fmt)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "fmt", "start"),
    [
        ("default = ", "toml", "toml: "),
        ('default = "always"\ndefault = "skip"\n', "toml", "toml: "),
        ("[1, 2]", "json", "(top level): must be a table"),
        ("{", "json", "json: "),
        ('{"default": "always", "default": "skip"}', "json", "json: duplicate key default"),
        ('{"policies": [{"name": "p", "behavior": {"debounce_ms": NaN}}]}', "json", "json: NaN"),
        ("[" * 100_000 + "]" * 100_000, "json", "json: "),
        ("a = " + "[" * 100_000 + "]" * 100_000, "toml", "toml: nested too deeply"),
        ("{}", "yaml", 'format must be "toml" or "json"'),
    ],
)
def test_unreadable_files_are_config_errors(text: str, fmt: str, start: str) -> None:
    with pytest.raises(GateConfigError) as info:
        parse_gate(text, fmt)
    assert str(info.value).startswith(start)
    assert "\n" not in str(info.value)


def test_scope_aliases_are_normalized() -> None:
    doc = {"policies": [pol(match={"scope": ["mcpl:push-event", "mcpl:channel-incoming"]})]}
    assert parse(doc).policies[0].match.scope == frozenset({"push", "incoming"})


# --- globs ----------------------------------------------------------------------------------

patterns = st.text(alphabet="ab*?", max_size=10)
texts = st.text(alphabet="abc", max_size=12)


@given(pattern=patterns, text=texts)
def test_glob_match_agrees_with_fnmatchcase(pattern: str, text: str) -> None:
    assert glob_match(pattern, text) == fnmatch.fnmatchcase(text, pattern)


@given(
    pattern=st.text(alphabet="aA*?.+()\\/:#", max_size=8), text=st.text("aA.+()\\/:#", max_size=10)
)
def test_glob_match_agrees_with_fnmatchcase_on_punctuation(pattern: str, text: str) -> None:
    assert glob_match(pattern, text) == fnmatch.fnmatchcase(text, pattern)


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("", "", True),
        ("", "a", False),
        ("*", "", True),
        ("?", "", False),
        ("lobby*", "lobby-2", True),
        ("lobby*", "Lobby-2", False),
        ("lobby:#?andom", "lobby:#random", True),
        ("a*b*c", "axxbyyc", True),
        ("a*b*c", "axxbyy", False),
        ("[a]", "[a]", True),
        ("[a]", "a", False),
        ("*x", "abcx", True),
        ("x*", "abcx", False),
    ],
)
def test_glob_match_examples(pattern: str, text: str, expected: bool) -> None:
    assert glob_match(pattern, text) is expected


def test_glob_match_is_not_exponential() -> None:
    started = time.perf_counter()
    assert not glob_match("*a" * 50, "a" * 5000 + "b")
    assert not glob_match("*" + "a" * 50 + "b", "a" * 5000)
    assert not glob_match("a*" * 40 + "c", "a" * 3000)
    assert time.perf_counter() - started < 2.0


# --- matching and first-match-wins ------------------------------------------------------------


def test_no_config_wakes_on_everything() -> None:
    gate = Gate()
    for event in (ev(), ev(kind="push", channel_id=None), ev(author="bob", tags=("chat:bot",))):
        assert gate.decide(event, 0.0) == Decision(wake=True, policy=None, behavior="default")


@pytest.mark.parametrize(("default", "wake"), [("always", True), ("defer", False), ("skip", False)])
def test_the_default_decides_when_nothing_matches(default: str, wake: bool) -> None:
    gate = gate_of(pol("never", match={"source": "nowhere"}), default=default)
    assert gate.decide(ev(), 0.0) == Decision(wake=wake, policy=None, behavior="default")


def test_the_first_matching_policy_wins() -> None:
    gate = gate_of(
        pol("skip-bots", "skip", match={"tags_any": ["chat:bot"]}),
        pol("mentions", "always", match={"tags_any": ["chat:mention"]}),
        pol("rest", "defer"),
        default="always",
    )
    both = ev(tags=("chat:bot", "chat:mention"))
    assert gate.decide(both, 0) == Decision(wake=False, policy="skip-bots", behavior="skip")
    mention = ev(tags=("chat:mention",))
    assert gate.decide(mention, 0) == Decision(wake=True, policy="mentions", behavior="always")
    assert gate.decide(ev(), 0) == Decision(wake=False, policy="rest", behavior="defer")


PUSH = {"kind": "push", "server_id": "lobby-2", "channel_id": None}

FIELDS: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ({"scope": ["push"]}, PUSH, {}),
    ({"scope": ["incoming"]}, {}, PUSH),
    ({"scope": ["mcpl:push-event"]}, PUSH, {}),
    ({"scope": ["push"]}, {"kind": "mcpl:push-event"}, {"kind": "mcpl:channel-incoming"}),
    ({"source": "lobby*"}, {"server_id": "lobby-2"}, {"server_id": "my-lobby"}),
    ({"source": "lobby"}, {"server_id": "lobby"}, {"server_id": "LOBBY"}),
    ({"channel": "lobby:#gen*"}, {}, {"channel_id": "lobby:#random"}),
    ({"channel": "*"}, {"channel_id": ""}, {"channel_id": None}),
    ({"channel": ""}, {"channel_id": ""}, {"channel_id": None}),
    ({"filter": {"type": "text", "pattern": "ChImE"}}, {"text": "a CHIME!"}, {"text": "chim e"}),
    ({"filter": {"type": "text", "pattern": ".*"}}, {"text": "x.*y"}, {"text": "anything"}),
    (
        {"filter": {"type": "regex", "pattern": r"^deploy \d+"}},
        {"text": "DEPLOY 42 done"},
        {"text": "we deploy 42"},
    ),
    ({"tags_any": ["chat:m*", "x:y"]}, {"tags": ("chat:mention",)}, {"tags": ("chat:dm",)}),
    ({"tags_any": ["x:y"]}, {"tags": ("a:b", "x:y")}, {"tags": ()}),
    ({"tags_all": ["a:*", "b:1"]}, {"tags": ("b:1", "a:z")}, {"tags": ("a:z", "b:2")}),
    ({"tags_none": ["chat:bot"]}, {"tags": ("chat:human",)}, {"tags": ("x:y", "chat:bot")}),
    ({"tags_none": ["chat:*"]}, {"tags": ()}, {"tags": ("chat:bot",)}),
    (
        {"metadata_true": ["addressed", "urgent"]},
        {"metadata": {"urgent": 1}},
        {"metadata": {"addressed": [], "urgent": ""}},
    ),
    ({"metadata_true": ["m"]}, {"metadata": {"m": {"k": 0}}}, {"metadata": {"m": {}}}),
    ({"metadata_true": ["m"]}, {"metadata": {"m": True}}, {"metadata": {"other": True}}),
    (
        {"scope": ["incoming"], "source": "lobby", "tags_any": ["chat:mention"]},
        {"tags": ("chat:mention",)},
        {"tags": ("chat:mention",), "server_id": "lobby2"},
    ),
]


@pytest.mark.parametrize(("match", "hit", "miss"), FIELDS)
def test_each_match_field(match: dict[str, Any], hit: dict[str, Any], miss: dict[str, Any]) -> None:
    gate = gate_of(pol("only", "always", match=match), default="skip")
    matched = gate.decide(ev(**hit), 0.0)
    assert matched == Decision(wake=True, policy="only", behavior="always")
    unmatched = gate.decide(ev(**miss), 0.0)
    assert unmatched == Decision(wake=False, policy=None, behavior="default")


def test_an_empty_match_matches_everything() -> None:
    for gate in (gate_of(pol("all", "defer", match={})), gate_of(pol("all", "defer"))):
        for event in (ev(), ev(kind="anything", server_id="", channel_id=None, tags=("a:b",))):
            assert gate.decide(event, 0.0) == Decision(wake=False, policy="all", behavior="defer")


# --- debounce ---------------------------------------------------------------------------------


def debounce_gate(ms: int = 2000) -> Gate:
    return gate_of(pol("batch", {"debounce_ms": ms}, match={"scope": ["push"]}))


def test_debounce_restarts_its_timer_and_fires_once() -> None:
    gate = debounce_gate(2000)
    dues = []
    for t, text in ((0.0, "one"), (1.0, "two"), (1.5, "three")):
        decision = gate.decide(ev(text, kind="push"), t)
        assert (decision.wake, decision.policy, decision.behavior) == (False, "batch", "debounce")
        dues.append(decision.due)
    assert dues == [2.0, 3.0, 3.5]
    for t in (2.0, 3.0, 3.49):
        assert gate.due(t) == []
        assert gate.next_due() == 3.5
    assert gate.due(3.5) == [
        Batch(
            policy="batch",
            count=3,
            snippets=("one", "two", "three"),
            conversations=(("lobby", "lobby:#general", None),),
        )
    ]
    assert gate.due(100.0) == []
    assert gate.next_due() is None


def test_debounce_does_not_touch_unmatched_events() -> None:
    gate = debounce_gate()
    assert gate.decide(ev(), 0.0).wake is True
    assert gate.next_due() is None


def test_two_debounce_policies_fire_in_due_order() -> None:
    gate = gate_of(
        pol("slow", {"debounce_ms": 5000}, match={"scope": ["push"]}),
        pol("fast", {"debounce_ms": 1000}),
    )
    gate.decide(ev("p", kind="push"), 0.0)
    gate.decide(ev("i"), 0.5)
    assert gate.next_due() == 1.5
    assert [b.policy for b in gate.due(10.0)] == ["fast", "slow"]


def test_batch_snippets_are_cut_and_conversations_deduplicated() -> None:
    gate = debounce_gate()
    gate.decide(ev("x" * 500, kind="push", channel_id="c1"), 0.0)
    gate.decide(ev("y", kind="push", channel_id="c2", thread_id="t"), 0.0)
    gate.decide(ev("z", kind="push", channel_id="c1"), 0.0)
    (batch,) = gate.due(2.0)
    assert batch.snippets == ("x" * MAX_SNIPPET, "y", "z")
    assert batch.conversations == (("lobby", "c1", None), ("lobby", "c2", "t"))


@pytest.mark.parametrize("n", [MAX_BATCH, MAX_BATCH + 1, MAX_BATCH + 7])
def test_a_batch_keeps_the_newest_100_snippets_and_counts_all(n: int) -> None:
    gate = debounce_gate()
    for i in range(n):
        gate.decide(ev(f"e{i}", kind="push"), i / 1000)
    (batch,) = gate.due(1000.0)
    assert batch.count == n
    assert len(batch.snippets) == MAX_BATCH
    assert batch.snippets == tuple(f"e{i}" for i in range(n - MAX_BATCH, n))


# --- withdrawal (RFC-006: a displaced occurrence no longer counts) ----------------------------


def test_a_withdrawn_item_leaves_its_batch_and_an_empty_batch_wakes_nobody() -> None:
    gate = debounce_gate(1000)
    gate.decide(ev("first", kind="push", item="o1"), 0.0)
    gate.decide(ev("second", kind="push", item="o2"), 0.1)
    assert gate.withdraw("o1") is True
    assert gate.withdraw("o1") is False  # once
    (batch,) = gate.due(5.0)
    assert (batch.count, batch.snippets) == (1, ("second",))
    gate.decide(ev("alone", kind="push", item="o3"), 10.0)
    assert gate.withdraw("o3") is True
    assert gate.next_due() is None and gate.due(100.0) == []


def test_an_item_without_an_id_or_unknown_cannot_be_withdrawn() -> None:
    gate = debounce_gate(1000)
    gate.decide(ev("anonymous", kind="push"), 0.0)
    assert gate.withdraw("o9") is False
    assert [b.count for b in gate.due(5.0)] == [1]


@pytest.mark.parametrize("extra", [0, 1, 5])
def test_a_batch_remembers_the_newest_items_to_withdraw_and_counts_the_rest(extra: int) -> None:
    gate = debounce_gate(1000)
    n = MAX_BATCH_ITEMS + extra
    for i in range(n):
        gate.decide(ev(f"e{i}", kind="push", item=f"o{i}"), 0.0)
    # the oldest ``extra`` items are forgotten: they stay counted
    assert [gate.withdraw(f"o{i}") for i in range(extra)] == [False] * extra
    assert gate.withdraw(f"o{n - 1}") is True
    (batch,) = gate.due(5.0)
    assert batch.count == n - 1


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 6)),
            st.tuples(st.just("withdraw"), st.integers(0, 6)),
        ),
        max_size=40,
    )
)
def test_withdrawal_counts_agree_with_a_set_of_live_items(ops: list[tuple[str, int]]) -> None:
    gate = debounce_gate(1000)
    live: list[str] = []  # a model: the items still counted, one entry per event
    for op, i in ops:
        item = f"o{i}"
        if op == "add":
            gate.decide(ev(item, kind="push", item=item), 0.0)
            live.append(item)
        else:
            assert gate.withdraw(item) is (item in live)
            live = [x for x in live if x != item]  # every event of that item goes
    batches = gate.due(10.0)
    assert [b.count for b in batches] == ([len(live)] if live else [])


def test_the_wake_buffer_removes_what_is_named_and_keeps_the_rest_in_order() -> None:
    buf: WakeBuffer[str] = WakeBuffer(cap=5)
    for item in ("a", "b", "a", "c"):
        buf.add(item, None)
    assert buf.remove(lambda x: x == "a") == 2
    assert buf.remove(lambda x: x == "z") == 0
    assert buf.drain().items == ("b", "c")


# --- rate limit -------------------------------------------------------------------------------


def test_rate_limit_spends_tokens_and_refills_continuously() -> None:
    gate = gate_of(pol("rl", {"rate_limit": {"tokens": 3, "refill_interval_ms": 60_000}}))
    assert wakes(gate, [ev()] * 4, 0.0) == [True, True, True, False]
    assert gate.decide(ev(), 19.9).wake is False  # 0.995 tokens
    decision = gate.decide(ev(), 20.0)  # one token: 3 per 60 s
    assert decision == Decision(wake=True, policy="rl", behavior="rate_limit")
    assert gate.decide(ev(), 20.0).wake is False
    assert gate.decide(ev(), 40.0).wake is True
    # a long pause refills to the capacity, never past it
    assert wakes(gate, [ev()] * 5, 10_000.0) == [True, True, True, False, False]


def test_rate_limit_keys_have_their_own_buckets() -> None:
    behavior = {"rate_limit": {"tokens": 1, "refill_interval_ms": 1000, "key_by": "channel"}}
    gate = gate_of(pol("rl", behavior))
    assert wakes(gate, [ev(channel_id="a"), ev(channel_id="a"), ev(channel_id="b")]) == [
        True,
        False,
        True,
    ]
    assert wakes(gate, [ev(channel_id=None), ev(channel_id=None)]) == [True, False]


@pytest.mark.parametrize(
    ("key_by", "same", "other"),
    [
        ("server", {"channel_id": "x"}, {"server_id": "other"}),
        ("author", {"channel_id": "x"}, {"author": "bob"}),
        ("conversation", {"author": "bob"}, {"thread_id": "t1"}),
        (None, {"server_id": "other", "author": "bob"}, None),
    ],
)
def test_rate_limit_key_by(key_by: str | None, same: dict[str, Any], other: Any) -> None:
    behavior: dict[str, Any] = {"tokens": 1, "refill_interval_ms": 1000}
    if key_by is not None:
        behavior["key_by"] = key_by
    gate = gate_of(pol("rl", {"rate_limit": behavior}))
    assert gate.decide(ev(author="alice"), 0.0).wake is True
    assert gate.decide(ev(**{"author": "alice", **same}), 0.0).wake is False
    if other is not None:
        assert gate.decide(ev(**{"author": "alice", **other}), 0.0).wake is True


# --- passive sample ---------------------------------------------------------------------------


def test_passive_sample_wakes_on_the_first_then_one_in_every() -> None:
    gate = gate_of(pol("s", {"passive_sample": {"every": 3}}))
    got = wakes(gate, [ev()] * 8)
    assert got == [True, False, False, True, False, False, True, False]
    assert gate.decide(ev(), 0.0) == Decision(wake=False, policy="s", behavior="passive_sample")


def test_passive_sample_every_one_always_wakes() -> None:
    gate = gate_of(pol("s", {"passive_sample": {"every": 1}}))
    assert wakes(gate, [ev()] * 5) == [True] * 5


def test_passive_sample_counts_per_key() -> None:
    gate = gate_of(pol("s", {"passive_sample": {"every": 2, "key_by": "conversation"}}))
    a, b = ev(thread_id="a"), ev(thread_id="b")
    assert wakes(gate, [a, b, a, b, a]) == [True, True, False, False, True]


# --- MAX_KEYS ---------------------------------------------------------------------------------


def authors(gate: Gate, names: list[str]) -> list[bool]:
    return wakes(gate, [ev(author=n) for n in names])


def test_passive_sample_keys_at_the_cap_are_all_kept() -> None:
    gate = gate_of(pol("s", {"passive_sample": {"every": 3, "key_by": "author"}}))
    names = [f"a{i}" for i in range(MAX_KEYS)]
    assert authors(gate, names) == [True] * MAX_KEYS
    assert gate.status(0.0)["policies"][0]["keys"] == MAX_KEYS
    # every key still remembers its count: the second event of each does not wake
    assert authors(gate, names) == [False] * MAX_KEYS


def test_passive_sample_past_the_cap_drops_the_least_recently_used_key() -> None:
    gate = gate_of(pol("s", {"passive_sample": {"every": 3, "key_by": "author"}}))
    authors(gate, [f"a{i}" for i in range(MAX_KEYS)])
    assert authors(gate, ["a0"]) == [False]  # a0 is now the most recently used
    assert authors(gate, ["new"]) == [True]  # past the cap: a1, the least recent, goes
    assert gate.status(0.0)["policies"][0]["keys"] == MAX_KEYS
    assert authors(gate, ["a0"]) == [False]  # kept: third event of a0
    assert authors(gate, ["a1"]) == [True]  # dropped: counted afresh
    assert authors(gate, ["a2"]) == [True]  # ...which dropped a2 in turn


def test_rate_limit_buckets_past_the_cap_drop_the_least_recently_used() -> None:
    behavior = {"rate_limit": {"tokens": 1, "refill_interval_ms": 86_400_000, "key_by": "author"}}
    gate = gate_of(pol("rl", behavior))
    names = [f"a{i}" for i in range(MAX_KEYS)]
    assert authors(gate, names) == [True] * MAX_KEYS
    assert authors(gate, names) == [False] * MAX_KEYS  # at the cap: every bucket is kept
    assert authors(gate, ["new"]) == [True]
    assert gate.status(0.0)["policies"][0]["keys"] == MAX_KEYS
    assert authors(gate, ["a0"]) == [True]  # its bucket was dropped: full again
    assert authors(gate, ["a2"]) == [False]


# --- resets -----------------------------------------------------------------------------------


def test_a_wake_resets_the_named_policies() -> None:
    gate = gate_of(
        pol("mention", "always", match={"tags_any": ["chat:mention"]}, resets=["ambient", "s"]),
        pol("s", {"passive_sample": {"every": 5}}, match={"scope": ["push"]}),
        pol("ambient", {"rate_limit": {"tokens": 1, "refill_interval_ms": 60_000}}),
    )
    push = ev(kind="push")
    assert wakes(gate, [ev(), ev(), push, push]) == [True, False, True, False]
    assert gate.decide(ev(tags=("chat:mention",)), 1.0).wake is True
    assert wakes(gate, [ev(), ev(), push, push], 1.0) == [True, False, True, False]


def test_a_reset_drops_a_pending_batch() -> None:
    gate = gate_of(
        pol("mention", "always", match={"tags_any": ["chat:mention"]}, resets=["batch"]),
        pol("batch", {"debounce_ms": 1000}),
    )
    gate.decide(ev(), 0.0)
    assert gate.next_due() == 1.0
    gate.decide(ev(tags=("chat:mention",)), 0.5)
    assert gate.next_due() is None
    assert gate.due(5.0) == []


def test_no_reset_without_a_wake() -> None:
    gate = gate_of(
        pol("quiet", "skip", match={"source": "q"}, resets=["ambient"]),
        pol("limited", RL, match={"source": "lobby"}, resets=["s"]),
        pol("s", {"passive_sample": {"every": 9}}, match={"source": "s"}),
        pol("ambient", RL, match={"source": "a"}),
    )
    a, q, s, lobby = (ev(server_id=x) for x in ("a", "q", "s", "lobby"))
    assert wakes(gate, [a, a, q, a]) == [True, False, False, False]  # skip does not reset
    assert wakes(gate, [s, s]) == [True, False]
    assert wakes(gate, [lobby, s, s]) == [True, True, False]  # limited woke: s starts over
    assert wakes(gate, [lobby, s]) == [False, False]  # limited is spent: no wake, no reset


def test_a_due_batch_applies_its_resets() -> None:
    gate = gate_of(
        pol("batch", {"debounce_ms": 1000}, match={"scope": ["push"]}, resets=["ambient"]),
        pol("ambient", {"rate_limit": {"tokens": 1, "refill_interval_ms": 86_400_000}}),
    )
    assert wakes(gate, [ev(), ev()]) == [True, False]
    gate.decide(ev(kind="push"), 0.0)
    assert gate.decide(ev(), 0.5).wake is False  # not due yet: no reset
    assert len(gate.due(1.0)) == 1
    assert gate.decide(ev(), 1.0).wake is True


# --- sleep ------------------------------------------------------------------------------------


def test_sleep_holds_wakes_until_it_ends() -> None:
    gate = gate_of(pol("s", {"passive_sample": {"every": 2}}, match={"scope": ["push"]}))
    gate.sleep(10.0)
    assert gate.asleep(0.0) and gate.asleep(9.99)
    assert not gate.asleep(10.0)
    asleep = Decision(wake=False, policy=None, behavior="asleep")
    assert gate.decide(ev(), 5.0) == asleep
    assert gate.decide(ev(kind="push"), 5.0) == asleep
    assert gate.decide(ev(), 10.0) == Decision(wake=True, policy=None, behavior="default")
    # events refused while asleep did not count towards the sample
    assert gate.decide(ev(kind="push"), 10.0).wake is True


def test_wake_up_ends_sleep_now() -> None:
    gate = Gate()
    gate.sleep(100.0)
    assert gate.decide(ev(), 1.0).behavior == "asleep"
    gate.wake_up()
    assert not gate.asleep(1.0)
    assert gate.decide(ev(), 1.0).wake is True


def test_privileged_authors_are_evaluated_while_asleep() -> None:
    gate = gate_of(
        pol("bots", "skip", match={"tags_any": ["chat:bot"]}),
        privileged_authors=["alice", "U-42"],
    )
    gate.sleep(100.0)
    assert gate.decide(ev(author="ALICE"), 1.0) == Decision(
        wake=True, policy=None, behavior="default"
    )
    assert gate.decide(ev(author="u-42"), 1.0).wake is True
    assert gate.decide(ev(author="alice", tags=("chat:bot",)), 1.0).behavior == "skip"
    assert gate.decide(ev(author="bob"), 1.0).behavior == "asleep"
    assert gate.decide(ev(author=None), 1.0).behavior == "asleep"


# --- reload -----------------------------------------------------------------------------------


def test_reload_keeps_the_state_of_unchanged_behaviors() -> None:
    gate = gate_of(pol("batch", {"debounce_ms": 1000}, match={"scope": ["push"]}), pol("rl", RL))
    assert wakes(gate, [ev(), ev()]) == [True, False]
    gate.decide(ev("kept", kind="push"), 0.0)
    new = parse(
        {
            "policies": [
                pol("batch", {"debounce_ms": 1000}, match={"scope": ["push"], "source": "*"}),
                pol("rl", RL, match={"source": "lobby"}),
            ]
        }
    )
    assert gate.reload(new, 0.5) == []
    assert gate.config is new
    assert gate.decide(ev(), 0.5).wake is False  # bucket kept
    assert gate.next_due() == 1.0
    assert gate.due(1.0)[0].snippets == ("kept",)
    assert gate.status(1.0)["policies"][1]["matched"] == 3


def test_reload_clears_the_state_of_changed_behaviors() -> None:
    gate = gate_of(pol("s", {"passive_sample": {"every": 4}}, match={"source": "x"}), pol("rl", RL))
    x = ev(server_id="x")
    assert wakes(gate, [ev(), ev(), x, x]) == [True, False, True, False]
    changed_rl = {"rate_limit": {"tokens": 1, "refill_interval_ms": 86_400_000, "key_by": "server"}}
    new = parse(
        {
            "policies": [
                pol(
                    "s", {"passive_sample": {"every": 4, "key_by": "server"}}, match={"source": "x"}
                ),
                pol("rl", changed_rl),
            ]
        }
    )
    assert gate.reload(new, 1.0) == []
    assert wakes(gate, [ev(), ev(), x, x]) == [True, False, True, False]
    assert gate.status(1.0)["policies"][0]["matched"] == 4  # statistics are kept by name


def test_reload_returns_the_batches_of_removed_and_changed_policies() -> None:
    gate = gate_of(
        pol("gone", {"debounce_ms": 1000}, match={"scope": ["push"]}),
        pol("changed", {"debounce_ms": 1000}, match={"tags_any": ["x:*"]}),
        pol("kept", {"debounce_ms": 1000}),
    )
    gate.decide(ev("g1", kind="push"), 0.0)
    gate.decide(ev("g2", kind="push"), 0.1)
    gate.decide(ev("c", tags=("x:y",)), 0.2)
    gate.decide(ev("k"), 0.3)
    new = parse(
        {
            "policies": [
                pol("changed", {"debounce_ms": 5000}, match={"tags_any": ["x:*"]}),
                pol("kept", {"debounce_ms": 1000}),
            ]
        }
    )
    flushed = gate.reload(new, 0.4)
    assert sorted(flushed, key=lambda b: b.policy) == [
        Batch(policy="changed", count=1, snippets=("c",), conversations=(ev().conversation,)),
        Batch(policy="gone", count=2, snippets=("g1", "g2"), conversations=(ev().conversation,)),
    ]
    assert gate.next_due() == 1.3
    assert [b.policy for b in gate.due(1.3)] == ["kept"]
    assert gate.due(100.0) == []


def test_reload_keeps_sleep_and_installs_new_privileged_authors() -> None:
    gate = gate_of(privileged_authors=["alice"])
    gate.sleep(50.0)
    gate.reload(parse({"privileged_authors": ["bob"]}), 1.0)
    assert gate.asleep(2.0)
    assert gate.decide(ev(author="alice"), 2.0).behavior == "asleep"
    assert gate.decide(ev(author="bob"), 2.0).wake is True


# --- status -----------------------------------------------------------------------------------


def test_status_is_json_and_reports_counts_pending_and_sleep() -> None:
    gate = gate_of(
        pol("batch", {"debounce_ms": 2000}, match={"scope": ["push"]}),
        pol("quiet", "skip", match={"tags_any": ["chat:bot"]}),
        default="always",
    )
    gate.decide(ev(kind="push"), 0.0)
    gate.decide(ev(kind="push"), 1.0)
    gate.decide(ev(tags=("chat:bot",)), 1.0)
    gate.decide(ev(), 1.0)
    gate.sleep(30.0)
    gate.decide(ev(), 2.0)
    status = gate.status(2.0)
    assert json.loads(json.dumps(status)) == status
    assert status["default"] == "always"
    assert status["policies"] == [
        {"name": "batch", "behavior": "debounce", "matched": 2, "woke": 0, "keys": 0},
        {"name": "quiet", "behavior": "skip", "matched": 1, "woke": 0, "keys": 0},
    ]
    assert status["pending"] == [{"policy": "batch", "count": 2, "due": 3.0}]
    assert status["sleep_until"] == 30.0 and status["asleep"] is True
    assert status["totals"] == {"events": 5, "woke": 1, "asleep": 1, "default": 1, "batches": 0}
    assert gate.status(30.0)["sleep_until"] is None


# --- the wake buffer --------------------------------------------------------------------------


def conv(i: int) -> tuple[str, str | None, str | None]:
    return ("s", f"c{i}", None)


def test_wake_buffer_at_its_cap_keeps_everything() -> None:
    buf: WakeBuffer[int] = WakeBuffer(cap=3)
    for i in range(3):
        buf.add(i, conv(i))
    assert len(buf) == 3 and buf.dropped == 0
    drained = buf.drain()
    assert drained.items == (0, 1, 2)
    assert (drained.dropped, drained.evicted, drained.overflow) == (0, frozenset(), False)
    assert len(buf) == 0


def test_wake_buffer_past_its_cap_evicts_the_oldest() -> None:
    buf: WakeBuffer[int] = WakeBuffer(cap=3)
    for i in range(4):
        buf.add(i, conv(i))
    assert len(buf) == 3 and buf.dropped == 1
    drained = buf.drain()
    assert drained.items == (1, 2, 3)
    assert drained.dropped == 1
    assert drained.evicted == frozenset({conv(0)})
    assert drained.overflow is False
    assert buf.drain().items == () and buf.dropped == 0


def test_wake_buffer_defaults() -> None:
    buf: WakeBuffer[int] = WakeBuffer()
    for i in range(MAX_BUFFERED + 1):
        buf.add(i, None)
    drained = buf.drain()
    assert drained.items == tuple(range(1, MAX_BUFFERED + 1))
    assert drained.dropped == 1 and drained.evicted == frozenset()


@pytest.mark.parametrize("conversation_cap", [1, 3, MAX_CONVERSATIONS])
def test_evicted_conversations_at_their_cap(conversation_cap: int) -> None:
    buf: WakeBuffer[int] = WakeBuffer(cap=1, conversation_cap=conversation_cap)
    for i in range(conversation_cap):
        buf.add(i, conv(i))
    buf.add(-1, conv(0))  # evicts the last distinct conversation: the set is now full
    assert buf.evicted_count == conversation_cap
    buf.add(-2, None)  # evicts conv(0) again: already recorded, so no overflow
    drained = buf.drain()
    assert drained.evicted == frozenset(conv(i) for i in range(conversation_cap))
    assert drained.overflow is False
    assert drained.dropped == conversation_cap + 1
    assert drained.items == (-2,)


@pytest.mark.parametrize("conversation_cap", [0, 1, 3])
def test_evicted_conversations_past_their_cap_overflow(conversation_cap: int) -> None:
    buf: WakeBuffer[int] = WakeBuffer(cap=1, conversation_cap=conversation_cap)
    for i in range(conversation_cap + 2):
        buf.add(i, conv(i))
        assert buf.evicted_count <= conversation_cap
    drained = buf.drain()
    assert drained.overflow is True
    assert drained.evicted == frozenset()
    assert drained.dropped == conversation_cap + 1
    assert buf.drain().overflow is False


def test_a_long_busy_period_keeps_the_bookkeeping_bounded() -> None:
    buf: WakeBuffer[int] = WakeBuffer()
    for i in range(20_000):
        buf.add(i, conv(i % 5_000))
        assert buf.evicted_count <= MAX_CONVERSATIONS
    drained = buf.drain()
    assert drained.overflow is True
    assert len(drained.evicted) <= MAX_CONVERSATIONS
    assert drained.dropped == 20_000 - MAX_BUFFERED
    assert drained.items == tuple(range(20_000 - MAX_BUFFERED, 20_000))


def test_none_conversations_are_never_recorded() -> None:
    buf: WakeBuffer[str] = WakeBuffer(cap=1, conversation_cap=0)
    for item in "abc":
        buf.add(item, None)
    drained = buf.drain()
    assert (drained.items, drained.dropped, drained.overflow) == (("c",), 2, False)


def test_wake_buffer_rejects_nonsense_caps() -> None:
    with pytest.raises(ValueError):
        WakeBuffer(cap=0)
    with pytest.raises(ValueError):
        WakeBuffer(conversation_cap=-1)


SMALL_POOL = [conv(i) for i in range(3)]
LARGE_POOL = [conv(i) for i in range(40)]


class WakeBufferMachine(RuleBasedStateMachine):
    """A WakeBuffer against a list-and-set model."""

    def __init__(self) -> None:
        super().__init__()
        self.buf: WakeBuffer[int] = WakeBuffer()
        self.cap = MAX_BUFFERED
        self.conversation_cap = MAX_CONVERSATIONS
        self.items: list[tuple[int, Any]] = []
        self.dropped = 0
        self.evicted: set[Any] = set()
        self.overflow = False
        self.next = 0

    @initialize(cap=st.integers(1, 6), conversation_cap=st.integers(0, 4))
    def setup(self, cap: int, conversation_cap: int) -> None:
        self.buf = WakeBuffer(cap=cap, conversation_cap=conversation_cap)
        self.cap, self.conversation_cap = cap, conversation_cap

    def _add(self, conversation: Any) -> None:
        self.buf.add(self.next, conversation)
        self.items.append((self.next, conversation))
        self.next += 1
        if len(self.items) > self.cap:
            _, lost = self.items.pop(0)
            self.dropped += 1
            if lost is not None and not self.overflow and lost not in self.evicted:
                if len(self.evicted) == self.conversation_cap:
                    self.evicted, self.overflow = set(), True
                else:
                    self.evicted.add(lost)

    @rule(conversation=st.sampled_from([*SMALL_POOL, None]))
    def add_small(self, conversation: Any) -> None:
        self._add(conversation)

    @rule(conversation=st.sampled_from(LARGE_POOL))
    def add_large(self, conversation: Any) -> None:
        self._add(conversation)

    @rule(n=st.integers(1, 15), start=st.integers(0, 39))
    def add_many_distinct(self, n: int, start: int) -> None:
        for i in range(n):
            self._add(LARGE_POOL[(start + i) % len(LARGE_POOL)])

    @rule()
    def drain(self) -> None:
        drained = self.buf.drain()
        assert drained.items == tuple(item for item, _ in self.items)
        assert drained.dropped == self.dropped
        assert drained.evicted == frozenset(self.evicted)
        assert drained.overflow is self.overflow
        self.items, self.dropped, self.evicted, self.overflow = [], 0, set(), False

    @invariant()
    def bounded(self) -> None:
        assert len(self.buf) == len(self.items) <= self.cap
        assert self.buf.evicted_count <= self.conversation_cap
        assert self.buf.dropped == self.dropped
        assert self.buf.overflow is self.overflow


TestWakeBufferMachine = WakeBufferMachine.TestCase


GATE_TOML = """
default = "always"
privileged_authors = ["alice"]

[[policies]]
name = "batch"
behavior = { debounce_ms = 2000 }
[policies.match]
scope = ["push"]
"""

ASLEEP = Decision(wake=False, policy=None, behavior="asleep")


class GateMachine(RuleBasedStateMachine):
    """A debounce policy and sleep under a monotonic clock, against a model."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate(parse_gate(GATE_TOML, "toml"))
        self.ms = 0
        self.sleep_until: float | None = None
        self.count = 0
        self.snippets: list[str] = []
        self.due_at: float | None = None
        self.serial = 0

    @property
    def now(self) -> float:
        return self.ms / 1000

    def _asleep(self) -> bool:
        return self.sleep_until is not None and self.now < self.sleep_until

    @rule(dt=st.integers(0, 3000))
    def advance(self, dt: int) -> None:
        self.ms += dt

    @rule(author=st.sampled_from(["alice", "Alice", "bob", None]))
    def push(self, author: str | None) -> None:
        self.serial += 1
        text = f"e{self.serial}"
        decision = self.gate.decide(ev(text, kind="push", author=author), self.now)
        if self._asleep() and (author or "").casefold() != "alice":
            assert decision == ASLEEP
            return
        due = self.now + 2.0
        assert decision == Decision(wake=False, policy="batch", behavior="debounce", due=due)
        self.count += 1
        self.snippets = [*self.snippets, text][-MAX_BATCH:]
        self.due_at = due

    @rule(author=st.sampled_from(["alice", "bob"]))
    def incoming(self, author: str) -> None:
        decision = self.gate.decide(ev(author=author), self.now)
        if self._asleep() and author != "alice":
            assert decision == ASLEEP
        else:
            assert decision == Decision(wake=True, policy=None, behavior="default")

    @rule(duration=st.integers(0, 5000))
    def sleep(self, duration: int) -> None:
        self.sleep_until = (self.ms + duration) / 1000
        self.gate.sleep(self.sleep_until)

    @rule()
    def wake_up(self) -> None:
        self.sleep_until = None
        self.gate.wake_up()

    @rule()
    def collect(self) -> None:
        batches = self.gate.due(self.now)
        if self.due_at is not None and self.due_at <= self.now:
            conversation = ev().conversation
            assert batches == [
                Batch(
                    policy="batch",
                    count=self.count,
                    snippets=tuple(self.snippets),
                    conversations=(conversation,),
                )
            ]
            self.count, self.snippets, self.due_at = 0, [], None
        else:
            assert batches == []

    @precondition(lambda self: self.count > 0)
    @rule()
    def wait_until_due(self) -> None:
        assert self.due_at is not None
        self.ms = max(self.ms, math.ceil(self.due_at * 1000))
        while self.due_at > self.now:
            self.ms += 1
        self.collect()
        assert self.count == 0

    @invariant()
    def agrees(self) -> None:
        assert self.gate.next_due() == self.due_at
        assert self.gate.asleep(self.now) is self._asleep()
        if self.due_at is not None:
            assert self.due_at - self.now <= 2.0 + 1e-9
        assert self.gate.status(self.now)["pending"] == (
            [{"policy": "batch", "count": self.count, "due": self.due_at}] if self.count else []
        )


TestGateMachine = GateMachine.TestCase


# --- the plain decision ----------------------------------------------------------------------


@given(
    policies=st.lists(st.sampled_from(["always", "skip"]), max_size=2),
    default=st.sampled_from(["always", "defer", "skip"]),
    sleep_for=st.one_of(st.none(), st.floats(min_value=-5, max_value=5)),
    privileged=st.booleans(),
)
def test_the_plain_decision_is_the_full_one_when_it_answers(
    policies: list[str], default: str, sleep_for: float | None, privileged: bool
) -> None:
    """``wakes_plainly`` answers only when ``decide`` would wake whatever the event, and it
    counts the decision exactly as ``decide`` does; otherwise it changes nothing."""
    top: dict[str, Any] = {"default": default}
    if privileged:
        top["privileged_authors"] = ["root"]

    def make() -> Gate:
        gate = gate_of(*(pol(f"p{i}", b) for i, b in enumerate(policies)), **top)
        if sleep_for is not None:
            gate.sleep(100.0 + sleep_for)
        return gate

    plain, full = make(), make()
    before = plain.status(100.0)["totals"]
    answered = plain.wakes_plainly(100.0)
    assert answered == (not policies and default == "always" and not full.asleep(100.0))
    if answered:
        assert full.decide(ev(author="someone"), 100.0).wake
        assert plain.status(100.0)["totals"] == full.status(100.0)["totals"]
    else:
        assert plain.status(100.0)["totals"] == before
