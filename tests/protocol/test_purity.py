"""The protocol package is sans-I/O: no clock, randomness, event loop, sockets, files, database."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "protocol"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
FORBIDDEN = {"time", "random", "trio", "socket", "os", "sqlite3"}


def test_the_package_has_the_expected_modules() -> None:
    assert {"framing", "jsonrpc", "mcpl", "tags", "content", "lanes", "errors"} <= set(MODULES)


def test_every_module_imports_without_trio_or_sqlite3() -> None:
    code = "\n".join(
        [
            "import sys",
            "sys.modules['trio'] = None",
            "sys.modules['sqlite3'] = None",
            "import importlib",
            f"for name in {MODULES!r}:",
            "    importlib.import_module('protocol.' + name)",
            "print('ok')",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def _imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and getattr(node.func, "id", getattr(node.func, "attr", ""))
            in ("__import__", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value.split(".")[0])
    return names


@pytest.mark.parametrize("name", ["__init__", *MODULES])
def test_no_module_imports_io_clock_or_randomness(name: str) -> None:
    tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
    assert _imported(tree) & FORBIDDEN == set()


def test_the_scan_sees_imports() -> None:
    tree = ast.parse("import os.path\nfrom time import monotonic\n__import__('random')\n")
    assert _imported(tree) == {"os", "time", "random"}
