"""A few of tinygrad's own op tests (tests/ports/test_tinygrad_ops.py, from the tinygrad checkout at
ATENSOR_TINYGRAD_DIR; skipped without one) on an OpenCL device: the same cases,
compared to PyTorch, with atensor's default device set to `CL`: a matmul and an elementwise op, forward and
backward. Two only, because pocl compiles each new kernel cold in CI (about 1 s each); tests/opencl covers
the mechanisms, and the whole file runs on CL with `ATENSOR_DEVICE=CL ATENSOR_TINYGRAD_OPS=all`
(docs/porting.md gives the pass rate)."""
from __future__ import annotations

import unittest

import pytest

import atensor
from atensor import Tensor

pytest.importorskip("torch", reason="tinygrad's test_ops compares against PyTorch: pip install 'atensor[reference]'")

from tests.ports.tinygrad_known_failures import expected_failures  # noqa: E402
from tests.ports.tinygrad_shim import load_test_ops, find_test_ops  # noqa: E402

try:
    _TEST_OPS = find_test_ops()
except LookupError as why:
    pytest.skip(str(why), allow_module_level=True)

CASES = ["TestOps::test_matmul", "TestOps::test_relu"]


@pytest.mark.parametrize("case", CASES)
def test_tinygrad_op_case_passes_on_cl(case):
    assert case not in expected_failures("CL"), f"{case} is a known failure on CL; pick another case"
    class_name, name = case.split("::")
    test = getattr(load_test_ops(_TEST_OPS), class_name)(name)
    result = unittest.TestResult()
    with atensor.Context(default_device="CL"):
        assert Tensor([1.0]).device == "CL:0"  # the case's tensors are made on CL
        test.run(result)
    problems = result.failures + result.errors
    assert not problems and not result.skipped, "\n".join(text for _, text in problems) or result.skipped
    assert result.testsRun == 1
