"""Slices at bound Variable positions (`cache[:, pos:pos + n]`, tinygrad's KV-cache write): they build
shrinks at symbolic offsets, pass the bounds proof (racecheck is on in the suite), and a jitted step
using them is captured once and replayed at each new position; checked against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor, jit
from atensor.graph.symbolic import SymbolicError, Variable


def test_a_kv_cache_written_and_read_at_a_variable_position_is_replayed_not_recaptured():
    cache = Tensor(np.zeros((2, 8, 3), np.float32))
    pos = Variable("pos", 0, 6)

    @jit
    def step(x, p):
        cache[:, p:p + 2] = x                    # setitem at a symbolic offset: one assign
        return cache[:, p:p + 2] * 2 + cache[:, 0:2]  # getitem at a symbolic offset, beside a fixed one
    ref = np.zeros((2, 8, 3), np.float32)
    rng = np.random.default_rng(0)
    for p in [0, 1, 2, 5, 3, 6]:
        x = rng.standard_normal((2, 2, 3)).astype(np.float32)
        out = step(Tensor(x), pos.bind(p)).numpy()
        ref[:, p:p + 2] = x
        np.testing.assert_allclose(out, ref[:, p:p + 2] * 2 + ref[:, 0:2], rtol=1e-6)
    np.testing.assert_allclose(cache.numpy(), ref)
    assert step.stats == {"calls": 6, "replays": 3, "captures": 1}


def test_slice_bounds_that_a_variable_could_push_past_the_axis_are_refused_when_built():
    cache = Tensor(np.zeros((4, 8), np.float32))
    late = Variable("late", 0, 7).bind(3)
    with pytest.raises(Exception, match="late"):  # stop late + 2 reaches 9 for late = 7
        cache[:, late:late + 2]
    with pytest.raises(SymbolicError, match="length that depends on a Variable"):
        cache[:, :late + 1]
    with pytest.raises(IndexError, match="step 1"):
        cache[:, late:late + 2:2]


def test_tinygrads_kv_cache_write_line_runs_as_written():
    """extra/models/llama.py's Attention writes its cache with this line (start_pos a bound Variable);
    its read, `cache_kv[0, :, 0:start_pos+seqlen]`, has a Variable length and is refused (see above)."""
    bsz, seqlen, max_context, n_kv_heads, head_dim = 1, 2, 8, 2, 4
    cache_kv = Tensor(np.zeros((2, bsz, max_context, n_kv_heads, head_dim), np.float32))
    start = Variable("start_pos", 0, max_context - seqlen)

    @jit
    def write(xk, xv, start_pos):
        cache_kv[:, :, start_pos:start_pos+seqlen, :, :].assign(Tensor.stack(xk, xv)).realize()
        return cache_kv[0, :, 0:max_context, :, :].sum()
    ref = np.zeros((2, bsz, max_context, n_kv_heads, head_dim), np.float32)
    rng = np.random.default_rng(1)
    for p in [0, 2, 4, 6, 1]:
        xk, xv = (rng.standard_normal((bsz, seqlen, n_kv_heads, head_dim)).astype(np.float32) for _ in range(2))
        total = write(Tensor(xk), Tensor(xv), start.bind(p)).numpy()
        ref[:, :, p:p + seqlen] = np.stack([xk, xv])
        np.testing.assert_allclose(total, ref[0].sum(), rtol=1e-5)
    np.testing.assert_allclose(cache_kv.numpy(), ref)
    assert write.stats["captures"] == 1 and write.stats["replays"] == 2
