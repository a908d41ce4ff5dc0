"""The README's two set-up commands: each makes and uses a virtual environment (a system Python
may be externally managed), and CI runs the second one as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [
        line
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.startswith("#")
    ]


def test_exactly_two_commands_each_in_a_fresh_virtual_environment() -> None:
    run, tests = _setup_commands()
    for command in (run, tests):
        steps = [s.strip() for s in command.split("&&")]
        assert steps[0] == "python3 -m venv .venv"
        assert steps[1] == ". .venv/bin/activate"
        assert all("sudo" not in s and "--break-system-packages" not in s for s in steps)
    assert run.endswith("&& mcplive run")
    assert tests.endswith("&& python3 -m pytest")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "README.md" in ci and "pytest" not in ci.replace("README", "")
