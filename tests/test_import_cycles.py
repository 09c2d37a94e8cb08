"""No import circle anywhere in the tree: the package, and the scripts,
benchmarks, recipes and tests around it (which import their neighbours by
plain module name, as Python does for the folder of the running script).

import-linter checks the package's layers; this follows every `import`
statement in every file, at any depth (a function-level import closes a
circle as surely as a top-level one once both functions run)."""

import ast
from pathlib import Path

from helpers import REPO

FOLDERS = ("keras_vit", "scripts", "bench", "recipes", "tests")


def module_files() -> dict[str, Path]:
    """Module name -> file: dotted names inside keras_vit, plain names for
    the files of the other folders (their folder is on sys.path when they
    run)."""
    found = {}
    for path in (REPO / "keras_vit").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    for folder in FOLDERS[1:]:
        for path in (REPO / folder).rglob("*.py"):
            if "fixtures" not in path.parts:
                found[f"{folder}:{path.relative_to(REPO / folder).with_suffix('')}"] = (
                    path
                )
    return found


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the tree that `path` names in its import statements."""
    local = path.parent.relative_to(REPO).parts[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from package import module` names the module.
            subs = [f"{node.module}.{alias.name}" for alias in node.names]
            named = [s for s in subs if s in modules]
            names.update(named or [node.module])
    found = set()
    for name in names:
        if name in modules:
            found.add(name)
        elif local != "keras_vit" and f"{local}:{name}" in modules:
            found.add(f"{local}:{name}")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module
    that imports itself (Tarjan)."""
    index, low, stack, on_stack, result = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                result.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return result


def test_no_import_circle_anywhere_in_the_tree():
    modules = module_files()
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    # The graph is real: the package's own imports and the scripts' are seen.
    assert "keras_vit.models.layers" in graph["keras_vit.models.vit"]
    assert "scripts:fixture_common" in graph["scripts:make_fixtures"]
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
