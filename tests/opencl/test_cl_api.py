"""The Tensor API forward and backward on CL against the CPU backend: every case of the project's
autograd table (tests/tensor/test_autograd.py's CASES: elementwise, broadcasts, reductions, movement,
matmuls, casts, copies, softmax, gather, scatter, conv2d, pooling...) computed on CL and on CPU from
the same inputs, with the same cotangent; the outputs and every input's gradient must agree."""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

from atensor import Tensor
from tests.tensor.test_autograd import _IDX, CASES, _inputs

# the cases whose function makes a tensor of its own (an index): made on the operand's device here
OWN_TENSORS = {
    "gather": lambda x: x.gather(1, Tensor(_IDX.astype(np.int32), device=x.device)),
    "getitem_tensor": lambda x: x[Tensor(np.array([2, 0, 2], np.int32), device=x.device)],
    "scatter_reduce_sum": lambda x, y: x.scatter_reduce(1, Tensor(_IDX.astype(np.int32), device=x.device), y, "sum"),
}


# one case per mechanism runs in the suite (a cold pocl compiles each kernel for about a second); the
# whole table with ATENSOR_CL_ALL=1 (bench/opencl.py --check runs it)
SUITE = {"exp", "relu", "sub_broadcast", "where", "sum_axis", "max_all", "pad", "getitem_steps", "matmul_batched",
         "copy_device", "softmax", "gather", "scatter_reduce_sum", "conv2d"}
RUN = CASES if os.environ.get("ATENSOR_CL_ALL") else [c for c in CASES if c[0] in SUITE]


def _grads(fn, arrays, cotangent, device):
    xs = [Tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(*xs)
    loss = (out * Tensor(cotangent, device=out.device)).sum()
    grads = loss.gradient(*xs)
    assert all(g.device == xs[0].device for g in grads)
    return out.numpy(), [g.numpy() for g in grads]


@pytest.mark.parametrize("name,fn,tfn,shapes,domain", RUN, ids=[c[0] for c in RUN])
def test_an_op_and_its_gradients_on_cl_equal_the_cpu_backends(name, fn, tfn, shapes, domain):
    fn = OWN_TENSORS.get(name, fn)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    arrays = [a.astype(np.float32) for a in _inputs(shapes, *domain)]  # float32: what a GPU runs
    out_shape = fn(*[Tensor(a) for a in arrays]).shape
    cotangent = rng.uniform(-1, 1, size=out_shape).astype(np.float32)
    cpu_out, cpu_grads = _grads(fn, arrays, cotangent, "CPU")
    cl_out, cl_grads = _grads(fn, arrays, cotangent, "CL")
    np.testing.assert_allclose(cl_out, cpu_out, rtol=1e-5, atol=1e-5)
    assert len(cl_grads) == len(cpu_grads) == len(arrays)
    for cl, cpu in zip(cl_grads, cpu_grads):
        assert cl.shape == cpu.shape and cl.dtype == cpu.dtype
        np.testing.assert_allclose(cl, cpu, rtol=1e-4, atol=1e-5)
