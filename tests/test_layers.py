"""The layers stay apart, measured from the source with ast (no imported package needed):

    runtime (inside torchrun)  <-  core (catalog, variables, plan, GPU datasheet, records, log parser,
                                         estimator, provenance)
                               <-  harness (launch side)   and   results (pages)   <-  __main__ (the CLI)

A module imports only its own layer or lower ones; harness and results never import each other; no
import circle anywhere (imports inside functions count too); megalab imports sit at module top, except
the runtime modules that bring torch, which the launcher side loads only inside the function that runs
on a GPU; and nothing outside megalab/runtime imports torch when it is imported (list, dry run, plan and
tables work with the base dependencies alone).
"""
import ast
import collections
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "megalab"
LAUNCHER_ONLY = ("megalab.harness.launch", "megalab.core.plan", "megalab.harness.slurm", "megalab.harness.monitor")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level?) for every import in the file, `from megalab.x import y`
    resolved to megalab.x.y where y is a module; in ast.walk's order. At module level: not inside a function (a
    class body runs at import time too)."""
    queue = collections.deque([(ast.parse(path.read_text(encoding="utf-8")), False)])  # (node, inside a function?)
    out = []
    while queue:
        node, in_function = queue.popleft()
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                     if f"{node.module}.{a.name}" in MODULES]
        out += [(n, not in_function) for n in names]
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        queue.extend((child, inner) for child in ast.iter_child_nodes(node))
    return out


@functools.cache
def graph() -> dict[str, list[tuple[str, bool]]]:
    """Each module's imports, parsed once, by the worker that runs these tests (not at collection, by every one)."""
    return {m: _imports(p) for m, p in MODULES.items()}


def test_graph_sees_the_package():
    assert {"megalab.results.tables", "megalab.core.records", "megalab.harness.bench"} <= set(MODULES)
    assert ("megalab.results.plots", True) in graph()["megalab.results.tables"]


# layer of each top-level part; harness and results share a level and must not import each other
LAYERS = {"megalab._compat": 0, "megalab.runtime": 0, "megalab.core": 1, "megalab.harness": 2,
          "megalab.results": 2, "megalab.__main__": 3, "megalab": 3}


def layer_of(module: str) -> tuple[str, int]:
    part = next(p for p in sorted(LAYERS, key=len, reverse=True) if module == p or module.startswith(p + "."))
    return part, LAYERS[part]


def test_every_module_has_a_layer():
    assert all(layer_of(m) for m in MODULES)


def test_no_import_cycles_anywhere():
    # every import counts, inside functions too: a lazy import that closes a circle is still a circle
    edges = {m: sorted({n for n, _ in graph()[m] if n in MODULES and n != m}) for m in MODULES}
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


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_runs_up_a_layer_or_across(module):
    part, level = layer_of(module)
    bad = []
    for n, _ in graph()[module]:
        if not n.startswith("megalab") or n not in MODULES:
            continue
        other, other_level = layer_of(n)
        if other_level > level or (other_level == level and other != part and level > 0):
            bad.append(n)
    assert not bad, f"{module} ({part}) imports {sorted(set(bad))}: a layer imports only itself and those below"


# the runtime modules that import torch: the launcher side loads them only where a GPU benchmark runs
TORCH_RUNTIME = ({m for m in MODULES if m.startswith("megalab.runtime.")} - {"megalab.runtime.levers"}) | {"megalab.runtime"}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(("megalab.core", "megalab.harness",
                                                                           "megalab.results"))))
def test_megalab_imports_sit_at_module_top(module):
    # __main__ dispatches each command to its module on demand (make help must not import pandas); the
    # runtime (inside torchrun) is left as it is: its imports are timed with the run
    inner = sorted({n for n, top in graph()[module] if not top and n.startswith("megalab") and n not in TORCH_RUNTIME})
    assert not inner, f"{module} imports {inner} inside a function: import it at the top"


# levers: the lever table; memcap: GPU_MEM_GB's conversion (torch inside its functions only)
TORCH_FREE_RUNTIME = {"megalab.runtime", "megalab.runtime.levers", "megalab.runtime.memcap"}


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith(("megalab.harness", "megalab.results"))])
def test_no_torch_at_import_time(module):
    # megalab/runtime/levers.py is the one runtime module written for the launcher: names only, no torch
    bad = sorted({n for n, top in graph()[module] if top and (n == "torch" or n.startswith(("torch.", "megalab.runtime")))
                  and n not in TORCH_FREE_RUNTIME})
    assert not bad, f"{module} imports {bad} at module level: import it inside the function that needs it"


def test_the_runtime_modules_the_launcher_may_import_import_no_torch():
    for module in TORCH_FREE_RUNTIME & set(graph()):
        assert not [n for n, top in graph()[module] if top and (n == "torch" or n.startswith("torch."))], module
