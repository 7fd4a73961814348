"""Masked views keep "every element is padding" through reshapes (issue 17, defect 1)."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.graph.view import View


@pytest.mark.parametrize("racecheck", [False, True])
def test_an_int_index_into_padding_reads_the_pad_value(racecheck: bool) -> None:
    expected = np.pad(np.array([1., 2., 3.], np.float32), (2, 2)).tolist()
    with atensor.Context(racecheck=racecheck):
        p = Tensor([1., 2., 3.]).pad(((2, 2),))
        assert [p[i].item() for i in range(7)] == expected
        assert p[0:1].reshape(()).item() == 0.0
        assert p[0:1].reshape(1, 1)[0].tolist() == [0.0]
        assert [p.flip(0)[i].item() for i in range(7)] == expected[::-1]


def test_an_all_masked_view_stays_all_masked_when_reshaped() -> None:
    padded = View.create((3,)).pad(((2, 2),))
    empty = padded.shrink(((0, 1),))
    assert empty.mask == ((0, 0),)
    assert empty.reshape(()) is None                # rank 0 cannot say "masked": the graph stacks a view
    assert empty.reshape((1, 1)).mask == ((0, 0), (0, 0))
    assert empty.reshape((1, 1)).index_range() == (0, -1)
    kept = padded.shrink(((2, 3),)).reshape((1, 1))  # a valid element keeps its offset and stays valid
    assert kept.index_range() == (0, 0)


@pytest.mark.parametrize("flip", [False, True])
def test_padding_of_an_empty_tensor_broadcast_reads_the_pad_value(flip: bool) -> None:
    # a pad of nothing is all padding; flipped its mask was (1, 1), which expand read as "valid" and so
    # broadcast memory past the empty buffer (found by tests/fuzz/test_op_chains.py)
    padded = Tensor(np.zeros((0,), np.int32)).pad(((0, 1),))
    chain = padded.flip((0,)) if flip else padded
    reference = np.pad(np.zeros((0,), np.int32), (0, 1))
    reference = reference[::-1] if flip else reference
    assert chain.reshape(1).expand(2).contiguous().tolist() == np.broadcast_to(reference, (2,)).tolist() == [0, 0]


def test_a_flipped_all_masked_view_is_all_masked_and_broadcasts_so() -> None:
    empty = View.create((0,)).pad(((0, 1),))
    assert empty.flip((True,)).mask == ((0, 0),)
    assert empty.flip((True,)).expand((1,)).mask == ((0, 0),)
    assert View(shape=(1,), strides=(0,), offset=0, mask=((1, 1),)).expand((3,)).mask == ((0, 0),)
