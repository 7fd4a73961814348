"""Every host activity that takes wall time is a named span: compiling (foreground and background,
naming the kernels), a job waiting in the dispatcher, garbage collections, loading and saving
weights, jitted calls, and a trio task's own code. And the coverage the summary prints is the
union of those spans over the profiled window."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import trio

import atensor
from atensor import Tensor, nn
from atensor.profiler import HostSpan, Profile
from atensor.profiler.summary import host_coverage


def _needs_compiler(monkeypatch):
    """backend/c/registry.py, with the default policy (ATENSOR_NATIVE=jit: only jitted kernels compile,
    when the function is captured), whatever the environment runs the suite with."""
    from atensor.backend.c import compiler, registry
    from atensor.config import settings
    if compiler.path() is None:
        pytest.skip("no C compiler here: every kernel stays on numpy")
    monkeypatch.setattr(settings, "native", "jit")
    return registry


async def test_a_jit_compile_is_a_host_span_naming_the_kernels_it_compiled(monkeypatch, tmp_path):
    registry = _needs_compiler(monkeypatch)
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))   # a cold cache: the compiler really runs

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return ((x * 1.4142).exp() - x).sum(0)   # constants no other test uses: new kernels
    x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32)
    with atensor.profile() as prof:
        for _ in range(3):
            out = await f(Tensor(x))
    np.testing.assert_allclose(out.numpy(), (np.exp(x * np.float32(1.4142)) - x).sum(0), rtol=1e-5)
    program = next(iter(f._programs.values()))
    names = {t.work.name for r in program.records for t in r.tasks
             if hasattr(t.work, "ast") and registry.lookup(t.work.ast) is not None}
    compiles = [h for h in prof.host_spans if h.category == "compile" and h.name.startswith("compile ")
                and h.detail]
    assert len(compiles) == 1, compiles
    span = compiles[0]
    assert span.track == "host" and span.duration_ns > 0
    assert names and {k.split(" (x")[0] for k in span.detail.split(", ")} == names
    assert span.name.startswith("compile ") and int(span.name.split()[1]) >= len(names)
    # the jitted calls themselves are spans too, and the compile happened inside the third one
    calls = sorted((h for h in prof.host_spans if h.category == "call"), key=lambda h: h.start_ns)
    assert [h.name for h in calls] == ["jit f"] * 3
    assert calls[2].start_ns <= span.start_ns and span.end_ns <= calls[2].end_ns


async def test_a_background_compile_is_on_its_own_track(monkeypatch, tmp_path):
    registry = _needs_compiler(monkeypatch)
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))

    @atensor.jit(compile="background")
    async def f(x: Tensor) -> Tensor:
        return ((x * 2.7183).sin() + x).max(0)
    x = np.random.default_rng(4).standard_normal((6, 3)).astype(np.float32)
    with atensor.profile() as prof:
        for _ in range(3):
            await f(Tensor(x))
        await trio.to_thread.run_sync(registry.wait_background)
    background = [h for h in prof.host_spans if h.track == "compile (background)"]
    assert len(background) == 1 and background[0].category == "compile"
    assert "mul_sin_add_max 6x3" in background[0].detail.split(", ")


async def test_a_job_waiting_for_the_dispatcher_is_a_wait_span_before_its_scheduling():
    x = Tensor(np.arange(64, dtype=np.float32))
    # race proofs send every realize to the dispatcher (a small one is otherwise planned inline, unqueued)
    with atensor.Context(racecheck=True), atensor.profile() as prof:
        await ((x + 1) * 3).sum().realize()
    waits = [h for h in prof.host_spans if h.category == "wait" and h.track == "dispatcher queue"]
    assert waits, prof.host_spans
    for wait in waits:
        job = wait.name.split()[1]
        scheduled = [h for h in prof.host_spans if h.name == f"schedule+submit job {job}"]
        assert len(scheduled) == 1 and wait.end_ns == scheduled[0].start_ns
        assert wait.start_ns <= wait.end_ns


@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_garbage_collections_during_a_profile_are_gc_spans_and_none_after():
    with atensor.profile() as prof:
        gc.collect()
    spans = [h for h in prof.host_spans if h.category == "gc"]
    assert [h.name for h in spans] == ["gc collection (generation 2)"]
    assert spans[0].track == "gc" and "objects collected" in spans[0].detail
    assert prof.start_ns <= spans[0].start_ns <= spans[0].end_ns <= prof.end_ns
    gc.collect()   # the hook is gone with the profile
    assert gc.callbacks.count(atensor.profiler.collector._on_gc) == 0


def test_saving_and_loading_weights_are_load_spans(tmp_path):
    pytest.importorskip("safetensors")
    layer = nn.Linear(8, 4)
    path = str(tmp_path / "w.safetensors")
    with atensor.profile() as prof:
        nn.safe_save(nn.get_state_dict(layer), path)
        state = nn.safe_load(path)
        nn.load_state_dict(nn.Linear(8, 4), state)
    names = [h.name for h in prof.host_spans if h.category == "load"]
    assert names == [f"save weights {path}", f"load weights {path}", "load_state_dict (2 tensors)"]
    np.testing.assert_array_equal(state["weight"].numpy(), layer.weight.numpy())


async def test_a_trio_task_holding_the_loop_is_a_task_span_with_its_name():
    async def busy() -> None:
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:   # holds the loop thread for 5 ms without awaiting
            pass
        await trio.sleep(0)

    with atensor.profile() as prof:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy, name="busy-task")
    steps = [h for h in prof.host_spans if h.name == "task busy-task"]
    assert steps and all(h.category == "task" and h.track == "event loop" for h in steps)
    assert max(h.duration_ns for h in steps) >= 5_000_000


def test_an_asyncio_task_holding_the_loop_is_a_task_span_and_a_callback_is_a_callback_span():
    import asyncio
    from atensor.profiler import tasks

    def hold(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:   # holds the loop thread without awaiting
            pass

    async def busy() -> None:
        hold(0.005)
        await asyncio.sleep(0)

    def busy_callback() -> None:
        hold(0.003)

    async def main() -> Profile:
        with atensor.profile() as prof:
            await asyncio.create_task(busy(), name="busy-task")
            asyncio.get_running_loop().call_soon(busy_callback)
            await asyncio.sleep(0.01)
            await asyncio.gather(*(asyncio.sleep(0) for _ in range(50)))   # short steps: not recorded
        return prof

    before = asyncio.events.Handle._run
    prof = asyncio.run(main())
    assert asyncio.events.Handle._run is before   # put back when the profile exits
    steps = [h for h in prof.host_spans if h.name == "task busy-task"]
    assert steps and all(h.category == "task" and h.track == "event loop" for h in steps)
    assert max(h.duration_ns for h in steps) >= 5_000_000
    callbacks = [h for h in prof.host_spans if h.name.endswith("busy_callback")]
    assert len(callbacks) == 1 and callbacks[0].name.startswith("callback ")
    assert callbacks[0].duration_ns >= 3_000_000
    assert all(h.duration_ns >= tasks.MIN_STEP_NS for h in prof.host_spans if h.category == "task")
    assert prof.start_ns <= min(h.start_ns for h in steps) and max(h.end_ns for h in steps) <= prof.end_ns


def test_outside_an_event_loop_no_task_steps_are_recorded():
    with atensor.profile() as plain:
        time.sleep(0.002)
    assert plain.host_spans == []


def test_coverage_is_the_union_of_host_spans_over_the_window_by_hand():
    spans = [
        HostSpan("schedule", "schedule", 100, 400),
        HostSpan("compile", "compile", 300, 500, track="compile (background)"),   # overlaps: union
        HostSpan("step", "task", 700, 800, track="event loop"),
        HostSpan("await", "await", 900, 950),
    ]
    prof = Profile.from_events(host_spans=spans)
    prof.start_ns, prof.end_ns = 0, 1000
    coverage = host_coverage(prof.timeline())
    # covered: [100, 500) + [700, 800) + [900, 950) = 550 of 1000; without "task": 450
    assert (coverage.window_ns, coverage.covered_ns, coverage.covered_own_ns) == (1000, 550, 450)
    assert coverage.share == pytest.approx(0.55) and coverage.own_share == pytest.approx(0.45)
    # gaps, longest first: [500, 700), [0, 100), [800, 900), [950, 1000)
    assert coverage.gaps == ((500, 200), (0, 100), (800, 100), (950, 50))
    text = prof.summary()
    assert "host time covered by named spans: 55.0% of 1.00 us (45.0% by atensor's own spans" in text
    assert "largest uncovered: 200 ns at 500 ns" in text
