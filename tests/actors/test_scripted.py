"""The scripted model: DESIGN section 6's rule format, matching, substitution and errors."""

from __future__ import annotations

import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from actors.agent.actor import render_for_model
from actors.errors import ConfigError
from actors.models.base import ModelReply, ModelRequest
from actors.models.scripted import ScriptedModel, body_of, fill

WEATHER = """
[[rules]]
when = "(?i)hello"
say = "Hi there!"

[[rules]]
when = "weather in (\\\\w+)"
calls = [{ tool = "lobby--forecast", arguments = { city = "{1}" } }]
say = "I looked up {1}."
"""


def model(tmp_path: Path, text: str) -> ScriptedModel:
    path = tmp_path / "model.toml"
    path.write_text(text, encoding="utf-8")
    return ScriptedModel(path)


def user(text: str, *, header: str | None = None, **meta: Any) -> dict[str, Any]:
    blocks = [{"type": "text", "text": text}]
    if header is not None:
        meta["source_header"] = header
        blocks.insert(0, {"type": "text", "text": header})
    return {"role": "user", "blocks": blocks, "metadata": meta}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "blocks": list(blocks), "metadata": {}}


def tool_results(reply: ModelReply) -> dict[str, Any]:
    return {
        "role": "tool",
        "blocks": [
            {"type": "tool_result", "tool_use_id": u["id"], "content": [], "is_error": False}
            for u in reply.tool_uses
        ],
        "metadata": {},
    }


async def ask(m: ScriptedModel, *messages: dict[str, Any], on_delta: Any = None) -> ModelReply:
    return await m.complete(ModelRequest(agent="Ada", system="", messages=messages), on_delta)


# -- matching ---------------------------------------------------------------------------------


async def test_the_design_example_says_hello(tmp_path: Path):
    reply = await ask(model(tmp_path, WEATHER), user("well, HELLO"))
    assert reply.blocks == ({"type": "text", "text": "Hi there!"},)
    assert reply.text == "Hi there!"
    assert reply.tool_uses == ()


async def test_the_first_matching_rule_fires(tmp_path: Path):
    m = model(
        tmp_path,
        """
[[rules]]
when = "a"
say = "first"

[[rules]]
when = "b"
say = "second"

[[rules]]
when = "."
say = "third"
""",
    )
    assert (await ask(m, user("ab"))).text == "first"
    assert (await ask(m, user("ba"))).text == "first"
    assert (await ask(m, user("b"))).text == "second"
    assert (await ask(m, user("z"))).text == "third"


async def test_no_match_is_silence(tmp_path: Path):
    reply = await ask(model(tmp_path, WEATHER), user("goodbye"))
    assert reply.blocks == ()
    assert reply.text == ""


async def test_no_user_message_is_silence(tmp_path: Path):
    m = model(tmp_path, '[[rules]]\nwhen = ""\nsay = "always"\n')
    assert (await ask(m)).blocks == ()
    assert (await ask(m, user("x"))).text == "always"


@pytest.fixture(scope="module")
def empty_model(tmp_path_factory: pytest.TempPathFactory) -> ScriptedModel:
    path = tmp_path_factory.mktemp("scripted") / "empty.toml"
    path.write_text("")
    return ScriptedModel(path)


@given(st.text())
async def test_an_empty_file_is_valid_and_never_speaks(empty_model: ScriptedModel, text: str):
    assert (await ask(empty_model, user(text))).blocks == ()
    assert (await ask(empty_model, user(text, header="[lobby #general] bob:"))).blocks == ()


async def test_an_empty_file_loads(tmp_path: Path):
    assert model(tmp_path, "").rules == ()
    assert model(tmp_path, "# only a comment\n").rules == ()


async def test_after_the_agent_spoke_it_is_silent(tmp_path: Path):
    m = model(tmp_path, WEATHER)
    spoke = assistant({"type": "text", "text": "Hi there!"})
    assert (await ask(m, user("hello"), spoke)).blocks == ()


async def test_a_host_notice_after_its_reply_is_not_new_input(tmp_path: Path):
    m = model(tmp_path, WEATHER)
    spoke = assistant({"type": "text", "text": "Hi there!"})
    receipt = {"role": "system", "blocks": [{"type": "text", "text": "[delivered] #general"}]}
    assert (await ask(m, user("hello"), spoke, receipt)).blocks == ()
    # a new message after the notice is answered
    assert (await ask(m, user("hello"), spoke, receipt, user("hello again"))).text == "Hi there!"


async def test_the_newest_incoming_message_is_matched(tmp_path: Path):
    m = model(tmp_path, WEATHER)
    history = [
        user("weather in Rome"),
        assistant({"type": "text", "text": "x"}),
        user("hello"),
    ]
    assert (await ask(m, *history)).text == "Hi there!"
    history = [user("hello"), assistant({"type": "text", "text": "x"}), user("weather in Oslo")]
    uses = (await ask(m, *history)).tool_uses
    assert [u["input"] for u in uses] == [{"city": "Oslo"}]


async def test_the_header_block_is_not_matched(tmp_path: Path):
    m = model(
        tmp_path,
        """
[[rules]]
when = "lobby"
say = "matched the header"

[[rules]]
when = "^hi$"
say = "matched the body"
""",
    )
    header = "[lobby #general] bob:"
    assert (await ask(m, user("hi", header=header))).text == "matched the body"
    # Only a first block equal to metadata.source_header is the header.
    other = user("hi", header=header)
    other["metadata"]["source_header"] = "[elsewhere] carol:"
    assert (await ask(m, other)).text == "matched the header"


async def test_prefix_blocks_are_not_matched(tmp_path: Path):
    m = model(
        tmp_path,
        """
[[rules]]
when = "lobby|bob|context"
say = "matched a prefix"

[[rules]]
when = "^hi$"
say = "matched the body"
""",
    )
    stored = user(
        "hi", inbound_source={"server": "lobby", "channel": "general"}, author={"name": "bob"}
    )
    rendered = render_for_model(stored)
    assert rendered["prefix"] == 1
    assert "lobby" in rendered["blocks"][0]["text"]
    assert (await ask(m, rendered)).text == "matched the body"

    two = user("hi")
    two["blocks"][:0] = [{"type": "text", "text": "context"}, {"type": "text", "text": "bob"}]
    two["prefix"] = 2
    assert (await ask(m, two)).text == "matched the body"
    two["prefix"] = 1
    assert (await ask(m, two)).text == "matched a prefix"


async def test_non_text_blocks_are_not_part_of_the_body(tmp_path: Path):
    m = model(tmp_path, '[[rules]]\nwhen = "^hi$"\nsay = "yes"\n')
    message = user("hi")
    message["blocks"].append({"type": "image", "source": {"data": "hi"}})
    assert (await ask(m, message)).text == "yes"


# -- substitution, calls then say ------------------------------------------------------------


async def test_groups_fill_say(tmp_path: Path):
    m = model(tmp_path, '[[rules]]\nwhen = "(\\\\w+) to (\\\\w+)"\nsay = "{0}|{2}|{1}|{3}|{1}"\n')
    assert (await ask(m, user("say go to Oslo now"))).text == "go to Oslo|Oslo|go||go"


async def test_calls_then_say_in_two_rounds(tmp_path: Path):
    m = model(tmp_path, WEATHER)
    first = user("what is the weather in Paris?")
    calls = await ask(m, first)
    assert calls.stop_reason == "tool_use"
    assert calls.blocks == (
        {"type": "tool_use", "id": "call_1", "name": "lobby--forecast", "input": {"city": "Paris"}},
    )
    asked = assistant(*calls.blocks)
    said = await ask(m, first, asked, tool_results(calls))
    assert said.blocks == ({"type": "text", "text": "I looked up Paris."},)
    assert said.stop_reason == "end_turn"
    done = await ask(m, first, asked, tool_results(calls), assistant(*said.blocks))
    assert done.blocks == ()


async def test_groups_fill_every_string_inside_call_arguments(tmp_path: Path):
    m = model(
        tmp_path,
        """
[[rules]]
when = "move (\\\\w+) to (\\\\w+)"
say = "moved"

[[rules.calls]]
tool = "board--move"
arguments = { piece = "{1}", path = ["from", "{1}", { to = "to {2}!" }], n = 6, ok = true }

[[rules.calls]]
tool = "board--log"
arguments = { text = "{0}", deep = { deeper = { deepest = ["{2}{1}"] } } }

[[rules.calls]]
tool = "board--noop"
""",
    )
    reply = await ask(m, user("please move knight to e5"))
    assert [(u["id"], u["name"], u["input"]) for u in reply.tool_uses] == [
        (
            "call_1",
            "board--move",
            {"piece": "knight", "path": ["from", "knight", {"to": "to e5!"}], "n": 6, "ok": True},
        ),
        (
            "call_2",
            "board--log",
            {"text": "move knight to e5", "deep": {"deeper": {"deepest": ["e5knight"]}}},
        ),
        ("call_3", "board--noop", {}),
    ]


async def test_calls_without_say_end_quietly(tmp_path: Path):
    m = model(tmp_path, '[[rules]]\nwhen = "roll"\ncalls = [{ tool = "lobby--roll" }]\n')
    first = user("roll")
    calls = await ask(m, first)
    assert [u["name"] for u in calls.tool_uses] == ["lobby--roll"]
    assert (await ask(m, first, assistant(*calls.blocks), tool_results(calls))).blocks == ()


async def test_say_streams_to_the_delta_sink(tmp_path: Path):
    deltas: list[str] = []

    async def sink(text: str) -> None:
        deltas.append(text)

    m = model(tmp_path, WEATHER)
    await ask(m, user("hello"), on_delta=sink)
    await ask(m, user("nothing"), on_delta=sink)
    assert deltas == ["Hi ", "there!"]  # word by word, as a provider streams


# -- fill: properties -------------------------------------------------------------------------

plain = st.text().filter(lambda s: not re.search(r"\{\d+\}", s))
groups = st.lists(st.text(), min_size=0, max_size=4)


def match_of(values: list[str]) -> re.Match[str]:
    pattern = "".join(f"({re.escape(v)})" for v in values) + "(unused)?"
    found = re.fullmatch(pattern, "".join(values))
    assert found is not None
    return found


@given(plain, groups)
def test_fill_leaves_text_without_fields_alone(text: str, values: list[str]):
    assert fill(text, match_of(values)) == text


@given(
    st.lists(
        st.one_of(plain.map(lambda s: ("text", s)), st.integers(0, 7).map(lambda n: ("group", n)))
    ),
    groups,
)
def test_fill_replaces_each_field_once(pieces: list[tuple[str, Any]], values: list[str]):
    found = match_of(values)
    template = ""
    expected = ""
    for kind, piece in pieces:
        if kind == "text":
            template += piece
            expected += piece
        else:
            template += "{" + str(piece) + "}"
            # {0} is the whole match; groups past the pattern's, and the group that did not
            # take part, are empty. Group text is not filled again.
            if piece == 0:
                expected += "".join(values)
            elif piece <= len(values):
                expected += values[piece - 1]
    # Keep pieces from gluing into a new field such as "{" + "1}" by checking the template
    # splits back into the same fields.
    assume(re.findall(r"\{(\d+)\}", template) == [str(p) for k, p in pieces if k == "group"])
    assert fill(template, found) == expected


json_like = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(alphabet="abc", max_size=3), inner, max_size=3),
    ),
    max_leaves=12,
)


def replaced(value: Any, found: re.Match[str]) -> Any:
    if isinstance(value, str):
        return fill(value, found)
    if isinstance(value, dict):
        return {k: replaced(v, found) for k, v in value.items()}
    if isinstance(value, list):
        return [replaced(v, found) for v in value]
    return value


@given(json_like, groups)
def test_fill_walks_every_list_and_table(value: Any, values: list[str]):
    found = match_of(values)
    out = fill(value, found)
    assert out == replaced(value, found)
    assert type(out) is type(value)


# -- what the model sees: render_for_model and body_of ----------------------------------------

sources = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"server": st.sampled_from(["lobby", "chat"])},
        optional={"channel": st.text(min_size=1, max_size=5), "label": st.text(max_size=5)},
    ),
)


@given(
    st.lists(st.text(), min_size=1, max_size=3),
    st.one_of(st.none(), st.text(min_size=1)),
    sources,
    st.one_of(st.none(), st.fixed_dictionaries({}, optional={"name": st.text(), "id": st.text()})),
)
@example(["0"], "0", {"server": "lobby"}, {"name": "0"})  # a body equal to its header
def test_rendering_never_changes_the_matched_body(
    texts: list[str], header: str | None, source: Any, author: Any
):
    stored = user(texts[-1], header=header)
    stored["blocks"][-1:-1] = [{"type": "text", "text": t} for t in texts[:-1]]
    if source is not None:
        stored["metadata"]["inbound_source"] = source
    if author is not None:
        stored["metadata"]["author"] = author
    before = repr(stored)
    rendered = render_for_model(stored)
    assert repr(stored) == before  # the stored message is not changed
    assert body_of(rendered) == body_of(stored) == "\n".join(texts)
    named = author is not None and any(author.values())
    if source is not None and header is None:
        assert rendered["prefix"] == 1
        intro = rendered["blocks"][0]["text"]
        assert intro.startswith(f"[{source['server']}")
    elif source is not None and named:
        # the host's author line right after the stored header, the rest as stored
        assert rendered["prefix"] == 2
        assert rendered["blocks"][0] == stored["blocks"][0]
        assert rendered["blocks"][1]["text"].startswith("[author")
        assert rendered["blocks"][2:] == stored["blocks"][1:]
    else:
        assert rendered["blocks"] == stored["blocks"]
        assert "prefix" not in rendered


def test_only_incoming_user_messages_are_introduced():
    source = {"server": "lobby", "channel": "general", "label": "#general"}
    spoke = assistant({"type": "text", "text": "hi"})
    spoke["metadata"] = {"inbound_source": source}
    assert render_for_model(spoke)["blocks"] == spoke["blocks"]
    heard = user("hi", inbound_source=source, author={"id": "u1"})
    assert render_for_model(heard)["blocks"][0] == {"type": "text", "text": "[lobby #general] u1:"}
    pushed = user("tick", inbound_source={"server": "lobby"})
    assert render_for_model(pushed)["blocks"][0] == {"type": "text", "text": "[lobby push event]"}


# -- errors: one line, ConfigError ------------------------------------------------------------

BAD: list[tuple[str, str, str]] = [
    ("bad regex", '[[rules]]\nwhen = "("\n', "rules[1].when"),
    ("bad toml", "[[rules]\nwhen = 1\n", "TOML"),
    ("missing when", '[[rules]]\nsay = "x"\n', "rules[1].when"),
    ("when not a string", "[[rules]]\nwhen = 1\n", "rules[1].when"),
    ("say not a string", '[[rules]]\nwhen = "x"\nsay = ["x"]\n', "rules[1].say"),
    ("calls not a list", '[[rules]]\nwhen = "x"\ncalls = "lobby--roll"\n', "rules[1].calls"),
    (
        "call without tool",
        '[[rules]]\nwhen = "x"\ncalls = [{ arguments = {} }]\n',
        "rules[1].calls",
    ),
    ("tool not a string", '[[rules]]\nwhen = "x"\ncalls = [{ tool = 1 }]\n', "rules[1].calls"),
    (
        "arguments not a table",
        '[[rules]]\nwhen = "x"\ncalls = [{ tool = "t", arguments = [1] }]\n',
        "rules[1].calls",
    ),
    ("call not a table", '[[rules]]\nwhen = "x"\ncalls = ["t"]\n', "rules[1].calls"),
    ("rules not an array", "rules = 1\n", "rules"),
    ("rules holding a number", "rules = [1]\n", "rules[1]"),
    ("the second rule", '[[rules]]\nwhen = "x"\n[[rules]]\nwhen = "["\n', "rules[2].when"),
    ("unknown rule key", '[[rules]]\nwhen = "x"\nsya = "hi"\n', "rules[1].sya"),
    ("unknown top-level key", '[[rule]]\nwhen = "x"\nsay = "hi"\n', "rule"),
    (
        "unknown call key",
        '[[rules]]\nwhen = "x"\ncalls = [{ tool = "t", args = { a = 1 } }]\n',
        "rules[1].calls",
    ),
]


@pytest.mark.parametrize(("text", "key"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_file_is_one_config_error_line(tmp_path: Path, text: str, key: str):
    with pytest.raises(ConfigError) as info:
        model(tmp_path, text)
    message = str(info.value)
    assert "\n" not in message
    assert str(tmp_path / "model.toml") in message
    assert key in message


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path):
    path = tmp_path / "model.toml"
    path.write_bytes(b'[[rules]]\nwhen = "\xff"\n')
    with pytest.raises(ConfigError) as info:
        ScriptedModel(path)
    assert "\n" not in str(info.value)
    assert str(path) in str(info.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        ScriptedModel(tmp_path / "nope.toml")
    assert "nope.toml" in str(info.value)
    assert "\n" not in str(info.value)


@given(
    st.lists(st.text(max_size=30), min_size=1, max_size=12),
    st.lists(st.integers(min_value=0, max_value=11), max_size=30),
    st.integers(min_value=1, max_value=6),
)
async def test_usage_counts_what_was_read_however_messages_are_shared(
    texts: list[str], picks: list[int], cap: int
) -> None:
    """Its input estimate is a token per four characters of the system prompt and every
    message's body, whether a message was read before (the same object, or another agent's
    copy of the same rendering) or not, with any number of lengths kept."""
    import tempfile

    from actors.models import scripted

    with tempfile.TemporaryDirectory() as folder:
        ada, bea = model(Path(folder), ""), model(Path(folder), "")
    pool = [user(t, header="[source: lobby]") for t in texts]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(scripted, "BODY_LENGTHS", cap)
        patch.setattr(scripted, "_body_lengths", OrderedDict())
        for turn in range(3):
            messages = [pool[(i + turn) % len(pool)] for i in picks] or pool
            copies = [dict(x, id=f"bea-{n}") for n, x in enumerate(messages)]
            read = "sys" * turn + "".join(body_of(x) for x in messages)
            for m, shown in ((ada, messages), (bea, copies)):
                request = ModelRequest(agent="Ada", system="sys" * turn, messages=shown)
                assert m._usage(request, "")["input_tokens"] == len(read) // 4 + 1
            assert len(scripted._body_lengths) <= cap


async def test_a_body_is_measured_once_for_every_agent_shown_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten agents shown copies of one rendering (shared blocks and metadata) measure its body
    once; at the cap the oldest length goes first, and a body measured again is right."""
    from actors.models import scripted

    measured: list[str] = []

    def counting(message: Any) -> str:
        measured.append(str(message.get("id")))
        return body_of(message)

    monkeypatch.setattr(scripted, "body_of", counting)
    monkeypatch.setattr(scripted, "BODY_LENGTHS", 2)
    monkeypatch.setattr(scripted, "_body_lengths", OrderedDict())
    rendered = [render_for_model(user(f"item {n}", header="[source: lobby]")) for n in range(3)]
    agents = [model(tmp_path, "") for _ in range(10)]
    for n, m in enumerate(agents):
        shown = [dict(r, id=f"{n}-{k}") for k, r in enumerate(rendered[:2])]
        m._usage(ModelRequest(agent=f"A{n}", system="", messages=shown), "")
    assert measured == ["0-0", "0-1"]
    agents[0]._usage(ModelRequest(agent="A0", system="", messages=[rendered[2]]), "")
    assert len(scripted._body_lengths) == 2  # the cap: the first item's length went
    request = ModelRequest(agent="A1", system="", messages=[dict(rendered[0], id="again")])
    expected = len(body_of(rendered[0])) // 4 + 1
    assert agents[1]._usage(request, "")["input_tokens"] == expected
    assert measured[-1] == "again"


def test_a_scripted_model_nested_5000_deep_is_a_config_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="nested too deeply"):
        ScriptedModel(deep)
