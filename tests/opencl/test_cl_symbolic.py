"""Symbolic-length views on an OpenCL device: backend/gpu/render.py refuses a kernel of symbolic shape (a launch's
work-items are counted at render time), so it runs on the host through the CPU backend's symbolic loops;
the values are numpy's, eagerly and under the jit, and the refusal says why."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor, TinyJit, Variable
from atensor.backend.c.render import Unsupported
from atensor.backend.gpu.render import render_gpu
from atensor.backend.gpu.dialect import OPENCL
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.rewrite import has_symbolic_shape
from atensor.graph.view import View
from atensor.sched.schedule import schedule

A = np.random.default_rng(1).standard_normal((3, 10)).astype(np.float32)
N = Variable("n", 1, 10)


def scores(t: Tensor, n) -> Tensor:
    return t.shrink((None, (0, n))).softmax(-1).sum(1) + t.shrink((None, (0, n))).max(1)


def reference(n: int) -> np.ndarray:
    x = A[:, :n]
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).sum(1) + x.max(1)


def test_symbolic_kernels_on_cl_run_on_the_host_with_numpy_values():
    for n in (2, 9):
        np.testing.assert_allclose(scores(Tensor(A, device="CL"), N.bind(n)).numpy(), reference(n), rtol=1e-5)
    step = TinyJit(lambda t, n: scores(t, n).realize())
    for n in (3, 7, 1, 10, 5):
        np.testing.assert_allclose(step(Tensor(A, device="CL"), N.bind(n)).numpy(), reference(n), rtol=1e-5)
    assert step.stats == {"calls": 5, "replays": 2, "captures": 1}


def test_the_opencl_renderer_refuses_a_symbolic_shape_by_name():
    n = scores(Tensor(A, device="CL"), N.bind(4)).node
    spec = BufferSpec(n.device, n.size, n.dtype)
    root = Node.make(Ops.ASSIGN, n.dtype, (spec.node(0), n), View.create((n.size,)).reshape(n.shape))
    kernels = [t.work for t in schedule([root]).graph.tasks if hasattr(t.work, "ast")]
    symbolic = [k for k in kernels if has_symbolic_shape(k.ast)]
    assert symbolic
    with pytest.raises(Unsupported, match="symbolic shape"):
        render_gpu(symbolic[0].ast, symbolic[0].name, OPENCL, True)
