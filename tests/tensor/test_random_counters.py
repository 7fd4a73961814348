"""Eager random draws: each takes the next counters of one generator in program order, and reads its
seed and first counter from a buffer of its own, so draws of one shape share one cached schedule. The
reference is Threefry-2x32 written out in numpy (graph/semantics.py, checked against the paper's
known-answer vector below) applied to the counters a draw should have taken."""
from __future__ import annotations

import numpy as np

from atensor import Tensor
from atensor.graph.semantics import threefry2x32
from atensor.sched import cache


def test_the_reference_threefry_matches_the_published_known_answer():
    # Random123's kat_vectors for threefry2x32_20: counter and key all ones ...
    ones = np.uint64(0xFFFFFFFFFFFFFFFF)
    bits = int(threefry2x32(np.array([ones]), np.array([ones]))[0])
    assert (bits & 0xFFFFFFFF, bits >> 32) == (0x1CB996FC, 0xBB002BE7)
    zero = int(threefry2x32(np.zeros(1, np.uint64), np.zeros(1, np.uint64))[0])  # ... and all zeros
    assert (zero & 0xFFFFFFFF, zero >> 32) == (0x6B200159, 0x99BA4EFE)


def _uniform(seed: int, start: int, size: int) -> np.ndarray:
    counters = np.arange(start, start + size, dtype=np.uint64)
    bits = threefry2x32(counters, np.full(size, seed, dtype=np.uint64))
    return ((bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)).astype(np.float32)


def test_draws_take_consecutive_counters_in_program_order():
    Tensor.manual_seed(77)
    a, b, c = Tensor.rand(5), Tensor.rand(2, 3), Tensor.rand(4, device="CPU:1")
    c.numpy()  # realized out of order: values depend on when each draw was made, not realized
    np.testing.assert_array_equal(a.numpy(), _uniform(77, 0, 5))
    np.testing.assert_array_equal(b.numpy().ravel(), _uniform(77, 5, 6))
    np.testing.assert_array_equal(c.numpy(), _uniform(77, 11, 4))


def test_draws_of_one_shape_hit_the_schedule_cache_and_still_differ():
    Tensor.manual_seed(1)
    Tensor.rand(64).numpy()
    hits = cache.stats["hits"]
    draws = [Tensor.rand(64).numpy() for _ in range(4)]
    assert cache.stats["hits"] >= hits + 4
    for k, d in enumerate(draws):
        np.testing.assert_array_equal(d, _uniform(1, 64 * (k + 1), 64))
