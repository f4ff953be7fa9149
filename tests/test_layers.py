"""The three layers stay apart: no import circles, the results side never reaches into the launcher,
and nothing outside megalab/runtime imports torch when it is imported (list, dry run, plan and tables
work with the base dependencies alone).

Read from the source with ast, so the test needs none of the imported packages.
"""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "megalab"
LAUNCHER_ONLY = ("megalab.harness.launch", "megalab.harness.plan", "megalab.harness.slurm", "megalab.harness.monitor")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the file, `from megalab.x import y`
    resolved to megalab.x.y where y is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                     if f"{node.module}.{a.name}" in MODULES]
        out += [(n, _at_module_level(tree, node)) for n in names]
    return out


def _at_module_level(tree: ast.Module, target: ast.AST) -> bool:
    """True unless the import sits inside a function (a class body runs at import time too)."""
    def walk(node, in_function):
        if node is target:
            return not in_function
        for child in ast.iter_child_nodes(node):
            r = walk(child, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
            if r is not None:
                return r
        return None
    return bool(walk(tree, False))


GRAPH = {m: _imports(p) for m, p in MODULES.items()}


def test_graph_sees_the_package():
    assert {"megalab.results.tables", "megalab.results.records", "megalab.harness.bench"} <= set(MODULES)
    assert ("megalab.results.plots", True) in GRAPH["megalab.results.tables"]


def test_no_import_cycles_at_module_level():
    edges = {m: sorted({n for n, top in GRAPH[m] if top and n in MODULES and n != m}) for m in MODULES}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in edges[m]:
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m)


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("megalab.results")])
def test_results_never_import_the_launcher(module):
    # provenance re-plans a record's target (inside a function) to ask whether today's launcher would run the same
    allowed = {"megalab.harness.plan"} if module == "megalab.results.provenance" else set()
    bad = sorted({n for n, _ in GRAPH[module] if n.startswith(LAUNCHER_ONLY) and n not in allowed})
    assert not bad, f"{module} imports {bad}: the results side reads records, it never launches"


TORCH_FREE_RUNTIME = {"megalab.runtime", "megalab.runtime.levers"}  # levers: names and parsing only


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(("megalab.harness", "megalab.results"))])
def test_no_torch_at_import_time(module):
    # megalab/runtime/levers.py is the one runtime module written for the launcher: names only, no torch
    bad = sorted({n for n, top in GRAPH[module] if top and (n == "torch" or n.startswith(("torch.", "megalab.runtime")))
                  and n not in TORCH_FREE_RUNTIME})
    assert not bad, f"{module} imports {bad} at module level: import it inside the function that needs it"


def test_the_runtime_modules_the_launcher_may_import_import_no_torch():
    for module in TORCH_FREE_RUNTIME & set(GRAPH):
        assert not [n for n, top in GRAPH[module] if top and (n == "torch" or n.startswith("torch."))], module
