"""dtypes: bfloat16 through ml_dtypes, bitcast, promotion on tinygrad's lattice, weak Python scalars."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor, dtypes
from atensor.dtype import least_upper_dtype
from atensor.graph.node import GraphError

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 needs ml_dtypes (a runtime dependency); only its tests skip
    BF16 = None
needs_bf16 = pytest.mark.skipif(BF16 is None, reason="bfloat16 needs ml_dtypes: pip install ml_dtypes")


@needs_bf16
def test_bfloat16_tensors_compute_and_convert():
    a = np.array([1.5, 2.25, -3.0, 0.0], dtype=BF16)
    t = Tensor(a)
    assert t.dtype == dtypes.bfloat16
    np.testing.assert_array_equal((t * 2 + 1).numpy(), (a * 2 + 1).astype(BF16))
    assert t.sum().dtype == dtypes.bfloat16 and t.sum().item() == 0.75  # accumulated in float32
    np.testing.assert_array_equal(t.cast(dtypes.float32).numpy(), a.astype(np.float32))
    np.testing.assert_array_equal(Tensor([0.1, 3.3]).cast("bfloat16").numpy(),
                                  np.array([0.1, 3.3], np.float32).astype(BF16))
    m = Tensor(np.full((8, 8), 0.5, dtype=BF16))
    assert (m @ m).dtype == dtypes.bfloat16 and (m @ m).numpy()[0, 0] == 2.0
    np.testing.assert_allclose(t.exp().numpy().astype(np.float32), np.exp(a.astype(np.float32)), rtol=1e-2)


def test_bitcast_reinterprets_bits_of_the_same_width():
    f = np.array([1.0, -2.5, np.inf], dtype=np.float32)
    np.testing.assert_array_equal(Tensor(f).bitcast(dtypes.int32).numpy(), f.view(np.int32))
    np.testing.assert_array_equal(Tensor(f.view(np.uint32)).bitcast("float32").numpy(), f)
    if BF16 is not None:
        b = np.array([1.5, -3.0], dtype=BF16)
        np.testing.assert_array_equal(Tensor(b).bitcast(dtypes.uint16).numpy(), b.view(np.uint16))
    np.testing.assert_array_equal(Tensor(np.array([1.0, 2.0], np.float16)).bitcast(dtypes.int16).numpy(),
                                  np.array([1.0, 2.0], np.float16).view(np.int16))
    with pytest.raises(GraphError, match="item sizes"):
        Tensor(f).bitcast(dtypes.int16)


# tinygrad's lattice, spot-checked: bool < int8 < int16 < ..., unsigned and signed meet one size up, 64-bit
# ints meet at float16 (not float64), and float16 with bfloat16 meet at float32
LATTICE = [
    ("bool", "int8", "int8"), ("int8", "uint8", "int16"),
    ("uint8", "int16", "int16"), ("int32", "uint32", "int64"),
    ("int64", "uint64", "float16"), ("uint64", "int8", "float16"), ("int32", "float16", "float16"),
    ("float16", "bfloat16", "float32"), ("bfloat16", "int64", "bfloat16"), ("float32", "float64", "float64"),
    ("uint16", "int8", "int32"), ("bool", "bool", "bool"), ("uint32", "float32", "float32"),
]


@pytest.mark.parametrize("a, b, expected", LATTICE)
def test_promotion_follows_tinygrads_lattice(a, b, expected):
    da, db = getattr(dtypes, a), getattr(dtypes, b)
    assert least_upper_dtype(da, db) == getattr(dtypes, expected)
    if BF16 is None and "bfloat16" in (a, b):
        pytest.skip("bfloat16 tensors need ml_dtypes")
    ta = Tensor(np.zeros(2, dtype=BF16 if a == "bfloat16" else a))
    tb = Tensor(np.zeros(2, dtype=BF16 if b == "bfloat16" else b))
    assert (ta + tb).dtype == getattr(dtypes, expected)


def test_python_scalars_are_weak():
    assert (Tensor(np.ones(2, np.float16)) * 2.5).dtype == dtypes.float16
    assert (Tensor(np.ones(2, np.int8)) + 300).dtype == dtypes.int8
    assert (Tensor([1, 2]) * 1.5).dtype == dtypes.float32
    assert (Tensor([True]) + 1).dtype == dtypes.int32
    if BF16 is not None:
        assert (Tensor(np.ones(2, BF16)) + 1).dtype == dtypes.bfloat16
    # a tensor made from Python scalars alone has a concrete dtype: atensor has no weak tensors, so
    # realizing one never meets an unresolved weak dtype (tinygrad's "cannot create storage for weak dtype")
    for value, dt in ((3, dtypes.int32), (2.5, dtypes.float32), (True, dtypes.bool)):
        t = Tensor(value)
        assert t.dtype == dt and t.item() == value
    with pytest.raises(TypeError, match="unknown dtype"):
        Tensor([1.0]).cast("weakfloat")
