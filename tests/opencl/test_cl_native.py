"""A short replay on one OpenCL queue launched, waited for and published from the calling thread through
the compiled core (atensor/core/cl.c, hcq/cl_native.py, CLQueue.run_here): it computes what the CPU
backend computes for the same calls, one kernel or several, with stamps in order; pyopencl's path (the
specification, and the fallback where the core is the Python one) computes the same; the library it
opens is the one pyopencl mapped."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor.core import implementation
from atensor.hcq import cl_native
from atensor.hcq.cl_queue import CLQueue
from atensor.hcq.device import Device
from tests.engine.loops import run_on

pytestmark = pytest.mark.default_settings  # as users run: replays planned inline
RNG = np.random.default_rng(11)


def test_the_compiled_core_opens_the_opencl_library_pyopencl_mapped():
    Device.get("CL")  # pyopencl is imported and its loader mapped
    path = cl_native.loaded_library()
    assert path is not None and "libOpenCL" in path
    with open("/proc/self/maps") as maps:
        assert any(line.rstrip().endswith(path) for line in maps)
    if implementation == "c":
        assert cl_native.native() is not None
    else:  # ATENSOR_CORE=python: pyopencl's path only
        assert cl_native.native() is None


def _calls(device: str, library: str, arrays: list[np.ndarray], w_np: np.ndarray) -> tuple[list, list]:
    """Each call's results of a jitted step of several kernels (a matmul, a reduce reading it, an
    elementwise one) and of one kernel, on `device`, awaited under `library`."""
    w = Tensor(w_np, device=device)

    @atensor.jit
    async def several(x: Tensor) -> tuple[Tensor, Tensor]:
        h = (x @ w).relu()
        return h * 2, h.sum(axis=1) + x.max()

    @atensor.jit
    async def one(x: Tensor) -> Tensor:
        return x * 3 - 1

    async def main() -> tuple[list, list]:
        got_several, got_one = [], []
        y = Tensor.zeros(16, device=device).contiguous()
        await y.realize()
        for a in arrays:
            out, total = await several(Tensor(a, device=device))
            got_several.append((out.numpy(), total.numpy()))
            y = await one(y)
            got_one.append(y.numpy())
        return got_several, got_one
    return run_on(library, main)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_short_replays_run_here_through_the_compiled_core_compute_what_the_cpu_backend_computes(library):
    arrays = [RNG.standard_normal((4, 16)).astype(np.float32) for _ in range(12)]
    w_np = RNG.standard_normal((16, 8)).astype(np.float32)
    compute = Device.get("CL").compute
    before = compute.ran_here
    cl_several, cl_one = _calls("CL", library, arrays, w_np)
    ran_here = compute.ran_here - before
    cpu_several, cpu_one = _calls("CPU", library, arrays, w_np)
    for (out, total), (want_out, want_total) in zip(cl_several, cpu_several):
        np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(total, want_total, rtol=1e-5, atol=1e-5)
    for got, want in zip(cl_one, cpu_one):
        np.testing.assert_array_equal(got, want)
    if cl_native.native() is not None:  # the replays after the first short run went through it, both steps
        assert ran_here >= 12, compute.statistics()
    else:
        assert ran_here == 0


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_the_compiled_launch_and_pyopencl_path_publish_the_same_values_with_ordered_stamps(library, monkeypatch):
    compute = Device.get("CL").compute

    @atensor.jit
    async def step(x: Tensor) -> Tensor:
        return (x + 1) * 2

    async def main() -> list[tuple[np.ndarray, tuple[int, int]]]:
        y = Tensor.ones(32, device="CL").contiguous()
        await y.realize()
        seen = []
        for _ in range(10):
            y = await step(y)
            value = compute.signal.value
            seen.append((y.numpy() % 1e6, compute.signal.stamp(value)))
        return seen

    native = run_on(library, main)
    monkeypatch.setattr(CLQueue, "_known_short", lambda self, run: False)  # pyopencl's submit and poll
    ran = compute.ran_here
    general = run_on(library, main)
    assert compute.ran_here == ran
    for (got, stamp), (want, other) in zip(native, general):
        np.testing.assert_array_equal(got, want)
        assert stamp is not None and other is not None and stamp[0] <= stamp[1] and other[0] <= other[1]
    starts = [stamp[0] for _, stamp in native]
    assert starts == sorted(starts)  # published in order, each after the one before


class _FakeCore:
    """Records what a sequence of launches releases and waits for (event handles are ints here)."""

    def __init__(self):
        self.released: list[int] = []
        self.finished: list[tuple[int, int]] = []

    def cl_release(self, event: int) -> None:
        self.released.append(event)

    def cl_finish(self, first: int, last: int) -> tuple[int, int, int]:
        self.finished.append((first, last))
        return 0, 0, 0


def test_a_sequence_of_launches_keeps_the_first_first_and_the_last_last_and_releases_every_other_event_once():
    from atensor.engine.cl_replay import sequence_launch
    core = _FakeCore()
    # runners of one kernel (first == last) and of two (two events): 1 | 2,3 | 4 | 5,6
    runs = [lambda q: (1, 1), lambda q: (2, 3), lambda q: (4, 4), lambda q: (5, 6)]
    assert sequence_launch(runs, core)(0) == (1, 6)
    assert sorted(core.released) == [2, 3, 4, 5] and core.finished == []
    core = _FakeCore()
    assert sequence_launch([lambda q: (7, 8), lambda q: (9, 9)], core)(0) == (7, 9)
    assert core.released == [8]


def test_a_launch_that_raises_in_a_sequence_is_raised_after_the_launches_before_it_finished():
    from atensor.engine.cl_replay import sequence_launch
    core = _FakeCore()

    def refused(queue: int) -> tuple[int, int]:
        raise RuntimeError("clEnqueueNDRangeKernel failed with OpenCL error -5 (injected)")
    with pytest.raises(RuntimeError, match="injected"):
        sequence_launch([lambda q: (1, 1), lambda q: (2, 3), refused], core)(0)
    assert core.finished == [(1, 3)] and core.released == [2]  # 1 and 3 released by cl_finish


@pytest.mark.parametrize("spin_us", [0, 1, 1000])
def test_the_wait_spins_then_sleeps_and_either_way_publishes_the_kernels_values(spin_us):
    """`cl_finish` reads the status in a loop for `cl_spin`'s time, then sleeps in the driver's wait: a
    kernel done within the spin (1000 us), one still running when it ends (1 us, 16 Ki elements), and
    no spin at all give the values the CPU backend gives, each run here."""
    core = cl_native.native() if implementation == "c" else None
    if core is None:
        pytest.skip("the compiled core's OpenCL launch is not there (ATENSOR_CORE=python or no loader)")
    compute = Device.get("CL").compute
    start = RNG.random(1 << 14).astype(np.float32)

    def calls(device: str) -> list[np.ndarray]:
        @atensor.jit
        async def step(x: Tensor) -> Tensor:
            return (x * 0.5 + 1).sqrt()

        async def main() -> list[np.ndarray]:
            y = Tensor(start, device=device).contiguous()
            await y.realize()
            seen = []
            for k in range(16):
                y = await step(y)
                if k % 8 == 7:  # (a read between calls is a copy on the queue: not every call)
                    seen.append(y.numpy())
            return seen
        return run_on("trio", main)

    core.cl_spin(spin_us * 1000)
    try:
        before = compute.ran_here
        got = calls("CL")
        ran_here = compute.ran_here - before
    finally:
        core.cl_spin(atensor.config.process_settings().cl_spin_us * 1000)
    for a, b in zip(got, calls("CPU")):
        np.testing.assert_allclose(a, b, rtol=1e-5)
    assert ran_here >= 4, compute.statistics()  # (the first calls capture, then learn it is short)
