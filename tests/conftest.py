"""Shared test setup: a derandomized hypothesis profile for CI, the race checker on for every
TaskGraph the scheduler produces, and the kernel choices (atensor/tune/) measured once per run."""
from __future__ import annotations

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


@pytest.fixture(autouse=True)
def racecheck_every_graph(request):
    """Every TaskGraph scheduled in the suite is proved race-free before it runs, except in tests
    marked `default_settings`: those run as users do (race checks off, small realizes planned inline)."""
    if request.node.get_closest_marker("default_settings") is not None:
        yield
        return
    with atensor.Context(racecheck=True):
        yield
