"""The tiled matmul's own index arithmetic (backend/gpu/render.py renders it from gpu_index.IExpr records)
is proved inside its buffers by engine/cl_bounds.py with z3, for every work-group, work-item and inner
tile; a wrong bound in those records (which are what the kernel's text is rendered from) is caught with
a counterexample. Needs no OpenCL device: it renders and proves only."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from atensor import Tensor
from atensor.backend.gpu.dialect import OPENCL
from atensor.backend.gpu.index import Guard
from atensor.backend.gpu.render import render_gpu
from atensor.engine import cl_bounds
from atensor.graph.node import BufferSpec, Node
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.sched.schedule import schedule
from atensor.sched.boundscheck import BoundsError

RNG = np.random.default_rng(5)


def _tiled(fn, *arrays):
    """The rendered OpenCL program of the last kernel `fn` schedules, and its tiled matmul's proof."""
    out = fn(*[Tensor(a) for a in arrays]).node
    spec = BufferSpec(out.device, out.size, out.dtype)
    root = Node.make(Ops.ASSIGN, out.dtype, (spec.node(0), out), View.create((out.size,)).reshape(out.shape))
    kernels = [t.work for t in schedule([root]).graph.tasks if t.work.kind == "kernel"]
    prog = render_gpu(kernels[-1].ast, "kernel", OPENCL)
    assert len(prog.proofs) == 1, "a tiled matmul declares its index arithmetic"
    return prog, prog.proofs[0]


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", ["ragged", "batched, transposed operand", "batched"])
def test_the_tiled_matmuls_global_loads_and_stores_are_proved_in_bounds(case):
    fn, arrays = {"ragged": (lambda x, y: x @ y, (_f32(70, 130), _f32(130, 45))),
                  "batched, transposed operand": (lambda x, y: x @ y.transpose(1, 2), (_f32(3, 70, 130), _f32(3, 45, 130))),
                  "batched": (lambda x, y: x @ y, (_f32(2, 70, 130), _f32(2, 130, 45)))}[case]
    prog, proof = _tiled(fn, *arrays)
    cl_bounds.check_program(prog, case)  # raises on a violation
    assert [a.what.split()[0] for a in proof.accesses] == ["load", "load", "store"]
    for access in proof.accesses:  # the kernel's text is rendered from these records
        assert f"{access.buffer}[{access.index.c()}]" in prog.body


def test_a_wrong_bound_in_the_tile_arithmetic_is_found_with_a_counterexample():
    prog, proof = _tiled(lambda x, y: x @ y, _f32(70, 130), _f32(130, 45))
    load_a, load_b, store = proof.accesses
    # the left operand's guard one row too lax (row < m + 1): the last tile row reads past the buffer
    lax = dataclasses.replace(load_a, guards=(Guard(load_a.guards[0].lhs, 71), load_a.guards[1]))
    with pytest.raises(BoundsError, match="left operand"):
        cl_bounds.check_program(dataclasses.replace(prog, proofs=(dataclasses.replace(proof, accesses=(lax, load_b, store)),)), "m")
    found = cl_bounds.violation(dataclasses.replace(proof, accesses=(lax,)))
    assert "reads element" in found and "grp=" in found and "lid=" in found
    # the store without its column guard: the ragged last column tile writes past the result
    unguarded = dataclasses.replace(store, guards=store.guards[:1])
    assert "writes element" in cl_bounds.violation(dataclasses.replace(proof, accesses=(unguarded,)))
    # the inner loop's tiles taken one past the end (k0 up to k + 15): the loads stay guarded, so still in bounds
    wide = dataclasses.replace(proof, ranges={**proof.ranges, "k0": (0, 130 + 15, 16)})
    assert cl_bounds.violation(wide) is None
    # a buffer one element short
    short = dataclasses.replace(load_b, elements=load_b.elements - 1)
    assert "reads element 5849" in cl_bounds.violation(dataclasses.replace(proof, accesses=(short,)))
