"""Shared test setup: a derandomized hypothesis profile for CI and the race checker on for every
TaskGraph the scheduler produces."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings as hsettings

import atensor

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
