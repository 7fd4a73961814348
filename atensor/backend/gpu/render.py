"""Renders a kernel AST into data-parallel GPU kernels, from the same lowering as the C backend.

Why a subclass of the C renderer: the kernel description is one (a STORE AST), and so is its lowering
(backend/c/render.py): which nodes are materialized, how a view, a gather, a cast or a reduce reads, the
semantics of every op. What a GPU changes is only where the loops go. The C renderer emits one
function whose loop nests run one after another; here each nest becomes a kernel of its own, launched
in order on an in-order queue (so one kernel's writes are visible to the next), and its outer loops
become work-items:
- an elementwise nest (a materialized value, the store): one work-item per element (up to 256 x 1024
  work-items, which then stride over the rest), the index of each axis decomposed from the element's;
- a reduce: one work-item per output element looping over the reduced axes (a "row"), or, when rows
  are long and few, one work-group per output element whose work-items stride over the row and then
  combine their partial results in shared memory (a tree, with barriers);
- a sum over a product of two strided views (a matmul in disguise, as c_render's gemm path finds it):
  a tiled matmul, TILE x TILE work-groups staging tiles of both operands in shared memory.
Temporaries are device buffers the runner allocates once (arguments after the kernel's buffers);
bound Variables are 64-bit scalar arguments after those. What a language spells differently
(address spaces, ids, barriers, helper names) comes from a `Dialect` (backend/gpu/dialect.py).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Callable

from atensor.backend.gemm.c_blas import merged_stride
from atensor.backend.c.render import CRenderer, Unsupported, _Nest, _ctype, _literal
from atensor.backend.gemm.axes import contraction_groups
from atensor.backend.gpu.dialect import Dialect
from atensor.backend.gpu.index import GlobalAccess, Guard, IExpr, IndexProof
from atensor.dtype import dtypes
from atensor.graph.node import Node
from atensor.graph.ops import Ops, ReduceOp
from atensor.graph.semantics import reduce_identity
from atensor.graph.rewrite import has_symbolic_shape
from atensor.graph.symbolic import Variable, as_sym
from atensor.graph.view import strides_for

GROUP_SIZE = 64          # work-items per work-group of a reduce's kernel (a work-item per row)
ELEMENTWISE_GROUP = 256  # work-items per work-group of an elementwise kernel ...
MAX_GROUPS = 1024        # ... and at most this many groups: its work-items stride over the rest
LONG_ROW = 2048          # a reduced row at least this long ...
FEW_ROWS = 4096          # ... in a reduce of at most this many rows gets a work-group per row
ROW_GROUP = 128          # work-items of such a work-group (a power of two: the tree halves it)
TILE = 16                # a tiled matmul's tile: TILE x TILE work-items, two TILE x TILE tiles shared
TILED_MIN_FLOPS = 1 << 18  # smaller products stay plain reduces (a tile's staging costs more)


@dataclass(frozen=True)
class GPUKernel:
    """One launch: the kernel's name, its work-items (a multiple of `local_size`) and work-group size."""
    name: str
    global_size: int
    local_size: int


@dataclass(frozen=True)
class GPUProgram:
    """A kernel AST as GPU source: its kernels, launched in order with the same arguments: the
    `buffers` buffers of the work, then the temporaries (`temp_bytes` each), then one 64-bit integer
    per bound Variable (`variables`)."""
    source: str
    kernels: tuple[GPUKernel, ...]
    buffers: int
    temp_bytes: tuple[int, ...]
    variables: tuple[Variable, ...]
    body: str = ""  # the kernels' code without the dialect's prelude (programs of many kernels join these)
    proofs: tuple[IndexProof, ...] = ()  # the index arithmetic of its own (a tiled matmul's): engine/cl_bounds.py


class GPURenderer(CRenderer):
    """The C renderer's lowering, each nest a data-parallel kernel (see the module docstring)."""

    def __init__(self, ast: Node, name: str, dialect: Dialect, fp64: bool):
        super().__init__(ast, name, blas=False)
        self.dialect, self.fp64 = dialect, fp64
        self.kernels: list[tuple[GPUKernel, list[str]]] = []
        self.temp_list: list[tuple[str, str, int]] = []  # (name, C type, elements)
        self.proofs: list[IndexProof] = []  # what its tiled kernels' addresses are made of (backend/gpu/index.py)

    # ---- what differs from the C function -----------------------------------------------------------
    def _temp(self, n: Node, ct: str, size: int) -> str:
        name = self.fresh("t")
        self.temp_list.append((name, ct, max(size, 1)))
        return name

    def _offset_expr(self, offset) -> IExpr:
        """A view's offset (an int, or linear over the kernel's variables) as an IExpr."""
        if type(offset) is int:
            return IExpr.of(offset)
        sym = as_sym(offset)
        return sum((IExpr.var(self.vars[var]) * c for var, c in sym.terms), IExpr.of(sym.const))

    def _kernel(self, items: int, lines: list[str], local: int = GROUP_SIZE) -> None:
        """A kernel of `lines` over `items` work-items, rounded up to whole work-groups of `local` (the
        lines return early past `items` themselves, where it is not a multiple)."""
        groups = max(1, -(-items // local))
        name = f"{self.name}_{len(self.kernels)}"
        self.kernels.append((GPUKernel(name, groups * local, local), lines))

    @staticmethod
    def _index_type(total: int) -> str:
        return "int" if total < 2 ** 31 else "int64_t"

    def _decompose(self, shape: tuple[int, ...], axes: list[int], index: list[str], flat: str,
                   itype: str) -> list[str]:
        """Lines giving each of `axes` (of `shape`, row-major) its index variable from `flat`."""
        live = [a for a in axes if shape[a] != 1]
        for a in axes:
            index[a] = "0"
        lines, rest = [], flat
        for k, a in enumerate(reversed(live)):
            var = self.fresh("i")
            index[a] = var
            if k == len(live) - 1:
                lines.append(f"{itype} {var} = {rest};")
            else:
                lines.append(f"{itype} {var} = {rest} % {shape[a]};")
                nxt = self.fresh("r")
                lines.append(f"{itype} {nxt} = {rest} / {shape[a]};")
                rest = nxt
        return lines

    def _emit_nest(self, shape: tuple[int, ...], body: Callable[[_Nest], list[str]], value: Node) -> None:
        """An elementwise kernel: a bounded launch whose work-items stride over the elements (a work-group
        costs pocl ~5 us to start: half a million elements in groups of 64 took 41 ms, 9.7x the CPU).
        (`value`, what it computes, is for the C renderer's loop split, which a launch does not need.)"""
        total = math.prod(shape)
        items = min(total, MAX_GROUPS * ELEMENTWISE_GROUP)
        itype = self._index_type(total + items)
        index = ["0"] * len(shape)
        decompose = self._decompose(shape, list(range(len(shape))), index, "gid", itype)
        nest = _Nest(self, index)
        tail = body(nest)
        stride = -(-items // ELEMENTWISE_GROUP) * ELEMENTWISE_GROUP
        lines = [f"for ({itype} gid = ({itype}){self.dialect.global_id}; gid < {total}; gid += {stride}) {{"]
        lines += ["  " + s for s in decompose + nest.stmts + tail] + ["}"]
        self._kernel(items, lines, local=ELEMENTWISE_GROUP)

    # ---- reductions ---------------------------------------------------------------------------------
    def _reduce(self, n: Node) -> None:
        op, axes = n.arg
        src = n.src[0]
        ct = _ctype(n.dtype)
        _ctype(src.dtype)
        if n.dtype != src.dtype:
            raise Unsupported("a reduce that changes dtype")
        kind = n.dtype.kind
        if kind == "f" and op is not ReduceOp.MAX:
            acc_t = "double" if self.fp64 else "float"
        else:
            acc_t = "uint64_t" if kind in "iu" and op is not ReduceOp.MAX else ct
        init = _literal(reduce_identity(op, n.dtype), n.dtype)
        out = self._temp(n, ct, n.size)
        shape = src.shape
        kept = [a for a in range(len(shape)) if a not in axes]
        reduced = [a for a in range(len(shape)) if a in axes]
        rows, length = n.size, math.prod(shape[a] for a in reduced)
        itype = self._index_type(max(rows, length) * ROW_GROUP)
        index = ["0"] * len(shape)
        d = self.dialect
        if length >= LONG_ROW and rows <= FEW_ROWS:  # a work-group per row, a tree in shared memory
            lines = [f"{d.local_space} {acc_t} part[{ROW_GROUP}];",
                     f"{itype} row = ({itype}){d.group_id};", f"int lid = (int){d.local_id};"]
            lines += self._decompose(shape, kept, index, "row", itype)
            lines.append(f"{acc_t} acc = ({acc_t}){init};")
            lines.append(f"for ({itype} j = lid; j < {length}; j += {ROW_GROUP}) {{")
            inner = self._decompose(shape, reduced, index, "j", itype)
            nest = _Nest(self, index)
            v = nest.value(src)
            lines += ["  " + s for s in inner + nest.stmts + [self._combine(op, kind, acc_t, "acc", v)]]
            lines += ["}", "part[lid] = acc;", d.barrier,
                      f"for (int s = {ROW_GROUP // 2}; s > 0; s >>= 1) {{",
                      f"  if (lid < s) part[lid] = {self._pair(op, kind, 'part[lid]', 'part[lid + s]')};",
                      f"  {d.barrier}", "}",
                      f"if (lid == 0) {out}[row] = ({ct})part[0];"]
            self._kernel(rows * ROW_GROUP, lines, local=ROW_GROUP)
        else:  # a work-item per row
            lines = [f"{itype} gid = ({itype}){d.global_id};", f"if (gid >= {rows}) return;"]
            lines += self._decompose(shape, kept, index, "gid", itype)
            lines.append(f"{acc_t} acc = ({acc_t}){init};")
            opened, depth = self._loops(shape, reduced, index, 0)
            nest = _Nest(self, index)
            v = nest.value(src)
            lines += opened
            lines += ["  " * depth + s for s in nest.stmts + [self._combine(op, kind, acc_t, "acc", v)]]
            lines += ["  " * k + "}" for k in range(depth - 1, -1, -1)]
            lines.append(f"{out}[gid] = ({ct})acc;")
            self._kernel(rows, lines)
        self.arrays[n] = (out, strides_for(n.shape))

    @staticmethod
    def _combine(op: ReduceOp, kind: str, acc_t: str, acc: str, v: str) -> str:
        """`acc` updated with the value `v` (the C renderer's rules: floats summed in `acc_t`)."""
        if op is ReduceOp.MAX:
            return f"{acc} = {'AT_FMAX' if kind == 'f' else 'AT_IMAX'}({acc}, {v});"
        if kind == "b":
            return f"{acc} = {acc} {'|' if op is ReduceOp.SUM else '&'} {v};"
        return f"{acc} {'+' if op is ReduceOp.SUM else '*'}= ({acc_t}){v};"

    @staticmethod
    def _pair(op: ReduceOp, kind: str, a: str, b: str) -> str:
        """Two partial results combined (a work-group's tree)."""
        if op is ReduceOp.MAX:
            return f"{'AT_FMAX' if kind == 'f' else 'AT_IMAX'}({a}, {b})"
        if kind == "b":
            return f"({a} {'|' if op is ReduceOp.SUM else '&'} {b})"
        return f"({a} {'+' if op is ReduceOp.SUM else '*'} {b})"

    # ---- a sum of products: a tiled matmul ------------------------------------------------------------
    def _gemm(self, n: Node) -> bool:
        op, axes = n.arg
        prod = n.src[0]
        if op is not ReduceOp.SUM or prod.op is not Ops.MUL or n.dtype not in (dtypes.float32, dtypes.float64):
            return False
        a, b = prod.src
        if any(x.op is not Ops.VIEW or x.arg.mask is not None or x.dtype != n.dtype
               or (x.src[0].op is not Ops.PARAM and (x.src[0] not in self.arrays or
                                                     self.arrays[x.src[0]][1] != strides_for(x.src[0].shape)))
               for x in (a, b)):
            return False
        va, vb = a.arg, b.arg
        shape = va.shape
        batch, rows, inner, cols = contraction_groups(va, vb, axes)
        if any(i in axes for i in rows + cols) or any(shape[i] != 1 and i not in inner for i in axes):
            return False
        m, k, nn = (math.prod(shape[i] for i in g) for g in (rows, inner, cols))
        nb = math.prod(shape[i] for i in batch)
        strides = (merged_stride(va, rows), merged_stride(va, inner), merged_stride(vb, inner),
                   merged_stride(vb, cols))
        if None in strides or 2 * nb * m * k * nn < TILED_MIN_FLOPS:
            return False
        sa_m, sa_k, sb_k, sb_n = strides
        ct = _ctype(n.dtype)
        out = self._temp(n, ct, nb * m * nn)
        ptr = lambda x: self.params[x.src[0]] if x.src[0].op is Ops.PARAM else self.arrays[x.src[0]][0]
        size = lambda x: x.src[0].size  # the elements of the buffer an operand reads (a PARAM or a temp)
        tiles_m, tiles_n = -(-m // TILE), -(-nn // TILE)
        groups = nb * tiles_m * tiles_n
        itype = self._index_type(groups * TILE * TILE + nb * m * nn + max(m, nn) * k)
        d = self.dialect
        # the tile arithmetic, written once as IExpr (backend/gpu/index.py): rendered here, proved by
        # engine/cl_bounds.py. Unknowns: the work-group, the work-item in it, the inner tile's start
        v = IExpr.var
        defs = [("ly", v("lid") // TILE), ("lx", v("lid") % TILE), ("tn", v("grp") % tiles_n),
                ("tm", (v("grp") // tiles_n) % tiles_m), ("bat", v("grp") // (tiles_n * tiles_m))]
        rest, at = v("bat"), {}
        live = [i for i in batch if shape[i] != 1]
        for j, i in enumerate(reversed(live)):  # the batch index, row-major over the live batch axes
            at[i] = rest if j == len(live) - 1 else rest % shape[i]
            rest = rest // shape[i]
        base = lambda view: sum((at[i] * view.strides[i] for i in live), self._offset_expr(view.offset))
        defs += [("abase", base(va)), ("bbase", base(vb)), ("row", v("tm") * TILE + v("ly")),
                 ("col", v("tn") * TILE + v("lx")), ("ka", v("k0") + v("lx")), ("kb", v("k0") + v("ly"))]
        load_a = GlobalAccess("load of the matmul's left operand", ptr(a), size(a),
                              v("abase") + v("row") * sa_m + v("ka") * sa_k, (Guard(v("row"), m), Guard(v("ka"), k)))
        load_b = GlobalAccess("load of the matmul's right operand", ptr(b), size(b),
                              v("bbase") + v("kb") * sb_k + v("col") * sb_n, (Guard(v("kb"), k), Guard(v("col"), nn)))
        store = GlobalAccess("store of the matmul's result", out, nb * m * nn,
                             v("bat") * (m * nn) + v("row") * nn + v("col"), (Guard(v("row"), m), Guard(v("col"), nn)))
        ranges = {"grp": (0, groups - 1, 1), "lid": (0, TILE * TILE - 1, 1), "k0": (0, max(k - 1, 0), TILE)}
        ranges.update({name: (var.min, var.max, 1) for var, name in self.vars.items()})
        self.proofs.append(IndexProof(f"tiled matmul {m}x{nn}x{k}", ranges, tuple(defs), (load_a, load_b, store)))
        lines = [f"{d.local_space} {ct} ta[{TILE}][{TILE}];", f"{d.local_space} {ct} tb[{TILE}][{TILE}];",
                 f"{itype} grp = ({itype}){d.group_id};", f"int lid = (int){d.local_id};"]
        lines += [f"{itype} {name} = {expr.c()};" for name, expr in defs if name not in ("ka", "kb")]
        lines += [f"{ct} acc = 0;",
                  f"for ({itype} k0 = 0; k0 < {k}; k0 += {TILE}) {{",
                  f"  {itype} ka = {dict(defs)['ka'].c()}, kb = {dict(defs)['kb'].c()};",
                  f"  ta[ly][lx] = ({load_a.guard_c()}) ? {load_a.buffer}[{load_a.index.c()}] : 0;",
                  f"  tb[ly][lx] = ({load_b.guard_c()}) ? {load_b.buffer}[{load_b.index.c()}] : 0;",
                  f"  {d.barrier}",
                  f"  for (int kk = 0; kk < {TILE}; kk++) acc += ta[ly][kk] * tb[kk][lx];",
                  f"  {d.barrier}", "}",
                  f"if ({store.guard_c()}) {store.buffer}[{store.index.c()}] = acc;"]
        self._kernel(nb * tiles_m * tiles_n * TILE * TILE, lines, local=TILE * TILE)
        # element strides of the [batch, rows, cols] result along each axis of n's shape (as c_render)
        out_strides = [0] * len(shape)
        layout = batch + rows + cols
        for i, s in zip(layout, strides_for(tuple(shape[i] for i in layout))):
            out_strides[i] = s
        self.arrays[n] = (out, tuple(out_strides))
        return True

    def materialize(self, n: Node) -> None:
        if n.op is Ops.REDUCE and self._gemm(n):
            return
        super().materialize(n)

    # ---- the program ----------------------------------------------------------------------------------
    def render_program(self) -> GPUProgram:
        params = {p.arg[0]: p for p in self.name_params()}
        if has_symbolic_shape(self.ast):
            # a launch's work-items are counted on the host at render time; a length read from the
            # variables would need a launch at the maximum with guards: not done, so the kernel runs on
            # the host (lower_cl.py), with the CPU backend's symbolic loops
            raise Unsupported("a kernel of symbolic shape (a Variable length) on a GPU")
        for n in self.order:
            if n.op in (Ops.SCATTER, Ops.BITCAST, Ops.THREEFRY, Ops.QMATMUL, Ops.DEQUANT):
                raise Unsupported(f"op {n.op}")
            if n.dtype == dtypes.float64 and not self.fp64:
                raise Unsupported("float64 on a device without doubles")
        self.lower()
        d = self.dialect
        args = []
        for k in range(self.var_base):
            p = params.get(k)
            args.append(f"{d.global_space} {_ctype(p.dtype) if p is not None else 'uint8_t'} *b{k}")
        args += [f"{d.global_space} {ct} *{name}" for name, ct, _ in self.temp_list]
        args += [f"{d.long_type} {name}" for name in self.vars.values()]
        signature = ", ".join(args)
        text = []
        for kernel, lines in self.kernels:
            text.append(f"{d.kernel} {kernel.name}({signature}) {{")
            text += ["  " + s for s in lines]
            text.append("}")
        body = "\n".join(text) + "\n"
        # names unique to the code (a digest of it), so that many kernels' code fits in one program
        tag = hashlib.sha1(body.encode()).hexdigest()[:10]
        body = body.replace(f" {self.name}_", f" {self.name}_{tag}_")
        kernels = tuple(replace(k, name=k.name.replace(f"{self.name}_", f"{self.name}_{tag}_", 1))
                        for k, _ in self.kernels)
        temp_bytes = tuple(size * _itemsize(ct) for _, ct, size in self.temp_list)
        return GPUProgram(d.prelude + body, kernels, self.var_base, temp_bytes, tuple(self.vars), body,
                          tuple(self.proofs))


_SIZES = {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4, "uint32_t": 4, "int64_t": 8,
          "uint64_t": 8, "float": 4, "double": 8}


def _itemsize(ct: str) -> int:
    return _SIZES[ct]


def render_gpu(ast: Node, name: str, dialect: Dialect, fp64: bool = True) -> GPUProgram:
    """The kernel `ast` as a GPU program in `dialect`; raises Unsupported for what it cannot lower. Its
    kernels are named after `name` made an identifier (a kernel's name holds a space and `x`s)."""
    ident = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "kernel"
    return GPURenderer(ast, ident, dialect, fp64).render_program()


__all__ = ["GPUKernel", "GPUProgram", "GPURenderer", "render_gpu"]
