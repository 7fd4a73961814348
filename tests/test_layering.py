"""The import graph of atensor/ has no circle, and its imports point down the layer table of docs/design.md.

The graph is read from the source with `ast`, not from `sys.modules`: every `import` counts, including
those under `if TYPE_CHECKING:` and those inside functions (a lazy import is still a dependency; it only
hides the circle from the interpreter, not from a reader or a static checker). A module is a node;
`from atensor.graph import multi` is an edge to the module atensor.graph.multi, `from atensor.graph.node
import Node` an edge to atensor.graph.node (the implicit import of a parent package's __init__ is not
counted: every module would then depend on its package's re-exports).

The layers ("Layers" in docs/design.md), top to bottom: the package root, serve/ (the LLM server's library),
models/, nn/, jit/, tensor/ (the
Tensor and its op families), engine/, dist/, sched/, backend/, hcq/, ledger/ (the storage ledger: under
sched/ and hcq/, which both write it), graph/, tune/ (the kernel choice mechanism: backend/ declares its families),
dtype.py and config.py, profiler/. `_MAY_IMPORT` says which layers each may import, besides itself.
"""
from __future__ import annotations

import ast
import pathlib
from typing import Optional

import atensor

PACKAGE_DIR = pathlib.Path(atensor.__file__).parent

_BASE = {"dtype", "config", "porting"}  # settings, dtypes, tinygrad's missing names: read by every layer
_MAY_IMPORT: dict[str, set[str]] = {
    "profiler": set(),
    "dtype": set(),
    "config": set(),
    "porting": set(),
    "tune": _BASE,
    "graph": {"dtype"},
    "ledger": {"graph"} | _BASE,
    "sched": {"ledger", "graph"} | _BASE,
    "backend": {"graph", "profiler", "tune"} | _BASE,
    "hcq": {"ledger", "graph", "profiler", "backend", "tune"} | _BASE,
    "dist": {"hcq", "backend", "tune", "ledger", "graph", "profiler"} | _BASE,
    "engine": {"sched", "hcq", "backend", "tune", "ledger", "graph", "profiler"} | _BASE,
    "tensor": {"engine", "dist", "sched", "hcq", "backend", "tune", "ledger", "graph", "profiler"} | _BASE,
    "jit": {"tensor", "engine", "dist", "sched", "hcq", "backend", "tune", "ledger", "graph", "profiler"} | _BASE,
    "nn": {"jit", "tensor", "engine", "dist", "sched", "hcq", "backend", "tune", "ledger", "graph", "profiler"} | _BASE,
    "models": {"nn", "jit", "tensor", "engine", "dist", "sched", "hcq", "backend", "tune", "ledger", "graph",
               "profiler"} | _BASE,
    "helpers": _BASE,
    "serve": {"models", "nn", "jit", "tensor", "engine", "dist", "sched", "hcq", "backend", "tune", "ledger", "graph",
              "profiler"} | _BASE,
    "atensor": {"helpers", "models", "nn", "jit", "tensor", "engine", "dist", "sched", "hcq", "backend",
                "tune", "ledger", "graph",
                "profiler"} | _BASE,
}

# Imports that point up the table today, each with why it stays. A pair here that no longer occurs
# fails the test too, so the list only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {
    ("atensor.dist.collective", "atensor.tensor"):
        "dist.allreduce takes and returns Tensors (the user-facing collective across processes)",
    ("atensor.dist.collective", "atensor.tensor.multi"):
        "shares the table of reduce ops with Tensor.allreduce (_REDUCE_OPS)",
    ("atensor.tune.__main__", "atensor.backend.quant.tuning"):
        "the command imports the modules that declare the packed kernels' families, to list and measure them",
    ("atensor.dist.processes", "atensor"):
        "check_same compares atensor.__version__ across processes (a lazy import)",
}


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "atensor"
    top = parts[1]
    return top


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = ["atensor", *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _import_graph() -> dict[str, set[str]]:
    """module -> the atensor modules it imports, anywhere in its source."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package, up level - 1 more
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]  # `import atensor.graph.node.x` style
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One import circle as [a, b, ..., a], or None (an iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def _upward_imports(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    found = {}
    for importer, targets in graph.items():
        for target in targets:
            low, high = _layer(importer), _layer(target)
            if low != high and high not in _MAY_IMPORT[low]:
                found[(importer, target)] = f"{importer} ({low}/) imports {target} ({high}/)"
    return found


def test_every_module_belongs_to_a_layer_of_the_table():
    unknown = sorted({_layer(m) for m in _modules()} - set(_MAY_IMPORT))
    assert not unknown, f"layers missing from the table in tests/test_layering.py: {unknown}"


def test_the_import_graph_of_atensor_has_no_circle():
    cycle = _find_cycle(_import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_tensor_mixins_do_not_import_the_tensor_class():
    graph = _import_graph()
    back = sorted(m for m, targets in graph.items()
                  if m.startswith("atensor.tensor.") and m != "atensor.tensor.tensor"
                  and targets & {"atensor.tensor", "atensor.tensor.tensor"})
    assert not back, (f"these mixins import atensor.tensor.tensor, which imports them: {back}; annotate "
                      f"with Self or atensor.tensor.base.AnyTensor instead")


def test_imports_point_down_the_layer_table():
    upward = _upward_imports(_import_graph())
    new = sorted(why for pair, why in upward.items() if pair not in KNOWN_UPWARD)
    assert not new, "imports that point up the layer table of docs/design.md:\n  " + "\n  ".join(new)
    stale = sorted(f"{a} -> {b}" for (a, b) in KNOWN_UPWARD if (a, b) not in upward)
    assert not stale, "KNOWN_UPWARD lists imports that no longer occur; remove them:\n  " + "\n  ".join(stale)


def test_the_cycle_finder_names_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
