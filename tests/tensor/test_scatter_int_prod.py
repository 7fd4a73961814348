"""Integer scatter products are exact (issue 40.3): `scatter_reduce("prod")` and
`scatter(reduce="multiply")` on integers multiply as numpy's `np.multiply.at` does (wrapping on
overflow, as torch does), not through float32 logarithms. Under the default settings, the schedule
cache off and every kernel compiled to C."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor

from tests.engine.settings_modes import settings_mode

pytestmark = pytest.mark.default_settings


@pytest.fixture(params=["default", "no_schedule_cache", "native_all"])
def mode(request, monkeypatch):
    with settings_mode(request.param, monkeypatch):
        yield request.param


def _reference(base: np.ndarray, index: np.ndarray, src: np.ndarray, include_self: bool) -> np.ndarray:
    out = base.copy()
    if not include_self:
        out[np.unique(index)] = 1
    np.multiply.at(out, index, src)
    return out


def test_the_issue_repro_is_exact(mode):
    src = np.array([8, 1, -4, 2, -3, -8, 8, 3, 8, 6], np.int32)
    got = Tensor(np.array([1], np.int32)).scatter_reduce(0, Tensor(np.zeros(10, np.int32)), Tensor(src),
                                                         "prod", include_self=False).tolist()
    assert got == [-1769472] == [int(np.prod(src))]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("include_self", [True, False])
def test_products_beyond_2_to_the_24_match_numpy(mode, dtype, include_self):
    rng = np.random.default_rng(3)
    base = rng.integers(-9, 10, size=(4, 3)).astype(dtype)
    index = rng.integers(0, 4, size=(40, 3)).astype(np.int32)
    src = (rng.integers(2, 10, size=(40, 3)) * rng.choice([-1, 1], size=(40, 3))).astype(dtype)
    got = Tensor(base).scatter_reduce(0, Tensor(index), Tensor(src), "prod", include_self=include_self).numpy()
    expected = base.copy()
    for j in range(3):  # torch's dim-0 scatter: column j of index and src goes to column j
        expected[:, j] = _reference(base[:, j], index[:, j], src[:, j], include_self)
    assert np.abs(expected).max() > 2 ** 24   # beyond float32's exact integers
    np.testing.assert_array_equal(got, expected)


def test_scatter_multiply_and_torch_agree(mode):
    torch = pytest.importorskip("torch")
    base = np.array([3, -2, 7, 5], np.int32)
    index = np.array([0, 0, 2, 2, 2, 1], np.int64)
    src = np.array([123457, 99, -4099, 3, 77, 5], np.int32)
    got = Tensor(base).scatter(0, Tensor(index.astype(np.int32)), Tensor(src), reduce="multiply").numpy()
    expected = torch.tensor(base).scatter_reduce(0, torch.tensor(index), torch.tensor(src), "prod").numpy()
    np.testing.assert_array_equal(got, expected)
    bools = Tensor([True, True, False]).scatter_reduce(0, Tensor([0, 1, 1]), Tensor([False, True, True]), "prod")
    assert bools.tolist() == [False, True, False]
