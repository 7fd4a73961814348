"""A hot eager graph waits for its kernels from the background compiler (engine/program.py's twin,
backend/c/registry.py's compile thread). A tight loop of eager round trips holds the GIL on its thread;
CPython hands the GIL to a waiting thread by force only after a whole switch interval without a release,
and an event loop's instants of release (its epoll) restart that interval each time: the compile thread
did not get the GIL, and the hot template stayed on its general path ("compiling") for thousands of
calls. The waiting template now gives the compile thread turns (`registry.give_turn`).

Measured with loops of `await (x + 1).realize()` in fresh processes, AMD EPYC Zen 5, 2 cores: with the
turns the twin's kernels were compiled after 9-68 round trips in every loop (52 loops, load 2-6); before,
11 of 22 loops of 3000 round trips never saw them at load 1.6-2, and at load 5-6 they took 11-644. That
outcome hangs on thread wake-up races; here it is made certain: while the loop runs, the switch interval
is far longer than the test, so no forced hand-over happens and the compile thread gets the GIL only when
the loop gives it: without the turns, the blocking loop's 20,000 round trips never saw the replay (3 of 3
runs; the awaited loops' epoll releases gave the waiter chances, and they passed without them). The
compile itself (the C compiler, not what is measured) is done before the loop starts; what is left for
the compile thread, once let go, is the Python that binds the compiled code to the template's kernels."""
from __future__ import annotations

import itertools
import sys
import threading

import pytest

from atensor import Tensor
from atensor.backend.c import compiler, registry
from atensor.engine import program as program_module
from tests.engine.loops import count_record_runs, run_on

pytestmark = [pytest.mark.default_settings,
              pytest.mark.skipif(compiler.path() is None, reason="no C compiler: no background compile")]

LIMIT = 20_000  # round trips a loop runs at most
BOUND = 300     # the first eager replay must come by then (measured: after 5)
NO_FORCED_SWITCH_S = 60.0  # the switch interval while the loop runs
_NEW = itertools.count(1)


@pytest.mark.parametrize("loop", ["blocking", "trio", "asyncio"])
def test_a_tight_loop_of_eager_round_trips_gives_the_background_compile_its_turn(loop, monkeypatch):
    monkeypatch.setattr(program_module, "HOT_HITS", 2)
    recorded = count_record_runs(monkeypatch)
    holding, compiled, let_go = threading.Event(), threading.Event(), threading.Event()
    prepare = registry.prepare

    def held_prepare(kernels):
        """Once `holding`, the compile thread's job in two: the compile (done while the test waits), then
        held; let go, the binding of the compiled code to the template's kernels (Python: it needs the GIL)."""
        if not holding.is_set():  # another template's kernels (x's copy is hot after a few tests)
            return prepare(kernels)
        prepare(kernels)
        with registry.REGISTRY.lock:  # unregistered again: the next prepare binds them by their code
            for ast, _ in kernels:
                registry.REGISTRY.kernels.pop(ast, None)
        compiled.set()
        let_go.wait()  # the compile thread waits without the GIL, as it does for the C compiler
        return prepare(kernels)
    monkeypatch.setattr(registry, "prepare", held_prepare)
    scale = 1.0 + next(_NEW) / 8  # a kernel no earlier test of this process compiled
    x = Tensor.zeros(19, device="CPU:0").contiguous()
    x.realize().wait()
    registry.wait_background()
    holding.set()

    def hot() -> None:  # hot after 2 hits: its kernel handed to the compile thread, compiled, held
        for _ in range(10):
            (x * scale + 2).realize().wait()
        assert compiled.wait(120) and not recorded, recorded

    async def awaited() -> int:
        for _ in range(10):
            await (x * scale + 2).realize()
        assert compiled.wait(120) and not recorded, recorded
        let_go.set()
        calls = 0
        while not recorded and calls < LIMIT:
            y = x * scale + 2
            await y.realize()
            calls += 1
        assert y.tolist() == [2.0] * 19
        return calls

    def blocking() -> int:
        hot()
        let_go.set()
        calls = 0
        while not recorded and calls < LIMIT:
            y = (x * scale + 2).realize().wait()
            calls += 1
        assert y.tolist() == [2.0] * 19
        return calls

    found = sys.getswitchinterval()
    sys.setswitchinterval(NO_FORCED_SWITCH_S)
    try:
        calls = blocking() if loop == "blocking" else run_on(loop, awaited)
    finally:
        sys.setswitchinterval(found)
        let_go.set()
        registry.wait_background()
    assert calls <= BOUND, f"{loop}: {calls} round trips before the first eager replay"
