"""tinygrad's own op tests (test/backend/test_ops.py, vendored in tinygrad/) run against atensor, comparing to
PyTorch, forward and backward.

By default a subset runs (SUBSET in tinygrad_known_failures.py, about a tenth, one case per kind of op);
`ATENSOR_TINYGRAD_OPS=all` runs all of them, and `ATENSOR_DEVICE=CL` runs them on OpenCL (docs/porting.md).
The known failures are xfail (not strict) with their reasons; the run ends with a line giving the pass rate.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="tinygrad's test_ops compares against PyTorch: pip install 'atensor[reference]'")

from tests.ports.tinygrad_shim import load_test_ops  # noqa: E402

_upstream = load_test_ops()
TestOps = _upstream.TestOps
TestOpsUint8 = _upstream.TestOpsUint8
