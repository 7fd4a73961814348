"""Marks tinygrad's test_ops cases (test_tinygrad_ops.py): known failures become xfail with their reason, the
cases outside the default subset are deselected unless ATENSOR_TINYGRAD_OPS=all, and the run ends with the
pass rate (passed / cases run, on the default device). ATENSOR_TINYGRAD_OPS_SHARD=i/n keeps every n-th case
from the i-th (0-based), so n processes split a slow run (OpenCL on pocl compiles every new kernel), and
ATENSOR_TINYGRAD_OPS_SHUFFLE=seed runs the cases in a seeded random order."""
from __future__ import annotations

import collections
import os
import random

import pytest

from tests.ports.tinygrad_known_failures import SUBSET, expected_failures

_FILE = "test_tinygrad_ops.py"
_outcomes: dict[str, str] = {}


def _device() -> str:
    import atensor
    return str(atensor.settings.default_device).split(":")[0]


def _shard() -> tuple[int, int]:
    text = os.environ.get("ATENSOR_TINYGRAD_OPS_SHARD", "0/1")
    try:
        shard, shards = (int(part) for part in text.split("/"))
    except ValueError:
        shard, shards = -1, 0
    if not 0 <= shard < shards:
        raise pytest.UsageError(f"ATENSOR_TINYGRAD_OPS_SHARD={text!r}: give i/n with 0 <= i < n, e.g. 0/3")
    return shard, shards


def _case(item) -> str | None:
    """"Class::test_name" of a test_ops case, or None for any other test."""
    if item.nodeid.split("::")[0].endswith(_FILE) and item.cls is not None:
        return f"{item.cls.__name__}::{item.name}"
    return None


def pytest_collection_modifyitems(config, items):
    run_all = os.environ.get("ATENSOR_TINYGRAD_OPS", "") == "all"
    shard, shards = _shard()
    failing = expected_failures(_device())
    keep, drop = [], []
    position = 0
    for item in items:
        case = _case(item)
        if case is not None:
            position += 1
            if (not run_all and case not in SUBSET) or (position - 1) % shards != shard:
                drop.append(item)
                continue
        if case in failing:
            item.add_marker(pytest.mark.xfail(reason=failing[case], strict=False))
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    seed = os.environ.get("ATENSOR_TINYGRAD_OPS_SHUFFLE")
    if seed is not None:  # a run stopped early has then covered a uniform sample of the cases
        items.sort(key=lambda item: random.Random(f"{seed}:{item.nodeid}").random())


def pytest_runtest_logreport(report):
    parts = report.nodeid.split("::")
    if not (parts[0].endswith(_FILE) and len(parts) == 3):  # a test_ops case is file::Class::test
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            _outcomes[report.nodeid] = "xpassed" if report.passed else "xfailed"
        else:
            _outcomes[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter):
    if not _outcomes:
        return
    counts = collections.Counter(_outcomes.values())
    passed, total = counts["passed"] + counts["xpassed"], len(_outcomes)
    ran = total - counts["skipped"]
    shard, shards = _shard()
    terminalreporter.write_line(
        f"tinygrad test_ops on {_device()}{f' (shard {shard}/{shards})' if shards > 1 else ''}: {passed} of "
        f"{ran} cases that ran passed ({100 * passed / max(ran, 1):.1f}%); {total} cases, {counts['skipped']} "
        f"skipped by test_ops' own conditions; known failures {counts['xfailed']} (and {counts['xpassed']} that "
        f"pass now); unexpected failures {counts['failed']}")
