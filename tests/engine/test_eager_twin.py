"""A hot eager graph (a schedule-cache template hit `HOT_HITS` times) replays its kept-runner twin
through a ReplayRecord (engine/program.py, engine/replay.py): each hit binds its own buffers into the
twin's placeholders. numpy is the reference; each test checks that the record path ran (so none passes
on the template's own program alone), or, with the compiler hidden (tests/engine/test_no_compiler.py
runs this file so), that it never did. Run as users run (race checks off), under trio and asyncio."""
from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np
import pytest
import trio

from atensor import Tensor
from atensor.backend.c import compiler, registry
from atensor.engine import program as program_module
from tests.engine.loops import count_record_runs

pytestmark = pytest.mark.default_settings
COMPILED = compiler.path() is not None


@pytest.fixture
def recorded(monkeypatch) -> list[int]:
    """One entry per submission that went through a ReplayRecord; a template is hot after 2 hits."""
    monkeypatch.setattr(program_module, "HOT_HITS", 2)
    return count_record_runs(monkeypatch)


def _expect_records(recorded: list[int], at_least: int) -> None:
    if COMPILED:
        assert len(recorded) >= at_least, recorded
    else:
        assert recorded == []


def _warm(step) -> None:
    """Runs `step()` until the template is hot, its kernels compiled (in the background) and its
    twin's record made (at the twin's second submission)."""
    for _ in range(3):
        step()
    registry.wait_background()
    for _ in range(4):
        step()


def test_hot_hits_bind_each_realizes_own_inputs_outputs_and_temporaries(recorded):
    rng = np.random.default_rng(1)

    def step(a_np=None, b_np=None):
        a_np = rng.random(16, dtype=np.float32) if a_np is None else a_np
        b_np = rng.random(16, dtype=np.float32) if b_np is None else b_np
        a, b = Tensor(a_np), Tensor(b_np)
        y = ((a - b).contiguous() * 3 + a).realize().wait()  # two kernels: a temporary between them
        np.testing.assert_allclose(y.numpy(), (a_np - b_np) * 3 + a_np, rtol=1e-6)
        return y
    _warm(step)
    recorded.clear()
    kept = []
    for _ in range(5):
        a_np, b_np = rng.random(16, dtype=np.float32), rng.random(16, dtype=np.float32)
        kept.append((step(a_np, b_np), a_np, b_np))
        step(b_np, a_np)  # the same buffers' values in the other slots
    _expect_records(recorded, 10)
    for y, a_np, b_np in kept:  # earlier results keep their values: each hit wrote its own buffer
        np.testing.assert_allclose(y.numpy(), (a_np - b_np) * 3 + a_np, rtol=1e-6)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_an_awaited_hot_loop_reads_the_previous_output_as_its_input(library, recorded):
    async def main():
        x = Tensor.zeros(16).contiguous()
        await x.realize()
        for k in range(12):
            x = x * 2 + 1
            await x.realize()
            if k == 4:
                registry.wait_background()
        assert x.tolist() == [2.0 ** 12 - 1] * 16
    trio.run(main) if library == "trio" else asyncio.run(main())
    _expect_records(recorded, 4)


def test_an_input_from_a_failed_task_is_refused_and_the_next_hit_runs_again(recorded):
    from atensor.hcq.buffer import Buffer

    def step(x: Tensor) -> Tensor:
        return (x + 1).contiguous().realize().wait()
    _warm(lambda: step(Tensor(np.zeros(8, dtype=np.float32))))
    bad = Tensor(np.zeros(8, dtype=np.float32)).realize().wait()
    Buffer.of(bad.node.base().arg[0]).failure = RuntimeError("the kernel that wrote it failed")
    recorded.clear()
    with pytest.raises(RuntimeError, match="failed"):
        step(bad)
    good = step(Tensor(np.full(8, 4.0, dtype=np.float32)))
    assert good.tolist() == [5.0] * 8
    _expect_records(recorded, 1)


@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_the_twin_keeps_no_realizes_buffers_alive(recorded):
    x = Tensor(np.ones(16, dtype=np.float32))
    refs = []
    for _ in range(8):
        y = (x + 3).contiguous() * 2
        y.realize().wait()
        assert y.tolist() == [8.0] * 16
        refs.append(weakref.ref(y.node.base().arg[0]))  # the output buffer's spec
        del y
        registry.wait_background()
    gc.collect()
    assert all(r() is None for r in refs)
    _expect_records(recorded, 2)


def test_a_profiled_hit_runs_the_templates_program_with_a_span_per_kernel(recorded):
    import atensor

    def step(k: int) -> None:
        y = ((Tensor(np.full(8, float(k), dtype=np.float32)) * 2).contiguous() - 1).realize().wait()
        assert y.tolist() == [2.0 * k - 1] * 8
    _warm(lambda: step(0))
    recorded.clear()
    with atensor.profile() as prof:
        step(3)
    assert recorded == []
    kernels = [s for s in prof.spans if s.kind == "kernel"]
    assert len(kernels) == 2, kernels  # one span per task, as an eager realize's


def _heavy_steps(library: str, hits: int, check_at: int, on_check, rows: int) -> list:
    """`hits` realizes of one graph too heavy for a record (a matmul past layout.py's flops bound), each
    checked against numpy; `on_check()` runs after hit `check_at` (once its kernels may be compiled).
    Each test gives its own `rows`: a template (and its twin's state) outlives a test, so a second
    library's run of a test finds it hot already.
    Returns each hit's (result tensor, expected values), for checking later that each kept its own."""
    rng = np.random.default_rng(2)
    w_np = rng.random((96, 96), dtype=np.float32)
    w = Tensor(w_np)
    kept = []

    async def main():
        for k in range(hits):
            x_np = rng.random((rows, 96), dtype=np.float32)
            y = ((Tensor(x_np) @ w).relu() * 2).sum(axis=1)
            await y.realize()
            expected = (np.maximum(x_np @ w_np, 0) * 2).sum(axis=1)
            np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4)
            kept.append((y, expected))
            if k == check_at:
                registry.wait_background()
                on_check()
    trio.run(main) if library == "trio" else asyncio.run(main())
    return kept


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_graph_too_heavy_for_a_twin_runs_its_kernels_compiled_to_c(library, recorded, monkeypatch):
    """With no twin allowed, a hot template's kernels are still compiled in the background and its later
    hits' runners (made per hit) are native (numpy before: the flagship's eager step ran numpy kernels
    forever)."""
    from atensor.engine import plan as plan_module
    monkeypatch.setattr(program_module, "HEAVY_TWIN_MAX_BYTES", 0)
    made: list[bool] = []
    runner_for = plan_module.runner_for

    def counting(work):
        run = runner_for(work)
        made.append(run is not None and run.native is not None)
        return run
    monkeypatch.setattr(plan_module, "runner_for", counting)
    _heavy_steps(library, 8, 3, made.clear, rows=64)
    assert made, "no runner was made per hit"
    assert all(made) if COMPILED else not any(made), made
    assert recorded == []  # too heavy for a record


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_heavy_graph_submits_its_kept_runner_twin_with_each_hits_buffers(library, recorded, monkeypatch):
    """A hot graph too heavy for a record gets a kept-runner twin (`twin_heavy`): later hits submit the
    twin's plan with their own buffers bound, no runner is made per hit, and every hit's result keeps
    its own values."""
    from atensor.engine import plan as plan_module
    submitted: list[bool] = []
    submit = plan_module.Plan.submit

    def counting(plan, mapping=None):
        submitted.append(not plan.layout.from_slots)  # kept runners (a twin), not made per hit
        return submit(plan, mapping)
    monkeypatch.setattr(plan_module.Plan, "submit", counting)
    kept = _heavy_steps(library, 10, 3, submitted.clear, rows=66)
    for y, expected in kept:  # each hit wrote buffers of its own
        np.testing.assert_allclose(y.numpy(), expected, rtol=1e-4)
    assert len(submitted) == 6
    if COMPILED:
        assert submitted[1:] == [True] * 5, submitted  # (the first hit after compiling makes the twin)
    else:
        assert not any(submitted)
    assert recorded == []


def test_a_hot_two_device_graph_with_an_allreduce_submits_its_twin(recorded, monkeypatch):
    """The twin of a data-parallel graph (x split over two devices, w on both, a sum over the split
    axis: its allreduce's steps are Copy and Kernel subclasses) keeps its runners too, and each hit's
    sum is right on both devices."""
    from atensor.engine import plan as plan_module
    submitted: list[bool] = []
    submit = plan_module.Plan.submit

    def counting(plan, mapping=None):
        submitted.append(not plan.layout.from_slots)
        return submit(plan, mapping)
    monkeypatch.setattr(plan_module.Plan, "submit", counting)
    devices = ("CPU:0", "CPU:1")
    rng = np.random.default_rng(3)
    w_np = rng.random((96, 96), dtype=np.float32)
    w = Tensor(w_np).shard(devices)
    for k in range(9):
        x_np = rng.random((68, 96), dtype=np.float32)
        y = (Tensor(x_np).shard(devices, axis=0) @ w).relu().sum(axis=0)
        y.realize().wait()
        np.testing.assert_allclose(y.numpy(), np.maximum(x_np @ w_np, 0).sum(axis=0), rtol=1e-4)
        if k == 3:
            registry.wait_background()
            submitted.clear()
    if COMPILED:
        assert submitted[1:] and all(submitted[1:]), submitted
    else:
        assert not any(submitted)
