"""tinygrad's own op tests (test/backend/test_ops.py of a tinygrad checkout, never copied here) run against
atensor, comparing to PyTorch, forward and backward: `scripts/run_tinygrad_ops.sh TINYGRAD_DIR`, or
ATENSOR_TINYGRAD_DIR=TINYGRAD_DIR with pytest on this file. Without a checkout the file skips.

By default a subset runs (SUBSET in tinygrad_known_failures.py, about a tenth, one case per kind of op);
`ATENSOR_TINYGRAD_OPS=all` runs all of them, and `ATENSOR_DEVICE=CL` runs them on OpenCL (docs/porting.md).
The known failures are xfail (not strict) with their reasons; the run ends with a line giving the pass rate.
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="tinygrad's test_ops compares against PyTorch: pip install 'atensor[reference]'")

from tests.ports.tinygrad_shim import load_test_ops, find_test_ops  # noqa: E402

try:
    _upstream = load_test_ops(find_test_ops())
except LookupError as why:
    pytest.skip(str(why), allow_module_level=True)
TestOps = _upstream.TestOps
TestOpsUint8 = _upstream.TestOpsUint8


def test_tinygrads_tests_call_atensor_and_the_real_tinygrad_stays_importable():
    import sys

    import atensor
    from tests.ports.tinygrad_shim import SHIMMED
    assert _upstream.Tensor is atensor.Tensor and _upstream.dtypes is atensor.dtypes
    for name in SHIMMED:  # no shim module is left behind for other tests to import
        module = sys.modules.get(name)
        assert module is None or "tinygrad_shim" not in (module.__doc__ or ""), name
    tinygrad = pytest.importorskip("tinygrad")
    assert tinygrad.Tensor is not atensor.Tensor
