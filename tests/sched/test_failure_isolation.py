"""A failed realize leaves nothing behind that breaks other values (issue 17, defects 2 and 6).

- a StaleReadError in one realize does not make unrelated values or pending clones stale;
- the output ASSIGNs of a realize that failed before anything ran do not stay pending;
- a value whose kernel failed is not a cached result: the same graph built again is computed again;
- an assign whose graph failed after its commit is not presented as the buffer's new contents.
"""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor
from atensor.backend.numpy import render as numpy_backend
from atensor.ledger import versions
from atensor.sched.schedule import StaleReadError


def test_a_stale_read_breaks_neither_unrelated_values_nor_pending_clones() -> None:
    t = Tensor(np.ones(3, np.float32))
    t[...] = 7.5
    z = t * 2
    t[...] = 8.0
    w, c = t * 3, t.clone()
    assert t.tolist() == [8.0] * 3
    with pytest.raises(StaleReadError):
        z.tolist()
    assert w.tolist() == [24.0] * 3            # reads the newest version: not stale
    assert c.tolist() == [8.0] * 3             # docs/semantics.md: pending clones never go stale
    with pytest.raises(StaleReadError):        # the stale value stays an error, every time
        z.tolist()


def test_a_failed_realize_leaves_no_pending_assign() -> None:
    t = Tensor(np.ones(3, np.float32))
    t[...] = 2.0
    stale = [t * k for k in range(1, 6)]
    t[...] = 3.0
    t.realize().wait()
    before = len(versions.pending_heads())
    for s in stale:
        with pytest.raises(StaleReadError):
            s.numpy()
    assert len(versions.pending_heads()) == before
    assert (t + 1).tolist() == [4.0] * 3


@pytest.fixture
def failing_where_kernels(monkeypatch: pytest.MonkeyPatch):
    """numpy kernels whose name has `where` raise while the fixture is active (a stand-in for any
    kernel failure); the kernel cache is emptied around it so no failing kernel outlives it."""
    real = numpy_backend.render
    state = {"fail": True}

    def render(ast, name):
        source, env = real(ast, name)
        if state["fail"] and "where" in name:
            head, body = source.split(":\n", 1)
            source = f"{head}:\n    raise ValueError('injected failure')\n{body}"
        return source, env
    monkeypatch.setattr(numpy_backend, "render", render)
    numpy_backend._cache.clear()
    yield state
    numpy_backend._cache.clear()


def test_a_failed_kernel_does_not_poison_the_same_graph_built_again(failing_where_kernels) -> None:
    b, y = Tensor([[True]]), Tensor([[-1.25]])
    with pytest.raises(Exception, match="injected failure"):
        ((b.where(y, 2.0) + 1) * 2).tolist()
    failing_where_kernels["fail"] = False
    numpy_backend._cache.clear()
    # the same interned graph over the same inputs: computed again, not read from the failed buffer
    assert ((b.where(y, 2.0) + 1) * 2).tolist() == [[-0.5]]


def test_an_assign_whose_graph_failed_is_not_the_buffers_new_contents(failing_where_kernels) -> None:
    b, y = Tensor([[True]]), Tensor([[-1.25]])
    v = b.where(y, 2.0) + 1
    with pytest.raises(Exception, match="injected failure"):
        v.tolist()
    t = Tensor(np.zeros((1, 1), np.float32))
    t.assign(v)                                # reads v's storage, which a failed task wrote
    for _ in range(2):                         # never the old zeros as if the assign had run
        with pytest.raises(RuntimeError, match="failed"):
            t.tolist()
    t.assign(Tensor([[3.0]]))                  # a new write makes the buffer valid again
    assert t.tolist() == [[3.0]]


def test_raising_a_kept_failure_leaves_it_as_it_was_and_keeps_no_frame_of_the_raiser() -> None:
    """A failure a job or a signal keeps is raised to each waiter as a copy: the kept object's
    traceback does not grow by the frames of every waiter (which held their locals, such as a jit
    call's arguments, for as long as the failure was kept)."""
    import weakref

    from atensor.engine.handle import raise_kept

    class Marker:
        pass

    try:
        raise StaleReadError("version 0 was overwritten")
    except StaleReadError as exc:
        kept = exc
    first = kept.__traceback__

    def waiter() -> weakref.ref:
        marker = Marker()
        try:
            raise_kept(kept)
        except StaleReadError as exc:  # (not pytest.raises: its info would hold this frame)
            assert exc is not kept and exc.args == kept.args
            assert exc.__traceback__.tb_next is not None  # the kept traceback follows the raiser's
        else:
            pytest.fail("raise_kept returned")
        return weakref.ref(marker)

    gone = waiter()
    assert kept.__traceback__ is first and first.tb_next is None
    assert gone() is None
