"""Which implementation of the host path's core objects runs: the compiled one or the Python one.

Why: an eager awaited realize spends most of its microseconds in the interpreter, not in its work;
a few loops run on every realize (the schedule key walk, interning each node an op records, making a
result's BufferSpec). `_ccore` (atensor/core/*.c, a CPython extension that `pip install` builds
from setup.py when a C compiler is there) runs those loops in C. The Python functions they replace
stay where they are (graph/node.py, sched/cache.py): they are the executable specification, the
fallback on a machine without a compiler, and what tests/core/ compares the compiled ones against.

The choice is made once, at import (the node table cannot change hands while nodes live):
`ATENSOR_CORE=python` selects the Python functions even where the extension is built (config.py's
`core` setting); the default `c` uses the extension when it imports, and says so in one line on
stderr when it does not (no compiler at install, or a build for another Python).

Each module that has a compiled twin asks `ccore` here (None: the Python one runs) and installs the
twin itself, next to the Python code it replaces, so a reader sees both in one place.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Optional

from atensor.config import current_settings

_choice = current_settings().core
if _choice not in ("c", "python"):
    raise ValueError(f"environment variable ATENSOR_CORE={_choice!r} is neither 'c' (the compiled core, "
                     f"the default) nor 'python' (the pure-Python fallback); set one of them")

ccore: Optional[ModuleType] = None
if _choice == "c":
    try:
        from atensor.core import _ccore as ccore  # type: ignore[attr-defined, no-redef]
    except ImportError:
        print("atensor: the compiled core atensor.core._ccore is not built, so the pure-Python core runs; "
              "`pip install -e .` with a C compiler builds it, ATENSOR_CORE=python chooses the fallback without "
              "this notice", file=sys.stderr)

# what runs: "c" or "python" (bench/ and tests report it)
implementation = "c" if ccore is not None else "python"

__all__ = ["ccore", "implementation"]
