"""Kernel families and the choice among their alternatives: forced, cached, measured, or safe.

Why one mechanism: atensor holds several ways to run the same thing (the packed-weight kernels' ISA
paths, rows per pass, a blocked kernel or sgemm on decoded panels, BLAS or its own GEMM for a float32
matmul), and which is fastest is a property of the CPU it runs on, not of the names: an AVX-512 gemv
lost to the AVX2 one on a Zen 4 before it had rows per pass, and a path made the default by its name
ran at 0.38x llama.cpp on a Xeon. So every family with alternatives is chosen here the same way, by
`choose(family, shape_class, shapes)`, in this order:

1. forced: `ATENSOR_KERNELS=family=alternative` (settings.kernels) names it. An unknown alternative,
   or one this CPU lacks a feature for, is a ValueError saying which exist and which run here.
2. cached: a trial on this CPU model and flags, for this family version and shape class, chose it
   before (atensor/tune/cache.py's key); the later run starts at once.
3. measured: a short timed trial now (`settings.tune` on, trial time left in `settings.tune_budget_s`):
   each alternative that runs here is prepared on the caller's real shapes and timed in alternating
   rounds; the fastest by its best round wins, and is stored.
4. safe: the family's `safe` alternative (the portable one), when trials are off or their time is
   spent. A path is never the default on a CPU where it was not measured.

The clock is the calling thread's CPU time (`time.thread_time`), and an alternative runs on that thread
alone: on a shared machine (load 10 on 2 cores, as measured while this was written) a wall-clock trial
times the other processes' slices of the core, and chose a kernel 19x slower than the fastest once;
CPU time does not count the slices it waits. Which kernel of a family is fastest is a property of one
core's work; how many threads run it is the thread split, a choice of its own.

The trial (after tinygrad's BEAM search, `time_linearizer`: the minimum of several runs, and an early
stop of candidates far slower than the best; ours picks among hand-written kernels, per machine, once,
and keeps the answer): every alternative is warmed up once (a first call pays page faults and cold
caches), then timed in rounds that visit the alternatives in turn, so a change of the machine's load
falls on all of them alike. An alternative slower than 27x the fastest on one run of the first shape
alone (a probe, before the warm-up on all shapes), or than 3x the best after two rounds, is dropped,
with why in `skipped`. The
winner must beat the safe alternative by `MARGIN` (a few percent), else the safe one is kept: a tie
within the noise is not a reason to leave the known path. Round count and length come from the share
of the budget a choice may take (`Family.trial_s`, default 0.25 s), so a model with a handful of
shape classes stays within about 2 s in all. The budget counts CPU seconds too: on a loaded machine a
wall-clock budget ran out before the second of four families (load 10 on 2 cores), leaving the rest
on their slow safe paths, uncached, to be tried again at every start. A progress line goes to stderr when a trial starts
(once per process) and when the trials so far have taken more than a moment.

Invariants: a choice is made once per (family, shape class) in a process and then read from memory
(`_made`); an alternative this CPU lacks a feature for is never prepared, timed nor chosen; a forced
alternative is never cached, so unsetting the variable brings back the measured one.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from atensor.config import settings
from atensor.tune import cache, machine as machines
from atensor.tune.cache import ChoiceKey, Record

MARGIN = 0.03          # the winner beats the safe alternative by more than this fraction, or safe stays
DROP_FACTOR = 3.0      # an alternative this many times slower than the best after two rounds is dropped
MIN_ROUNDS = 3
MAX_ROUNDS = 15
_MOMENT_S = 0.2        # trials longer than this in all get a progress line

# an alternative's timed run on given shapes: returns a function that runs it once (its data prepared)
Prepare = Callable[[Sequence[Any]], Callable[[], Any]]


@dataclass(frozen=True)
class Alternative:
    """One way to run a family's work: `needs` the CPU features (/proc/cpuinfo flag names) it runs on,
    `prepare(shapes)` a function that runs it once on those shapes on the calling thread (inputs made
    beforehand, so only the kernel is timed; its CPU time is the measure), `note` what it is, in a few
    words."""
    name: str
    needs: tuple[str, ...]
    prepare: Prepare
    note: str = ""


@dataclass(frozen=True)
class Family:
    """A kernel family: its alternatives, the `safe` one (runs everywhere; taken when nothing was
    measured), and its `version` (a hash of its kernels' source: a cached choice made for other code is
    not reused). `trial_s` caps one trial's time."""
    name: str
    alternatives: tuple[Alternative, ...]
    safe: str
    version: str
    doc: str = ""
    trial_s: float = 0.25

    def __post_init__(self) -> None:
        names = [a.name for a in self.alternatives]
        if self.safe not in names or len(set(names)) != len(names):
            raise ValueError(f"family {self.name}: alternatives {names} must be distinct and hold the safe "
                             f"one {self.safe!r}")

    def alternative(self, name: str) -> Alternative:
        """The alternative called `name`; a ValueError naming the family's alternatives otherwise."""
        for alt in self.alternatives:
            if alt.name == name:
                return alt
        raise ValueError(f"kernel family {self.name} has no alternative {name!r}; it has "
                         f"{[a.name for a in self.alternatives]} (ATENSOR_KERNELS=family=alternative)")


@dataclass(frozen=True)
class Choice:
    """The alternative a family runs for a shape class, and why: `reason` is one of "forced" (by
    ATENSOR_KERNELS), "cached" (measured by an earlier run), "measured" (a trial now), "safe" (no
    measurement: `detail` says why), "only" (the one alternative this CPU runs). `times_s` are the
    measured times (seconds, best round; cached or now), `skipped` the alternatives left out and why."""
    family: str
    shape_class: str
    alternative: str
    reason: str
    detail: str = ""
    times_s: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def version_of(*sources: str) -> str:
    """A family version: a hash of its kernels' source texts (and of whatever else its choice rests on,
    such as the BLAS library's name and version)."""
    return hashlib.sha256("\0".join(sources).encode()).hexdigest()[:16]


_families: dict[str, Family] = {}
_made: dict[tuple[str, str], Choice] = {}
_lock = threading.RLock()
_spent_s = 0.0          # trial time this process has spent (CPU seconds of the trials' thread)
_announced = False


def register(family: Family) -> Family:
    """Makes `family` known to `python -m atensor.tune` and to the ATENSOR_KERNELS check; returns it.
    Registering a family of the same name again replaces it (and forgets its choices made here)."""
    with _lock:
        _families[family.name] = family
        for key in [k for k in _made if k[0] == family.name]:
            del _made[key]
    return family


def families() -> dict[str, Family]:
    """The registered families, by name."""
    return dict(_families)


def made() -> list[Choice]:
    """The choices made in this process so far."""
    return list(_made.values())


def check_forced(forced: Optional[dict[str, str]] = None) -> None:
    """Raises a ValueError for a family named in ATENSOR_KERNELS (or `forced`) that is not registered."""
    forced = settings.kernels if forced is None else forced
    unknown = sorted(set(forced) - set(_families))
    if unknown:
        raise ValueError(f"ATENSOR_KERNELS names unknown kernel families {unknown}; the families are "
                         f"{sorted(_families)} (python -m atensor.tune lists their alternatives)")


def runnable(family: Family, here: Optional[machines.Machine] = None) -> tuple[list[Alternative], dict[str, str]]:
    """The alternatives this CPU runs, and those it does not with why."""
    here = here or machines.current()
    runs, skipped = [], {}
    for alt in family.alternatives:
        missing = here.lacks(alt.needs)
        if missing:
            skipped[alt.name] = f"this CPU lacks {' '.join(missing)}"
        else:
            runs.append(alt)
    return runs, skipped


def key_for(family: Family, shape_class: str, here: Optional[machines.Machine] = None) -> ChoiceKey:
    """The cache key of `family`'s choice for `shape_class` on `here` (default: this CPU)."""
    return ChoiceKey(family.name, shape_class, family.version, (here or machines.current()).digest())


def choose(family: Family, shape_class: str, shapes: Sequence[Any]) -> Choice:
    """The alternative `family` runs for `shape_class`, chosen once per process (see the module's
    order: forced, cached, measured on `shapes`, safe). `shapes` are what the alternatives' `prepare`
    takes: the caller's real shapes of this class."""
    memo = (family.name, shape_class)
    with _lock:
        known = _made.get(memo)
        if known is not None:
            return known
        choice = _decide(family, shape_class, shapes)
        _made[memo] = choice
        return choice


def _decide(family: Family, shape_class: str, shapes: Sequence[Any]) -> Choice:
    here = machines.current()
    runs, skipped = runnable(family, here)
    forced = settings.kernels.get(family.name)
    if forced is not None:
        alt = family.alternative(forced)
        if alt not in runs:
            raise ValueError(f"ATENSOR_KERNELS forces {family.name}={forced}, but {skipped[forced]}; "
                             f"this CPU runs {[a.name for a in runs]}")
        return Choice(family.name, shape_class, forced, "forced", "ATENSOR_KERNELS", skipped=skipped)
    if len(runs) == 1:
        return Choice(family.name, shape_class, runs[0].name, "only", "the one alternative this CPU runs",
                      skipped=skipped)
    key = key_for(family, shape_class, here)
    record = cache.load(key)
    if record is not None and record.alternative in {a.name for a in runs}:
        return Choice(family.name, shape_class, record.alternative, "cached", str(cache.path()),
                      record.times_s, skipped)
    if not settings.tune:
        return Choice(family.name, shape_class, family.safe, "safe", "trials off (ATENSOR_TUNE=0)", skipped=skipped)
    left = settings.tune_budget_s - _spent_s
    if left <= 0.01:
        return Choice(family.name, shape_class, family.safe, "safe",
                      f"the {settings.tune_budget_s:g} s of trials (ATENSOR_TUNE_BUDGET) are spent", skipped=skipped)
    times, failed = trial(family, runs, shapes, min(family.trial_s, left))
    skipped.update(failed)
    winner = pick(family.safe, times)
    store = cache.store(key, Record(winner, times, here.model, time.time()))
    return Choice(family.name, shape_class, winner, "measured",
                  f"{'stored in' if store else 'could not store in'} {cache.path()}", times, skipped)


def pick(safe: str, times: dict[str, float]) -> str:
    """The fastest alternative of `times`, unless it beats `safe` by no more than MARGIN.

    >>> pick("portable", {"portable": 1.0, "avx2": 0.5}), pick("portable", {"portable": 1.0, "avx2": 0.99})
    ('avx2', 'portable')
    """
    if not times:
        return safe
    best = min(times, key=times.__getitem__)
    if safe in times and times[best] * (1 + MARGIN) >= times[safe]:
        return safe
    return best


def trial(family: Family, alternatives: Sequence[Alternative], shapes: Sequence[Any],
          budget_s: float) -> tuple[dict[str, float], dict[str, str]]:
    """Times each of `alternatives` on `shapes` within about `budget_s`: (best round's seconds by
    alternative, alternatives that failed or were dropped and why)."""
    global _spent_s, _announced
    start = time.thread_time()
    if not _announced or _spent_s > _MOMENT_S:
        print(f"atensor: measuring kernel family {family.name} ({len(alternatives)} alternatives) on this CPU "
              f"(once; cached in {cache.path()})", file=sys.stderr, flush=True)
        _announced = True
    runners: dict[str, Callable[[], Any]] = {}
    failed: dict[str, str] = {}
    best: dict[str, float] = {}
    try:
        probe = _probe(alternatives, shapes, failed)  # the first shape alone: drops the hopeless cheaply
        quickest = min(probe.values(), default=0.0)
        first: dict[str, float] = {}
        for alt in alternatives:
            if alt.name not in probe:
                continue
            if len(probe) > 1 and probe[alt.name] > DROP_FACTOR ** 3 * quickest:
                failed[alt.name] = (f"dropped after a first run on {shapes[0]}: "
                                    f"{probe[alt.name] / quickest:.0f}x the fastest")
                continue
            try:
                run = alt.prepare(shapes)
                t0 = time.thread_time()
                run()  # the warm-up call
                first[alt.name] = time.thread_time() - t0
                runners[alt.name] = run
            except Exception as exc:  # noqa: BLE001 - an alternative that cannot run here is not chosen
                failed[alt.name] = f"failed: {type(exc).__name__}: {exc}"
        if not runners:
            return best, failed
        warm = time.thread_time() - start
        per_round = max(sum(first[n] for n in runners), 1e-6)
        left = max(budget_s - warm, 0.0)
        rounds = int(min(MAX_ROUNDS, max(MIN_ROUNDS, left / per_round)))
        calls = max(1, int(left / rounds / per_round)) if left > per_round * rounds else 1
        for index in range(rounds):
            for name, run in list(runners.items()):
                t0 = time.thread_time()
                for _ in range(calls):
                    run()
                took = (time.thread_time() - t0) / calls
                best[name] = min(best.get(name, took), took)
            if index == 1:
                fastest = min(best.values())
                for name in [n for n in runners if best[n] > DROP_FACTOR * fastest]:
                    runners.pop(name)
                    failed[name] = f"dropped after two rounds: {best[name] / fastest:.1f}x the fastest"
            if time.thread_time() - start > 2 * budget_s and index + 1 >= MIN_ROUNDS:
                break
        return best, failed
    finally:
        _spent_s += time.thread_time() - start


def _probe(alternatives: Sequence[Alternative], shapes: Sequence[Any], failed: dict[str, str]) -> dict[str, float]:
    """Each alternative's CPU time for one run on the first shape alone (several shapes: else the warm-up
    is the probe); records those that fail in `failed`."""
    times: dict[str, float] = {}
    for alt in alternatives:
        try:
            if len(shapes) > 1:
                run = alt.prepare(shapes[:1])
                t0 = time.thread_time()
                run()
                times[alt.name] = time.thread_time() - t0
            else:
                times[alt.name] = 0.0
        except Exception as exc:  # noqa: BLE001 - an alternative that cannot run here is not chosen
            failed[alt.name] = f"failed: {type(exc).__name__}: {exc}"
    return times


def reset_for_tests() -> None:
    """Forgets this process's choices and trial time (tests; a choice already applied stays applied)."""
    global _spent_s, _announced
    with _lock:
        _made.clear()
        _spent_s = 0.0
        _announced = False
