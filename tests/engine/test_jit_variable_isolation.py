"""A Variable's binding belongs to the call that bound it (issue 40.1): jit replays rebinding their
captured kernels never change what an eager realize of the same graph computes (the schedule cache's
template must not share its variable values with the jit's program), nor what a second jit of the same
function captures. Eager and jitted calls interleaved, against numpy, under every settings mode."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.graph.symbolic import Variable

from tests.engine.settings_modes import MODES, settings_mode

pytestmark = pytest.mark.default_settings

TABLE = np.arange(5, dtype=np.float32).reshape(5, 1)


@pytest.fixture(params=MODES)
def mode(request, monkeypatch):
    with settings_mode(request.param, monkeypatch):
        yield request.param


def _expected(pos: int) -> float:
    return float((TABLE[pos:pos + 2] * 2).sum())


def test_eager_realizes_after_replays_use_their_own_binding(mode):
    table, var = Tensor(TABLE), Variable("pos", 0, 3)

    def step(x: Tensor, pos: Variable) -> Tensor:
        return (table.shrink(((pos, pos + 2), None)) * 2 + x).sum(0)

    def zeros() -> Tensor:
        return Tensor(np.zeros((2, 1), np.float32))
    first, second = atensor.jit(step), atensor.jit(step)
    positions = (2, 3, 1, 0, 3, 2, 0)
    assert [first(zeros(), var.bind(p)).item() for p in positions] == [_expected(p) for p in positions]
    assert first.stats["replays"] == 4
    for p in (3, 1, 2):   # the same graphs, eagerly, between and after replays at other positions
        assert step(zeros(), var.bind(p)).item() == _expected(p)
        assert first(zeros(), var.bind(0)).item() == _expected(0)
    assert [second(zeros(), var.bind(p)).item() for p in positions] == [_expected(p) for p in positions]
    assert step(zeros(), var.bind(3)).item() == _expected(3)
