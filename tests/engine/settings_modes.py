"""The settings a bug about realize ordering must be tested under (issues 33 and 40): as users run
(small realizes planned inline), with race proofs on, with the schedule cache off, with every realize
planned on the dispatcher thread, and with every kernel compiled to C. A module that uses `MODES`
marks itself `default_settings`, so that the race checks are on only in the mode that asks for them."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

import atensor
from atensor.backend.c import compiler
from atensor.engine.dispatch import dispatcher

MODES = ["default", "racecheck", "no_schedule_cache", "dispatcher", "native_all"]


@contextlib.contextmanager
def settings_mode(name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Runs the block under the mode `name` (one of MODES)."""
    if name == "native_all" and compiler.path() is None:
        pytest.skip("no C compiler on PATH")
    if name == "dispatcher":  # every realize and replay goes through the dispatcher thread
        monkeypatch.setattr(dispatcher, "run_inline", lambda job, keep_error=False: False)
    changes = {"racecheck": {"racecheck": True}, "no_schedule_cache": {"schedule_cache": False},
               "native_all": {"native": "all"}}.get(name, {})
    with atensor.Context(**changes):
        yield
