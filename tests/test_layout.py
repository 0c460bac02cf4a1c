"""The floors of the code: every import points down, and nothing imports in a circle.

Packages: bench (scripts) may import everything; agent_runtime imports distill, environments, memory and modelkit;
distill imports memory and modelkit; environments, memory and modelkit, the ground floor of model primitives that
acting and training share, import nothing of ours. Inside agent_runtime each room has a floor (`FLOORS`) and
imports only rooms on lower floors. Every import counts, a lazy one inside a
function too (it is the same dependency, only later), and a `from package import module` counts as an import of
that module, not of the package."""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

import pytest

from tests import ROOT

# agent_runtime's rooms (a subpackage, or a module directly in the package), lowest floor first
FLOORS = {
    "bounded_yaml": 0,
    "checkpoints": 0,
    "curriculum": 0,
    "terminal": 0,
    "llm": 1,
    "config": 2,
    "offline_packages": 3,
    "episode": 3,
    "evaluation": 4,
    "testing": 4,
    "state": 5,
    "phases": 6,
    "run": 7,
    "dashboard": 7,
    "cli": 8,
    "__main__": 9,
}
# which package may import which, top first (bench's scripts: all of them; the bottom three: none of ours)
PACKAGES = {
    "bench": {"agent_runtime", "distill", "environments", "memory", "modelkit"},
    "agent_runtime": {"distill", "environments", "memory", "modelkit"},
    "distill": {"memory", "modelkit"},
    "environments": set(),
    "memory": set(),
    "modelkit": set(),
}


def import_graph(root: Path, packages) -> dict[str, set[str]]:
    """module -> the modules of `packages` (under `root`) it imports, anywhere in its body."""
    files = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in files.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
                modules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
                targets = modules + ([base] if len(modules) < len(node.names) else [])
            else:
                continue
            graph[module] |= {t for t in targets if t in files and t != module}
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def arrows_up(graph) -> list[str]:
    """agent_runtime's imports that do not point to a lower floor, as 'module -> module (room -> room)'."""
    bad = []
    for module, targets in graph.items():
        if not module.startswith("agent_runtime."):
            continue
        for target in targets:
            a, b = room(module), room(target)
            if target.startswith("agent_runtime.") and a != b and FLOORS[a] <= FLOORS[b]:
                bad.append(f"{module} -> {target} ({a} -> {b})")
    return sorted(bad)


def circles(graph) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def room_arrows(graph) -> dict[str, set[str]]:
    """agent_runtime's rooms -> what each imports: its rooms below, and the other packages (by package name); the
    package's own `__init__` is `agent_runtime`."""
    arrows: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        if not module.startswith("agent_runtime."):
            continue
        for target in targets:
            to = (room(target) or "agent_runtime") if target.startswith("agent_runtime") else target.split(".")[0]
            if to != room(module):
                arrows[room(module)].add(to)
    return arrows


def render_floors(graph) -> str:
    """The picture of agent_runtime's floors that docs/architecture.md shows: each room, top floor first, with the
    rooms it imports (every one lower) and, after `|`, the other packages it imports."""
    arrows = room_arrows(graph)
    order = lambda r: (-FLOORS.get(r, -1), r)
    width = max(map(len, FLOORS))
    lines = [f"floor  {'room':<{width}}  imports"]
    for name in sorted(FLOORS, key=order):
        inside = sorted((t for t in arrows[name] if t in FLOORS or t == "agent_runtime"), key=order)
        outside = sorted(arrows[name] - set(inside))
        shown = " ".join(inside) + (" | " if inside and outside else "| " if outside else "") + " ".join(outside)
        lines.append(f"{FLOORS[name]:>5}  {name:<{width}}  {shown}".rstrip())
    return "\n".join(lines)


DOC_START = "<!-- floors: `python -m tests.test_layout` prints this block from the code's imports -->"


@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT, PACKAGES)


def test_every_room_of_agent_runtime_has_a_floor():
    here = ROOT / "agent_runtime"
    rooms = {p.stem for p in here.glob("*.py")} | {p.parent.name for p in here.glob("*/__init__.py")}
    assert rooms - {"__init__"} == set(FLOORS), f"rooms without a floor: {sorted(rooms - {'__init__'} - set(FLOORS))}"


def test_no_import_in_agent_runtime_points_up_or_sideways(graph):
    assert arrows_up(graph) == []


def test_the_packages_import_only_downwards(graph):
    wrong = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        for t in targets
        if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in PACKAGES[m.split(".")[0]]
    )
    assert wrong == []


def test_no_module_of_any_package_imports_in_a_circle(graph):
    """Every module of every package, bench's scripts too: a circle is a lazy import away from a partly initialised
    module, and says that two modules are one concern or share a third."""
    assert circles(graph) == []


def test_the_architecture_page_draws_the_floors_the_code_has(graph):
    """docs/architecture.md's picture of the floors is the code's import graph, not a drawing that can go stale."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert DOC_START in page, "docs/architecture.md lost its floors block"
    drawn = page.split(DOC_START, 1)[1].split("```", 2)[1].strip("\n")
    assert drawn == render_floors(graph), "the floors changed: paste `python -m tests.test_layout` into the page"


def test_the_checks_see_an_arrow_up_and_a_circle(tmp_path):
    """The analysis itself, on a made-up package: a phase importing the loop, two modules importing each other."""
    pkg = tmp_path / "agent_runtime"
    for folder in ("phases", "run", "llm"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "phases" / "cycle.py").write_text("def f():\n    from agent_runtime.run.loop import AgentLoop\n")
    (pkg / "run" / "loop.py").write_text("from agent_runtime.phases import cycle\nAgentLoop = 1\n")
    (pkg / "llm" / "a.py").write_text("from agent_runtime.llm import b\n")
    (pkg / "llm" / "b.py").write_text("from . import a\n")
    made = import_graph(tmp_path, ["agent_runtime"])
    assert arrows_up(made) == ["agent_runtime.phases.cycle -> agent_runtime.run.loop (phases -> run)"]
    assert sorted(circles(made)) == [
        ["agent_runtime.llm.a", "agent_runtime.llm.b"],
        ["agent_runtime.phases.cycle", "agent_runtime.run.loop"],
    ]


def test_the_old_module_names_are_gone():
    """The rooms' modules import from one place only (no import hook answering to the names before the rooms)."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agent_runtime.loop")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agent_runtime.consolidate")


def test_no_module_is_over_600_lines():
    """A module over 600 lines holds more than one concern and is split by them: every module of the packages and
    bench's scripts (tests are left out)."""
    long = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 600
    }
    assert not long, f"modules over 600 lines: {long}"


if __name__ == "__main__":
    print(DOC_START)
    print("```")
    print(render_floors(import_graph(ROOT, PACKAGES)))
    print("```")
