"""Differential fuzzing on CL: random op chains (tests/fuzz/programs.py: elementwise ops, broadcasting,
reductions, casts, movement ops over int32, float32 and bool, size-0 and size-1 axes) run on an
OpenCL device must equal the numpy model, as they must on the CPU paths (tests/fuzz/test_op_chains.py).
Few examples: each program is new OpenCL kernels for pocl to compile (~1 s each, once; the disk
cache keeps them, and CI's derandomized profile draws the same programs every run)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings

import atensor
from atensor import Tensor
from tests.fuzz.programs import AT, NP, Program, assert_same, examples, fresh_inputs, programs, run

FUZZ = settings(max_examples=examples(8), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(programs())
def test_random_op_chains_on_cl_equal_the_numpy_model(program: Program):
    with atensor.Context(default_device="CL"):
        arrays = fresh_inputs(program, 1)
        got = run(program, [Tensor(a, device="CL") for a in arrays], AT).numpy()
    assert_same(got, run(program, arrays, NP), f"CL: program {program}")
