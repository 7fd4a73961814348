"""Differential fuzzing of the defects of issues 33 and 40, against numpy:

- a tensor realized and not awaited, then written through views and realized again (its view or
  itself), and finally awaited: every write lands in its buffer, whichever thread plans the realizes
  (planned inline as users run, or queued behind a held dispatcher, so every write is issued while
  the realize is in flight), and the await performs the writes issued after the realize;
- eager and jitted calls of one function with bound Variables interleaved (a replay's binding must
  not reach an eager realize, or a second jit, through the schedule cache);
- integer reductions whose products exceed 2^24 (prod, cumprod, scatter_reduce "prod"), on the numpy
  kernels and on C kernels.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Callable
from unittest import mock

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings, strategies as st

import atensor
from atensor import Tensor
from atensor.backend.c import compiler
from atensor.graph.symbolic import Variable
from atensor.engine.dispatch import Job, dispatcher

from tests.fuzz.programs import assert_same, examples, make_input
from tests.fuzz.test_mutations import apply_write, mutation_programs

pytestmark = pytest.mark.default_settings
FUZZ = settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- writes while a realize is in flight ---------------------------------------------------------------
@st.composite
def in_flight_programs(draw: Callable) -> tuple:
    """A mutation program (no reads) and, per step, whether to realize afterwards (without awaiting):
    nothing, the tensor, or the view the step wrote."""
    shape, dtype, steps = draw(mutation_programs(reads=False))
    realizes = [draw(st.sampled_from(["none", "none", "tensor", "view"])) for _ in steps]
    return shape, dtype, steps, realizes


def _issue(shape: tuple, dtype: str, steps: list, realizes: list, seed: int) -> tuple[Tensor, np.ndarray]:
    """Builds the program on a computed tensor realized first (not awaited); returns it and numpy's."""
    rng = np.random.default_rng(seed)
    start = make_input(shape, dtype, rng)
    model = start.copy()
    t = (Tensor(start) & True) if dtype == "bool" else Tensor(start) * 1   # a computed value, no storage
    t.realize()                                                            # its storage is fixed here
    for step, then in zip(steps, realizes):
        model = apply_write(t, model, step, dtype, rng)
        _, index, _ = step
        if then == "tensor":
            t.realize()
        elif then == "view" and index is not None:
            t[index].realize()
    return t, model


def _held_dispatcher() -> threading.Event:
    """Holds the dispatcher thread on a job until the returned event is set: realizes issued meanwhile
    are queued behind it, in flight, when the writes after them are issued."""
    release = threading.Event()
    dispatcher.submit(Job(lambda: release.wait(30), []))
    return release


@pytest.mark.parametrize("planning", ["inline", "dispatcher"])
@FUZZ
@given(program=in_flight_programs())
def test_writes_into_a_tensor_whose_realize_is_in_flight_land_in_its_buffer(planning, program) -> None:
    shape, dtype, steps, realizes = program
    with mock.patch.object(dispatcher, "run_inline", lambda job, keep_error=False: False) \
            if planning == "dispatcher" else contextlib.nullcontext():
        release = _held_dispatcher() if planning == "dispatcher" else None
        try:
            t, model = _issue(shape, dtype, steps, realizes, seed=2)
        finally:
            if release is not None:
                release.set()
        t.wait()
        assert t._is_ready_single(), f"t.wait() left work pending: {steps} {realizes}"
        assert_same(t.numpy(), model, f"{planning}: {steps} with realizes {realizes} on {shape} {dtype}")


@pytest.mark.parametrize("loop", ["trio", "asyncio"])
@settings(FUZZ, max_examples=examples(10))
@given(program=in_flight_programs())
def test_await_performs_the_writes_issued_after_an_unawaited_realize(loop, program) -> None:
    shape, dtype, steps, realizes = program

    async def main() -> np.ndarray:
        t, model = _issue(shape, dtype, steps, realizes, seed=4)
        await t
        assert_same(t.numpy(), model, f"{loop}: {steps} with realizes {realizes} on {shape} {dtype}")
        return model
    trio.run(main) if loop == "trio" else asyncio.run(main())


# ---- eager and jitted calls with bound Variables, interleaved -------------------------------------------
@settings(FUZZ, max_examples=examples(12))
@given(rows=st.integers(3, 5), window=st.integers(1, 2), data=st.data())
def test_eager_and_jitted_calls_with_bound_variables_interleaved(rows, window, data) -> None:
    """The first jit is captured and replayed first (four calls), then eager calls and both jits come
    in any order, at positions drawn from a few, so an eager graph often equals a captured one."""
    table_np = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) * 3 - 5
    table = Tensor(table_np)
    cache_np = np.zeros((rows, 2), np.float32)
    cache = Tensor(cache_np.copy())
    var = Variable("pos", 0, rows - window)

    def step(x: Tensor, pos: Variable) -> Tensor:
        cache.shrink(((pos, pos + 1), None)).assign(x[0:1] * 2)          # a write at the bound slot
        return (table.shrink(((pos, pos + window), None)) * 2 + x).sum(0)

    jitted = [atensor.jit(step), atensor.jit(step)]
    positions = st.integers(0, rows - window)
    calls = [("jit0", data.draw(positions)) for _ in range(4)]
    calls += data.draw(st.lists(st.tuples(st.sampled_from(["eager", "jit0", "jit1"]), positions),
                                min_size=2, max_size=8))
    rng = np.random.default_rng(5)
    for i, (how, pos) in enumerate(calls):
        x_np = rng.integers(-3, 4, (window, 2)).astype(np.float32)
        fn = step if how == "eager" else jitted[int(how[-1])]
        got = fn(Tensor(x_np), var.bind(pos)).numpy()
        cache_np[pos] = x_np[0] * 2
        expected = (table_np[pos:pos + window] * 2 + x_np).sum(0)
        assert_same(got, expected, f"call {i} ({how} at {pos}) of {calls}")
        assert_same(cache.numpy(), cache_np, f"the cache after call {i} ({how} at {pos}) of {calls}")


# ---- integer reductions beyond float32's exact integers -------------------------------------------------
needs_cc = pytest.mark.skipif(compiler.path() is None, reason="no C compiler on PATH: no C kernel path")


@pytest.mark.parametrize("path", ["numpy backend", pytest.param("C kernels", marks=needs_cc)])
@settings(FUZZ, max_examples=examples(12))
@given(rows=st.sampled_from([1, 2]), length=st.sampled_from([12, 16]), dtype=st.sampled_from(["int32", "int64"]),
       seed=st.integers(0, 2 ** 16), include_self=st.booleans())
def test_integer_products_beyond_2_to_the_24_match_numpy(path, rows, length, dtype, seed, include_self):
    """prod, cumprod, scatter_reduce("prod") and scatter(reduce="multiply") of factors in [-9, 9]
    (a few zeros), 12 or 16 of them per product (about half that per scattered position): exact,
    wrapping as numpy does. Few shapes, so the C kernels are compiled once."""
    rng = np.random.default_rng(seed)
    values = (rng.integers(1, 10, (rows, length)) * rng.choice([-1, 1], (rows, length))).astype(dtype)
    values[rng.random((rows, length)) < 0.03] = 0
    base = rng.integers(-3, 4, (rows, 4)).astype(dtype)
    index = rng.integers(0, 2, (rows, length)).astype(np.int32)   # columns 2 and 3 get nothing
    multiplied = base.copy()
    for r in range(rows):   # dim 1: row r of index and values goes to row r
        np.multiply.at(multiplied[r], index[r], values[r])
    reduced = base.copy()
    for r in range(rows):
        if not include_self:
            reduced[r, np.unique(index[r])] = 1
        np.multiply.at(reduced[r], index[r], values[r])
    mode = dict(native="0") if path == "numpy backend" else dict(native="all")
    with atensor.Context(**mode):
        t, at = Tensor(values), Tensor(index)
        results = {"prod": (t.prod(1), np.prod(values, 1, dtype=dtype)),
                   "cumprod": (t.cumprod(1), np.cumprod(values, 1, dtype=dtype)),
                   "scatter_reduce prod": (Tensor(base).scatter_reduce(1, at, t, "prod", include_self=include_self),
                                           reduced),
                   "scatter multiply": (Tensor(base).scatter(1, at, t, reduce="multiply"), multiplied)}
        Tensor.realize(*[got for got, _ in results.values()]).wait()
        for name, (got, expected) in results.items():
            assert_same(got.numpy(), expected, f"{name} on {path} of {values.tolist()}, index {index.tolist()}")
