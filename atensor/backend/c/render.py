"""Renders a kernel AST into one C function, for the native (compiled) tier of the CPU backend.

Why C: a numpy kernel is a Python function that holds the GIL between its numpy calls, so two CPU
devices, each a thread, take turns instead of running at once (bench/threads.py measures it). A C
kernel is one foreign call for the whole kernel; ctypes releases the GIL for its duration.

How a kernel is lowered. Nodes are computed in loop nests over their shapes:
- an elementwise node is an expression inside the nest of whatever reads it (a local variable
  each, so a value read twice in one nest is computed once);
- a REDUCE is materialized into a temporary array: its nest runs over the source's shape and
  accumulates (float sums in double);
- a REDUCE of a product of two broadcast views (a matmul in disguise) is one BLAS gemm per batch
  element (gemvs for a product of a few rows or columns; backend/gemm/c_gemm.py, backend/gemm/c_blas.py) into a temporary laid out
  [batch, rows, cols], read back through strides;
- a VIEW reads a PARAM buffer, a materialized array, a constant or an arange through its strides,
  offset and mask (a masked-out element reads 0); the computed source of a view is materialized
  first, in row-major order, as numpy's backend reads it;
- a GATHER reads its source (a buffer, a view of a leaf, or a materialized array) at the computed
  index, 0 outside the source;
- the STORE nest writes the value through the target view; a value that reads the target anywhere
  else (`t[1:] = t[:-1]`, a gather from it) is computed into a temporary first;
- a nest whose innermost axis crosses the bounds of a masked view it reads (a concatenation) is split
  there into one loop per piece, each with those masks decided (backend/c/reads.py `mask_cuts`): no
  select of a read, which GCC turns into masked loads that AMD Zen runs slowly.
A view whose offset, mask bounds or shape use Variables (a KV cache written at `start_pos`, read
`[:start_pos+1]`) reads each variable's value from an argument slot after the buffers
(`variable_slots`), so one compiled function serves every position and a jit replay rebinds it by
writing that slot; a loop over a symbolic dim runs to its value, and a temporary of symbolic shape is
allocated and laid out at the maximum (graph/view.py).
Anything this file does not know (scatter, threefry, bitcast, half floats,
integer powers) raises `Unsupported`, and the kernel stays on numpy. The semantics are those of
graph/semantics.py: floor division and divisor-signed modulo for integers, division by zero 0 for
integers, NaN-propagating max, wrapping integer arithmetic, and numpy's float-to-integer casts (a
negative value wraps into an unsigned type, where C leaves the conversion undefined).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from atensor.dtype import DType, dtypes
from atensor.graph.node import Node, toposort
from atensor.graph.ops import BINARY, PACKED, Ops, ReduceOp, UNARY
from atensor.graph.semantics import reduce_identity
from atensor.graph.symbolic import Expr, SymbolicError, Variable, as_sym
from atensor.graph.view import View, strides_for
from atensor.backend.gemm.c_gemm import render_gemm
from atensor.backend.c.reads import mask_cuts as _mask_cuts, readable_anywhere as _readable_anywhere, \
    reads_at as _reads_at
from atensor.backend.c.types import Unsupported, ctype as _ctype
from atensor.backend.quant.source import NotPacked, render_packed


# float ops as C templates: {f} is libm's float suffix ("f" for float32), {t} the C type
_FLOAT_UNARY = {**{op: fn + "{f}({x})" for op, fn in (
    (Ops.SQRT, "sqrt"), (Ops.EXP, "exp"), (Ops.LOG, "log"), (Ops.SIN, "sin"), (Ops.COS, "cos"),
    (Ops.TANH, "tanh"), (Ops.EXP2, "exp2"), (Ops.LOG2, "log2"), (Ops.TRUNC, "trunc"))},
    Ops.NEG: "(-{x})", Ops.RECIP: "(({t})1 / {x})"}
_FLOAT_BINARY = {Ops.ADD: "({a} + {b})", Ops.SUB: "({a} - {b})", Ops.MUL: "({a} * {b})",
                 Ops.FDIV: "({a} / {b})", Ops.MAX: "AT_FMAX({a}, {b})", Ops.POW: "pow{f}({a}, {b})",
                 Ops.MOD: "at_fmod{f}({a}, {b})"}


def _float_op(table: dict[Ops, str], op: Ops, dtype: DType, ct: str, **operands: str) -> str:
    template = table.get(op)
    if template is None:
        raise Unsupported(f"{op} on floats")
    return template.format(f="f" if dtype == dtypes.float32 else "", t=ct, **operands)
_CMP = {Ops.CMPLT: "<", Ops.CMPEQ: "==", Ops.CMPNE: "!="}
_BITS = {Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}


def _literal(value: Any, dtype: DType) -> str:
    """A C constant of `dtype` for the Python scalar `value`."""
    ct = _ctype(dtype)
    if dtype.kind == "f":
        value = float(value)
        if math.isnan(value):
            return f"(({ct})NAN)"
        if math.isinf(value):
            return f"(({ct})({'-' if value < 0 else ''}INFINITY))"
        return f"(({ct}){value!r})"
    if dtype.kind == "b":
        return "1" if value else "0"
    value = int(value)
    return f"(({ct}){value}ULL)" if dtype.kind == "u" else f"(({ct})({value}LL))" if value != -2**63 \
        else f"(({ct})(-9223372036854775807LL - 1))"


def variable_slots(ast: Node) -> tuple[int, tuple[Variable, ...]]:
    """(the first argument slot after the buffers, the kernel's variables in slot order): a kernel
    whose views' offsets or mask bounds use (unbound) Variables reads variable j's value, an int64,
    from `bufs[base + j]`, so one compiled function serves every value and a replay rebinds it by
    writing that slot (engine/lower.py)."""
    base, found = 0, {}
    for n in toposort([ast]):
        if n.op is Ops.PARAM:
            base = max(base, n.arg[0] + 1)
        elif n.op is Ops.VIEW:
            for v in n.arg.variables():
                found[v] = None
    return base, tuple(sorted(found, key=lambda v: (v.name, v.min, v.max)))


def _int_c(x: Expr, names: dict[Variable, str]) -> str:
    """C text of an index expression: an int, or a linear Sym over the kernel's variables."""
    if type(x) is int:
        return str(x) if -2**31 < x < 2**31 else f"{x}LL"
    s = as_sym(x)
    terms = [names[v] if c == 1 else f"{c}LL * {names[v]}" for v, c in s.terms]
    if s.const:
        terms.append(f"{s.const}LL")
    return "(" + " + ".join(terms) + ")"


def _never_valid(b: Expr, e: Expr) -> bool:
    """A mask range that holds no element for any value of its variables."""
    try:
        return bool(b >= e)
    except SymbolicError:
        return False


# reads `_Nest.value` leaves to `expression` (a leaf, or a source read at another index)
_READS = frozenset({Ops.PARAM, Ops.CONST, Ops.ARANGE, Ops.VIEW, Ops.GATHER})


class _Nest:
    """One loop nest under construction: its index variable per axis and its body's statements."""

    def __init__(self, renderer: CRenderer, index: list[str]):
        self.r, self.index, self.stmts = renderer, index, []
        self.local: dict[Node, str] = {}

    def value(self, n: Node) -> str:
        """A C expression for `n` at this nest's index (`n` has the nest's shape). Its elementwise
        sources are named first, deepest first, so a long chain does not recurse once per node."""
        found = self.local.get(n)
        if found is not None:
            return found
        order, stack, seen = [], [(n, False)], set()
        while stack:
            m, done = stack.pop()
            if done:
                order.append(m)
            elif m not in seen and m not in self.local and m not in self.r.arrays and m.op not in _READS:
                seen.add(m)
                stack.append((m, True))
                stack.extend((s, False) for s in reversed(m.src))
        for m in order[:-1]:
            if m not in self.local:
                self._value(m)
        return self._value(n)

    def _value(self, n: Node) -> str:
        expr = self.r.expression(n, self.index, self)
        if n.op in (Ops.CONST,) or expr.isidentifier():
            return expr
        name = self.r.fresh("v")
        self.stmts.append(f"{_ctype(n.dtype)} {name} = {expr};")
        self.local[n] = name
        return name


class CRenderer:
    """Lowers one kernel AST (a STORE) to the C source of `void name(void **bufs)`."""

    def __init__(self, ast: Node, name: str, blas: bool):
        if ast.op is not Ops.STORE:
            raise Unsupported(f"a kernel rooted at {ast.op}")
        self.ast, self.name, self.blas = ast, name, blas
        self.order = toposort([ast])
        self.counter = 0
        self.lines: list[str] = []
        self.temps: list[str] = []
        # materialized node -> (array name, element strides per axis)
        self.arrays: dict[Node, tuple[str, tuple[int, ...]]] = {}
        self.params: dict[Node, str] = {}
        self.var_base, variables = variable_slots(ast)
        self.vars: dict[Variable, str] = {v: f"var{j}" for j, v in enumerate(variables)}
        # a negative stride anywhere (a flip) selects the flags known to be correct (backend/c/prelude.py), and
        # no `omp simd` loop (which GCC would vectorize despite them)
        self.negative = any(n.op is Ops.VIEW and any(st < 0 for st in n.arg.strides) for n in self.order)
        # the piece of a split innermost loop being rendered (`_emit_nest`): its variable and range
        self.piece: tuple[str, int, int] | None = None

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # ---- reading values ---------------------------------------------------------------------------
    def expression(self, n: Node, index: list[str], nest: _Nest) -> str:
        op = n.op
        if n in self.arrays:
            name, strides = self.arrays[n]
            return f"{name}[{self.offset(0, strides, n.shape, index)}]"
        if op is Ops.PARAM:
            return f"{self.params[n]}[{index[0] if n.shape and n.shape[0] != 1 else '0'}]"
        if op is Ops.CONST:
            return _literal(n.arg[0], n.dtype)
        if op is Ops.ARANGE:
            return self._arange(n, index[0] if n.shape[0] != 1 else "0")
        if op is Ops.VIEW:
            return self._view(n, index)
        if op is Ops.GATHER:
            source, size = n.src[0], n.src[0].shape[0]
            at = f"(int64_t)({nest.value(n.src[1])})"
            read = self.expression(source, [at], nest)  # a leaf or an array: read at any position
            return f"(({at} >= 0 && {at} < {size}) ? {read} : {_literal(0, n.dtype)})"
        ct = _ctype(n.dtype)
        srcs = [nest.value(s) for s in n.src]
        if op is Ops.CAST:
            return self._cast(srcs[0], n.src[0].dtype, n.dtype)
        if op is Ops.WHERE:
            return f"({srcs[0]} ? {srcs[1]} : {srcs[2]})"
        if any(s.dtype != n.src[0].dtype for s in n.src):
            raise Unsupported(f"{op} on mixed dtypes")
        if op in UNARY:
            return self._unary(op, srcs[0], n.dtype, ct)
        if op in BINARY:
            return self._binary(op, srcs[0], srcs[1], n.src[0].dtype, ct)
        raise Unsupported(f"op {op}")

    def _arange(self, n: Node, position: str) -> str:
        start, step = n.arg[0], n.arg[1]
        ct = _ctype(n.dtype)
        if n.dtype.kind == "f" or start != int(start) or step != int(step):
            # an integer arange with a fractional start or step is computed in double and each value
            # truncated, as the numpy backend does (arange(0.5, 5, 1.5, dtype=int32) is 0, 2, 3)
            value = f"((double){float(start)!r} + (double){float(step)!r} * (double)({position}))"
            return f"(({ct}){value})" if n.dtype.kind == "f" else self._cast(value, dtypes.float64, n.dtype)
        return f"(({ct})((int64_t)({int(start)}LL) + (int64_t)({int(step)}LL) * (int64_t)({position})))"

    def _view(self, n: Node, index: list[str]) -> str:
        view: View = n.arg
        src = n.src[0]
        flat = self.offset(view.offset, view.strides, view.shape, index)
        if src.op is Ops.CONST:
            read = _literal(src.arg[0], src.dtype)
        elif src.op is Ops.ARANGE:
            read = self._arange(src, flat)
        elif src.op is Ops.PARAM:
            read = f"{self.params[src]}[{flat}]"
        else:
            name, strides = self.arrays[src]
            if strides != strides_for(src.shape):
                raise Unsupported("a view of a strided temporary")  # materialize() copies these
            read = f"{name}[{flat}]"
        if view.mask is None:
            return read
        piece = self.piece
        conds = []
        for (b, e), s, i in zip(view.mask, view.shape, index):
            if type(b) is int and type(e) is int:
                if b == 0 and e == s:
                    continue
                if piece is not None and i == piece[0]:  # decided for the whole piece (`_emit_nest`)
                    if b <= piece[1] and piece[2] <= e:
                        continue
                    if piece[2] <= b or e <= piece[1]:
                        return _literal(0, n.dtype)
            conds.append(f"({self.int_c(b)} <= {i} && {i} < {self.int_c(e)})")
        if any(_never_valid(b, e) for b, e in view.mask):
            return _literal(0, n.dtype)
        if not conds:
            return read
        return f"(({' && '.join(conds)}) ? {read} : {_literal(0, n.dtype)})"

    @staticmethod
    def _cast(x: str, src: DType, dst: DType) -> str:
        ct = _ctype(dst)
        _ctype(src)
        if dst == dtypes.bool:
            return f"(uint8_t)({x} != 0)"
        if src.kind == "f" and (dst.itemsize < 4 or dst.kind == "u"):
            # numpy's conversion: through a signed integer, so a negative value wraps into an unsigned
            # type (-129.0 -> uint32 4294967167) where C leaves it undefined (AVX-512 saturates)
            if dst == dtypes.uint64:
                return f"(({x}) < 0 ? (uint64_t)(int64_t)({x}) : (uint64_t)({x}))"
            return f"(({ct})(int{32 if dst.itemsize < 4 else 64}_t)({x}))"
        return f"(({ct})({x}))"

    @staticmethod
    def _unary(op: Ops, x: str, dtype: DType, ct: str) -> str:
        if dtype.kind == "f":
            return _float_op(_FLOAT_UNARY, op, dtype, ct, x=x)
        if op is Ops.NOT:
            return f"(uint8_t)(!{x})" if dtype.kind == "b" else f"(({ct})~{x})"
        if op is Ops.TRUNC:
            return x
        if op is Ops.NEG and dtype.kind in "iu":
            return f"(({ct})(0 - ({'uint64_t' if dtype.itemsize == 8 else 'uint32_t'}){x}))"
        raise Unsupported(f"{op} on {dtype}")

    @staticmethod
    def _binary(op: Ops, a: str, b: str, dtype: DType, ct: str) -> str:
        if op in _CMP:
            return f"(uint8_t)({a} {_CMP[op]} {b})"
        kind = dtype.kind
        if kind == "f":
            return _float_op(_FLOAT_BINARY, op, dtype, ct, a=a, b=b)
        if kind == "b":
            if op in (Ops.ADD, Ops.OR, Ops.MAX):
                return f"(uint8_t)({a} | {b})"
            if op in (Ops.MUL, Ops.AND):
                return f"(uint8_t)({a} & {b})"
            if op is Ops.XOR:
                return f"(uint8_t)({a} ^ {b})"
            raise Unsupported(f"{op} on bool")
        # wrapping arithmetic in unsigned int at least: uint16_t * uint16_t would promote to (signed)
        # int and overflow, which C leaves undefined
        unsigned = "uint64_t" if dtype.itemsize == 8 else "uint32_t"
        if op in (Ops.ADD, Ops.SUB, Ops.MUL):
            sym = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*"}[op]
            return f"(({ct})(({unsigned}){a} {sym} ({unsigned}){b}))"
        if op in _BITS:
            return f"(({ct})({a} {_BITS[op]} {b}))"
        if op is Ops.MAX:
            return f"AT_IMAX({a}, {b})"
        if op in (Ops.IDIV, Ops.MOD):
            fn = ("at_idiv" if op is Ops.IDIV else "at_imod") if kind == "i" else \
                ("at_udiv" if op is Ops.IDIV else "at_umod")
            wide = "int64_t" if kind == "i" else "uint64_t"
            return f"(({ct}){fn}(({wide}){a}, ({wide}){b}))"
        raise Unsupported(f"{op} on {dtype}")

    def int_c(self, x: Expr) -> str:
        """C text of an int or a symbolic index expression over this kernel's variables."""
        return _int_c(x, self.vars)

    def offset(self, base: Expr, strides: tuple[int, ...], shape: tuple[int, ...], index: list[str]) -> str:
        """C text of the flat index `base + sum(index[i] * strides[i])`; `base` may be symbolic."""
        return _offset(self.int_c(base), strides, shape, index)

    # ---- loop nests ---------------------------------------------------------------------------------
    def _loops(self, shape: tuple[int, ...], axes: list[int], index: list[str], depth: int) -> tuple[list[str], int]:
        """`for` lines over `axes` of `shape` (size-1 axes are index 0, no loop)."""
        opened = []
        for a in axes:
            if shape[a] == 1:
                index[a] = "0"
                continue
            var = self.fresh("i")
            index[a] = var
            # a symbolic dim loops to its value, read from the kernel's variable slots (graph/view.py)
            opened.append("  " * depth + f"for (int64_t {var} = 0; {var} < {self.int_c(shape[a])}; {var}++) {{")
            depth += 1
        return opened, depth

    def _emit_nest(self, shape: tuple[int, ...], body: Callable[[_Nest], list[str]], value: Node) -> None:
        """A full nest over `shape` whose innermost statements `body` gives (computing `value`). When
        masked views read in it start or end inside its innermost axis (`_mask_cuts`), that loop is
        split there, and each piece is rendered with every such mask decided (`_view`): no select of a
        read in the loop."""
        index = ["0"] * len(shape)
        cuts = _mask_cuts(value, shape, self.arrays)
        if not cuts:
            opened, depth = self._loops(shape, list(range(len(shape))), index, 1)
            nest = _Nest(self, index)
            tail = body(nest)
            self.lines.extend(opened)
            self.lines.extend("  " * depth + s for s in nest.stmts + tail)
            self.lines.extend("  " * d + "}" for d in range(depth - 1, 0, -1))
            return
        last = len(shape) - 1
        opened, depth = self._loops(shape, list(range(last)), index, 1)
        self.lines.extend(opened)
        var = index[last] = self.fresh("i")
        bounds = [0, *cuts, shape[last]]
        for lo, hi in zip(bounds, bounds[1:]):
            self.piece = (var, lo, hi)
            nest = _Nest(self, index)
            tail = body(nest)
            self.lines.append("  " * depth + f"for (int64_t {var} = {lo}; {var} < {hi}; {var}++) {{")
            self.lines.extend("  " * (depth + 1) + s for s in nest.stmts + tail)
            self.lines.append("  " * depth + "}")
        self.piece = None
        self.lines.extend("  " * d + "}" for d in range(depth - 1, 0, -1))

    def _temp(self, n: Node, ct: str, size: int) -> str:
        name = self.fresh("t")
        self.lines.append(f"  {ct} *{name} = ({ct} *)malloc({max(size, 1)} * sizeof({ct}));")
        self.temps.append(name)
        return name

    def materialize(self, n: Node) -> None:
        """Computes `n` into a temporary (row-major unless a gemm lays it out otherwise)."""
        if n.op is Ops.REDUCE:
            if self.blas and self._gemm(n):
                return
            self._reduce(n)
            return
        self._row_major(n)

    def _row_major(self, n: Node) -> None:
        """`n` computed (or, already materialized at other strides, copied) into a row-major temporary."""
        name = self._temp(n, _ctype(n.dtype), n.size)
        strides = strides_for(n.shape)

        def body(nest: _Nest) -> list[str]:
            return [f"{name}[{self.offset(0, strides, n.shape, nest.index)}] = {nest.value(n)};"]
        self._emit_nest(n.shape, body, n)
        self.arrays[n] = (name, strides)

    def _reduce(self, n: Node) -> None:
        op, axes = n.arg
        src = n.src[0]
        ct = _ctype(n.dtype)
        _ctype(src.dtype)
        if n.dtype != src.dtype:
            raise Unsupported("a reduce that changes dtype")
        kind = n.dtype.kind
        acc_t = "double" if kind == "f" and op is not ReduceOp.MAX else \
            ("uint64_t" if kind in "iu" and op is not ReduceOp.MAX else ct)
        init = _literal(reduce_identity(op, n.dtype), n.dtype)

        def combine(acc: str, v: str) -> str:
            if op is ReduceOp.MAX:
                return f"{acc} = {'AT_FMAX' if kind == 'f' else 'AT_IMAX'}({acc}, {v});"
            if kind == "b":
                return f"{acc} = {acc} {'|' if op is ReduceOp.SUM else '&'} {v};"
            cast = f"({acc_t})" if kind in "iuf" else ""
            return f"{acc} {'+' if op is ReduceOp.SUM else '*'}= {cast}{v};"
        out_name = self._temp(n, ct, n.size)
        out_strides = strides_for(n.shape)
        shape = src.shape
        kept = [a for a in range(len(shape)) if a not in axes]
        reduced = [a for a in range(len(shape)) if a in axes]
        index = ["0"] * len(shape)
        out_index = lambda: self.offset(0, out_strides, n.shape, [("0" if a in axes else index[a])
                                                                for a in range(len(shape))])
        if reduced and all(a > max(kept, default=-1) for a in reduced):
            # inner reduction: a register accumulator per output element
            opened, depth = self._loops(shape, kept, index, 1)
            self.lines.extend(opened)
            acc = self.fresh("acc")
            self.lines.append("  " * depth + f"{acc_t} {acc} = ({acc_t}){init};")
            inner, d2 = self._loops(shape, reduced, index, depth)
            nest = _Nest(self, index)
            v = nest.value(src)
            simd = _simd_reduction(op, kind, acc) if inner and not self.negative else None
            if simd is not None:
                # the innermost loop's partial results may be kept in vector lanes (backend/c/flags.py), the
                # same reassociation in every path that runs this kernel (jit, eager, any thread count)
                pragma, update, nan = simd
                if nan:
                    self.lines.append("  " * depth + f"uint8_t {nan} = 0;")
                inner.insert(len(inner) - 1, "  " * (d2 - 1) + pragma)
                body = update(v)
            else:
                nan, body = None, [combine(acc, v)]
            self.lines.extend(inner)
            self.lines.extend("  " * d2 + s for s in nest.stmts + body)
            self.lines.extend("  " * d + "}" for d in range(d2 - 1, depth - 1, -1))
            if nan:
                self.lines.append("  " * depth + f"if ({nan}) {acc} = NAN;")
            self.lines.append("  " * depth + f"{out_name}[{out_index()}] = ({ct}){acc};")
            self.lines.extend("  " * d + "}" for d in range(depth - 1, 0, -1))
        else:
            # any other order: accumulate into an array in the source's row-major order
            acc = out_name if acc_t == ct else self._temp(n, acc_t, n.size)
            self.lines.append(f"  for (int64_t j = 0; j < {n.size}; j++) {acc}[j] = ({acc_t}){init};")
            opened, depth = self._loops(shape, list(range(len(shape))), index, 1)
            nest = _Nest(self, index)
            v = nest.value(src)
            self.lines.extend(opened)
            self.lines.extend("  " * depth + s for s in nest.stmts + [combine(f"{acc}[{out_index()}]", v)])
            self.lines.extend("  " * d + "}" for d in range(depth - 1, 0, -1))
            if acc != out_name:
                self.lines.append(f"  for (int64_t j = 0; j < {n.size}; j++) {out_name}[j] = ({ct}){acc}[j];")
        self.arrays[n] = (out_name, out_strides)

    def _gemm(self, n: Node) -> bool:
        """A SUM over a product of two broadcast views as BLAS calls (backend/gemm/c_gemm.py); False when it does not fit."""
        return render_gemm(self, n)

    # ---- the function -------------------------------------------------------------------------------
    def name_params(self) -> list[Node]:
        """The kernel's PARAM nodes in argument order, each named `b<k>` in the rendered code."""
        params = sorted((n for n in self.order if n.op is Ops.PARAM), key=lambda n: n.arg[0])
        for p in params:
            self.params[p] = f"b{p.arg[0]}"
        return params

    def render(self) -> str:
        params = self.name_params()
        if self.ast.src[1].op in PACKED:  # one call of the packed-weight kernels
            try:
                return render_packed(self.ast, self.name, [(p.arg[0], _ctype(p.dtype)) for p in params])
            except NotPacked as why:
                raise Unsupported(str(why)) from None
        header = [f"{'AT_NEGATIVE_STEPS ' if self.negative else ''}void {self.name}(void **bufs) {{"]
        header += [f"  {_ctype(p.dtype)} *restrict b{p.arg[0]} = ({_ctype(p.dtype)} *)bufs[{p.arg[0]}];"
                   for p in params]
        # a bound Variable's value sits in the slots after the buffers, as an int64 (variable_slots)
        header += [f"  const int64_t {name} = (int64_t)(intptr_t)bufs[{self.var_base + j}];"
                   for j, name in enumerate(self.vars.values())]
        self.lower()
        return "\n".join(header + self.lines + [f"  free({t});" for t in self.temps] + ["}"]) + "\n"

    def lower(self) -> None:
        """Emits the kernel's nests (`self.lines`), materialized values first, then the store; the
        parameters are named first (`name_params`). backend/gpu/render.py emits the same nests as kernels."""
        need: set[Node] = set()
        for n in self.order:
            if n.op in (Ops.SCATTER, Ops.BITCAST, Ops.THREEFRY):
                raise Unsupported(f"op {n.op}")
            _ctype(n.dtype)
            if n.op is Ops.REDUCE:
                need.add(n)
            elif n.op is Ops.GATHER and not _readable_anywhere(n.src[0]):
                need.add(n.src[0])
            elif n.op is Ops.VIEW and n is not self.ast.src[0]:
                if n.src[0].op not in (Ops.PARAM, Ops.CONST, Ops.ARANGE):
                    need.add(n.src[0])
        for n in self.order:
            if n in need:
                self.materialize(n)  # a view of a view: the inner one is copied out first
                name, strides = self.arrays[n]
                if strides != strides_for(n.shape) and any(u.op is Ops.VIEW and u.src[0] is n for u in self.order):
                    self._row_major(n)
        self._store()

    def _reads_elsewhere(self, value: Node, param: Node, view: View) -> bool:
        return _reads_at(value, param, view, self.arrays, set())

    def _store(self) -> None:
        target, value = self.ast.src
        if target.op is Ops.VIEW:
            view, param = target.arg, target.src[0]
        else:
            view, param = View.create(target.shape), target
        if view.mask is not None or param.op is not Ops.PARAM:
            raise Unsupported("a masked store")
        ct = _ctype(param.dtype)
        buf = self.params[param]
        if self._reads_elsewhere(value, param, view) and value not in self.arrays:
            self.materialize(value)  # `t[1:] = t[:-1]`: every read happens before the first write

        def body(nest: _Nest) -> list[str]:
            v = nest.value(value)
            if value.dtype != param.dtype:
                v = self._cast(v, value.dtype, param.dtype)
            return [f"{buf}[{self.offset(view.offset, view.strides, view.shape, nest.index)}] = ({ct}){v};"]
        self._emit_nest(value.shape, body, value)


SimdReduction = tuple[str, Callable[[str], list[str]], "str | None"]


def _simd_reduction(op: ReduceOp, kind: str, acc: str) -> SimdReduction | None:
    """(the `omp simd` pragma, the loop body's update of `acc` by a value, the NaN flag's name or None)
    that vectorizes an inner reduce loop. A float max keeps NaN apart: `AT_FMAX`'s NaN test does not
    vectorize as a reduction (GCC 12 turned it into a wrong one under `reduction(max)`: -inf for rows
    holding a NaN), so the lanes take a plain max and a flag ORs `v != v`; the flag, set, makes the
    result NaN, as numpy's max is. None for a reduce the pragma does not cover."""
    if op is ReduceOp.MAX and kind == "f":
        nan = acc + "_nan"
        return (f"#pragma omp simd reduction(max:{acc}) reduction(|:{nan})",
                lambda v: [f"{nan} |= (uint8_t)({v} != {v});", f"{acc} = {acc} > {v} ? {acc} : {v};"], nan)
    if kind == "b":
        sym = "|" if op in (ReduceOp.SUM, ReduceOp.MAX) else "&"
        return f"#pragma omp simd reduction({sym}:{acc})", lambda v: [f"{acc} = {acc} {sym} {v};"], None
    if op is ReduceOp.MAX:
        return f"#pragma omp simd reduction(max:{acc})", lambda v: [f"{acc} = AT_IMAX({acc}, {v});"], None
    if op in (ReduceOp.SUM, ReduceOp.PROD):
        sym = "+" if op is ReduceOp.SUM else "*"
        return (f"#pragma omp simd reduction({sym}:{acc})",
                lambda v: [f"{acc} {sym}= ({'double' if kind == 'f' else 'uint64_t'}){v};"], None)
    return None


def _offset(base: str, strides: tuple[int, ...], shape: tuple[int, ...], index: list[str]) -> str:
    """C text of `base + sum(index[i] * strides[i])` (`base` is C text already, "0" for none)."""
    terms = [base] if base != "0" else []
    for st, s, i in zip(strides, shape, index):
        if st == 0 or s == 1 or i == "0":
            continue
        terms.append(i if st == 1 else f"{i} * {st}")
    return " + ".join(terms) or "0"


def render_c(ast: Node, name: str, blas: bool = True) -> str:
    """C source of `void name(void **bufs)` computing the kernel `ast`; raises Unsupported."""
    return CRenderer(ast, name, blas).render()
