"""The benchmark suite's registry (bench/registry.py) is consistent with bench/, without running a benchmark:
every registered script exists (or is marked optional), every option the suite passes it is one it declares,
it writes its results through common.write_results (so the file names the machine), every results file
belongs to a registered benchmark, and a results file the suite ran names its machine."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import common, machine, report
from bench.registry import AREAS, BENCHMARKS, by_name

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PRESENT = [b for b in BENCHMARKS if b.path.exists()]


def _declared_options(source: str) -> set[str]:
    """The "--name" strings a script declares: argparse's add_argument, or a hand-read sys.argv."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("--"):
            found.add(node.value)
    return found


def test_names_are_unique_and_every_record_is_complete():
    assert len(by_name()) == len(BENCHMARKS)
    for bench in BENCHMARKS:
        assert bench.area in AREAS, bench.name
        assert bench.measures and bench.results, bench.name
        assert bench.path.exists() or bench.optional, f"bench/{bench.script} is missing"
    areas = {b.area for b in BENCHMARKS if b.core}
    assert {"host", "kernels", "llm", "training", "mpi", "opencl", "serving"} <= areas


@pytest.mark.parametrize("bench", PRESENT, ids=lambda b: b.name)
def test_the_options_the_suite_passes_are_the_scripts_own(bench):
    declared = _declared_options(bench.path.read_text())
    for option in bench.args + bench.quick:
        if option.startswith("--"):
            assert option in declared, f"bench/{bench.script} declares no {option} (it has {sorted(declared)})"


@pytest.mark.parametrize("bench", PRESENT, ids=lambda b: b.name)
def test_the_script_writes_its_results_through_write_results(bench):
    calls = [node for node in ast.walk(ast.parse(bench.path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "write_results"]
    assert calls, f"bench/{bench.script} must write bench/results/<name>.json with common.write_results"


def test_write_results_records_the_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    path = common.write_results("probe", {"value": 1.5, "bad": float("nan")})
    data = json.loads(path.read_text())
    record = data["machine"]
    assert record["cpu"] and record["cores"] >= 1 and isinstance(record["flags"], list)
    assert set(record["flags"]) <= set(machine.FLAGS)
    assert record["load_start"] == machine.START_LOAD and record["git"]
    assert record["python"] and record["numpy"]
    assert data["value"] == 1.5 and data["bad"] is None and data["command"].startswith("python")


def test_every_results_file_belongs_to_a_registered_benchmark():
    known = {name for b in BENCHMARKS for name in b.results + b.other_results}
    for path in RESULTS.glob("*.json"):
        name = path.stem
        assert name in known or name == "suite" or name.startswith("ab_"), \
            f"bench/results/{path.name} is written by no registered benchmark: register its script or remove it"


def test_every_results_file_the_suite_wrote_names_its_machine():
    for path in RESULTS.glob("*.json"):
        data = json.loads(path.read_text())
        if "suite" in data or path.stem == "suite":
            assert data["machine"].get("cpu"), f"{path.name} has no CPU model"
            assert "load_start" in data["machine"] and data["machine"].get("cores"), path.name


def test_the_report_renders_every_area_and_names_machines():
    text = report.render()
    assert text.startswith("# Benchmarks") and "python -m bench --quick" in text
    for bench in BENCHMARKS:
        if bench.path.exists():
            assert f"### {bench.name}:" in text, bench.name
    assert text.count("Machine: ") >= 1


def test_list_runs_and_names_each_benchmark():
    out = subprocess.run([sys.executable, "-m", "bench", "--list"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for bench in BENCHMARKS:
        assert bench.name in out


def test_numbers_flattens_a_results_file_and_headline_picks_by_pattern():
    from bench.registry import Benchmark
    from bench.suite import headline, numbers
    data = {"machine": {"cores": 2}, "time": "t", "rows": [{"name": "a", "us": 3.0, "ok": True}, {"us": 4}],
            "total": 7}
    assert numbers(data) == {"rows.0.us": 3.0, "rows.1.us": 4.0, "total": 7.0}
    probe = Benchmark("probe", "probe.py", "other", "m", (), None, ("probe",), figures=("rows.*.us",))
    assert headline(probe, numbers(data)) == {"rows.0.us": 3.0, "rows.1.us": 4.0}


def test_a_benchmark_past_its_timeout_is_stopped_with_its_children(tmp_path):
    """The suite kills the whole session of a script that overruns (a server it started, too)."""
    import time

    from bench.suite import _stream
    child = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(child)!r}, 'w').write(str(p.pid)); print('started', flush=True); "
              "time.sleep(60)")
    start = time.monotonic()
    rc, output = _stream([sys.executable, "-c", script], tmp_path, 3.0, dict(__import__("os").environ))
    assert rc is None and "started" in output and time.monotonic() - start < 30
    pid = int(child.read_text())
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower():
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the script's child {pid} outlived the timeout")
