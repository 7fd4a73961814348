"""The kernel choice mechanism (atensor/tune/): a trial at first use picks the fastest alternative this CPU
runs, the choice is cached under a key of CPU, flags, version and shape class, a forced alternative
wins, and without a measurement the safe alternative runs.

The families here are made up: alternatives whose "kernels" spin for known CPU times (the trial's
clock is the thread's CPU time), so which one a trial must pick is known beforehand, and the trials
take milliseconds."""
from __future__ import annotations

import time

import pytest

import atensor
from atensor.tune import cache, family as tune, machine as machines
from atensor.tune.machine import Machine

ZEN4 = Machine("AMD EPYC 9R14", frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}), 2)
ZEN3 = Machine("AMD EPYC 7R13", frozenset({"avx2", "fma", "f16c"}), 2)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Each test has its own cache file, this process's choices forgotten, and the Zen 4 machine."""
    monkeypatch.setenv("ATENSOR_TUNE_CACHE", str(tmp_path / "choices.json"))
    monkeypatch.setattr(machines, "current", lambda: ZEN4)
    tune.reset_for_tests()
    yield
    tune.reset_for_tests()


def spin(seconds: float) -> None:
    """Uses `seconds` of this thread's CPU time."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


class Sleeper:
    """Alternatives that take `seconds[name]` of CPU a run, counting their preparations and runs."""

    def __init__(self, seconds: dict[str, float]):
        self.seconds, self.prepared, self.runs = seconds, [], []

    def alternative(self, name: str, needs: tuple[str, ...] = ()) -> tune.Alternative:
        def prepare(shapes):
            self.prepared.append((name, tuple(shapes)))

            def run():
                self.runs.append(name)
                spin(self.seconds[name])
            return run
        return tune.Alternative(name, needs, prepare, f"spins {self.seconds[name] * 1e3:g} ms")


def make_family(sleeper: Sleeper, needs: dict[str, tuple[str, ...]] = {}, version: str = "v1",
                name: str = "test.family") -> tune.Family:
    alts = tuple(sleeper.alternative(n, needs.get(n, ())) for n in sleeper.seconds)
    return tune.register(tune.Family(name, alts, "portable", version, "a made-up family", trial_s=0.05))


def test_the_trial_picks_the_fastest_alternative_and_records_every_time():
    sleeper = Sleeper({"portable": 0.004, "fast": 0.001, "slow": 0.003})
    choice = tune.choose(make_family(sleeper), "m1", [(4, 4)])
    assert (choice.alternative, choice.reason) == ("fast", "measured")
    assert set(choice.times_s) == {"portable", "fast", "slow"}
    assert choice.times_s["fast"] < choice.times_s["slow"] < choice.times_s["portable"]
    assert all(shapes == ((4, 4),) for _, shapes in sleeper.prepared)  # prepared on the caller's shapes


def test_a_second_process_reads_the_cache_and_runs_no_trial():
    sleeper = Sleeper({"portable": 0.003, "fast": 0.001})
    assert tune.choose(make_family(sleeper), "m1", [1]).reason == "measured"
    tune.reset_for_tests()  # as a new process: only the file remains
    again = Sleeper({"portable": 0.003, "fast": 0.001})
    choice = tune.choose(make_family(again), "m1", [1])
    assert (choice.alternative, choice.reason) == ("fast", "cached")
    assert again.prepared == [] and again.runs == []
    assert choice.times_s.keys() == {"portable", "fast"}


def test_within_a_process_a_choice_is_made_once():
    sleeper = Sleeper({"portable": 0.003, "fast": 0.001})
    fam = make_family(sleeper)
    first = tune.choose(fam, "m1", [1])
    runs = len(sleeper.runs)
    assert tune.choose(fam, "m1", [1]) is first and len(sleeper.runs) == runs


def test_the_key_changes_with_the_cpu_its_flags_the_version_and_the_shape_class():
    fam = make_family(Sleeper({"portable": 0.0, "fast": 0.0}))
    base = tune.key_for(fam, "m1", ZEN4)
    other_model = Machine("Intel Xeon Platinum 8488C", ZEN4.flags, 2)
    other_flags = Machine(ZEN4.model, ZEN4.flags - {"avx512_vnni"}, 2)
    newer = tune.Family(fam.name, fam.alternatives, fam.safe, "v2")
    keys = {base, tune.key_for(fam, "m1", other_model), tune.key_for(fam, "m1", other_flags),
            tune.key_for(newer, "m1", ZEN4), tune.key_for(fam, "m2-7", ZEN4)}
    assert len(keys) == 5
    assert tune.key_for(fam, "m1", Machine(ZEN4.model, ZEN4.flags, 16)) == base  # the core count is not the CPU


def test_a_choice_cached_on_another_cpu_or_version_is_measured_again(monkeypatch):
    sleeper = Sleeper({"portable": 0.003, "fast": 0.001})
    tune.choose(make_family(sleeper), "m1", [1])
    for machine, version in ((ZEN3, "v1"), (ZEN4, "v2")):
        tune.reset_for_tests()
        monkeypatch.setattr(machines, "current", lambda machine=machine: machine)
        assert tune.choose(make_family(Sleeper({"portable": 0.003, "fast": 0.001}), version=version), "m1",
                           [1]).reason == "measured"


def test_an_alternative_the_cpu_lacks_is_never_prepared_nor_chosen(monkeypatch):
    monkeypatch.setattr(machines, "current", lambda: ZEN3)
    sleeper = Sleeper({"portable": 0.003, "avx2": 0.002, "avx512": 0.0005})
    choice = tune.choose(make_family(sleeper, {"avx2": ("avx2",), "avx512": ("avx512f", "avx512bw")}), "m1", [1])
    assert choice.alternative == "avx2"
    assert "avx512" not in sleeper.runs and all(name != "avx512" for name, _ in sleeper.prepared)
    assert choice.skipped == {"avx512": "this CPU lacks avx512f avx512bw"}


def test_a_cached_choice_the_cpu_cannot_run_is_not_used(monkeypatch, tmp_path):
    """A cache file copied from another machine under this machine's key (or edited) cannot make a path run."""
    sleeper = Sleeper({"portable": 0.003, "avx512": 0.001})
    fam = make_family(sleeper, {"avx512": ("avx512f",)})
    monkeypatch.setattr(machines, "current", lambda: ZEN3)
    cache.store(tune.key_for(fam, "m1", ZEN3), cache.Record("avx512", {"avx512": 1e-3}, ZEN3.model, 0.0))
    choice = tune.choose(fam, "m1", [1])
    assert choice.alternative == "portable" and choice.reason == "only"


def test_the_override_forces_an_alternative_and_is_not_cached():
    sleeper = Sleeper({"portable": 0.003, "fast": 0.001})
    fam = make_family(sleeper)
    with atensor.Context(kernels={"test.family": "portable"}):
        choice = tune.choose(fam, "m1", [1])
    assert (choice.alternative, choice.reason) == ("portable", "forced") and sleeper.runs == []
    assert cache.entries() == {}


def test_an_unknown_override_is_a_clear_error():
    fam = make_family(Sleeper({"portable": 0.0, "fast": 0.0}))
    with atensor.Context(kernels={"test.family": "avx1024"}):
        with pytest.raises(ValueError, match=r"test.family has no alternative 'avx1024'.*\['portable', 'fast'\]"):
            tune.choose(fam, "m1", [1])
    with pytest.raises(ValueError, match=r"unknown kernel families \['no.such'\].*python -m atensor.tune"):
        tune.check_forced({"no.such": "x"})


def test_forcing_an_alternative_the_cpu_lacks_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(machines, "current", lambda: ZEN3)
    fam = make_family(Sleeper({"portable": 0.0, "avx512": 0.0}), {"avx512": ("avx512f",)})
    with atensor.Context(kernels={"test.family": "avx512"}):
        with pytest.raises(ValueError, match="this CPU lacks avx512f; this CPU runs \\['portable'\\]"):
            tune.choose(fam, "m1", [1])


def test_a_malformed_override_variable_fails_at_import_naming_the_form():
    import os
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", "import atensor"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ATENSOR_KERNELS": "quant.gemv_f32"})
    assert done.returncode != 0 and "is not family=alternative" in done.stderr


def test_without_trials_the_safe_alternative_runs_and_nothing_is_timed():
    sleeper = Sleeper({"portable": 0.003, "fast": 0.001})
    with atensor.Context(tune=False):
        choice = tune.choose(make_family(sleeper), "m1", [1])
    assert (choice.alternative, choice.reason) == ("portable", "safe") and sleeper.runs == []
    assert "ATENSOR_TUNE=0" in choice.detail


def test_once_the_budget_is_spent_the_safe_alternative_runs_uncached():
    with atensor.Context(tune_budget_s=0.012):
        first = tune.choose(make_family(Sleeper({"portable": 0.004, "fast": 0.001}), name="a"), "m1", [1])
        second = tune.choose(make_family(Sleeper({"portable": 0.004, "fast": 0.001}), name="b"), "m1", [1])
    assert first.reason == "measured"
    assert (second.alternative, second.reason) == ("portable", "safe") and "spent" in second.detail
    assert [k.split("|")[0] for k in cache.entries()] == ["a"]


def test_a_tie_within_the_margin_keeps_the_safe_alternative():
    assert tune.pick("portable", {"portable": 1.0, "fast": 1.0 / (1 + tune.MARGIN / 2)}) == "portable"
    assert tune.pick("portable", {"portable": 1.0, "fast": 0.5, "faster": 0.4}) == "faster"


def test_an_alternative_that_fails_is_skipped_with_its_error():
    sleeper = Sleeper({"portable": 0.003, "fast": 0.001})

    def broken(shapes):
        raise RuntimeError("no such kernel")
    fam = tune.register(tune.Family("test.broken", (sleeper.alternative("portable"), sleeper.alternative("fast"),
                                                     tune.Alternative("broken", (), broken)), "portable", "v1",
                                    trial_s=0.05))
    choice = tune.choose(fam, "m1", [1])
    assert choice.alternative == "fast" and "RuntimeError: no such kernel" in choice.skipped["broken"]


def test_a_trial_says_so_on_stderr(capsys):
    tune.choose(make_family(Sleeper({"portable": 0.002, "fast": 0.001})), "m1", [1])
    assert "measuring kernel family test.family" in capsys.readouterr().err


def test_cpuinfo_is_read_into_model_and_flags():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 9R14 96-Core Processor\nflags\t\t: fpu avx2 avx512f hypervisor\n" \
           "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
    m = machines.read_cpuinfo(text, 2)
    assert m.model == "AMD EPYC 9R14 96-Core Processor" and m.flags == {"fpu", "avx2", "avx512f", "hypervisor"}
    assert m.hypervisor and m.lacks(("avx2", "amx_tile")) == ["amx_tile"]


def test_an_unreadable_cache_file_counts_as_empty(tmp_path, monkeypatch):
    file = tmp_path / "bad.json"
    file.write_text("{not json")
    monkeypatch.setenv("ATENSOR_TUNE_CACHE", str(file))
    assert cache.entries() == {}
    choice = tune.choose(make_family(Sleeper({"portable": 0.002, "fast": 0.001})), "m1", [1])
    assert choice.reason == "measured" and len(cache.entries()) == 1
