"""An eager realize whose graph hits a hot template with a light twin runs as an `EagerReplay`
(engine/eager_replay.py): from the caller's thread, no job, its handle finished when `realize()`
returns. Each test checks that the replay ran (so none passes on the general path alone) and compares
it with the general path (the replay declined by `EagerReplay.of` returning None): the same values,
the same ledger state, the same failures. numpy is the reference. Without a C compiler
(tests/engine/test_no_compiler.py hides it) no twin is made, and the tests check the replay never
ran. Run as users run (race checks off), under trio and asyncio."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import trio

from atensor import Tensor, ledger
from atensor.backend.c import compiler, registry
from atensor.engine import eager_replay, program as program_module
from atensor.engine.plan import Plan
from atensor.hcq.buffer import Buffer
from atensor.ledger.versions import StaleReadError

pytestmark = pytest.mark.default_settings
COMPILED = compiler.path() is not None


@pytest.fixture
def replays(monkeypatch) -> list[int]:
    """One entry per EagerReplay run; a template is hot after 2 hits."""
    monkeypatch.setattr(program_module, "HOT_HITS", 2)
    runs: list[int] = []
    run = eager_replay.EagerReplay.run

    def counting(self, key, template, roots, result):
        handle = run(self, key, template, roots, result)
        if handle is not False:  # (False: declined, nothing ran)
            runs.append(len(roots))
        return handle
    monkeypatch.setattr(eager_replay.EagerReplay, "run", counting)
    return runs


def _general_path_only(monkeypatch) -> None:
    """Every hot hit declines its EagerReplay (none is made, a kept one is invalid)."""
    monkeypatch.setattr(eager_replay.EagerReplay, "of", staticmethod(lambda program: None))
    monkeypatch.setattr(eager_replay.EagerReplay, "valid", lambda self: False)


def _expect(runs: list[int], at_least: int) -> None:
    if COMPILED:
        assert len(runs) >= at_least, runs
    else:
        assert runs == []


def _run(library: str, main):
    return trio.run(main) if library == "trio" else asyncio.run(main())


def _warm(step) -> None:
    """Runs `step()` until its template is hot, its kernels compiled and its twin's record made."""
    for _ in range(3):
        step()
    registry.wait_background()
    for _ in range(4):
        step()


def _ledger_state(t: Tensor, lazy) -> tuple:
    """What the ledger says of a realized tensor, in terms that do not name its buffer: its version, its
    head, whether a realize still claims it, and where the value of `lazy` (the node it computed) lives."""
    node = t.node
    base = node.base()
    spec, version = base.arg
    value = ledger.value(lazy)
    return (base.op.name, version, ledger.version(spec), ledger.head(spec), ledger.claimed(spec),
            value is not None and value.base().arg == (spec, version), ledger.pending_heads(),
            Buffer.of(spec).failure is None)


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_awaited_loop_runs_as_eager_replays_and_equals_the_general_path(library, replays, monkeypatch):
    def loop_values(rows: int) -> tuple[list[float], tuple]:
        async def main():
            x = Tensor.zeros(rows).contiguous()
            await x.realize()
            for k in range(12):
                lazy_x = x * 2 + 1
                x = lazy_x
                lazy = x.node
                handle = x._dispatch()
                if k >= 8 and COMPILED and replays:
                    assert handle.done()  # it ran while it was issued: the await is a checkpoint only
                await handle
                if k == 4:
                    registry.wait_background()
            return x.tolist(), _ledger_state(x, lazy.src[0] if lazy.op.name == "VIEW" else lazy)
        return _run(library, main)

    values, state = loop_values(24)
    assert values == [2.0 ** 12 - 1] * 24
    _expect(replays, 4)
    replays.clear()
    _general_path_only(monkeypatch)
    general_values, general_state = loop_values(24)
    assert replays == []
    assert general_values == values
    assert general_state == state


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_replay_binds_each_realizes_inputs_temporaries_and_outputs(library, replays):
    rng = np.random.default_rng(5)

    async def main():
        kept = []
        for k in range(14):
            a_np, b_np = rng.random(16, dtype=np.float32), rng.random(16, dtype=np.float32)
            a, b = Tensor(a_np), Tensor(b_np)
            y = (a - b).contiguous() * 3 + a  # two kernels: a temporary between them
            z = (a + b) * 0.5
            await y.realize(z)  # two outputs, one realize
            np.testing.assert_allclose(y.numpy(), (a_np - b_np) * 3 + a_np, rtol=1e-6)
            np.testing.assert_allclose(z.numpy(), (a_np + b_np) * 0.5, rtol=1e-6)
            kept.append((y, z, a_np, b_np))
            if k == 3:
                registry.wait_background()
        for y, z, a_np, b_np in kept:  # each hit wrote buffers of its own
            np.testing.assert_allclose(y.numpy(), (a_np - b_np) * 3 + a_np, rtol=1e-6)
            np.testing.assert_allclose(z.numpy(), (a_np + b_np) * 0.5, rtol=1e-6)
    _run(library, main)
    _expect(replays, 6)


def test_a_read_of_a_failed_tasks_contents_declines_and_the_general_path_raises(replays):
    def step(x: Tensor) -> Tensor:
        return (x - 2).contiguous().realize().wait()
    _warm(lambda: step(Tensor(np.zeros(12, dtype=np.float32))))
    bad = Tensor(np.zeros(12, dtype=np.float32)).realize().wait()
    Buffer.of(bad.node.base().arg[0]).failure = RuntimeError("the kernel that wrote it failed")
    replays.clear()
    with pytest.raises(RuntimeError, match="failed"):
        step(bad)
    assert replays == []
    good = step(Tensor(np.full(12, 4.0, dtype=np.float32)))
    assert good.tolist() == [2.0] * 12
    _expect(replays, 1)


def test_a_stale_read_declines_and_the_general_path_raises_stale_read_error(replays):
    def step(x: Tensor) -> Tensor:
        return (x * 5).contiguous().realize().wait()
    _warm(lambda: step(Tensor(np.ones(10, dtype=np.float32))))
    a = Tensor(np.ones(10, dtype=np.float32)).realize().wait()
    lazy = (a * 5).contiguous()  # reads version 0 of a's buffer
    a.assign(Tensor(np.zeros(10, dtype=np.float32))).realize().wait()  # version 1
    replays.clear()
    with pytest.raises(StaleReadError):
        lazy.realize().wait()
    assert replays == []
    assert step(Tensor(np.full(10, 2.0, dtype=np.float32))).tolist() == [10.0] * 10
    _expect(replays, 1)


@pytest.mark.skipif(not COMPILED, reason="without a compiler no plan has a record to run")
@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_run_that_raises_is_committed_and_raised_at_the_await_like_the_general_path(library, replays,
                                                                                      monkeypatch):
    """A failure inside the record's run (native kernels cannot fail: a failed allocation, say) leaves
    the ledger as the general path leaves a failed submission: the version committed, the output buffer
    marked failed, the error raised at the await and again at every later read."""
    def outcome(rows: int) -> tuple:
        async def main():
            x = Tensor(np.ones(rows, dtype=np.float32))
            for k in range(10):
                y = (x + 7).contiguous()
                await y.realize()
                if k == 3:
                    registry.wait_background()
            run_record = Plan.run_record

            def failing(plan, new_specs):
                raise MemoryError("no memory for the output")
            monkeypatch.setattr(Plan, "run_record", failing)
            y = (x + 7).contiguous()
            lazy = y.node
            with pytest.raises(MemoryError, match="no memory"):
                await y.realize()
            monkeypatch.setattr(Plan, "run_record", run_record)
            state = _ledger_state(y, lazy)
            with pytest.raises(RuntimeError, match="no memory"):
                y.numpy()
            return state
        return _run(library, main)

    state = outcome(20)
    if COMPILED:
        assert replays and state[1:3] == (1, 1) and state[-1] is False, state
    replays.clear()
    _general_path_only(monkeypatch)
    general = outcome(20)
    assert replays == []
    assert general == state


def test_a_profiled_or_busy_hit_takes_the_general_path(replays):
    import atensor

    def step(k: float) -> None:
        y = ((Tensor(np.full(8, k, dtype=np.float32)) * 2).contiguous() - 1).realize().wait()
        assert y.tolist() == [2.0 * k - 1] * 8
    _warm(lambda: step(0.0))
    _expect(replays, 1)
    replays.clear()
    with atensor.profile() as prof:
        step(3.0)
    assert replays == []
    assert len([s for s in prof.spans if s.kind == "kernel"]) == 2  # one span per task
    step(4.0)
    _expect(replays, 1)


def test_a_declined_hit_hands_its_walk_to_schedule_so_the_graph_is_walked_once(replays, monkeypatch):
    """What `_hot_hit` found (the key and template, or that the walk met a realized value) goes on to
    `schedule`: one walk per realize, and a realized value in the graph is read from its buffer."""
    from atensor.sched import cache
    walks: list[int] = []
    walk_key = cache.walk_key

    def counting(roots, settings, has_entry):
        walks.append(len(roots))
        return walk_key(roots, settings, has_entry)
    monkeypatch.setattr(cache, "walk_key", counting)
    x = Tensor(np.arange(6, dtype=np.float32)).realize().wait()
    a = (x + 1).contiguous()
    held = a.node  # (held: the ledger keeps a realized value as long as its node lives)
    a.realize().wait()  # a miss: walked once, then scheduled afresh
    assert len(walks) == 1
    b = ((x + 1).contiguous() * 2).realize().wait()  # the same (interned) x + 1: its value is a's buffer
    assert len(walks) == 2
    assert b.tolist() == [2.0 * (k + 1) for k in range(6)]
    assert replays == []
    del held  # (alive until b was scheduled)


def test_an_unrelated_pending_assign_stays_pending_and_one_the_graph_overwrites_goes_along(replays):
    """A lazy assign elsewhere does not stop the replay (and stays pending); one that reads a version
    the graph overwrites must be realized along, before the overwrite: the replay declines and the
    general path takes it along (ledger/versions.py `_flush_along`)."""
    def step(x: Tensor) -> Tensor:
        return (x * 3).contiguous().realize().wait()
    _warm(lambda: step(Tensor(np.ones(14, dtype=np.float32))))
    elsewhere = Tensor(np.zeros(5, dtype=np.float32)).realize().wait()
    elsewhere.assign(Tensor(np.ones(5, dtype=np.float32)) * 4)  # pending, unrelated
    replays.clear()
    assert step(Tensor(np.full(14, 2.0, dtype=np.float32))).tolist() == [6.0] * 14
    _expect(replays, 1)
    from atensor.ledger import versions
    assert len(versions.pending_heads()) >= 1  # still pending: not realized along
    assert elsewhere.tolist() == [4.0] * 5
    # a graph that realizes a pending assign into x along (x's node is that assign) overwrites x: a
    # pending assign that reads x's older version must go first
    def step_over(value: float, saved=None) -> tuple:
        x = Tensor(np.full(14, value, dtype=np.float32)).realize().wait()
        if saved is not None:
            saved.assign(x + 0)  # pending: reads x's version 0
        x.assign(x * 3)  # pending: overwrites it
        y = (x + 1).contiguous().realize().wait()
        return x, y
    _warm(lambda: step_over(1.0))
    replays.clear()
    x, y = step_over(2.0)
    assert x.tolist() == [6.0] * 14 and y.tolist() == [7.0] * 14
    _expect(replays, 1)
    saved = Tensor(np.zeros(14, dtype=np.float32)).realize().wait()
    replays.clear()
    x, y = step_over(5.0, saved)
    assert replays == []
    assert saved.tolist() == [5.0] * 14 and x.tolist() == [15.0] * 14 and y.tolist() == [16.0] * 14


def test_unrelated_pending_assigns_bigger_than_the_inline_bound_leave_the_hot_hit_on_the_callers_thread(replays):
    """Pending assigns are counted against INLINE_MAX_NODES only when the general path plans (it may
    take them along); a hot hit takes none along, so a program's big unrealized assigns elsewhere do
    not send every small realize to the dispatcher thread (they stay pending, and realize as before)."""
    from atensor.engine.realize import INLINE_MAX_NODES
    from atensor.ledger import versions

    def step(x: Tensor) -> Tensor:
        return (x * 3).contiguous().realize().wait()
    _warm(lambda: step(Tensor(np.ones(14, dtype=np.float32))))
    big = Tensor(np.zeros(6, dtype=np.float32)).realize().wait()
    chain = big
    for k in range(INLINE_MAX_NODES):
        chain = chain + k
    big.assign(chain)  # pending: more nodes than the inline bound
    replays.clear()
    assert step(Tensor(np.full(14, 2.0, dtype=np.float32))).tolist() == [6.0] * 14
    _expect(replays, 1)
    assert len(versions.pending_heads()) >= 1  # not realized along
    expected = float(sum(range(INLINE_MAX_NODES)))
    assert big.tolist() == [expected] * 6
