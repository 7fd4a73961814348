"""The C renderer splits a nest's innermost loop where the masks of the views it reads begin and end
(backend/c/reads.py `mask_cuts`, asked by backend/c/render.py): a concatenation (views padded into one
buffer and added, as the fused optimizer packs its gradients) is one plain loop per piece, with no
select of a read left in it, and the values are numpy's. A mask on an outer axis, or more cuts than
MAX_MASK_CUTS, keep the select."""
from __future__ import annotations

import re

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.backend.c import compiler, registry
from atensor.backend.c import reads

pytestmark = pytest.mark.skipif(compiler.path() is None, reason="no C compiler ($CC, cc, gcc or clang) "
                                "on PATH: the native tier is off and every kernel runs on numpy")

_SELECT = re.compile(r"<= i\d+ && i\d+ <")  # a mask's test in a loop body


def _sources_after(run) -> list[str]:
    """The C source of every kernel compiled while `run()` ran under native="all", and `run()`'s result."""
    before = set(registry.REGISTRY.kernels)
    with atensor.Context(native="all"):
        result = run()
    return [k.source for ast, k in registry.REGISTRY.kernels.items() if ast not in before], result


def test_a_concatenation_is_one_plain_loop_per_piece_and_equals_numpy():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(n).astype(np.float32) for n in (5, 17, 33, 1, 64)]
    parts[1][3] = -0.0
    sources, got = _sources_after(lambda: Tensor.cat(*[Tensor(p) * 2 for p in parts]).numpy())
    np.testing.assert_array_equal(got, np.concatenate(parts) * 2)
    source = "\n".join(sources)
    pieces = re.findall(r"for \(int64_t (i\d+) = (\d+); \1 < (\d+); \1\+\+\)", source)
    assert [(int(lo), int(hi)) for _, lo, hi in pieces][-5:] == [(0, 5), (5, 22), (22, 55), (55, 56), (56, 120)]
    assert not _SELECT.search(source), source


def test_a_concatenation_along_the_last_axis_of_a_matrix_splits_the_inner_loop_only():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 7)).astype(np.float32), rng.standard_normal((6, 9)).astype(np.float32)
    sources, got = _sources_after(lambda: Tensor.cat(Tensor(a) + 1, Tensor(b) - 1, dim=1).numpy())
    np.testing.assert_array_equal(got, np.concatenate([a + 1, b - 1], axis=1))
    assert any(re.search(r"for \(int64_t (i\d+) = 7; \1 < 16;", s) for s in sources), sources
    assert not any(_SELECT.search(s) for s in sources), sources


def test_a_mask_on_an_outer_axis_keeps_its_select_and_equals_numpy():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((5, 8)).astype(np.float32)
    sources, got = _sources_after(lambda: Tensor.cat(Tensor(a) * 3, Tensor(b) * 3, dim=0).numpy())
    np.testing.assert_array_equal(got, np.concatenate([a, b]) * 3)
    assert any(_SELECT.search(s) for s in sources), sources  # (the split is for the innermost loop only)


def test_more_cuts_than_the_bound_keep_the_selects_and_equal_numpy(monkeypatch):
    monkeypatch.setattr(reads, "MAX_MASK_CUTS", 2)
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal(n).astype(np.float32) for n in (3, 4, 5, 6)]
    sources, got = _sources_after(lambda: Tensor.cat(*[Tensor(p) - 2 for p in parts]).numpy())
    np.testing.assert_array_equal(got, np.concatenate(parts) - 2)
    assert any(_SELECT.search(s) for s in sources), sources
