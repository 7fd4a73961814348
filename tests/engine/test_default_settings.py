"""The realize, mutation and mode tests again, in atensor's default configuration: race checks off
(the rest of the suite proves every graph race-free, tests/conftest.py), so small realizes are
planned inline on the caller's thread (engine/realize.py) instead of on the dispatcher thread, as in
users' programs. Same tests, other path: both must give the same values and errors."""
from __future__ import annotations

import pytest

from tests.engine.test_async import *  # noqa: F401,F403 - collected again here, under the marker
from tests.engine.test_modes import *  # noqa: F401,F403
from tests.engine.test_mutation import *  # noqa: F401,F403

pytestmark = pytest.mark.default_settings


async def test_a_small_realize_is_planned_on_the_callers_thread_and_a_big_one_on_the_dispatcher():
    import gc

    import trio

    from atensor import Tensor
    from atensor.engine.dispatch import dispatcher
    from atensor.ledger import versions

    gc.collect()  # the lazy assigns earlier tests left pending that nobody holds go
    while dispatcher.statistics()["dispatched"] < dispatcher.statistics()["issued"]:
        await trio.sleep(0.01)  # an earlier test's realize still being planned
    inline = 0
    for k in range(5):  # an earlier test's garbage may issue a realize now and then: most must be inline
        before = dispatcher.statistics()["issued"]
        small = await (Tensor([1.0, 2.0]) * 2 + k).realize()
        assert small.tolist() == [2.0 + k, 4.0 + k]
        inline += dispatcher.statistics()["issued"] == before  # never handed to the dispatcher thread
    assert inline >= 3, (inline, dispatcher.statistics(), len(versions.pending_heads()))
    before = dispatcher.statistics()["issued"]
    big = Tensor([1.0, 2.0])
    for _ in range(100):  # more nodes than engine/realize.py plans inline
        big = big + 1
    await big.realize()
    assert big.tolist() == [101.0, 102.0]
    assert dispatcher.statistics()["issued"] > before  # planned on the dispatcher thread
