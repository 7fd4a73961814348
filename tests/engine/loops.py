"""Shared by the engine's tests: one test body run under each event loop the project supports, and a
count of the submissions that went through a ReplayRecord (engine/replay.py's one foreign call)."""
from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest
import trio

from atensor.engine.replay import ReplayRecord


def run_on(library: str, main: Callable[[], Any]) -> Any:
    """Runs the async function `main` under "trio", "uvloop" (skipped where it is not installed) or
    "asyncio", and returns what it returns."""
    if library == "trio":
        return trio.run(main)
    if library == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        return uvloop.run(main())
    return asyncio.run(main())


def count_record_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wraps ReplayRecord.command (bound once per run of the record) for the test: the list it returns
    gets one entry per run (the number of swapped buffers that run bound)."""
    calls: list[int] = []
    original = ReplayRecord.command

    def counting(self: ReplayRecord, base: int, new_specs: list):
        calls.append(len(new_specs))
        return original(self, base, new_specs)
    monkeypatch.setattr(ReplayRecord, "command", counting)
    return calls
