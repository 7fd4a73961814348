"""An eager realize on one OpenCL device whose graph hits a hot template runs as an `EagerReplay` of its
twin's lean CL replay (engine/eager_replay.py, engine/cl_replay.py): submitted from the caller's thread
with no job, committed while the device runs, then polled, so a short kernel's handle is finished when
`realize()` returns. Each test checks that this path ran (so none passes on the general path alone) and
compares it with the general path (the replay declined by `EagerReplay.of` returning None): the same
values, the same ledger state, the same failures. numpy is the reference; trio and asyncio both."""
from __future__ import annotations

import numpy as np
import pytest

import atensor
from atensor import Tensor, ledger
from atensor.engine import eager_replay, program as program_module
from atensor.engine.cl_replay import CLReplay
from atensor.engine.handle import RealizeHandle
from atensor.hcq.device import Device
from atensor.hcq.queue import KernelError
from tests.engine.loops import run_on

pytestmark = pytest.mark.default_settings  # as users run: realizes planned inline


@pytest.fixture(autouse=True)
def no_pending_assigns(monkeypatch) -> None:
    """Hides the assigns earlier tests of the process left pending (some stale: they raise when realized,
    so they stay pending): beside more of their nodes than INLINE_MAX_NODES the general path plans on the
    dispatcher thread, not inline as these tests compare (engine/realize.py). They read none of these
    tests' buffers; the eager replay beside pending assigns is tests/engine/test_eager_replay.py's."""
    from atensor.ledger import versions
    left = set(versions.pending_heads())
    pending_heads = versions.pending_heads
    monkeypatch.setattr(versions, "pending_heads", lambda: [h for h in pending_heads() if h not in left])


@pytest.fixture
def replays(monkeypatch) -> list[bool]:
    """One entry per EagerReplay run (True: through the lean CL replay); a template is hot after 2 hits."""
    monkeypatch.setattr(program_module, "HOT_HITS", 2)
    runs: list[bool] = []
    run = eager_replay.EagerReplay.run

    def counting(self, key, template, roots, result):
        handle = run(self, key, template, roots, result)
        if handle is not False:  # (False: declined, nothing ran)
            runs.append(self.lean is not None)
        return handle
    monkeypatch.setattr(eager_replay.EagerReplay, "run", counting)
    return runs


@pytest.fixture
def leans(monkeypatch) -> list[CLReplay]:
    """One entry per submission of a lean CL replay (the record it used), on either path."""
    calls: list[CLReplay] = []
    bind = CLReplay.bind

    def counting(self: CLReplay, new_specs: list):
        calls.append(self)
        return bind(self, new_specs)
    monkeypatch.setattr(CLReplay, "bind", counting)
    return calls


def _general_path_only(monkeypatch) -> None:
    """Every hot hit declines its EagerReplay (none is made, a kept one is invalid)."""
    monkeypatch.setattr(eager_replay.EagerReplay, "of", staticmethod(lambda program: None))
    monkeypatch.setattr(eager_replay.EagerReplay, "valid", lambda self: False)


def _ledger_state(t: Tensor, lazy) -> tuple:
    """What the ledger says of a realized tensor, in terms that do not name its buffer (as
    tests/engine/test_eager_replay.py reads it)."""
    base = t.node.base()
    spec, version = base.arg
    value = ledger.value(lazy)
    return (base.op.name, version, ledger.version(spec), ledger.head(spec), ledger.claimed(spec),
            value is not None and value.base().arg == (spec, version), ledger.pending_heads())


def _lazy_of(t: Tensor):
    node = t.node
    return node.src[0] if node.op.name == "VIEW" else node


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hot_eager_cl_loop_runs_its_lean_replay_from_the_caller_and_equals_the_general_path(
        library, replays, monkeypatch):
    compute = Device.get("CL").compute

    def loop(rows: int) -> tuple[list[float], tuple, list[bool]]:
        async def main():
            x = Tensor.zeros(rows, device="CL").contiguous()
            await x.realize()
            done = []
            for k in range(14):
                x = x * 2 + 1
                lazy = _lazy_of(x)
                before = compute.commands_run
                handle = x._dispatch()
                done.append(handle.done())  # (a short kernel: waited for while it was issued)
                await handle
                if k >= 8:
                    assert compute.commands_run - before == 1  # its one command
            stats = compute.statistics()
            assert stats["pending_commands"] == 0 and stats["signal"] == stats["reserved"], stats
            return x.tolist(), _ledger_state(x, lazy), done
        return run_on(library, main)

    values, state, done = loop(20)
    assert values == [2.0 ** 14 - 1] * 20
    assert len(replays) >= 6 and all(replays), replays  # the lean replay, from the caller's thread
    # a short kernel is published on the calling thread (hcq/cl_queue.py): most handles are finished
    # (one preempted past the queue's short bound on a loaded machine leaves a handle, awaited as any)
    assert done[-6:].count(True) >= 3, done
    replays.clear()
    _general_path_only(monkeypatch)
    general_values, general_state, _ = loop(20)
    assert replays == []
    assert general_values == values
    assert general_state == state


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_hit_still_running_when_submitted_gets_a_handle_on_its_submission(library, replays, monkeypatch):
    """When the poll after the submission does not find the command done, the realize returns a handle on
    the submission (no job), which the await waits on; each hit writes a buffer of its own."""
    monkeypatch.setattr(eager_replay, "finished_here", lambda submission: False)
    rng = np.random.default_rng(7)

    async def main():
        x = Tensor(rng.standard_normal(12).astype(np.float32), device="CL")
        await x.realize()
        x_np = x.numpy()
        kept = []
        for k in range(10):
            x = (x * 0.5 - 1).relu() + x  # on its own result: each hit reads the last one's buffer
            x_np = np.maximum(x_np * 0.5 - 1, 0) + x_np
            handle = x._dispatch()
            if replays:
                assert type(handle) is RealizeHandle and handle.job.submission is not None
            await handle
            kept.append((x, x_np))
        for y, y_np in kept:
            np.testing.assert_allclose(y.numpy(), y_np, rtol=1e-6)
    run_on(library, main)
    assert len(replays) >= 4 and all(replays), replays


@pytest.mark.parametrize("library", ["trio", "asyncio"])
def test_a_failed_launch_is_raised_at_the_await_and_its_result_refused_like_the_general_path(
        library, replays, leans, monkeypatch):
    """A launch that fails (an enqueue that raises, injected into the lean replay's one command) leaves
    the ledger as the general path leaves it: the version committed, KernelError raised at the await,
    the result refused as an input (the replay declines that read; the general path raises it), and the
    next hit runs again."""
    def outcome(rows: int) -> tuple:
        async def main():
            x = Tensor.full((rows,), 2.0, device="CL").contiguous()
            await x.realize()
            for _ in range(8):
                await (x + 7).realize()
            assert leans, "the hot hits ran no lean CL replay"
            lean = leans[-1]  # the twin's, which the general path's hits submit too
            good = lean.runner.enqueue, lean.runner.launch  # pyopencl's enqueue, the compiled launch

            def refuse(*_):
                raise RuntimeError("out of resources (injected)")
            lean.runner.enqueue = refuse
            if lean.runner.launch is not None:
                lean.runner.launch = refuse
            try:
                y = x + 7
                lazy = _lazy_of(y)
                ran = len(replays)
                with pytest.raises(KernelError, match="injected"):
                    await y.realize()
            finally:
                lean.runner.enqueue, lean.runner.launch = good
            state = _ledger_state(y, lazy)
            ran_failed = len(replays) - ran
            ran = len(replays)
            with pytest.raises(RuntimeError, match="failed"):
                await (y + 7).realize()  # the same template, reading the failed result
            declined = len(replays) == ran
            again = x + 7
            await again.realize()
            assert again.tolist() == [9.0] * rows
            with pytest.raises(RuntimeError, match="injected"):
                y.numpy()
            return state, ran_failed, declined
        return run_on(library, main)

    state, ran_failed, declined = outcome(18)
    assert ran_failed == 1 and declined and replays and all(replays), (ran_failed, declined, replays)
    assert state[1:3] == (1, 1), state  # committed: the version advanced as the general path's
    replays.clear()
    _general_path_only(monkeypatch)
    general, ran_failed, _ = outcome(18)
    assert replays == [] and ran_failed == 0
    assert general == state


def test_a_profiled_hit_takes_the_general_path_with_a_span_per_kernel(replays):
    x = Tensor.full((8,), 1.0, device="CL").contiguous().realize().wait()
    expected = 1.0

    def step() -> None:
        nonlocal x, expected
        x = (x * 2 + 1).realize().wait()
        expected = expected * 2 + 1
        assert x.tolist() == [expected] * 8
    for _ in range(6):
        step()
    assert replays and all(replays)
    replays.clear()
    with atensor.profile() as prof:
        step()
    assert replays == []
    assert [s for s in prof.spans if s.kind == "kernel"]
    for _ in range(3):  # (the twin's plan is lowered again after a profile: its replay follows)
        step()
    assert replays and all(replays), replays
