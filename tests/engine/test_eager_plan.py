"""The Plan an eager realize keeps on a schedule-cache template (engine/realize.py `program_of`): a graph
structured like one realized before is submitted by filling that plan's slots with its own buffers,
without building or lowering its TaskGraph. In the default configuration (race checks off), as users
run: with race proofs on, every realize builds its graph to prove it."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from atensor import Tensor, ledger
from atensor.graph.ops import Ops
from atensor.engine import realize
from atensor.sched import cache

pytestmark = pytest.mark.default_settings


@pytest.fixture
def looked_up(monkeypatch) -> list:
    """What each schedule-cache lookup returned (a template on a hit, None on a miss), in order."""
    found: list = []
    original = cache.lookup

    def spy(key: cache.GraphKey):
        template = original(key)
        found.append(template)
        return template
    monkeypatch.setattr(cache, "lookup", spy)
    return found


def test_a_repeated_eager_chain_runs_the_kept_plan_and_computes_what_numpy_does(looked_up):
    rng = np.random.default_rng(0)
    ref = rng.random(16, dtype=np.float32)
    plans = set()
    for k in range(6):
        x = Tensor(ref + k)  # another input buffer each time, one structure
        y = ((x * 2).contiguous() - 1).exp2()  # two kernels: a temporary buffer between them
        looked_up.clear()
        y.realize().wait()
        expect_y = np.exp2(((ref + k) * 2) - 1)
        np.testing.assert_allclose(y.numpy(), expect_y, rtol=1e-6)
        assert len(looked_up) == 1  # this realize's own lookup
        if k >= 1:  # the first use of a structure schedules it; from the first hit on, its plan is kept
            template = looked_up[0]
            assert template is not None, f"realize {k} missed the schedule cache"
            assert template in realize._programs, "the hit did not submit its template's captured program"
            plans.add(id(realize.program_of(template).plan()))
    assert len(plans) == 1  # one Plan, submitted again with other buffers


@pytest.mark.usefixtures("young_heap")  # gc.collect() traverses the test's objects only
def test_the_kept_plan_does_not_keep_the_buffers_of_the_graph_it_was_lowered_from():
    x = Tensor(np.ones(16, dtype=np.float32))
    refs = []
    for _ in range(4):
        y = (x + 3).contiguous() * 2
        y.realize().wait()
        assert y.tolist() == [8.0] * 16
        refs.append(weakref.ref(y.node.base().arg[0]))  # the output buffer's spec
        del y
    gc.collect()
    assert all(r() is None for r in refs)  # every output buffer went with its tensor


def test_assigns_through_the_kept_plan_count_versions_and_stale_reads_still_raise():
    from atensor.ledger.versions import StaleReadError
    acc = Tensor(np.zeros(8, dtype=np.float32)).contiguous()
    acc.realize().wait()
    for k in range(5):
        acc.assign(acc + k)
        acc.realize().wait()
    assert acc.tolist() == [10.0] * 8
    spec = acc.node.base().arg[0]
    assert ledger.version(spec) == 6  # the first realize made version 1
    old = Tensor(np.ones(8, dtype=np.float32)).contiguous()
    old.realize().wait()
    for _ in range(3):  # the same structure each time: the kept plan runs it
        lazy = old * 2
        old.assign(old + 1)
        old.realize().wait()
        with pytest.raises(StaleReadError):
            lazy.realize().wait()


def test_a_failing_kernel_through_the_kept_plan_fails_its_readers_and_leaves_the_device_usable():
    for k in range(4):  # the same failing structure again and again: kept from the second on
        bad = Tensor([2, 3], dtype="int32") ** Tensor([-1, -2 - k], dtype="int32")
        with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
            bad.realize().wait()
        with pytest.raises(RuntimeError, match="failed"):
            (bad + 1).realize().wait()
        good = Tensor([1.0, 2.0]) * (3 + k)
        good.realize().wait()
        assert good.tolist() == [3.0 + k, 6.0 + 2 * k]


def test_a_kept_plan_runs_a_copy_between_devices():
    src = np.arange(16, dtype=np.float32)
    for k in range(4):
        y = (Tensor(src) + k).to("CPU:1") * 2
        y.realize().wait()
        assert y.device == "CPU:1"
        np.testing.assert_array_equal(y.numpy(), (src + k) * 2)
        assert y.node.base().op is Ops.BUFFER
