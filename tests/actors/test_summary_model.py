"""``summary_model``: the model folding an agent's older context, as config and ``mcplive check``
read it, and the scripted model's ``[summary]`` rule."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from actors.agent.folding import span_text, summary_model
from actors.agent.history import render_for_model
from actors.cli.check import cmd_check
from actors.config import ConfigErrors, load_config
from actors.errors import ConfigError
from actors.models.base import ModelRequest
from actors.models.providers import make_model
from actors.models.scripted import ScriptedModel, load_script


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def agent(**keys: str) -> dict[str, object]:
    return {"agents": [{"name": "Ada", **keys}]}


def problems(raw: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        load_config(raw)
    return info.value.problems


def test_a_summary_model_is_read_like_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = write(tmp_path, "ada.toml", "")
    folds = write(tmp_path, "folds.toml", "[summary]\n")
    cfg = load_config(agent(model=f"scripted:{own}", summary_model=f"scripted:{folds}"))
    assert cfg.agents[0].summary_model == f"scripted:{folds}"
    assert load_config(agent(model=f"scripted:{own}")).agents[0].summary_model is None
    bad = problems(agent(model=f"scripted:{own}", summary_model="gpt:x"))
    assert len(bad) == 1 and bad[0].startswith("agents[Ada].summary_model: must be ")
    missing = problems(agent(model=f"scripted:{own}", summary_model="scripted:nope.toml"))
    assert len(missing) == 1 and missing[0].startswith("agents[Ada].summary_model: scripted model")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    keyless = problems(agent(model=f"scripted:{own}", summary_model="anthropic:claude-x"))
    assert keyless == [
        "agents[Ada].summary_model: anthropic:claude-x needs an API key; "
        "environment variable ANTHROPIC_API_KEY is not set"
    ]


def test_which_model_folds(tmp_path: Path) -> None:
    quiet = write(tmp_path, "quiet.toml", "")
    folds = write(tmp_path, "folds.toml", "[summary]\n")
    cfg = load_config(agent(model=f"scripted:{quiet}")).agents[0]
    assert summary_model(cfg, make_model(cfg)) is None  # a scripted model without [summary]
    cfg = load_config(agent(model=f"scripted:{folds}")).agents[0]
    own = make_model(cfg)
    assert summary_model(cfg, own) is own
    cfg = load_config(agent(model=f"scripted:{quiet}", summary_model=f"scripted:{folds}")).agents[0]
    other = summary_model(cfg, make_model(cfg))
    assert isinstance(other, ScriptedModel) and other.path == folds


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[summary]\ncolour = 1\n", "summary.colour: unknown key"),
        ("[summary]\nitem_chars = 0\n", "summary.item_chars: must be a whole number"),
        ('[summary]\nsay = ""\n', "summary.say: must be a non-empty string"),
        ("summary = 3\n", "summary must be a table"),
        ("[other]\n", "other: unknown key"),
    ],
)
def test_a_bad_summary_rule_is_one_clear_line(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(ConfigError, match=problem):
        load_script(path)


def test_check_names_a_summary_model_that_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "ada.toml", "")
    write(tmp_path, "folds.toml", "[summary]\nitem_chars = -1\n")
    cfg = write(
        tmp_path,
        "mcplive.toml",
        f'[host]\ndata_dir = "{tmp_path / "data"}"\n\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:ada.toml"\n'
        'summary_model = "scripted:folds.toml"\n',
    )
    args = argparse.Namespace(config=cfg, manifest=[], connect=False)
    assert cmd_check(args) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    assert out[0].startswith(f"{cfg}: agents[Ada].summary_model: ")
    assert "summary.item_chars" in out[0]


async def test_the_scripted_summary_is_a_fixed_format_of_the_span(tmp_path: Path) -> None:
    model = ScriptedModel(write(tmp_path, "s.toml", '[summary]\nsay = "{count}: {items}"\n'))
    span = [
        {
            "id": "a",
            "role": "user",
            "blocks": [
                {"type": "text", "text": "[source: lobby / general]"},
                {"type": "text", "text": "[author: Ann]"},
                {"type": "text", "text": "the key is\nunder the mat"},
            ],
            "prefix": 2,
        },
        {"id": "b", "role": "assistant", "blocks": [{"type": "text", "text": "Noted."}]},
    ]
    request = ModelRequest(
        agent="Ada",
        system="",
        messages=({"role": "user", "blocks": [{"type": "text", "text": span_text(span)}]},),
        purpose="summary",
    )
    reply = await model.complete(request)
    assert reply.text == (
        "2: [source: lobby / general] / [author: Ann] / the key is / under the mat\n"
        "(the agent itself) / Noted."
    )
    assert (await model.complete(request)).text == reply.text


def test_the_documented_summary_example_loads(tmp_path: Path) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "guide" / "models.md"
    section = (
        page.read_text(encoding="utf-8").split("## Scripted models", 1)[1].split("\n## ", 1)[0]
    )
    blocks = [b.split("```", 1)[0] for b in section.split("```toml\n")[1:]]
    example = next(b for b in blocks if "[summary]" in b)
    _, rule = load_script(write(tmp_path, "s.toml", example))
    assert rule is not None and rule.item_chars == 120
    assert rule.summarize("--- item 1\nhi") == "Earlier (1 messages):\nhi"


def test_the_summarizer_reads_each_item_under_its_source_and_author() -> None:
    header = "[source: lobby / general]"
    with_author = render_for_model(
        {
            "id": "a",
            "role": "user",
            "blocks": [{"type": "text", "text": header}, {"type": "text", "text": "hi all"}],
            "metadata": {
                "source_header": header,
                "inbound_source": {"server": "lobby", "channel": "general"},
                "author": {"id": "u1", "name": "Ann"},
            },
        }
    )
    no_author = render_for_model(
        {
            "id": "b",
            "role": "user",
            "blocks": [{"type": "text", "text": header}, {"type": "text", "text": "a push"}],
            "metadata": {"source_header": header, "inbound_source": {"server": "lobby"}},
        }
    )
    call = {
        "id": "c",
        "role": "assistant",
        "blocks": [{"type": "tool_use", "id": "t", "name": "recall", "input": {"query": "x"}}],
    }
    result = {
        "id": "d",
        "role": "tool",
        "blocks": [
            {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": [{"type": "text", "text": "none"}],
                "is_error": False,
            }
        ],
    }
    assert span_text([with_author, no_author, call, result]) == (
        "--- item 1\n[source: lobby / general]\n[author: Ann]\nhi all\n"
        "--- item 2\n[source: lobby / general]\na push\n"
        "--- item 3\n(the agent itself)\n[called recall with {'query': 'x'}]\n"
        "--- item 4\n(tool results)\n[result: none]"
    )


def test_check_tells_how_each_agent_folds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "quiet.toml", "")
    write(tmp_path, "folds.toml", "[summary]\n")
    cfg = write(
        tmp_path,
        "mcplive.toml",
        f'[host]\ndata_dir = "{tmp_path / "data"}"\n\n'
        '[[agents]]\nname = "Ada"\nmodel = "scripted:quiet.toml"\n'
        'summary_model = "scripted:folds.toml"\ncontext_tokens = 8000\n\n'
        '[[agents]]\nname = "Bo"\nmodel = "scripted:quiet.toml"\n',
    )
    assert cmd_check(argparse.Namespace(config=cfg, manifest=[], connect=False)) == 0
    out = capsys.readouterr().out
    assert "agent Ada: " in out and "8,000 context tokens, folds older context with " in out
    assert "scripted:folds.toml" in out.split("agent Ada: ", 1)[1].splitlines()[0]
    bo = out.split("agent Bo: ", 1)[1].splitlines()[0]
    assert bo.endswith(
        "60,000 context tokens, drops older context (its scripted model has no [summary])"
    )
