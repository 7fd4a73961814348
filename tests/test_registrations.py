"""No import order matters: what one module hands another (graph/multi.py's rules to graph/node.py, the
ledger's `set_head` to graph/, the bounds checker's indexed loads, the packed kernels' variant choice
before a compile) is in place whichever modules a
process imports, in whichever order.

Each case runs in a fresh interpreter. All but one replace the `atensor` package's init with an empty
package (the real init imports everything, which would hide a registration made as a side effect of
importing some other module), import a subset of modules in a given order, and run a probe; the probe's
output must equal the one of a process that ran `import atensor` first.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

import atensor

PACKAGE = Path(atensor.__file__).resolve().parent

_BARE = """
import sys, types
package = types.ModuleType("atensor")
package.__path__ = [{path!r}]
sys.modules["atensor"] = package
"""

# what the probes compute: a sharded value's graph pushed through MULTI (graph/multi.py's rules), a copy
# of it to one device (assemble: the ledger's head of the new buffer), and the checker's indexed loads
_PROBES = {
    "multi": """
from atensor.dtype import dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops, ReduceOp
def describe(node, seen):
    if node in seen:
        return seen[node]
    text = f"{node.op.name}{list(node.shape)}@{node.device}(" + ",".join(describe(s, seen) for s in node.src) + ")"
    seen[node] = text
    return text
a = Node.const(1.5, dtypes.float32, "CPU:0", (2, 3))
b = Node.const(2.5, dtypes.float32, "CPU:1", (2, 3))
m = Node.make(Ops.MULTI, dtypes.float32, (a, b), (0, ((0, 2), (2, 4))))
y = m.alu(Ops.MUL, m).reduce(ReduceOp.SUM, (0,)).reshape((3, 1))
result = describe(y, {})
""",
    "assemble": """
from atensor.dtype import dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.ledger import versions
a = Node.const(1.5, dtypes.float32, "CPU:0", (2, 3))
b = Node.const(2.5, dtypes.float32, "CPU:1", (2, 3))
m = Node.make(Ops.MULTI, dtypes.float32, (a, b), (0, ((0, 2), (2, 4))))
one = Node.make(Ops.COPY, dtypes.float32, (m,), "CPU:0")
result = [one.op.name, list(one.shape), one.device]
""",
    "tuning": """
import sys
from atensor.backend.c import registry
# registry.prepare chooses the packed kernels' variants (backend/quant/tuning.py) before it compiles:
# the chooser is there whenever the registry is, not only when some other module imported it
result = ["atensor.backend.quant.tuning" in sys.modules, registry.prepare.__module__]
""",
    "bounds": """
from atensor.dtype import dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.sched.boundscheck import INDEXED_LOADS
source = Node.const(1.0, dtypes.float32, "CPU:0", (5,))
index = Node.const(3, dtypes.int32, "CPU:0", (4,))
gather = Node.make(Ops.GATHER, dtypes.float32, (source, index))
loads = INDEXED_LOADS[Ops.GATHER](gather)
result = [sorted(op.name for op in INDEXED_LOADS), len(loads), loads[0].valid.op.name, list(loads[0].valid.shape)]
""",
}

# (probe, modules imported first, in order); each also runs after `import atensor` for the reference
CASES = [
    ("multi", ["atensor.graph.node"]),
    ("multi", ["atensor.graph.ops", "atensor.graph.view", "atensor.graph.node"]),
    ("multi", ["atensor.graph.multi", "atensor.graph.node"]),
    ("assemble", ["atensor.ledger", "atensor.graph.node"]),
    ("assemble", ["atensor.graph.node", "atensor.graph.multi", "atensor.ledger"]),
    ("tuning", ["atensor.backend.c.registry"]),
    ("tuning", ["atensor.backend.c.programs", "atensor.backend.c.registry"]),
    ("bounds", ["atensor.sched.boundscheck"]),
    ("bounds", ["atensor.graph.node", "atensor.sched.boundscheck"]),
    ("bounds", ["atensor.tensor.indexing", "atensor.sched.boundscheck"]),
]


@functools.lru_cache(maxsize=None)
def _references() -> dict[str, object]:
    """Every probe's output after `import atensor`, all from one process (a start costs ~1 s of CPU;
    each probe runs in a namespace of its own, and a full import has made every registration anyway)."""
    script = "import atensor\nimport json\nout = {}\n"
    script += "".join(f"space = {{}}\nexec({code!r}, space)\nout[{name!r}] = space['result']\n"
                      for name, code in _PROBES.items())
    script += "print(json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=str(PACKAGE.parent))
    assert proc.returncode == 0, f"the probes after import atensor: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _reference(probe: str) -> object:
    return _references()[probe]


def _run(probe: str, modules: list[str], bare: bool) -> object:
    script = (_BARE.format(path=str(PACKAGE)) if bare else "import atensor\n")
    script += "".join(f"import {name}\n" for name in modules)
    script += _PROBES[probe] + "\nimport json\nprint(json.dumps(result))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=str(PACKAGE.parent))
    assert proc.returncode == 0, f"{probe} after importing {modules}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("probe,modules", CASES, ids=[f"{p}:{'+'.join(m.split('.')[-1] for m in ms)}"
                                                       for p, ms in CASES])
def test_a_subset_imported_in_another_order_gives_what_a_full_import_gives(probe, modules):
    assert _run(probe, modules, bare=True) == _reference(probe)


def test_the_bare_package_really_skips_the_init():
    """The cases above mean something only if the bare package does not run atensor/__init__.py."""
    script = _BARE.format(path=str(PACKAGE)) + "import atensor.graph.node, sys\nprint('atensor.tensor' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr[-2000:]
