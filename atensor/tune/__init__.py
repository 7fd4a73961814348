"""Kernel choice by measurement on the running CPU: families of alternatives, a short trial at first use,
the choice cached on disk, an override, and `python -m atensor.tune` to say what was chosen and why.

atensor/tune/family.py holds the mechanism (its header says the order: forced, cached, measured,
safe), cache.py the file and its key, machine.py the CPU record. The families themselves are declared
beside the kernels they choose among (backend/quant/tuning.py), which imports
this package; it imports nothing above config.
"""
from __future__ import annotations

from atensor.tune.family import (Alternative, Choice, Family, choose, families, made, register,  # noqa: F401
                                 version_of)
