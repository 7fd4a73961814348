"""The flagship's cold start: how long the first steps of examples/train.py take when every C kernel
of the jitted step must be compiled (a fresh kernel cache), and again with the cache warm.

    python bench/cold_compile.py [--rounds N] [--baseline OTHER_CHECKOUT]

Each measurement is a fresh process that runs `train(max_steps=4, batch_size=64)` for the MLP and the
CNN on 1 and 2 devices, with ATENSOR_CACHE pointing at an empty directory (cold) or at the one the cold
run filled (warm). Reported: the call's wall time, the kernels compiled, and the compiler's own
seconds (the sum of its calls, which run two at once when a long kernel has its own call). The
physical anchor is the compiler: a cold start cannot be shorter than its longest compiler call.
`--baseline` alternates rounds of another checkout and this one (A/B of a change in the same run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CASES = [("mlp", 1), ("mlp", 2), ("cnn", 1), ("cnn", 2)]

_WORKER = r"""
import importlib.util, json, sys, time
import trio
from atensor.backend.c import compiler, registry
calls = []
real = compiler.compile_source
def timed(*args, **kwargs):
    start = time.perf_counter()
    real(*args, **kwargs)
    calls.append(time.perf_counter() - start)
compiler.compile_source = timed
spec = importlib.util.spec_from_file_location("train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
sys.modules["train"] = train
spec.loader.exec_module(train)
data = train.load_digits(0)
start = time.perf_counter()
trio.run(lambda: train.train(devices=int(sys.argv[3]), max_steps=4, batch_size=64, model=sys.argv[2],
                             progress=False, data=data))
print(json.dumps({"seconds": time.perf_counter() - start, "compiled": registry.REGISTRY.compiled,
                  "compiler_s": sum(calls), "compiler_calls": len(calls)}))
"""


def measure(tree: Path, model: str, devices: int, cache: Path) -> dict:
    """One fresh process of `tree`'s flagship with the kernel cache in `cache`."""
    env = dict(os.environ, ATENSOR_CACHE=str(cache), PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _WORKER, str(tree / "examples" / "train.py"), model,
                          str(devices)], env=env, capture_output=True, text=True, timeout=900, cwd=tree)
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {model} x{devices} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", type=Path, help="another checkout, measured in alternating rounds")
    args = parser.parse_args()
    trees = {"this": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    runs: dict = {name: {f"{m}x{d}": {"cold": [], "warm": []} for m, d in CASES} for name in trees}
    for round_ in range(args.rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
        for name, tree in order:
            for model, devices in CASES:
                with tempfile.TemporaryDirectory(prefix="atensor-cold-") as tmp:
                    key = f"{model}x{devices}"
                    runs[name][key]["cold"].append(measure(tree, model, devices, Path(tmp)))
                    runs[name][key]["warm"].append(measure(tree, model, devices, Path(tmp)))
    rows, summary = [], {}
    for name in trees:
        for model, devices in CASES:
            key = f"{model}x{devices}"
            cold, warm = runs[name][key]["cold"], runs[name][key]["warm"]
            entry = {"cold_s": statistics.median(r["seconds"] for r in cold),
                     "warm_s": statistics.median(r["seconds"] for r in warm),
                     "compiler_s": statistics.median(r["compiler_s"] for r in cold),
                     "warm_compiler_s": statistics.median(r["compiler_s"] for r in warm),
                     "compiled": cold[0]["compiled"], "compiler_calls": cold[0]["compiler_calls"]}
            summary.setdefault(name, {})[key] = entry
            rows.append([name, key, entry["cold_s"], entry["warm_s"], entry["compiler_s"],
                         entry["warm_compiler_s"], entry["compiled"], entry["compiler_calls"]])
    print(table(f"examples/train.py, 4 steps of batch 64, median of {args.rounds} rounds (seconds)",
                ["tree", "model x devices", "cold", "warm", "compiler (cold)", "compiler (warm)", "kernels",
                 "compiler calls"], rows))
    if "baseline" in summary:
        ratios = [[key, summary["baseline"][key]["cold_s"] / summary["this"][key]["cold_s"]]
                  for key in summary["this"]]
        print(table("cold start, baseline / this", ["model x devices", "ratio"], ratios))
    print("written to", write_results("cold_compile", {"rounds": args.rounds, "trees": {k: str(v) for k, v in
                                                                                         trees.items()},
                                                     "summary": summary, "runs": runs}))


if __name__ == "__main__":
    main()
