"""hcq/gcpause.py: the collector is off while atensor's threads work, and what survives a big pause is
frozen (not traversed by the next collection) until the application releases it."""
from __future__ import annotations

import gc
import weakref

import pytest

from atensor.hcq import gcpause


class _Cell:
    """A tracked object that can be part of a reference cycle and be watched through a weakref."""

    def __init__(self) -> None:
        self.other: object = None


@pytest.fixture
def clean_gc():
    """The collector on, nothing frozen, gcpause's bookkeeping fresh; restored afterwards."""
    was = gc.isenabled()
    gc.enable()
    gc.collect()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.collect()
    if not was:
        gc.disable()


def test_a_pause_turns_the_collector_off_and_back_on(clean_gc):
    with gcpause.gc_paused():
        assert not gc.isenabled()
        with gcpause.gc_paused():  # nested (another thread entering meanwhile counts the same)
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_application_turned_off_stays_off(clean_gc):
    gc.disable()
    with gcpause.gc_paused():
        pass
    assert not gc.isenabled()
    gc.enable()


def test_a_small_pause_leaves_its_objects_to_the_collector(clean_gc):
    with gcpause.gc_paused():
        kept = [_Cell() for _ in range(1000)]
    assert gc.get_freeze_count() == 0
    assert len(kept) == 1000


def test_what_survives_a_big_pause_is_frozen_and_still_freed_by_reference_counting(clean_gc):
    before = gcpause.stats["freezes"]
    with gcpause.gc_paused():
        kept = [_Cell() for _ in range(gcpause.FREEZE_AT + 1000)]
    assert gcpause.stats["freezes"] == before + 1
    assert gc.get_count()[0] < 1000  # the young generation is empty: the next collection has nothing to traverse
    frozen = gc.get_freeze_count()
    assert frozen >= gcpause.FREEZE_AT
    probe = weakref.ref(kept[0])
    del kept
    assert probe() is None  # freed at once by reference counting, frozen or not
    assert gc.get_freeze_count() <= frozen - gcpause.FREEZE_AT


def test_a_frozen_cycle_waits_for_release_frozen(clean_gc):
    a, b = _Cell(), _Cell()
    a.other, b.other = b, a  # a cycle, frozen by the next big pause
    probe = weakref.ref(a)
    with gcpause.gc_paused():
        kept = [_Cell() for _ in range(gcpause.FREEZE_AT)]
    del a, b
    gc.collect()
    assert probe() is not None  # frozen: even a full collection does not see the cycle
    assert gcpause.release_frozen() >= 2
    assert probe() is None and gc.get_freeze_count() == 0
    assert len(kept) == gcpause.FREEZE_AT
