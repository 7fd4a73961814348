"""The captured program (engine/program.py) fuzzed: one random program run eagerly (its repeats are
schedule-cache hits that submit the template's CapturedProgram) and jitted (replays submit the jit's
CapturedPrograms), each under the default settings, with the schedule cache off, and with race checks
on; every result must equal the numpy model's (tests/fuzz/programs.py), so all six agree.

The eager runs also check that the captured program was really used: with the cache on, every repeat
of the program that schedules anything is a hit; with it off, none is.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import atensor
from atensor import Tensor
from atensor.backend.c import compiler
from atensor.engine.program import CapturedProgram
from atensor.sched import cache

from tests.fuzz.programs import AT, NP, Program, assert_same, examples, fresh_inputs, programs, run
from tests.fuzz.test_op_chains import _replayed

pytestmark = pytest.mark.default_settings  # each case sets its own settings
FUZZ = settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SETTINGS = {"default": dict(), "schedule cache off": dict(schedule_cache=False),
            "race checks on": dict(racecheck=True)}


def _eager(program: Program, cached: bool) -> None:
    for call in range(4):
        arrays = fresh_inputs(program, 300 + call)
        before = dict(cache.stats)
        got = run(program, [Tensor(a) for a in arrays], AT).numpy()
        assert_same(got, run(program, arrays, NP), f"eager call {call}: program {program}")
        hits, misses = cache.stats["hits"] - before["hits"], cache.stats["misses"] - before["misses"]
        if not cached:
            assert hits == misses == 0, "the schedule cache was consulted while off"
        elif call >= 1:
            assert misses == 0, f"eager call {call} of the same program missed the schedule cache"


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("mode", ["eager", pytest.param("jit", marks=pytest.mark.skipif(
    compiler.path() is None, reason="no C compiler on PATH: the jit compiles its kernels"))])
@FUZZ
@given(program=programs())
def test_a_program_gives_numpys_values_eagerly_and_jitted_under_every_setting(mode: str, setting: str,
                                                                            program: Program) -> None:
    with atensor.Context(**SETTINGS[setting]):
        if mode == "eager":
            _eager(program, cached=setting != "schedule cache off")
        else:
            _replayed(program)  # the jit path of test_op_chains: 3 normal calls, then replays


def test_an_eager_hit_submits_the_templates_captured_program(monkeypatch):
    """Not only equal values: from the second realize of a structure on, each realize submits the one
    CapturedProgram kept for its template."""
    submitted: list[CapturedProgram] = []
    original = CapturedProgram.submit

    def spy(self: CapturedProgram, mapping: dict) -> object:
        submitted.append(self)
        return original(self, mapping)
    monkeypatch.setattr(CapturedProgram, "submit", spy)
    programs: list[CapturedProgram] = []
    with atensor.Context(racecheck=False, schedule_cache=True):
        for k in range(4):
            submitted.clear()
            y = ((Tensor(np.full(8, k, np.float32)) * 3).contiguous() + 1).exp2()
            y.realize().wait()
            np.testing.assert_allclose(y.numpy(), np.exp2(np.full(8, k, np.float32) * 3 + 1))
            if k == 0:
                assert submitted == []  # scheduled afresh: lowered and submitted once, no program
            else:
                assert len(submitted) == 1 and not submitted[0].keep_runners
                programs.append(submitted[0])
    assert all(p is programs[0] for p in programs)  # the same program on every hit
