# `python -m atensor.profiler trace.json`, run as a user would run it.
from __future__ import annotations

import subprocess
import sys

from atensor.profiler import Profile

from .sample_events import simulate_step


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "atensor.profiler", *args], capture_output=True,
                          text=True, timeout=120)


def saved_profile(tmp_path) -> tuple[Profile, str]:
    run = simulate_step(seed=2, queue_clock_skew=True)
    prof = Profile.from_events(run.spans, run.host_spans, run.memory, run.clock_offsets)
    return prof, str(prof.export(tmp_path / "trace.json"))


def test_cli_prints_the_same_summary_as_the_live_profile(tmp_path):
    prof, path = saved_profile(tmp_path)
    result = run_cli(path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == prof.summary() + "\n"
    assert "per kernel" in result.stdout and "critical path" in result.stdout


def test_cli_converts_a_saved_trace_to_the_html_timeline(tmp_path):
    _, path = saved_profile(tmp_path)
    page = tmp_path / "timeline.html"
    result = run_cli(path, "--export", str(page))
    assert result.returncode == 0, result.stderr
    assert page.read_text().startswith("<!doctype html>")
    assert f"wrote {page}" in result.stdout


def test_cli_reports_a_missing_file_in_one_line(tmp_path):
    result = run_cli(str(tmp_path / "nope.json"))
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"error: no such file: {tmp_path / 'nope.json'}")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_cli_reports_invalid_json_with_its_position(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [\n  {"ph": "X",,}\n]}')
    result = run_cli(str(bad))
    assert result.returncode == 2
    assert "not valid JSON (line 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_reports_json_that_is_not_a_trace(tmp_path):
    other = tmp_path / "package.json"
    other.write_text('{"name": "left-pad"}')
    result = run_cli(str(other))
    assert result.returncode == 2
    assert "not a Chrome trace" in result.stderr


def test_cli_needs_a_trace_argument():
    result = run_cli()
    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_cli_prints_how_much_of_the_host_time_named_spans_cover(tmp_path):
    from atensor.profiler import HostSpan, Span
    prof = Profile.from_events(
        spans=[Span("CPU:0", "compute", 1, "k", "kernel", 1_000_000, 2_000_000)],
        host_spans=[HostSpan("schedule", "schedule", 0, 1_000_000),
                    HostSpan("await", "await", 1_000_000, 3_000_000)])
    prof.start_ns, prof.end_ns = 0, 4_000_000   # the profiled window: 4 ms, the last one uncovered
    result = run_cli(str(prof.export(tmp_path / "trace.json")))
    assert result.returncode == 0, result.stderr
    assert "host time covered by named spans: 75.0% of 4.00 ms (75.0% by atensor's own spans" in result.stdout
    assert "largest uncovered: 1.00 ms at 3.00 ms" in result.stdout
