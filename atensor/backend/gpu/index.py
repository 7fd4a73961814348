"""Index arithmetic a GPU kernel computes itself, as expressions that are both rendered to C and proved.

Why: the kernel-level bounds check (sched/boundscheck.py) proves a kernel's views inside their buffers,
and the C and OpenCL renderers turn views into addresses the same way. A tiled matmul is different: its
addresses come from the renderer's own tile arithmetic (work-group and work-item ids split into tile
rows and columns, a loop over tiles of the inner axis, guards at the ragged edges), not from a view.
So that arithmetic is written once, as `IExpr` trees: `c()` renders the kernel's text from them, and
engine/cl_bounds.py proves, with z3, every global access they describe inside its buffer under its
guard. What is proved is what runs.

`IExpr` is integer arithmetic over named unknowns: +, * by a constant or another expression, // and %
by a positive constant (C's truncating division equals floor division on the non-negative values used
here: ids, loop counters and their quotients). `GlobalAccess` is one load or store of a global buffer.
`IndexProof` is what a kernel declares for the proof: its unknowns' ranges (ids, loop counters), the
definitions of its named intermediates, and its accesses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

Operand = Union["IExpr", int]


@dataclass(frozen=True)
class IExpr:
    """An integer expression: `op` is "var" (arg: its name), "const" (arg: the value), "+", "*", "//" or
    "%" (args: the two operands; the right one of // and % a positive int)."""
    op: str
    args: tuple

    @staticmethod
    def var(name: str) -> IExpr:
        return IExpr("var", (name,))

    @staticmethod
    def of(x: Operand) -> IExpr:
        return x if isinstance(x, IExpr) else IExpr("const", (int(x),))

    def __add__(self, other: Operand) -> IExpr:
        other = IExpr.of(other)
        if other.op == "const" and other.args[0] == 0:
            return self
        if self.op == "const" and self.args[0] == 0:
            return other
        return IExpr("+", (self, other))

    __radd__ = __add__

    def __mul__(self, other: Operand) -> IExpr:
        other = IExpr.of(other)
        if other.op == "const" and other.args[0] == 1:
            return self
        if other.op == "const" and other.args[0] == 0:
            return other
        return IExpr("*", (self, other))

    __rmul__ = __mul__

    def __floordiv__(self, d: int) -> IExpr:
        assert d > 0, "a divisor of the index arithmetic is a positive constant"
        return self if d == 1 else IExpr("//", (self, IExpr.of(d)))

    def __mod__(self, d: int) -> IExpr:
        assert d > 0, "a modulus of the index arithmetic is a positive constant"
        return IExpr.of(0) if d == 1 else IExpr("%", (self, IExpr.of(d)))

    def c(self) -> str:
        """The expression as C (and OpenCL C) text."""
        if self.op == "var":
            return self.args[0]
        if self.op == "const":
            return str(self.args[0])
        a, b = self.args
        return f"({a.c()} {'/' if self.op == '//' else self.op} {b.c()})"


@dataclass(frozen=True)
class Guard:
    """`lhs < bound`: an access happens only where it holds."""
    lhs: IExpr
    bound: int

    def c(self) -> str:
        return f"{self.lhs.c()} < {self.bound}"


@dataclass(frozen=True)
class GlobalAccess:
    """A load or store of `buffer` (`elements` long) at `index`, where every guard holds."""
    what: str                 # "load" or "store", and of what: for messages
    buffer: str               # its name in the kernel's text
    elements: int
    index: IExpr
    guards: tuple[Guard, ...] = ()

    def guard_c(self) -> str:
        return " && ".join(g.c() for g in self.guards) or "1"


@dataclass(frozen=True)
class IndexProof:
    """A kernel's index arithmetic, for engine/cl_bounds.py: `ranges` bounds each unknown (name ->
    (lo, hi) inclusive, and an optional step: a loop counter that takes lo, lo + step, ...);
    `defs` define the named intermediates in order; `accesses` are its global loads and stores."""
    kernel: str
    ranges: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    defs: tuple[tuple[str, IExpr], ...] = ()
    accesses: tuple[GlobalAccess, ...] = ()


__all__ = ["GlobalAccess", "Guard", "IExpr", "IndexProof"]
