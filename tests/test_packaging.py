"""What installing mcplive puts in site-packages: the packages ``actors``, ``protocol`` and
``store`` and nothing else at the top (no ``examples``, no ``tests``), with the bundled lobby
(``examples/lobby`` in the source tree) inside as ``actors/cli/lobby``, where ``mcplive run``
finds it with no config."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("actors", "protocol", "store")
LOBBY = "actors.cli.lobby"
LOBBY_FILES = {"__init__.py", "server.py", "lobby.toml", "ada.toml", "grace.toml"}


def options() -> configparser.SectionProxy:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg", encoding="utf-8")
    return cfg["options"]


def listed(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip()]


def test_every_package_of_the_source_tree_is_listed_and_the_lobby_is_mapped_in() -> None:
    found = [
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in TOP_LEVEL
        for init in (ROOT / top).rglob("__init__.py")
    ]
    packages = listed(options()["packages"])
    assert sorted(packages) == sorted([*found, LOBBY])
    assert {p.split(".")[0] for p in packages} == set(TOP_LEVEL)
    mapping = dict(line.split("=") for line in listed(options()["package_dir"]))
    assert {k.strip(): v.strip() for k, v in mapping.items()} == {LOBBY: "examples/lobby"}


@pytest.mark.slow
def test_the_built_packages_carry_the_lobby_and_mcplive_finds_it_there(tmp_path: Path) -> None:
    # the build runs in a copy, so that it leaves nothing in the source tree
    source = tmp_path / "source"
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "mcplive-data")
    for folder in (*TOP_LEVEL, "examples/lobby"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    built = tmp_path / "lib"
    build = [sys.executable, "-c", "import setuptools; setuptools.setup()"]
    done = subprocess.run(
        [*build, "-q", "build_py", "--build-lib", str(built)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in built.iterdir()) == sorted(TOP_LEVEL)
    lobby = built / "actors" / "cli" / "lobby"
    assert {p.name for p in lobby.iterdir()} == LOBBY_FILES
    assert (lobby / "server.py").read_bytes() == (ROOT / "examples/lobby/server.py").read_bytes()
    found = subprocess.run(
        [sys.executable, "-c", "from actors.cli.command import bundled_example as b; print(b())"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(built), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str((lobby / "lobby.toml").resolve())
