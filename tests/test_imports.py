"""Imports only go down: no import cycle between ondevice's modules or folders, and product code never
imports `ondevice.eval` (the measurement scripts run as `python -m ondevice.eval.*`).

The graph is read from the source with `ast`, not by importing: an import inside a function counts
as much as one at the top of a file (it only runs later), and so does one under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ondevice

ROOT = Path(ondevice.__file__).parent

# Module imports left out of the folder graph on purpose, each with its reason (none now).
FOLDER_EDGE_EXCEPTIONS: dict[tuple[str, str], str] = {}


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name → file, for every .py under `root` (a package is named by its __init__.py)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The ondevice modules `name` imports anywhere in its file (top level, functions, branches).
    `from a import b` counts as `a.b` when `a.b` is a module, else as `a`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else source)
    return {module for module in found if module in modules and module != name}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = module_files(root)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def folder_of(module: str) -> str:
    """The folder a module lives in (`ondevice.plan.auto` → `ondevice.plan`); a top-level module or
    package is its own unit (`ondevice.decode.engine`, `ondevice.plan`)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = folders.setdefault(folder_of(module), set())
        edges.update(folder_of(target) for target in targets)
    for folder, edges in folders.items():
        edges.discard(folder)
    return folders


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node (every cycle lies inside one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first node, as a path that returns to it."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    return paths[node] + [start]
                if target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError("a strongly connected component always holds a cycle")


def cycle_report(graph: dict[str, set[str]], components: list[list[str]]) -> str:
    return "\n".join(
        f"{len(c)} in a cycle: {', '.join(c)}\n  e.g. {' → '.join(one_cycle(graph, c))}" for c in components
    )


def test_no_module_imports_another_that_imports_it_back():
    graph = import_graph()
    components = strongly_connected(graph)
    assert not components, "import cycles between modules:\n" + cycle_report(graph, components)


def test_no_folder_imports_another_that_imports_it_back():
    modules = import_graph()
    stale = [edge for edge in FOLDER_EDGE_EXCEPTIONS if edge[1] not in modules.get(edge[0], ())]
    assert not stale, f"exceptions for imports that are gone (remove them): {stale}"
    graph = folder_graph({m: {t for t in targets if (m, t) not in FOLDER_EDGE_EXCEPTIONS} for m, targets in modules.items()})
    components = strongly_connected(graph)
    assert not components, "import cycles between folders:\n" + cycle_report(graph, components)


def test_product_code_never_imports_eval():
    graph = import_graph()
    upward = sorted(
        f"{module} → {target}"
        for module, targets in graph.items()
        if folder_of(module) != "ondevice.eval"
        for target in targets
        if folder_of(target) == "ondevice.eval"
    )
    assert not upward, "product code imports the measurement scripts:\n" + "\n".join(upward)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The checks above can fail: a toy package with a cycle through a function-level relative import,
    a `from package import submodule`, and a folder-level cycle."""
    package = tmp_path / "ondevice"
    (package / "low").mkdir(parents=True)
    (package / "high").mkdir()
    for folder in (package, package / "low", package / "high"):
        (folder / "__init__.py").write_text("")
    (package / "low" / "facts.py").write_text("def f():\n    from ..high import decide  # hidden\n")
    (package / "low" / "other.py").write_text("from . import facts\n")
    (package / "high" / "decide.py").write_text("from ondevice.low import other\n")
    graph = import_graph(package)
    assert graph["ondevice.low.facts"] == {"ondevice.high.decide"}
    assert graph["ondevice.low.other"] == {"ondevice.low.facts"}
    assert graph["ondevice.high.decide"] == {"ondevice.low.other"}
    assert strongly_connected(graph) == [["ondevice.high.decide", "ondevice.low.facts", "ondevice.low.other"]]
    assert strongly_connected(folder_graph(graph)) == [["ondevice.high", "ondevice.low"]]
