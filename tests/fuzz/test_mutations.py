"""Differential fuzzing of mutation programs: assigns and setitem through views, interleaved with reads.

A program mutates one tensor `t` (int32, float32 or bool, with size-0 and size-1 axes) step by step,
and a numpy array mirrors it. Steps: `t[index] = value` (slices with any step, ints; a scalar, a new
tensor, or an expression of `t` itself), `t.assign(f(t))`, reads of `t` and of views of it, and
values kept for later: clones (which never go stale, docs/semantics.md) and lazy values (which give
the value at the time they were made or raise StaleReadError, never another value). Each program
runs on the numpy backend, on C kernels, and as a jitted step replayed on the C kernels it compiles.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import atensor
from atensor import Tensor
from atensor.backend.c import compiler
from atensor.sched.schedule import StaleReadError

from tests.fuzz.programs import DTYPES, assert_same, examples, make_input

needs_cc = pytest.mark.skipif(compiler.path() is None, reason="no C compiler on PATH: no C kernel path")
FUZZ = settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _index(shape: tuple[int, ...], draw: Callable) -> tuple:
    """A basic index into `shape`: per axis a slice with a step (maybe negative) or an int."""
    out: list[Any] = []
    for size in shape:
        if size and draw(st.integers(0, 3)) == 0:
            out.append(draw(st.integers(-size, size - 1)))
        else:
            step = draw(st.sampled_from([1, 1, 2, -1, -2, 3]))
            start = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
            stop = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
            out.append(slice(start, stop, step))
    return tuple(out)


def _scalar(dtype: str, draw: Callable) -> Any:
    if dtype == "bool":
        return draw(st.booleans())
    value = draw(st.integers(-3, 3))
    return value * 0.5 if dtype == "float32" else value


@st.composite
def mutation_programs(draw: Callable, reads: bool = True, first: tuple[tuple[str, ...], ...] = ()
                      ) -> tuple[tuple[int, ...], str, list[tuple]]:
    """(shape, dtype, steps); `first` lists the kinds the first steps are drawn from."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 5]), min_size=1, max_size=2)))
    kinds = ["set_scalar", "set_tensor", "set_self", "assign"] + (["read", "read_view", "keep"] if reads else [])
    steps: list[tuple] = []
    for n in range(len(first) + draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(first[n] if n < len(first) else kinds))
        if kind in ("set_scalar", "set_tensor", "set_self", "read_view"):
            steps.append((kind, _index(shape, draw), _scalar(dtype, draw)))
        elif kind == "assign":
            steps.append((kind, None, _scalar(dtype, draw)))
        else:
            steps.append((kind, None, draw(st.sampled_from(["clone", "lazy"]))))
    return shape, dtype, steps


def _update(x: Any, dtype: str, c: Any) -> Any:
    """The expression an assign or a self-referencing setitem writes (numpy arrays and tensors alike)."""
    if dtype == "bool":
        return ~x if c else x & (~x)
    return x * 2 + c if dtype == "int32" else x * 0.5 + c


WRITES = ("set_scalar", "set_tensor", "set_self", "assign")


def apply_write(t: Tensor, model: np.ndarray, step: tuple, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Applies one write step (a kind in WRITES) to the tensor and to its numpy model; returns the
    model afterwards (an assign makes a new array)."""
    kind, index, arg = step
    if kind == "set_scalar":
        t[index] = arg
        model[index] = arg
    elif kind == "set_tensor":
        value = make_input(model[index].shape, dtype, rng)
        t[index] = Tensor(value)
        model[index] = value
    elif kind == "set_self":
        t[index] = _update(t[index], dtype, arg)
        model[index] = _update(model[index], dtype, arg)
    else:
        t.assign(_update(t, dtype, arg))
        model = _update(model, dtype, arg).astype(model.dtype)
    return model


def _run(shape: tuple[int, ...], dtype: str, steps: list[tuple], seed: int) -> None:
    rng = np.random.default_rng(seed)
    model = make_input(shape, dtype, rng)
    t = Tensor(model.copy())
    kept: list[tuple[str, Tensor, np.ndarray]] = []
    for i, (kind, index, arg) in enumerate(steps):
        what = f"step {i} {kind} {index} {arg} of {steps} on {shape} {dtype}"
        if kind in WRITES:
            model = apply_write(t, model, (kind, index, arg), dtype, rng)
        elif kind == "read":
            assert_same(t.numpy(), model, what)
        elif kind == "read_view":
            assert_same(t[index].numpy(), model[index], what)
        else:
            kept.append((arg, t.clone() if arg == "clone" else _update(t, dtype, 1),
                         model.copy() if arg == "clone" else _update(model, dtype, 1).astype(model.dtype)))
    assert_same(t.numpy(), model, f"the end of {steps} on {shape} {dtype}")
    for kind, value, snapshot in sorted(kept, key=lambda k: k[0] == "clone"):  # a stale read first
        if kind == "clone":  # a pending clone never goes stale
            assert_same(value.numpy(), snapshot, f"a clone kept in {steps}")
        else:
            try:
                got = value.numpy()
            except StaleReadError:
                continue
            assert_same(got, snapshot, f"a lazy value kept in {steps}")


# a value kept across a write and a read of what it reads (the stale read of issue 17 that made
# unrelated values and clones stale too), then more kept values
SET = ("set_scalar", "set_tensor", "set_self", "assign")
STALE = mutation_programs(first=(SET, ("keep",), SET, ("keep",), ("read", "read_view"), ("keep",)))


@pytest.mark.parametrize("path", ["numpy backend", pytest.param("C kernels", marks=needs_cc)])
@FUZZ
@given(program=st.one_of(mutation_programs(), STALE))
def test_mutation_programs_match_numpy(path: str, program) -> None:
    mode = dict(native="0") if path == "numpy backend" else dict(native="all", racecheck=False)
    with atensor.Context(**mode):
        _run(*program, seed=1)


@needs_cc
@settings(FUZZ, max_examples=examples(15))
@given(mutation_programs(reads=False))
def test_mutation_programs_as_a_jitted_step_match_numpy_on_every_call(program) -> None:
    """The state is a tensor made before the calls; each call applies the mutations with fresh values
    (tensor arguments) and returns a copy of the state; replays write the same state buffer."""
    shape, dtype, steps = program
    rng = np.random.default_rng(3)
    model = make_input(shape, dtype, rng)
    state = Tensor(model.copy())
    sizes = [np.zeros(shape)[index].shape for kind, index, _ in steps if kind == "set_tensor"]

    @atensor.jit
    def step(*values: Tensor) -> Tensor:
        given = iter(values)
        for kind, index, arg in steps:
            if kind == "set_scalar":
                state[index] = arg
            elif kind == "set_tensor":
                state[index] = next(given)
            elif kind == "set_self":
                state[index] = _update(state[index], dtype, arg)
            else:
                state.assign(_update(state, dtype, arg))
        return state * 1 if dtype != "bool" else state & True

    alive = []
    for call in range(6):
        values = [make_input(s, dtype, rng) for s in sizes]
        given = iter(values)
        for kind, index, arg in steps:
            if kind == "set_scalar":
                model[index] = arg
            elif kind == "set_tensor":
                model[index] = next(given)
            elif kind == "set_self":
                model[index] = _update(model[index], dtype, arg)
            else:
                model = _update(model, dtype, arg).astype(model.dtype)
        alive.append([Tensor(v) for v in values])  # kept: a replay reading an earlier one finds its values
        got = step(*alive[-1])
        assert_same(got.numpy(), model, f"call {call} of {steps} on {shape} {dtype}")
        assert_same(state.numpy(), model, f"the state after call {call} of {steps} on {shape} {dtype}")
