"""The ``gate = "community"`` preset and the ``aliases`` key as the config reads them, and the
line ``mcplive check`` prints of what wakes each agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.cli.check import wakes_line
from actors.config import ConfigErrors, load_config
from protocol.gate import preset


def cfg(tmp_path: Path, **agent: Any) -> dict[str, Any]:
    rules = tmp_path / "ada.toml"
    rules.write_text("", encoding="utf-8")
    return {
        "host": {"data_dir": str(tmp_path / "data")},
        "agents": [{"name": "Ada", "model": f"scripted:{rules}", **agent}],
    }


def test_the_community_preset_and_aliases(tmp_path: Path) -> None:
    [ada] = load_config(cfg(tmp_path, gate="community", aliases=["ada-bot", " Lovelace "])).agents
    assert ada.gate is None and ada.gate_preset == "community"
    assert ada.gate_policy == preset("community")
    assert ada.aliases == ("ada-bot", "Lovelace")
    assert wakes_line(ada) == (
        "wakes on pushes, direct messages and messages addressing it "
        "(Ada, @Ada, aliases: ada-bot, Lovelace, replies to it); "
        "other chatter is stored for its next turn"
    )


def test_without_a_gate_everything_wakes_and_a_file_is_named(tmp_path: Path) -> None:
    [ada] = load_config(cfg(tmp_path)).agents
    assert wakes_line(ada).startswith("wakes on every item it hears")
    gate = tmp_path / "gate.toml"
    gate.write_text('default = "skip"\n', encoding="utf-8")
    [ada] = load_config(cfg(tmp_path, gate=str(gate))).agents
    assert wakes_line(ada) == f"wakes as its gate file {gate} says (0 policies, default skip)"


@pytest.mark.parametrize("aliases", ["ada", [1], [""], ["x" * 65], ["a"] * 17])
def test_bad_aliases_are_one_line(tmp_path: Path, aliases: Any) -> None:
    with pytest.raises(ConfigErrors) as caught:
        load_config(cfg(tmp_path, aliases=aliases))
    assert "agents[Ada].aliases: must be a list of at most 16 names" in str(caught.value)
