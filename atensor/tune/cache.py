"""Where measured kernel choices are kept between runs: one JSON file, one entry per key.

Why on disk: a trial costs up to a couple of seconds of a model's start; the choice it makes holds for
as long as the CPU, the kernels' code and the shapes stay what they were, so a later run reads it and
starts at once. The key (`ChoiceKey`) is exactly those: the family, the shape class, the family's
version (a hash of its kernels' source, and atensor's version), and the machine (a hash of the CPU
model and its flags; atensor/tune/machine.py). A change of any of them is another key, and so another
trial: a choice is never reused on a CPU, or for code, it was not measured on.

The file: `$ATENSOR_TUNE_CACHE` if set (a file path; the test suite points it at a file of its own
run), else `tune/choices.json` under atensor's cache folder (`$ATENSOR_CACHE`, else
`$XDG_CACHE_HOME/atensor`, else ~/.cache/atensor). Invariant: the file is replaced whole
(written beside it, then renamed), after merging in what other processes wrote since it was read, so a
reader never sees half a file and two writers lose at most each other's same key. A file that cannot
be read or parsed is treated as empty (and rewritten at the next store); one that cannot be written
leaves the choice in this process only.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from atensor.config import tune_cache_file


@dataclass(frozen=True)
class ChoiceKey:
    """What a cached choice is valid for."""
    family: str
    shape_class: str
    version: str
    machine: str

    def text(self) -> str:
        """The key as the file's entry name."""
        return f"{self.family}|{self.shape_class}|{self.version}|{self.machine}"


@dataclass(frozen=True)
class Record:
    """A measured choice: the alternative chosen and each alternative's time on the trial's shapes
    (seconds; an alternative that failed or was cut short has none), with the CPU model it ran on and
    when (seconds since the epoch)."""
    alternative: str
    times_s: dict[str, float]
    cpu: str
    when: float


def path() -> Path:
    """The cache file (config.tune_cache_file)."""
    return tune_cache_file()


_lock = threading.Lock()


def _read(file: Path) -> dict[str, dict]:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _record(entry: object) -> Optional[Record]:
    """An entry of the file as a Record; None when it is malformed (it then counts as absent)."""
    try:
        return Record(str(entry["alternative"]), {str(k): float(v) for k, v in entry["times_s"].items()},
                      str(entry.get("cpu", "")), float(entry.get("when", 0.0)))
    except (TypeError, KeyError, ValueError, AttributeError):
        return None


def load(key: ChoiceKey) -> Optional[Record]:
    """The record stored under `key`, if any."""
    return _record(_read(path()).get(key.text()))


def store(key: ChoiceKey, record: Record) -> bool:
    """Stores `record` under `key`; False when the file cannot be written (the choice then lives in
    this process only)."""
    file = path()
    with _lock:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            data = _read(file)
            data[key.text()] = asdict(record)
            fd, temporary = tempfile.mkstemp(prefix=".choices-", dir=file.parent)
            with os.fdopen(fd, "w") as out:
                json.dump(data, out, indent=1, sort_keys=True)
            os.replace(temporary, file)
            return True
        except OSError:
            return False


def entries() -> dict[str, Record]:
    """Every stored record, by key text (for `python -m atensor.tune`)."""
    records = {text: _record(entry) for text, entry in _read(path()).items()}
    return {text: record for text, record in records.items() if record is not None}


def clear() -> None:
    """Removes the cache file (every choice is measured again at its next use)."""
    try:
        path().unlink()
    except FileNotFoundError:
        pass
