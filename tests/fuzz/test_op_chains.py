"""Differential fuzzing of random op chains on every kernel path, against a numpy model.

Each program (tests/fuzz/programs.py: elementwise ops, broadcasting, reductions, casts, and movement
ops including pad, flip, slices with steps and int indexing of padded and flipped views, over int32,
float32 and bool with size-0 and size-1 axes) runs on:
- the numpy backend (`native="0"`, race and bounds checks on, as the suite runs);
- C kernels (`native="all"`, checks off: the default configuration);
- jit replays (the program as a jitted function, called with fresh inputs, replayed from the fourth
  call on, on the C kernels the jit compiles);
and each result must equal the numpy model's, and so each other's.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import atensor
from atensor import Tensor
from atensor.backend import native

from tests.fuzz.programs import AT, NP, Program, assert_same, examples, fresh_inputs, programs, run

needs_cc = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH: no C kernel path")
FUZZ = settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _eager(program: Program, seed: int) -> None:
    arrays = fresh_inputs(program, seed)
    want = run(program, arrays, NP)
    got = run(program, [Tensor(a) for a in arrays], AT).numpy()
    assert_same(got, want, f"program {program}")


@FUZZ
@given(programs())
def test_op_chains_on_the_numpy_backend_match_numpy(program: Program) -> None:
    with atensor.Context(native="0"):
        _eager(program, 1)


@needs_cc
@FUZZ
@given(programs())
def test_op_chains_in_c_kernels_match_numpy(program: Program) -> None:
    with atensor.Context(native="all", racecheck=False):
        _eager(program, 2)


@needs_cc
@settings(FUZZ, max_examples=examples(20))
@given(programs())
def test_op_chains_replayed_by_the_jit_match_numpy_on_every_call(program: Program) -> None:
    @atensor.jit
    def f(*tensors: Tensor) -> Tensor:
        return run(program, list(tensors), AT)

    for call in range(6):  # 3 normal calls (capture, verify), then replays
        arrays = fresh_inputs(program, 100 + call)
        got = f(*[Tensor(a) for a in arrays]).numpy()
        assert_same(got, run(program, arrays, NP), f"call {call} of program {program}")
    assert f.stats["replays"] == 3
