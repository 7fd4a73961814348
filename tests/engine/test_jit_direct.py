"""A jit call shaped like the previous one whose program replays in one foreign call runs directly on
the calling thread (jit/direct.py): no key, no job, no handle. It must compute what the function
computes, keep the ledger's versions as the general replay does, and step aside (to the general path)
whenever that path would do something else: another key, a lazy assign pending, a profile taken, a
stale input. numpy is the reference. Run as users run (race checks off)."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor
from atensor import ledger
from atensor.jit.direct import DirectReplay
from atensor.profiler import collector
from tests.engine.loops import run_on

pytestmark = pytest.mark.default_settings


@pytest.fixture
def direct_runs(monkeypatch) -> list[str]:
    """One entry per call that the direct replay ran (not declined): "record" when its one foreign
    call ran the program, "submitted" when it submitted the plan (and returned a handle, unless the
    submission had run by then)."""
    runs: list[str] = []
    original = DirectReplay.run

    def counting(self: DirectReplay, inputs: list) -> object:
        found = original(self, inputs)
        if found is not None:
            runs.append("record" if self.record is not None else "submitted")
        return found
    monkeypatch.setattr(DirectReplay, "run", counting)
    return runs


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_calls_shaped_like_the_last_run_directly_and_each_keeps_its_own_result(library, direct_runs):
    w_np = np.linspace(-1, 1, 16, dtype=np.float32)
    w = Tensor(w_np)

    @atensor.jit
    async def f(x: Tensor, b: Tensor) -> Tensor:
        return (x * w + b).relu()

    async def main() -> None:
        rng = np.random.default_rng(3)
        kept = []
        for _ in range(12):
            x_np, b_np = rng.standard_normal((2, 16)).astype(np.float32)
            got = await f(Tensor(x_np), Tensor(b_np))
            kept.append((got, np.maximum(x_np * w_np + b_np, 0)))
        for got, want in kept:  # fresh result buffers: no later call overwrote an earlier result
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)

    run_on(library, main)  # calls 1-3 run, capture, verify; the 4th sets up the direct one


def test_a_chain_fed_its_own_result_runs_directly_and_counts_like_eager(direct_runs):
    @atensor.jit
    def step(x: Tensor) -> Tensor:
        return x * 2 + 1

    y = Tensor(np.zeros(8, dtype=np.float32))
    want = np.zeros(8, dtype=np.float32)
    for _ in range(20):
        y = step(y)
        want = want * 2 + 1
    np.testing.assert_allclose(y.numpy(), want)
    assert len(direct_runs) >= 14
    assert step.stats["replays"] == 17 and step.stats["calls"] == 20


def test_a_call_of_another_shape_is_its_own_key_and_the_direct_one_resumes(direct_runs):
    @atensor.jit
    def f(x: Tensor) -> Tensor:
        return x + 1

    for _ in range(6):
        f(Tensor(np.ones(16, dtype=np.float32)))
    before = len(direct_runs)
    np.testing.assert_allclose(f(Tensor(np.arange(32, dtype=np.float32))).numpy(), np.arange(32) + 1)
    np.testing.assert_allclose(f(Tensor(np.arange(16, dtype=np.int32))).numpy(), np.arange(16) + 1)
    assert len(direct_runs) == before  # other keys: never the direct replay of the 16-float one
    for _ in range(3):
        f(Tensor(np.ones(16, dtype=np.float32)))
    got = f(Tensor(np.full(16, 4, dtype=np.float32)))
    np.testing.assert_allclose(got.numpy(), np.full(16, 5))
    assert len(direct_runs) >= before + 2


def test_a_lazy_assign_to_state_is_realized_before_the_call_and_versions_advance_as_the_state_is_written(
        direct_runs):
    state = Tensor(np.zeros(4, dtype=np.float32))
    scale = Tensor(np.ones(4, dtype=np.float32))

    @atensor.jit
    def accumulate(x: Tensor) -> Tensor:
        state.assign(state + x * scale)
        return state * 1

    total = np.zeros(4, dtype=np.float32)
    spec = state.node.src[0].arg[0] if state.node.src else state.node.arg[0]
    for k in range(8):
        x_np = np.full(4, k, dtype=np.float32)
        version = ledger.version(spec)
        if k == 6:  # a lazy assign, pending when the call comes: the call must see its value
            scale.assign(scale * 3)
            factor = 3.0
        else:
            factor = 1.0 if k < 6 else 3.0
        total = total + x_np * factor
        got = accumulate(Tensor(x_np))
        np.testing.assert_allclose(got.numpy(), total)
        assert ledger.version(spec) == version + 1  # one assign per call, direct or not
    np.testing.assert_allclose(state.numpy(), total)
    assert direct_runs  # the calls without a pending assign ran directly


def test_while_a_profile_is_taken_calls_take_the_general_path_and_are_profiled(direct_runs):
    @atensor.jit
    def f(x: Tensor) -> Tensor:
        return x - 1

    for _ in range(6):
        f(Tensor(np.ones(8, dtype=np.float32)))
    before = len(direct_runs)
    with collector.profile() as prof:
        got = f(Tensor(np.ones(8, dtype=np.float32)))
    np.testing.assert_allclose(got.numpy(), np.zeros(8))
    assert len(direct_runs) == before
    assert any(span.name.startswith("replay 1 tasks") for span in prof.host_spans)
    f(Tensor(np.ones(8, dtype=np.float32)))
    f(Tensor(np.ones(8, dtype=np.float32)))
    assert len(direct_runs) > before  # after the profile, the direct replay again


def test_a_lazy_input_or_an_input_realized_just_before_takes_the_general_path_and_is_computed(direct_runs):
    @atensor.jit
    def f(x: Tensor) -> Tensor:
        return x * 3

    a = Tensor(np.ones(8, dtype=np.float32))
    for _ in range(6):
        f(Tensor(np.ones(8, dtype=np.float32)))
    before = len(direct_runs)
    np.testing.assert_allclose(f(a + 1).numpy(), np.full(8, 6))  # another key: the lazy `a + 1`
    assert len(direct_runs) == before
    b = a + 2
    b.realize()  # not waited for: the call comes while it may still be in flight
    np.testing.assert_allclose(f(b).numpy(), np.full(8, 9))
    np.testing.assert_allclose(f(a).numpy(), np.full(8, 3))


def test_a_stray_lazy_assign_elsewhere_neither_stops_the_direct_replay_nor_is_realized_by_it(direct_runs):
    @atensor.jit
    def f(x: Tensor) -> Tensor:
        return x + 2

    for k in range(4):  # run, capture (which realizes every pending assign first), verify, replay
        f(Tensor(np.full(4, k, dtype=np.float32)))
    other = Tensor(np.zeros(2, dtype=np.float32))
    spec = other.node.base().arg[0]
    other.assign(other + 5)  # pending, on a buffer the function never touches
    before = len(direct_runs)
    for k in range(6):
        np.testing.assert_allclose(f(Tensor(np.full(4, k, dtype=np.float32))).numpy(), np.full(4, k + 2))
    assert len(direct_runs) >= before + 5
    assert ledger.head(spec) is not None  # still lazy: the replays did not realize it
    np.testing.assert_allclose(other.numpy(), np.full(2, 5))


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_program_too_big_for_a_record_is_submitted_directly_and_its_handle_awaited(library, direct_runs):
    n = 1 << 16  # 256 KiB: not a light plan, so no record; the queue's worker runs it

    @atensor.jit
    async def f(x: Tensor, y: Tensor) -> Tensor:
        return x * 2 + y

    async def main() -> None:
        kept = []
        for k in range(8):
            x_np = np.full(n, k, dtype=np.float32)
            got = await f(Tensor(x_np), Tensor(np.ones(n, dtype=np.float32)))
            kept.append((got, x_np * 2 + 1))
        for got, want in kept:
            np.testing.assert_allclose(got.numpy(), want)

    run_on(library, main)
    assert direct_runs.count("submitted") >= 3 and "record" not in direct_runs, direct_runs


def test_while_the_dispatcher_is_busy_a_call_waits_its_turn_behind_it_and_is_not_run_directly(direct_runs):
    import threading
    from atensor.engine.dispatch import dispatcher

    @atensor.jit
    def f(x: Tensor) -> Tensor:
        return x * 5

    for _ in range(6):
        f(Tensor(np.ones(4, dtype=np.float32)))
    before = len(direct_runs)
    x = Tensor(np.full(4, 2, dtype=np.float32))
    got: list = []
    assert dispatcher.claim()  # another planner holds the dispatching role
    try:
        caller = threading.Thread(target=lambda: got.append(f(x).numpy()))
        caller.start()
        caller.join(0.3)
        assert not got  # queued behind the planner, not run beside it
    finally:
        dispatcher.unclaim()
    caller.join(10)
    np.testing.assert_allclose(got[0], np.full(4, 10))
    assert len(direct_runs) == before
    np.testing.assert_allclose(f(x).numpy(), np.full(4, 10))
    assert len(direct_runs) == before + 1  # the dispatcher idle again: direct


def test_a_plan_lowered_again_for_newer_kernels_is_not_replayed_by_the_old_direct_replay(direct_runs, monkeypatch):
    from atensor.backend.c import registry

    @atensor.jit
    def f(x: Tensor) -> Tensor:
        return x + 7

    for _ in range(6):
        f(Tensor(np.ones(4, dtype=np.float32)))
    old = f._last.direct
    old_runs = []
    original = type(old).run
    monkeypatch.setattr(type(old), "run", lambda self, inputs: (old_runs.append(self is old),
                                                                original(self, inputs))[1])
    monkeypatch.setattr(registry.REGISTRY, "epoch", registry.REGISTRY.epoch + 1)  # as when newer kernels are compiled
    for k in range(5):
        np.testing.assert_allclose(f(Tensor(np.full(4, k, dtype=np.float32))).numpy(), np.full(4, k + 7))
    assert f._last.direct is not old and old_runs and not any(old_runs)  # only the new plan's one ran


@pytest.mark.parametrize("library", ["trio", "asyncio", "blocking"])
def test_a_direct_replays_small_result_is_made_by_fresh_small_and_counts_like_the_general_replay(
        library, monkeypatch):
    """A direct replay's fresh 16-element result gets its memory and ledger record from hcq/device.py's
    `fresh_small` (one step, its version set there), and leaves what the general replay
    leaves: the result's version, the value numpy computes, the device's byte count."""
    from atensor.jit import direct
    made = []
    original = direct.fresh_small

    def counting(device, spec, version, key):
        made.append(version)
        return original(device, spec, version, key)
    monkeypatch.setattr(direct, "fresh_small", counting)

    def body(x: Tensor) -> Tensor:
        return x * 3 - 1

    x_np = np.linspace(-2, 2, 16, dtype=np.float32)
    versions_seen = []

    def check(y: Tensor, want: np.ndarray) -> np.ndarray:
        """Notes the result's version; the value the next result must hold."""
        versions_seen.append(ledger.version(y.node.arg[0]))
        return want * 3 - 1

    if library == "blocking":
        step = atensor.jit(body)
        y, want = Tensor(x_np).contiguous(), x_np * 3 - 1
        for _ in range(16):
            y = step(y)
            np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)
            want = check(y, want)
    else:
        @atensor.jit
        async def step(x: Tensor) -> Tensor:
            return body(x)

        async def main() -> None:
            y, want = Tensor(x_np).contiguous(), x_np * 3 - 1
            for _ in range(16):
                y = await step(y)
                np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)
                want = check(y, want)
        run_on(library, main)
    assert len(made) >= 8 and set(made) == {1}  # the direct replays made their result here, at version 1
    assert set(versions_seen) == {1}  # every call's result (eager, general and direct replays alike)
