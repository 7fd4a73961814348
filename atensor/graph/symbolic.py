"""Symbolic integers: `Variable(name, min, max)` and linear expressions over them.

Why: a KV cache written at `start_pos` should be one task graph and one compiled kernel for every
`start_pos`, not one per value. So a view's offset (and its pad/shrink mask bounds) may be an
expression such as `4*start_pos + 3` instead of an int. The graph holds *bound* variables
(`start_pos.bind(7)`: the value is part of the node's identity, so interning never hands back a node
built for another value); scheduling strips the values off (`unbind`), so the kernel AST and the
task graph's byte ranges hold only unbound variables with their bounds, and the values travel
beside them (`Kernel.var_vals`) to the backend, which evaluates the offsets at run time.

Design: only *linear* expressions, `const + sum(coeff * var)` with integer coefficients. That is
what movement ops produce from a variable bound (offset += begin * stride), it normalizes
(`start_pos + 1 - start_pos` is the plain int 1, so shapes stay ints), and deciding a comparison
over the variables' bounds is exact by interval arithmetic (each variable occurs once). Products of
variables or division that does not come out even raise `SymbolicError`. Offsets, mask bounds and
shape dims may be expressions (graph/view.py says how a symbolic dim is laid out); strides never are.

Invariant kept by every operation here: a result with no variable left is a plain `int`, so the
integer fast path everywhere else (`type(x) is int`) stays plain ints.

    >>> s = Variable("start_pos", 0, 15)
    >>> (s + 1) - s
    1
    >>> 0 <= s < 16          # decided for every value in the bounds
    True
"""
from __future__ import annotations

import operator
from typing import Mapping, Union

any_bound = False  # True once some variable was bound: schedulers skip unbinding until then


class SymbolicError(ValueError):
    """An expression is not linear, or a comparison holds for some values of the variables only."""


class Variable:
    """An integer unknown in [min, max], optionally bound to a value. Immutable and hashable; two
    variables with the same name, bounds and value are equal.

    >>> Variable("n", 1, 8).bind(3).value
    3
    """
    __slots__ = ("name", "min", "max", "value", "_hash")

    def __init__(self, name: str, min: int, max: int, value: int | None = None):  # noqa: A002
        if type(min) is not int or type(max) is not int or min > max:
            raise SymbolicError(f"Variable {name!r}: bounds must be ints with min <= max, got [{min}, {max}]")
        if value is not None and (type(value) is not int or not min <= value <= max):
            raise SymbolicError(f"Variable {name!r}: value {value!r} is outside its bounds [{min}, {max}]")
        self.name, self.min, self.max, self.value = name, min, max, value
        self._hash = hash((name, min, max, value))

    def bind(self, value: int) -> Variable:
        """This variable with a value; graph nodes keep the value, kernels see only the variable."""
        global any_bound
        any_bound = True
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise SymbolicError(f"Variable {self.name!r}: bind needs an int, got {value!r}")
        return Variable(self.name, self.min, self.max, operator.index(value))

    def unbind(self) -> tuple[Variable, int]:
        """(the unbound variable, its value); raises when it has none."""
        if self.value is None:
            raise SymbolicError(f"variable {self.name!r} is not bound: use {self.name}.bind(value)")
        return Variable(self.name, self.min, self.max), self.value

    @property
    def unbound(self) -> Variable:
        return self if self.value is None else Variable(self.name, self.min, self.max)

    def _key(self) -> tuple:
        return (self.name, self.min, self.max, -1 if self.value is None else self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Variable) and (self.name, self.min, self.max, self.value) == \
            (other.name, other.min, other.max, other.value)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        bound = "" if self.value is None else f"={self.value}"
        return f"{self.name}[{self.min}..{self.max}]{bound}"

    def __reduce__(self):
        return (Variable, (self.name, self.min, self.max, self.value))

    # arithmetic and comparisons go through the linear form
    def _lin(self) -> Sym:
        return Sym(((self, 1),), 0)

    def __add__(self, o): return self._lin() + o
    def __radd__(self, o): return self._lin() + o
    def __sub__(self, o): return self._lin() - o
    def __rsub__(self, o): return (-self._lin()) + o
    def __mul__(self, o): return self._lin() * o
    def __rmul__(self, o): return self._lin() * o
    def __neg__(self): return -self._lin()
    def __floordiv__(self, o): return self._lin() // o
    def __lt__(self, o): return self._lin() < o
    def __le__(self, o): return self._lin() <= o
    def __gt__(self, o): return self._lin() > o
    def __ge__(self, o): return self._lin() >= o


class Sym:
    """`const + sum(coeff * var)`: a linear integer expression with at least one variable. Build it
    with arithmetic on Variables; results without variables are plain ints."""
    __slots__ = ("terms", "const", "_hash")

    def __init__(self, terms: tuple[tuple[Variable, int], ...], const: int):
        self.terms, self.const = terms, const
        self._hash = hash((terms, const))

    @staticmethod
    def make(coeffs: Mapping[Variable, int], const: int) -> Union[int, Sym]:
        """The normal form: zero coefficients dropped, terms ordered; a plain int when no term is left."""
        terms = tuple(sorted(((v, c) for v, c in coeffs.items() if c), key=lambda t: t[0]._key()))
        return Sym(terms, const) if terms else const

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sym) and self.terms == other.terms and self.const == other.const

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        parts = [("-" if c == -1 else "" if c == 1 else f"{c}*") + v.name for v, c in self.terms]
        text = " + ".join(parts) + (f" + {self.const}" if self.const else "")
        return text.replace("+ -", "- ")

    def __reduce__(self):
        return (Sym, (self.terms, self.const))

    # ---- arithmetic ---------------------------------------------------------------------------
    def __add__(self, other) -> Union[int, Sym]:
        coeffs = dict(self.terms)
        if type(other) is int:
            return Sym(self.terms, self.const + other) if other else self
        other = as_sym(other)
        for v, c in other.terms:
            coeffs[v] = coeffs.get(v, 0) + c
        return Sym.make(coeffs, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> Sym:
        return Sym(tuple((v, -c) for v, c in self.terms), -self.const)

    def __sub__(self, other) -> Union[int, Sym]:
        return self + (-other if type(other) is int else -as_sym(other))

    def __rsub__(self, other) -> Union[int, Sym]:
        return (-self) + other

    def __mul__(self, other) -> Union[int, Sym]:
        if type(other) is not int:
            if isinstance(other, bool) or not isinstance(other, int):
                raise SymbolicError(f"symbolic expressions are linear: cannot multiply {self} by {other!r} "
                                    f"(expressions stay linear: a symbolic dim cannot be merged with or scaled by another symbolic value)")
            other = int(other)
        return Sym.make({v: c * other for v, c in self.terms}, self.const * other)

    __rmul__ = __mul__

    def __floordiv__(self, other) -> Union[int, Sym]:
        if type(other) is int and other > 0 and all(c % other == 0 for _, c in self.terms) \
                and self.const % other == 0:
            return Sym.make({v: c // other for v, c in self.terms}, self.const // other)
        raise SymbolicError(f"cannot divide {self} by {other!r} exactly for every value of its variables")

    # ---- bounds and comparisons ---------------------------------------------------------------
    @property
    def min(self) -> int:
        return self.const + sum(c * (v.min if c > 0 else v.max) for v, c in self.terms)

    @property
    def max(self) -> int:
        return self.const + sum(c * (v.max if c > 0 else v.min) for v, c in self.terms)

    def _decide(self, other, op: str) -> bool:
        diff = self - other  # op holds iff `diff op 0`
        lo, hi = (diff, diff) if type(diff) is int else (diff.min, diff.max)
        verdicts = {"<": (hi < 0, lo >= 0), "<=": (hi <= 0, lo > 0), ">": (lo > 0, hi <= 0),
                    ">=": (lo >= 0, hi < 0)}
        always, never = verdicts[op]
        if always:
            return True
        if never:
            return False
        raise SymbolicError(f"`{self} {op} {other}` holds for some values of its variables and not others")

    def __lt__(self, o): return self._decide(o, "<")
    def __le__(self, o): return self._decide(o, "<=")
    def __gt__(self, o): return self._decide(o, ">")
    def __ge__(self, o): return self._decide(o, ">=")

    def variables(self) -> tuple[Variable, ...]:
        return tuple(v for v, _ in self.terms)


Expr = Union[int, Sym]


def as_sym(x) -> Sym:
    """`x` (a Variable or Sym) as a Sym; raises for anything else."""
    if isinstance(x, Sym):
        return x
    if isinstance(x, Variable):
        return x._lin()
    raise SymbolicError(f"not an integer expression: {x!r}")


def as_dim(x) -> Expr:
    """A shape dim: an int (anything with `__index__`) or a Variable/Sym as its linear form."""
    if type(x) is int:
        return x
    if isinstance(x, Variable):
        return x._lin()
    if isinstance(x, Sym):
        return x
    return operator.index(x)


def is_symbolic(x) -> bool:
    """True for Sym and Variable, False for ints (the fast path)."""
    return type(x) is not int and isinstance(x, (Sym, Variable))


def lo_of(x) -> int:
    """The smallest value `x` takes over its variables' bounds."""
    return x if type(x) is int else as_sym(x).min


def hi_of(x) -> int:
    """The largest value `x` takes over its variables' bounds."""
    return x if type(x) is int else as_sym(x).max


def sym_min(a, b):
    """min(a, b) when one is never larger, else a conservative int lower bound of both."""
    if type(a) is int and type(b) is int:
        return a if a < b else b
    try:
        return a if a <= b else b
    except SymbolicError:
        return min(lo_of(a), lo_of(b))


def sym_max(a, b):
    """max(a, b) when one is never smaller, else a conservative int upper bound of both."""
    if type(a) is int and type(b) is int:
        return a if a > b else b
    try:
        return a if a >= b else b
    except SymbolicError:
        return max(hi_of(a), hi_of(b))


def variables_of(x) -> tuple[Variable, ...]:
    """The variables `x` mentions (empty for an int)."""
    return () if type(x) is int else as_sym(x).variables()


def evaluate(x, values: Mapping[Variable, int] | None = None) -> int:
    """The int value of `x`: each variable from `values` (keyed by the unbound variable) or else its
    own bound value."""
    if type(x) is int:
        return x
    s = as_sym(x)
    total = s.const
    for v, c in s.terms:
        value = v.value
        if values is not None:
            value = values.get(v.unbound, value)
        if value is None:
            raise SymbolicError(f"no value for variable {v.name!r}")
        total += c * value
    return total


def unbind(x, into: dict[Variable, int]):
    """`x` with every bound variable replaced by its unbound self; the values are added to `into`
    (a variable bound to two different values raises)."""
    if type(x) is int:
        return x
    s = as_sym(x)
    if all(v.value is None for v, _ in s.terms):
        return x
    coeffs: dict[Variable, int] = {}
    for v, c in s.terms:
        if v.value is not None:
            free, value = v.unbind()
            if into.setdefault(free, value) != value:
                raise SymbolicError(f"variable {v.name!r} is bound to both {into[free]} and {value} in one "
                                    f"realize")
            v = free
        coeffs[v] = coeffs.get(v, 0) + c
    return Sym.make(coeffs, s.const)


def rebind(x, values: Mapping[Variable, int]):
    """`x` with each bound variable bound instead to its value in `values` (keyed by the unbound
    variable; one not there keeps its value): a jit replay's result at this call's values."""
    if type(x) is int:
        return x
    s = as_sym(x)
    coeffs: dict[Variable, int] = {}
    for v, c in s.terms:
        new = values.get(v.unbound) if v.value is not None else None
        if new is not None and new != v.value:
            v = Variable(v.name, v.min, v.max, new)
        coeffs[v] = coeffs.get(v, 0) + c
    return Sym.make(coeffs, s.const)
