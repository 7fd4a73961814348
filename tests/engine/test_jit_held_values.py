"""atensor.jit with results of earlier calls still alive. Building `x * 2` again on the same input gives
the same interned node, and a realized node remembers the buffer its value went to. A capture that
read that buffer instead of computing `x * 2` recorded a copy of an old value: the next call then
computed `x * 2` and the jit raised "built different graphs". When the capture and the verifying call
both read it, the replays copied the stale value after `x` had changed. The reference is numpy."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import atensor
from atensor import Tensor


HOLDS = list(itertools.product(["dropped", "next call", "kept"], repeat=3))


@pytest.mark.parametrize("held", HOLDS, ids="-".join)
def test_held_results_of_earlier_calls_never_change_the_captured_graph(held):
    """Each of the first three calls' result is dropped at once, alive during the next call, or kept.
    A result is not read until the end: reading it gives the tensor its buffer's node, and the lazy
    graph it held (with the interned `x * 2`) goes."""
    f = atensor.jit(lambda x: x * 2)
    x = Tensor(np.arange(4, dtype=np.float32))
    kept, previous = [], None
    for hold in held + ("dropped",) * 3:
        r = f(x)
        previous = r if hold == "next call" else None
        if hold == "kept":
            kept.append(r)
    assert f.stats == {"calls": 6, "replays": 3, "captures": 1}
    for r in kept + [r] + ([previous] if previous is not None else []):
        np.testing.assert_allclose(r.numpy(), np.arange(4) * 2)


def test_a_replay_computes_from_the_input_not_from_an_old_result_of_the_same_expression():
    f = atensor.jit(lambda x: x * 2)
    x = Tensor(np.arange(4, dtype=np.float32)).contiguous()
    x.numpy()  # realized: an input with storage, assigned below
    kept = [f(x), f(x), f(x)]  # first call, capture, verify: each result alive
    for value in (7.0, -1.5, 3.0):
        x.assign(Tensor(np.full(4, value, dtype=np.float32))).numpy()
        np.testing.assert_allclose(f(x).numpy(), np.full(4, value * 2))
    for r in kept:
        np.testing.assert_allclose(r.numpy(), np.arange(4) * 2)
    assert f.stats["replays"] == 3 and f.stats["captures"] == 1


def test_a_value_realized_inside_the_call_is_still_read_by_its_later_realizes():
    """Only values of earlier calls are computed again; one realized during the call is the call's own."""
    @atensor.jit
    def f(x: Tensor) -> Tensor:
        y = (x * 3).contiguous()
        y.numpy()  # realized here, during the call
        return (x * 3) + y  # the interned `x * 3` is realized in this call's buffer

    for i in range(6):
        x = np.arange(5, dtype=np.float32) + i
        np.testing.assert_allclose(f(Tensor(x)).numpy(), x * 6)
    assert f.stats == {"calls": 6, "replays": 3, "captures": 1}
