"""Gradient buckets: with a bucket cap, the allreduce of one layer's gradient is issued as soon as that
gradient is computed, so it runs while the backward of earlier layers still computes (DDP's overlap),
visible in the profile; with one bucket, every gradient waits for the whole backward."""
from __future__ import annotations

import numpy as np

import atensor
from atensor import Tensor

DEVICES = ("CPU:0", "CPU:1")


def _step(bucket_bytes: int):
    rng = np.random.default_rng(0)
    sizes = [64, 256, 256, 256, 10]
    weights = [Tensor(rng.standard_normal((a, b)).astype(np.float32) * 0.1).to(DEVICES)
               for a, b in zip(sizes, sizes[1:])]
    for w in weights:
        w.requires_grad = True
    x = Tensor(rng.standard_normal((512, 64)).astype(np.float32)).shard(DEVICES, axis=0)
    h = x
    for w in weights[:-1]:
        h = (h @ w).relu()
    loss = (h @ weights[-1]).square().mean()
    loss.backward()
    with atensor.Context(allreduce_bucket_bytes=bucket_bytes), atensor.profile() as prof:
        Tensor.realize(loss, *[w.grad for w in weights]).wait()
    grads = [w.grad.numpy() for w in weights]
    for w in weights:
        w.requires_grad = False
    steps = [s.task_id for s in prof.spans if s.kind == "allreduce"]
    matmuls = [s.task_id for s in prof.spans if s.kind == "kernel" and "matmul" in s.name]
    return steps, matmuls, grads


def test_a_bucket_cap_issues_each_gradients_allreduce_before_the_rest_of_the_backward():
    steps, matmuls, grads = _step(bucket_bytes=1)            # every gradient its own bucket
    assert min(steps) < max(matmuls), "no allreduce was issued before the backward finished"
    one_steps, one_matmuls, one_grads = _step(bucket_bytes=1 << 30)  # one bucket, lowered at the end
    assert min(one_steps) > max(one_matmuls)
    for got, want in zip(grads, one_grads):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
