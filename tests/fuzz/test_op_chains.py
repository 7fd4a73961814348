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
from hypothesis import HealthCheck, given, settings, strategies as st

import atensor
from atensor import Tensor
from atensor.backend.c import compiler

from tests.fuzz.programs import AT, NP, Program, assert_same, examples, fresh_inputs, programs, run

needs_cc = pytest.mark.skipif(compiler.path() is None, reason="no C compiler on PATH: no C kernel path")
FUZZ = settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# views of views: pads read through flips, stepped slices and int indices (the reads of padding that
# issue 17 found), on shapes with many axes of size 1
small = st.lists(st.sampled_from([0, 1, 1, 2, 3]), min_size=1, max_size=2).map(tuple)
view_programs = programs(first=(("pad",), ("flip", "slice", "permute", "reshape"), ("index",),
                                ("index", "slice", "flip"), ("index", "reshape")), max_ops=3, shape=small)
# elementwise chains over one-element operands of any rank (the read-only broadcast of issue 17)
ones = st.lists(st.just(1), max_size=3).map(tuple)
scalar_programs = programs(first=(("where", "binary", "cast"), ("scalar", "unary"), ("scalar", "binary")),
                           max_ops=2, shape=ones, movement_weight=0)
PROGRAMS = st.one_of(programs(), view_programs, scalar_programs)


PATHS = ["numpy backend", pytest.param("C kernels", marks=needs_cc), pytest.param("jit replays", marks=needs_cc)]


def run_on(path: str, program: Program) -> None:
    """Runs `program` on one kernel path, checking every result against the numpy model. In CI the
    derandomized profile draws the same programs for every path (the seed is the test's name)."""
    if path == "jit replays":
        _replayed(program)
        return
    mode = {"numpy backend": dict(native="0"), "C kernels": dict(native="all", racecheck=False)}[path]
    with atensor.Context(**mode):
        arrays = fresh_inputs(program, 1)
        got = run(program, [Tensor(a) for a in arrays], AT).numpy()
        assert_same(got, run(program, arrays, NP), f"{path}: program {program}")


def _replayed(program: Program) -> None:
    @atensor.jit
    def f(*tensors: Tensor) -> Tensor:
        return run(program, list(tensors), AT)

    alive = []  # every call's inputs stay alive: a replay reading an earlier input finds its values
    for call in range(6):  # 3 normal calls (capture, verify), then replays
        arrays = fresh_inputs(program, 100 + call)
        alive.append([Tensor(a) for a in arrays])
        got = f(*alive[-1]).numpy()
        assert_same(got, run(program, arrays, NP), f"jit call {call}: program {program}")
    assert f.stats["replays"] == 3


@pytest.mark.parametrize("path", PATHS)
@FUZZ
@given(program=PROGRAMS)
def test_op_chains_match_numpy_on_every_kernel_path(path: str, program: Program) -> None:
    run_on(path, program)


EXTRAS = {"contiguous": lambda x: x.contiguous(), "clone": lambda x: x.clone(), "times one": lambda x: x * 1,
          "view": lambda x: x[1:] if x.ndim else x.reshape(1), "permuted view": lambda x: x.permute(
              *reversed(range(x.ndim))), "size 0": lambda x: x.reshape(-1)[:0] == x.reshape(-1)[:0],
          "flipped copy": lambda x: x.flip(0).contiguous() if x.ndim else x.contiguous()}
NP_EXTRAS = {"contiguous": lambda x: x.copy(), "clone": lambda x: x.copy(),
             "times one": lambda x: x.astype(np.int32) if x.dtype == bool else x * 1,  # bool * 1 is int32
             "view": lambda x: x[1:] if x.ndim else x.reshape(1), "permuted view": lambda x: x.transpose(),
             "size 0": lambda x: x.reshape(-1)[:0] == x.reshape(-1)[:0],
             "flipped copy": lambda x: np.flip(x, 0).copy() if x.ndim else x.copy()}


@needs_cc
@settings(FUZZ, max_examples=examples(25))
@given(program=PROGRAMS, extras=st.lists(st.sampled_from(sorted(EXTRAS)), min_size=1, max_size=3))
def test_jit_results_that_copy_view_or_empty_an_input_are_the_new_inputs_on_every_replay(program, extras):
    """A jitted program returns its result and, of its first input, copies, views and size-0 values;
    every call gets fresh inputs and every result must follow them."""
    @atensor.jit
    def f(*tensors: Tensor):
        return (run(program, list(tensors), AT), *[EXTRAS[e](tensors[0]) for e in extras])

    alive = []  # every call's inputs stay alive: a replay reading an earlier input finds its values
    for call in range(7):
        arrays = fresh_inputs(program, 200 + call)
        alive.append([Tensor(a) for a in arrays])
        got = f(*alive[-1])
        want = [run(program, arrays, NP)] + [NP_EXTRAS[e](arrays[0]) for e in extras]
        for g, w, what in zip(got, want, ["result"] + extras):
            assert_same(g.numpy(), np.asarray(w), f"jit call {call}, {what}: program {program}")
    assert f.stats["replays"] == 4
