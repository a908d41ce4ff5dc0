"""Names that moved in 0.2.0 (the wings of ``actors``) still import for one release, with a
DeprecationWarning naming the new place; the public names never warn."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import warnings

import pytest

from actors.version import MOVED_ATTRIBUTES, MOVED_MODULES


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_an_old_module_name_is_the_new_module_with_a_warning(old: str, new: str) -> None:
    sys.modules.pop(f"actors.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"actors.{old} moved to actors.{new}"):
        module = importlib.import_module(f"actors.{old}")
    assert module is importlib.import_module(f"actors.{new}")


@pytest.mark.parametrize(
    ("package", "name"),
    [
        ("actors.models", "Model"),
        ("actors.models", "ModelRequest"),
        ("actors.references", "ReferenceRegistry"),
        ("actors.agent", "AgentActor"),
        ("actors.channel", "ChannelActor"),
        ("actors.link", "Link"),
        ("actors.cli", "build_parser"),
        ("actors.web", "open_console"),
        ("actors.transcript", "format_event"),
    ],
)
def test_an_old_attribute_of_a_module_that_became_a_wing_warns(package: str, name: str) -> None:
    new = importlib.import_module(MOVED_ATTRIBUTES[package])
    with pytest.warns(DeprecationWarning, match=f"{package}.{name} moved to"):
        value = getattr(importlib.import_module(package), name)
    assert value is getattr(new, name)


def test_a_name_no_module_had_is_still_an_attribute_error() -> None:
    import actors.models

    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = actors.models.nothing_here
    with pytest.raises(ImportError):
        importlib.import_module("actors.nothing_here")


def test_submodules_and_public_names_import_without_a_warning() -> None:
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "from actors import Host\n"
        "from actors.cli import main\n"
        "from actors.serverkit import MCPLServer, ToolError, Publish\n"
        "from actors.models import scripted, base\n"
        "from actors.agent import history\n"
        "import actors.web.console, actors.link.connection\n"
        "print('quiet')\n"
    )
    assert printed_by(code) == "quiet"


def test_the_toolkit_loads_no_host_module() -> None:
    code = (
        "import sys\n"
        "from actors.serverkit import MCPLServer\n"
        "host_side = sorted(m for m in sys.modules if m.startswith('actors.')\n"
        "    and not m.startswith('actors.serverkit') and m != 'actors.version')\n"
        "print(host_side)\n"
    )
    assert printed_by(code) == "[]"


def test_the_warning_points_at_the_import_statement() -> None:
    sys.modules.pop("actors.cli_history", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import actors.cli_history

        line = inspect.currentframe().f_lineno - 2  # type: ignore[union-attr]
    assert actors.cli_history is importlib.import_module("actors.cli.history")
    assert [(w.category, w.filename, w.lineno) for w in caught] == [
        (DeprecationWarning, __file__, line)
    ]


def test_an_old_attributes_warning_points_at_the_line_that_reads_it() -> None:
    import actors.models

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = actors.models.Model
        line = inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]
    assert model is importlib.import_module("actors.models.base").Model
    assert [(w.category, w.filename, w.lineno) for w in caught] == [
        (DeprecationWarning, __file__, line)
    ]


def printed_by(code: str) -> str:
    """What ``code`` prints when run in a fresh interpreter (which must end cleanly)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
