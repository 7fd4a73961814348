"""z3, as the race and bounds checkers use it: one lock, one timeout, counted calls.

Why a module of its own: both checkers decide what they can with interval arithmetic and ask z3 only
for what intervals cannot settle (ranges at symbolic offsets, masks that are not boxes, indices that
come from data). Whatever they ask has the same shape: "is there an assignment of these integers,
within their bounds, for which this bad thing happens?" `find_counterexample` answers it: None when
z3 proves there is none (unsat), the assignment when there is one (sat), and `ProofTimeout` when z3
gives up within `settings.z3_timeout_ms` (an access we cannot prove safe is rejected, never assumed
safe).

z3's default context is not thread-safe, and checks run on the dispatcher thread as well as in tests,
so every use goes through `LOCK`. z3 is imported on first use: `import atensor` stays fast.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Optional

from atensor.config import settings
from atensor.graph.symbolic import Variable, as_sym

LOCK = threading.RLock()
_z3: Any = None


class ProofTimeout(AssertionError):
    """z3 could neither prove nor refute a safety condition within the timeout."""


class Stats:
    """How much proving cost: z3 calls and their total time (for the benchmark and for debugging)."""
    __slots__ = ("z3_calls", "z3_ns", "timeouts")

    def __init__(self) -> None:
        self.z3_calls = self.z3_ns = self.timeouts = 0

    def __repr__(self) -> str:
        return f"Stats(z3_calls={self.z3_calls}, z3_ms={self.z3_ns / 1e6:.1f}, timeouts={self.timeouts})"


stats = Stats()


def z3mod() -> Any:
    """The z3 module, imported on first use."""
    global _z3
    if _z3 is None:
        import z3
        _z3 = z3
    return _z3


class Symbols:
    """z3 integer constants for atensor Variables (unbound: one per name and bounds), with their bounds
    as constraints, plus fresh names for the checkers' own unknowns."""

    def __init__(self) -> None:
        self.of_var: dict[tuple[Variable, Any], Any] = {}  # (variable, sort) -> z3 constant
        self.bounds: list[Any] = []
        self._names: set[str] = set()

    def fresh(self, name: str, sort: Any = "int") -> Any:
        """A new z3 constant named after `name` (made unique): sort "int", "bool", "real" or a
        bit-vector width."""
        z3 = z3mod()
        unique, k = name, 1
        while unique in self._names:
            k += 1
            unique = f"{name}_{k}"
        self._names.add(unique)
        if isinstance(sort, int):
            return z3.BitVec(unique, sort)
        return {"int": z3.Int, "bool": z3.Bool, "real": z3.Real}[sort](unique)

    def var(self, v: Variable, sort: Any = "int") -> Any:
        """The z3 constant of variable `v` (as an integer, or a signed bit-vector of width `sort`),
        constrained to the variable's bounds."""
        v = v.unbound
        found = self.of_var.get((v, sort))
        if found is None:
            found = self.of_var[(v, sort)] = self.fresh(v.name, sort)
            self.bounds += [found >= v.min, found <= v.max]  # signed comparison for bit-vectors
        return found

    def expr(self, x: Any) -> Any:
        """An int or a linear Sym/Variable as a z3 integer expression."""
        z3 = z3mod()
        if type(x) is int:
            return z3.IntVal(x)
        s = as_sym(x)
        total = z3.IntVal(s.const)
        for v, c in s.terms:
            total = total + c * self.var(v)
        return total


def find_counterexample(symbols: Symbols, conditions: Iterable[Any],
                        show: Iterable[tuple[str, Any]] = ()) -> Optional[dict[str, int]]:
    """An assignment (within the symbols' bounds) that makes every condition true, as {name: value}
    for the symbols' variables and for each (label, z3 expression) of `show`; None when z3 proves
    there is none. Raises ProofTimeout when z3 cannot tell within `settings.z3_timeout_ms`."""
    z3 = z3mod()
    with LOCK:
        start = time.perf_counter_ns()
        solver = z3.Solver()
        solver.set("timeout", int(settings.z3_timeout_ms))
        solver.add(*symbols.bounds, *conditions)
        verdict = solver.check()
        stats.z3_calls += 1
        stats.z3_ns += time.perf_counter_ns() - start
        if verdict == z3.unsat:
            return None
        if verdict == z3.unknown:
            stats.timeouts += 1
            raise ProofTimeout(f"z3 could not decide within {settings.z3_timeout_ms} ms "
                               f"({solver.reason_unknown()}); raise atensor.settings.z3_timeout_ms")
        model = solver.model()
        found: dict[str, int] = {}
        for (v, _), const in symbols.of_var.items():
            found[v.name] = _as_python(model.eval(const, model_completion=True))
        for label, expr in show:
            found[label] = _as_python(model.eval(expr, model_completion=True))
        return found


def _as_python(value: Any) -> Any:
    z3 = z3mod()
    if z3.is_int_value(value):
        return value.as_long()
    if z3.is_bv_value(value):
        return value.as_signed_long()
    if z3.is_true(value) or z3.is_false(value):
        return z3.is_true(value)
    return str(value)
