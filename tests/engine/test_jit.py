"""atensor.jit: capture a step once, replay it. A replayed call gives what the plain function gives
(numpy and the un-jitted function are the references), without calling the function."""
from __future__ import annotations

import time

import numpy as np
import pytest
import trio
from hypothesis import given, strategies as st

import atensor
from atensor import Tensor, nn
from atensor.nn import optim
from atensor.profiler import ticking


def _data(seed: int, shape: tuple[int, ...] = (4, 3)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


async def test_replays_after_capture_and_verify_without_calling_the_function():
    calls = 0

    @atensor.jit
    async def f(x: Tensor, y: Tensor) -> Tensor:
        nonlocal calls
        calls += 1
        return (x * 2 + y).relu().sum(axis=1)

    for i in range(6):
        x, y = _data(i), _data(100 + i)
        out = await f(Tensor(x), Tensor(y))
        np.testing.assert_allclose(out.numpy(), np.maximum(x * 2 + y, 0).sum(1), rtol=1e-6)
    assert calls == 3  # the first call, the captured one, the verifying one
    assert f.stats == {"calls": 6, "replays": 3, "captures": 1}


async def test_results_of_earlier_calls_keep_their_values():
    @atensor.jit
    async def f(x: Tensor) -> tuple[Tensor, dict]:
        return x + 1, {"double": x * 2, "label": "ok"}

    results = [await f(Tensor(_data(i))) for i in range(6)]
    for i, (plus, extra) in enumerate(results):
        np.testing.assert_allclose(plus.numpy(), _data(i) + 1)
        np.testing.assert_allclose(extra["double"].numpy(), _data(i) * 2)
        assert extra["label"] == "ok"


async def test_other_shapes_and_plain_arguments_capture_separately():
    @atensor.jit
    async def f(x: Tensor, scale: float) -> Tensor:
        return x * scale

    for i in range(24):  # six keys, four calls each
        shape, scale = [(2, 3), (5,)][i % 2], [0.5, 3.0, -1.0][i % 3]
        x = np.random.default_rng(i).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose((await f(Tensor(x), scale)).numpy(), x * scale, rtol=1e-6)
    assert f.stats["captures"] == 6 and f.stats["replays"] == 6


async def test_state_updated_by_assign_persists_across_replays():
    acc = Tensor(np.zeros(3, dtype=np.float32))

    @atensor.jit
    async def add(x: Tensor) -> Tensor:
        acc.assign(acc + x)
        await acc.realize()
        return acc * 1

    total = np.zeros(3, dtype=np.float32)
    for i in range(7):
        x = _data(i, (3,))
        total += x
        out = await add(Tensor(x))
        np.testing.assert_allclose(out.numpy(), total, rtol=1e-6)
    np.testing.assert_allclose(acc.numpy(), total, rtol=1e-6)
    assert add.stats["replays"] == 4


async def test_a_lazy_assign_before_the_call_takes_effect_first():
    scale = Tensor(np.ones(1, dtype=np.float32))

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return x * scale

    x = _data(0, (3,))
    for i in range(6):
        scale.assign(Tensor(np.array([float(i)], dtype=np.float32)))  # left lazy, as an LR schedule does
        np.testing.assert_allclose((await f(Tensor(x))).numpy(), x * i, rtol=1e-6)
    assert f.stats["replays"] == 3


async def test_an_unhashable_plain_argument_is_refused():
    @atensor.jit
    async def f(x: Tensor, other: np.ndarray) -> Tensor:
        return x + Tensor(other)

    with pytest.raises(atensor.JitError, match="ndarray is neither a Tensor nor hashable"):
        await f(Tensor(_data(0)), _data(1))


async def test_concurrent_calls_each_get_their_own_values():
    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return (x @ x.T).sum(axis=0)

    for i in range(4):  # capture and verify first
        await f(Tensor(_data(i, (16, 16))))
    got: dict[int, np.ndarray] = {}

    async def one(i: int) -> None:
        out = await f(Tensor(_data(i, (16, 16))))
        got[i] = out.numpy()

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one, i)
    for i in range(10):
        x = _data(i, (16, 16))
        np.testing.assert_allclose(got[i], (x @ x.T).sum(0), rtol=1e-5, atol=1e-5)


async def test_an_error_inside_a_replayed_kernel_surfaces_and_the_next_call_works():
    @atensor.jit
    async def power(x: Tensor, y: Tensor) -> Tensor:
        return x ** y

    x = Tensor(np.array([2, 3], dtype=np.int32))
    for _ in range(4):
        assert (await power(x, Tensor(np.array([1, 2], dtype=np.int32)))).tolist() == [2, 9]
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        await power(x, Tensor(np.array([-1, 2], dtype=np.int32)))
    assert (await power(x, Tensor(np.array([2, 1], dtype=np.int32)))).tolist() == [4, 3]
    assert power.stats["replays"] == 3


class _MLP:
    def __init__(self) -> None:
        self.layers = [nn.Linear(12, 16), nn.Linear(16, 5)]

    def __call__(self, x: Tensor) -> Tensor:
        return self.layers[1](self.layers[0](x).relu())


async def _train(devices: tuple[str, ...], use_jit: bool, fused: bool, steps: int = 7) -> list[float]:
    Tensor.manual_seed(3)
    net = _MLP()
    params = nn.get_parameters(net)
    if len(devices) > 1:
        for p in params:
            p.shard_(devices)
    await Tensor.realize(*params)
    opt = optim.Adam(params, lr=0.05, fused=fused)
    lr = optim.OneCycleLR(opt, max_lr=0.05, total_steps=steps + 1)

    async def step(x: Tensor, y: Tensor) -> Tensor:
        loss = nn.cross_entropy(net(x), y)
        opt.zero_grad()
        loss.backward()
        await opt.step(loss)
        return loss

    run = atensor.jit(step) if use_jit else step
    rng = np.random.default_rng(0)
    losses = []
    with Tensor.train():
        for _ in range(steps):
            x = rng.standard_normal((8, 12)).astype(np.float32)
            y = rng.integers(0, 5, 8).astype(np.int32)
            xt, yt = Tensor(x, device=devices[0]), Tensor(y, device=devices[0])
            if len(devices) > 1:
                xt, yt = xt.shard(devices, axis=0), yt.shard(devices, axis=0)
            losses.append((await run(xt, yt)).item())
            lr.step()
    if use_jit:
        assert run.stats["replays"] == steps - 3
    return losses


@pytest.mark.parametrize("devices,fused", [(("CPU:0",), False), (("CPU:0",), True), (("CPU:0", "CPU:1"), True)])
async def test_a_jitted_training_step_gives_the_losses_of_the_plain_one(devices, fused):
    plain = await _train(devices, use_jit=False, fused=fused)
    jitted = await _train(devices, use_jit=True, fused=fused)
    np.testing.assert_allclose(jitted, plain, rtol=1e-6)
    assert plain[-1] < plain[0]


async def test_training_mode_is_part_of_the_key():
    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return x * 2 if Tensor.training else x + 1

    x = _data(0)
    for _ in range(4):
        with Tensor.train():
            np.testing.assert_allclose((await f(Tensor(x))).numpy(), x * 2)
        np.testing.assert_allclose((await f(Tensor(x))).numpy(), x + 1)
    assert f.stats["replays"] == 2 and f.stats["captures"] == 2


async def test_a_jitted_method_binds_to_its_instance():
    class Scaler:
        def __init__(self, k: float) -> None:
            self.k = Tensor(np.array([k], dtype=np.float32))

        @atensor.jit
        async def __call__(self, x: Tensor) -> Tensor:
            return x * self.k

    x = _data(1, (3,))
    scaler = Scaler(3.0)
    for _ in range(5):
        np.testing.assert_allclose((await scaler(Tensor(x))).numpy(), x * 3, rtol=1e-6)


async def test_the_event_loop_keeps_ticking_while_replays_run():
    w = Tensor(_data(7, (384, 384)))

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return ((x @ w).relu() @ w * 0.001).exp().sum(axis=0)

    x = _data(8, (384, 384))
    for _ in range(3):
        await f(Tensor(x))
    async with ticking() as lag:
        start = time.perf_counter()
        for _ in range(8):
            out = await f(Tensor(x))
        elapsed = time.perf_counter() - start
    assert f.stats["replays"] == 8
    w_np = _data(7, (384, 384))
    np.testing.assert_allclose(out.numpy(), np.exp(np.maximum(x @ w_np, 0) @ w_np * 0.001).sum(0), rtol=1e-4)
    # a blocked loop would show a gap as long as a whole replay (tests/engine/test_async.py's GAP_BOUND)
    assert lag.worst < 0.1, (lag.worst, elapsed)


async def test_a_big_replay_goes_through_the_dispatcher_and_gives_the_same_values():
    from atensor.jit.jit import INLINE_MAX_REPLAY_TASKS

    @atensor.jit
    async def many(x: Tensor) -> list[Tensor]:
        return [(x * (i + 1)).contiguous().sum() for i in range(INLINE_MAX_REPLAY_TASKS + 20)]

    for seed in range(5):
        x = _data(seed, (8,))
        out = await many(Tensor(x))
        np.testing.assert_allclose([o.item() for o in out], [(x * (i + 1)).sum() for i in range(len(out))],
                                   rtol=1e-5)
    assert many.stats["replays"] == 2


def test_a_plain_function_is_jitted_as_tinygrad_does_outside_an_event_loop():
    calls = []

    @atensor.TinyJit
    def f(x: Tensor, y: Tensor) -> Tensor:
        calls.append(1)
        return (x @ y).relu()

    for i in range(6):
        x, y = _data(i, (4, 3)), _data(10 + i, (3, 5))
        np.testing.assert_allclose(f(Tensor(x), Tensor(y)).numpy(), np.maximum(x @ y, 0), rtol=1e-5, atol=1e-6)
    assert len(calls) == 3 and f.stats["replays"] == 3


async def test_a_plain_jitted_function_refuses_to_block_the_event_loop():
    @atensor.jit
    def f(x: Tensor) -> Tensor:
        return x + 1

    with pytest.raises(RuntimeError, match="would block the running trio event loop.*async def"):
        f(Tensor(_data(0)))


def test_a_plain_function_that_returns_an_awaitable_is_refused():
    async def inner(x: Tensor) -> Tensor:
        return x

    f = atensor.jit(lambda x: inner(x))
    with pytest.raises(atensor.JitError, match="returned an awaitable; declare it `async def`"):
        f(Tensor(_data(0)))


async def test_cancelling_a_replay_leaves_the_next_calls_correct():
    w = Tensor(_data(3, (256, 256)))

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return (x @ w @ w @ w).sum(axis=0)

    x = _data(4, (256, 256))
    w_np = _data(3, (256, 256))
    expected = (x @ w_np @ w_np @ w_np).sum(0)
    for _ in range(3):
        await f(Tensor(x))
    with trio.move_on_after(0.0001):  # cancels the wait for the replay; its work still runs
        await f(Tensor(x))
    out = await f(Tensor(x))
    np.testing.assert_allclose(out.numpy(), expected, rtol=2e-3)
    assert f.stats["replays"] == 2


async def test_many_distinct_keys_keep_bounded_state():
    @atensor.jit(max_programs=2)
    async def f(x: Tensor, k: float) -> Tensor:
        return x * k

    x = _data(0, (3,))
    for i in range(40):  # a new plain argument every call: never replayed, always right
        np.testing.assert_allclose((await f(Tensor(x), float(i))).numpy(), x * i, rtol=1e-6)
    assert len(f._programs) <= 2 and len(f._calls) <= 8 and f.stats["replays"] == 0


_CHAIN = {
    "neg": (lambda t: -t, np.negative), "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0)),
    "tanh": (lambda t: t.tanh(), np.tanh), "sq": (lambda t: t * t, lambda a: a * a),
    "add1": (lambda t: t + 1, lambda a: a + np.float32(1)), "T": (lambda t: t.T, lambda a: a.T),
    "flip0": (lambda t: t.flip(0), lambda a: np.flip(a, 0)), "step": (lambda t: t[::-2], lambda a: a[::-2]),
    "mulx": (None, None),  # multiplies by the second input: a jit input that is not the first
}


@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       ops=st.lists(st.sampled_from(sorted(_CHAIN)), min_size=1, max_size=6),
       reduce_axis=st.one_of(st.none(), st.integers(0, 2)), seed=st.integers(0, 2**16))
def test_replays_of_random_op_chains_match_numpy(shape, ops, reduce_axis, seed):
    @atensor.jit
    def chain(t: Tensor, k: Tensor) -> Tensor:
        for name in ops:
            t = t * k.reshape(()) if name == "mulx" else _CHAIN[name][0](t)
        return t.sum(reduce_axis) if reduce_axis is not None and reduce_axis < t.ndim else t

    rng = np.random.default_rng(seed)
    for _ in range(5):  # run, capture, verify, then two replays with new data
        a = rng.standard_normal(shape).astype(np.float32)
        k = rng.standard_normal(1).astype(np.float32)
        ref = a
        for name in ops:
            ref = ref * k[0] if name == "mulx" else _CHAIN[name][1](ref)
        if reduce_axis is not None and reduce_axis < ref.ndim:
            ref = ref.sum(axis=reduce_axis)
        np.testing.assert_allclose(chain(Tensor(a), Tensor(k)).numpy(), ref, rtol=1e-4, atol=1e-4)
    assert chain.stats["replays"] == 2


async def test_background_compile_returns_at_once_and_replays_switch_to_c(monkeypatch, tmp_path):
    """compile="background": the third call does not wait for the compiler; replays run the numpy
    kernels until the C ones are loaded, then the C ones, with the same values throughout."""
    from atensor.backend.c import compiler, programs, registry
    if compiler.path() is None:
        pytest.skip("no C compiler here: every kernel stays on numpy")
    real, started = compiler.compile_source, []

    def slow_compile(*args):
        started.append(time.perf_counter())
        time.sleep(0.5)
        return real(*args)
    monkeypatch.setattr(compiler, "compile_source", slow_compile)
    monkeypatch.setenv("ATENSOR_CACHE", str(tmp_path))

    @atensor.jit(compile="background")
    async def f(x: Tensor) -> Tensor:
        return ((x * 1.25).exp() - x).sum(0)
    x = np.random.default_rng(5).standard_normal((6, 9)).astype(np.float32)
    want = (np.exp(x * np.float32(1.25)) - x).sum(0)
    for _ in range(2):
        await f(Tensor(x))
    t0 = time.perf_counter()
    np.testing.assert_allclose((await f(Tensor(x))).numpy(), want, rtol=1e-5)  # verifies, starts the compile
    assert time.perf_counter() - t0 < 0.4
    np.testing.assert_allclose((await f(Tensor(x))).numpy(), want, rtol=1e-5)  # a replay, on numpy
    program = next(iter(f._programs.values()))
    kernels = [t.work.ast for r in program.records for t in r.tasks if hasattr(t.work, "ast")]
    await trio.to_thread.run_sync(registry.wait_background)
    assert started and kernels and all(registry.lookup(ast) is not None for ast in kernels)
    np.testing.assert_allclose((await f(Tensor(x))).numpy(), want, rtol=1e-5)  # re-lowered: C kernels
    in_use = [r.plans.get(programs.programs_available()) for r in program.records]
    assert all(p is not None and p.epoch == registry.REGISTRY.epoch for p in in_use)  # the last replay re-lowered them
    assert f.stats["replays"] == 2


def test_jit_rejects_an_unknown_compile_mode():
    with pytest.raises(ValueError, match="compile='soon'"):
        atensor.jit(lambda x: x, compile="soon")


async def test_plans_are_lowered_on_the_dispatcher_thread_not_the_event_loop(monkeypatch):
    """Lowering a captured graph (its first replay, or the first after kernels were compiled) is
    heavy Python: it runs on the dispatcher thread, once; the replays after it reuse the plan."""
    import threading

    from atensor.engine import plan
    from atensor.backend.c import compiler, programs, registry
    lowered_on: list[str] = []
    original = plan.Plan.__init__

    def recording_init(self, tasks, swapped=None, *args, **kwargs):
        if swapped is not None:  # a jit's plan (an eager realize's is submitted once)
            lowered_on.append(threading.current_thread().name)
        original(self, tasks, swapped, *args, **kwargs)
    monkeypatch.setattr(plan.Plan, "__init__", recording_init)

    @atensor.jit
    async def f(x: Tensor) -> Tensor:
        return (x * 2 + 1).sum(0)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for _ in range(5):
        np.testing.assert_allclose((await f(Tensor(x))).numpy(), (x * 2 + 1).sum(0))
    assert f.stats["replays"] == 2 and lowered_on == ["atensor-dispatch"]
    monkeypatch.setattr(registry.REGISTRY, "epoch", registry.REGISTRY.epoch + 1)  # as when new kernels are compiled
    for _ in range(2):
        np.testing.assert_allclose((await f(Tensor(x))).numpy(), (x * 2 + 1).sum(0))
    assert lowered_on == ["atensor-dispatch", "atensor-dispatch"]
