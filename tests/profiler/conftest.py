from __future__ import annotations

import pytest

from atensor.profiler import collector


@pytest.fixture(autouse=True)
def _isolated_collector():
    """Every test starts with no active profile and no clock offsets, and leaves none behind."""
    saved = dict(collector._clock_offsets)
    collector._clock_offsets = {}
    assert not collector.is_active(), "a previous test left a profile active"
    yield
    leftover = collector._active
    collector._active = ()
    collector._clock_offsets = saved
    assert not leftover, "the test left a profile active"
