"""`python -m atensor.tune`: what each kernel family runs on this CPU, and why (the measured times).

    python -m atensor.tune              the families, their alternatives, and the choices cached for this CPU
    python -m atensor.tune --measure    also choose each family now on its example shapes (a trial where
                                        nothing is cached), and print those choices
    python -m atensor.tune --clear      forget every cached choice (the next use measures again)

The families are declared beside their kernels; importing those modules registers them (the only
import of this package that points up the layers, tests/test_layering.py).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from atensor.backend.quant import tuning as _quant_tuning
from atensor.config import settings
from atensor.tune import cache, family as tune, machine as machines


def _times(times: dict[str, float]) -> str:
    if not times:
        return ""
    fastest = min(times.values())
    ordered = sorted(times.items(), key=lambda kv: kv[1])
    return ", ".join(f"{name} {t * 1e6:.1f} us ({t / fastest:.2f}x)" for name, t in ordered)


def _print_choice(choice: tune.Choice) -> None:
    print(f"  {choice.family} [{choice.shape_class}]: {choice.alternative} ({choice.reason}"
          f"{': ' + choice.detail if choice.detail else ''})")
    if choice.times_s:
        print(f"      measured: {_times(choice.times_s)}")
    for name, why in choice.skipped.items():
        print(f"      not run: {name}: {why}")


def main(argv: Optional[list[str]] = None) -> int:
    """Prints the machine, the families and the choices; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m atensor.tune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="choose every family now on its example shapes")
    parser.add_argument("--clear", action="store_true", help="forget the cached choices first")
    args = parser.parse_args(argv)
    if args.clear:
        cache.clear()
        print(f"cleared {cache.path()}")
    here = machines.current()
    print(f"CPU: {here.model}, {here.cores} cores{' (virtual machine)' if here.hypervisor else ''}, "
          f"key {here.digest()}")
    print(f"cache: {cache.path()}; trials {'on' if settings.tune else 'off'} "
          f"(budget {settings.tune_budget_s:g} s); forced: {settings.kernels or 'nothing'}")
    _quant_tuning.families()
    tune.check_forced()
    stored = cache.entries()
    for fam in tune.families().values():
        runs, skipped = tune.runnable(fam, here)
        print(f"\n{fam.name}: {fam.doc}")
        for alt in fam.alternatives:
            state = "safe path" if alt.name == fam.safe else ("runs here" if alt in runs else skipped[alt.name])
            needs = f" needs {' '.join(alt.needs)};" if alt.needs else ""
            print(f"  - {alt.name}:{needs} {alt.note} [{state}]")
        prefix = f"{fam.name}|"
        for text, record in sorted(stored.items()):
            name, shape_class, version, machine = text.split("|")
            if text.startswith(prefix) and version == fam.version and machine == here.digest():
                print(f"  cached [{shape_class}]: {record.alternative}; measured: {_times(record.times_s)}")
    if args.measure:
        print("\nchoices now:")
        for choice in _quant_tuning.measure_examples():
            _print_choice(choice)
    elif tune.made():
        print("\nchoices made in this process:")
        for choice in tune.made():
            _print_choice(choice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
