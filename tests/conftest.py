"""Shared test setup: a derandomized hypothesis profile for CI, the race checker on for every
TaskGraph the scheduler produces, the kernel choices (atensor/tune/) measured once per run, and a fixture
that keeps a test's gc.collect() to the test's own objects."""
from __future__ import annotations

import gc
import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings as hsettings

# kernel trials stay on (the suite runs the paths users get), into a cache file of this run's own, which
# the processes the tests start inherit: each family is measured once per run, not in every process,
# and never from a file an earlier run or another machine left (tests/tune/ use files of their own)
os.environ.setdefault("ATENSOR_TUNE_CACHE", os.path.join(tempfile.mkdtemp(prefix="atensor-tune-"), "choices.json"))

import atensor  # noqa: E402

hsettings.register_profile("ci", derandomize=True, max_examples=40, deadline=None,
                           suppress_health_check=[HealthCheck.too_slow])
hsettings.register_profile("dev", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# nightly: random (not derandomized) and 25 times the examples (tests/fuzz scale their own counts)
hsettings.register_profile("long", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
hsettings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# ATENSOR_SUITE_PROOFS=0 runs every test as `default_settings` tests run: scripts/test.sh's second pass (the
# pure-Python core) takes the paths users take, where the first pass (the compiled core) proves every graph
PROOFS = os.environ.get("ATENSOR_SUITE_PROOFS", "1")
if PROOFS not in ("0", "1"):
    raise ValueError(f"ATENSOR_SUITE_PROOFS={PROOFS!r}: use 1 (prove every graph, the default) or 0 (users' settings)")


@pytest.fixture(autouse=True)
def racecheck_every_graph(request):
    """Every TaskGraph scheduled in the suite is proved race-free before it runs, except in tests
    marked `default_settings`: those run as users do (race checks off, small realizes planned inline).
    With ATENSOR_SUITE_PROOFS=0 every test runs as users do."""
    if PROOFS == "0" or request.node.get_closest_marker("default_settings") is not None:
        yield
        return
    with atensor.Context(racecheck=True):
        yield


@pytest.fixture(autouse=True, scope="module")
def settled_heap():
    """After each test module, what survived it (the modules imported at collection, the caches it
    filled, its long-lived fixtures' leftovers) moves to the permanent generation (`gc.freeze()`, constant
    time), out of the full collections of the rest of the suite. Without it, the pure-Python core's pass
    ran 117 full collections over a heap growing to 1.08 M objects, 29 CPU s of the pass; with it a full
    collection traverses only what was made since the last module (tests/core, engine, tensor, graph, hcq
    and nn on that core: full collections 18.9 -> 9.4 CPU s; what is left is mostly tests' own
    gc.collect() after a gc.unfreeze()). Young cycles are collected as before (`gc.collect(1)` here, the
    young collections meanwhile); only garbage that reached the oldest generation inside a module stays
    until the process ends (38,000 objects over 1,733 tests; peak memory 899 -> 918 MiB). Tests that
    depend on what a collection finds make their garbage in the test (`young_heap` freezes the rest)."""
    yield
    gc.collect(1)
    gc.freeze()


@pytest.fixture
def young_heap():
    """For tests that call `gc.collect()`: everything allocated before the test (the suite's modules,
    caches and earlier tests' data: millions of objects late in the pure-Python core's pass, where one
    full collection took 1-3 s) is frozen while it runs, so a collection traverses only what the test
    made; its garbage cycles are found as before (an older object keeps a young one alive only where it
    is alive itself, or is garbage of an earlier test). Given back to the collector afterwards only
    where nothing was frozen before: gc.unfreeze() gives back everything, and what atensor froze
    (hcq/gcpause.py) would then be traversed by every later full collection of the suite's process
    (seconds each late in the pure-Python pass: long enough to starve a test's event loop)."""
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    try:
        yield
    finally:
        if frozen_before == 0:
            gc.unfreeze()
