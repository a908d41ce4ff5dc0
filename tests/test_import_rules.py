"""The layout's import rules, read from the source with ``ast`` (nothing is imported).

Every ``import`` counts, wherever it stands: at the top, inside a function, or under
``if TYPE_CHECKING:``. A cycle, or an arrow that goes up, fails with the modules named.

- No import cycle among the modules of ``protocol``, ``store`` and ``actors``.
- ``protocol`` imports neither ``store`` nor ``actors``; ``store`` imports no ``actors``.
- The wings of ``actors`` stand on floors, lowest first (``FLOORS``); a module imports only
  from its own wing or from a lower floor. ``actors.leasing`` (the lease keeper, which starts and
  stops agents) stands between the agent wing and ``actors.host``; ``actors.host`` is the floor
  of its own between them and the faces: only ``cli`` and ``web`` stand above it.
- ``actors.serverkit`` imports nothing of ``actors`` outside itself (a server author's process
  never loads the host), and no module outside it imports it.
- The root of ``actors`` holds at most 20 modules, none named after a wing (``cli_check``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "store", "actors")

#: The floors of ``actors``, lowest first; a module may import its own wing or a lower floor.
#: ``root`` is every module at the top of ``actors`` but ``host`` and the package itself.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("root",),
    ("models", "fleet"),
    ("transcript", "references"),
    ("link",),
    ("channel",),
    ("agent",),
    # the lease keeper starts and stops agent actors (so it stands above ``agent``) and the host
    # opens it (so below ``host``); nothing else builds agents
    ("leasing",),
    ("host",),
    ("web",),
    ("cli",),
)
WINGS = frozenset(w for floor in FLOORS for w in floor) - {"root", "host"}
TOOLKIT = "serverkit"
MAX_ROOT_MODULES = 20


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_modules(root: Path) -> dict[str, Path]:
    return {
        module_name(path, root): path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports: each import resolved to the deepest known
    module it names (``from a.b import c`` names ``a.b.c`` when that is a module, else ``a.b``)."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            # ``from package import module`` imports the module, not the package's own names
            names = [f"{origin}.{alias.name}" for alias in node.names]
            named.update(names)
            if not all(name in known for name in names):
                named.add(origin)
    found = set()
    for module in named:
        while module and module not in known:
            module = module.rpartition(".")[0]
        if module and module != name:
            found.add(module)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = read_modules(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (or one importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # an iterative Tarjan: each frame is a node and the iterator over what it imports
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph[node]:
                        found.append(sorted(component))
    return sorted(found)


def wing_of(module: str) -> str | None:
    """The wing of an ``actors`` module (``root``, ``host``, a wing's name), None elsewhere."""
    parts = module.split(".")
    if parts[0] != "actors" or len(parts) == 1:
        return None
    if len(parts) == 2 and parts[1] not in WINGS | {TOOLKIT}:
        return "host" if parts[1] == "host" else "root"
    return parts[1]


def floor_of(wing: str) -> int:
    return next(i for i, floor in enumerate(FLOORS) if wing in floor)


def forbidden_arrows(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """Every import that breaks a rule, as ``importer -> imported (why)``."""
    bad = []
    for importer, targets in sorted(graph.items()):
        top = importer.split(".")[0]
        for target in sorted(targets):
            target_top = target.split(".")[0]
            if top == "protocol" and target_top in {"store", "actors"}:
                bad.append(f"{importer} -> {target} (protocol is pure)")
            elif top == "store" and target_top == "actors":
                bad.append(f"{importer} -> {target} (store imports no actors)")
            if top != "actors" or target_top != "actors" or importer == "actors":
                continue
            if target == "actors":
                bad.append(f"{importer} -> {target} (the package's front door is for users)")
                continue
            wing, target_wing = wing_of(importer), wing_of(target)
            assert wing is not None and target_wing is not None
            if wing == target_wing:
                continue
            if TOOLKIT in (wing, target_wing):
                bad.append(f"{importer} -> {target} (the toolkit and the host stay apart)")
            elif floor_of(target_wing) > floor_of(wing):
                bad.append(f"{importer} -> {target} ({wing} stands below {target_wing})")
            elif floor_of(target_wing) == floor_of(wing):
                bad.append(f"{importer} -> {target} ({wing} and {target_wing} share a floor)")
    return bad


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_every_arrow_goes_down() -> None:
    assert forbidden_arrows(import_graph()) == []


def test_the_root_of_actors_is_small_and_names_no_wing() -> None:
    root_modules = sorted(path.stem for path in (ROOT / "actors").glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules
    prefixed = [
        name for name in root_modules if any(name.startswith(w + "_") for w in WINGS | {TOOLKIT})
    ]
    assert prefixed == []


def test_every_wing_says_what_it_owns_and_may_import() -> None:
    for wing in sorted(WINGS | {TOOLKIT}):
        init = ROOT / "actors" / wing / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc and "Never imported by" in doc, f"actors/{wing}: {doc!r}"


# The rules themselves, checked on made-up trees: a rule that cannot fail proves nothing.


def write_tree(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


BASE = {
    "protocol/__init__.py": "",
    "store/__init__.py": "",
    "actors/__init__.py": "",
    "actors/kernel.py": "",
    "actors/host.py": "from .agent import actor\n",
    "actors/agent/__init__.py": "",
    "actors/agent/actor.py": "from actors.kernel import x\n",
    "actors/link/__init__.py": "",
    "actors/link/state.py": "",
    "actors/serverkit/__init__.py": "",
    "actors/serverkit/server.py": "import protocol\n",
}


def test_a_well_ordered_tree_passes(tmp_path: Path) -> None:
    write_tree(tmp_path, BASE)
    graph = import_graph(tmp_path)
    assert cycles(graph) == [] and forbidden_arrows(graph) == []


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"actors/link/state.py": "def f():\n    from actors.agent.actor import y\n"},
            "actors.link.state -> actors.agent.actor (link stands below agent)",
        ),
        (
            {
                "actors/kernel.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from .host import Host\n"
            },
            "actors.kernel -> actors.host (root stands below host)",
        ),
        (
            {"actors/serverkit/server.py": "from actors.kernel import x\n"},
            "actors.serverkit.server -> actors.kernel (the toolkit and the host stay apart)",
        ),
        (
            {"actors/agent/actor.py": "from actors.serverkit import server\n"},
            "actors.agent.actor -> actors.serverkit.server (the toolkit and the host stay apart)",
        ),
        (
            {"protocol/__init__.py": "import store\n"},
            "protocol -> store (protocol is pure)",
        ),
        (
            {"store/__init__.py": "from actors import kernel\n"},
            "store -> actors.kernel (store imports no actors)",
        ),
        (
            {"actors/agent/actor.py": "import actors\n"},
            "actors.agent.actor -> actors (the package's front door is for users)",
        ),
    ],
)
def test_an_upward_arrow_is_named(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    write_tree(tmp_path, {**BASE, **files})
    assert expected in forbidden_arrows(import_graph(tmp_path))


def test_a_cycle_through_a_function_level_import_is_named(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            **BASE,
            "actors/agent/a.py": "from .b import x\n",
            "actors/agent/b.py": "def f():\n    from . import a\n",
        },
    )
    assert cycles(import_graph(tmp_path)) == [["actors.agent.a", "actors.agent.b"]]


@given(
    st.dictionaries(
        st.sampled_from("abcdefgh"), st.sets(st.sampled_from("abcdefgh"), max_size=4), max_size=8
    )
)
def test_cycles_agree_with_reachability(edges: dict[str, set[str]]) -> None:
    graph = {node: edges.get(node, set()) for node in "abcdefgh"}

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(graph[node])
        return seen

    on_a_cycle = {node for node in graph if node in reach(node)}
    found = cycles(graph)
    assert {node for component in found for node in component} == on_a_cycle
    for component in found:
        for a in component:
            assert set(component) <= reach(a)
