"""The operations a graph `Node` can hold, grouped by what the scheduler and backends do with them."""
from __future__ import annotations

from enum import Enum, auto


class Ops(Enum):
    """Every op of the lazy graph. Groups below say how each is scheduled."""
    __hash__ = object.__hash__  # members are singletons; Enum's own hash is Python code, and hot
    # leaves
    BUFFER = auto()      # arg: (BufferSpec, version); shape (size,)
    CONST = auto()       # arg: (value, device); shape ()
    ARANGE = auto()      # arg: (start, step, size, device); shape (size,)
    PARAM = auto()       # kernel ASTs only: arg (index, size); a kernel's buffer parameter
    # unary
    NEG = auto(); RECIP = auto(); SQRT = auto(); EXP = auto(); LOG = auto(); SIN = auto()  # noqa: E702
    EXP2 = auto(); LOG2 = auto(); TRUNC = auto(); NOT = auto(); CAST = auto(); BITCAST = auto()  # noqa: E702
    COS = auto(); TANH = auto()  # noqa: E702
    # binary
    ADD = auto(); SUB = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto()  # noqa: E702
    MAX = auto(); POW = auto(); CMPLT = auto(); CMPEQ = auto(); CMPNE = auto()  # noqa: E702
    AND = auto(); OR = auto(); XOR = auto(); THREEFRY = auto()  # noqa: E702
    # ternary
    WHERE = auto()
    # reduce: arg (ReduceOp, axes); keeps reduced axes with size 1
    REDUCE = auto()
    # indexing (tensor/indexing.py): data-dependent positions into a flat (N,) source, 0-based; an index
    # outside [0, N) reads 0 (GATHER) or writes nothing (SCATTER)
    GATHER = auto()      # src (source (N,), index): out[p] = source[index[p]]; shape of index
    SCATTER = auto()     # src (base (N,), index, values of index's shape), arg "set"/"sum"/"max"/"prod": (N,)
    # movement: arg View; never copies
    VIEW = auto()
    # realization
    CONTIGUOUS = auto()  # compute into a temporary buffer; not kept after the realize
    DETACH = auto()      # the same value, through which no gradient flows; removed by simplify
    COPY = auto()        # arg: target device
    ASSIGN = auto()      # src (storage, value), arg View: the storage after writing value through the view
    STORE = auto()       # kernel ASTs only: src (PARAM view, value)
    # multi-device (graph/multi.py): the only nodes whose device is a tuple, and the collective
    MULTI = auto()       # src: one node per device; arg (axis, bounds): sharded on axis (None: replicated)
    ALLREDUCE = auto()   # src: one partial per device; arg AllReduceArg; the reduced value on src[arg.index]
    # packed weights (graph/quant.py): each its own kernel, its sources read from buffers
    QMATMUL = auto()     # src (x (..., cols) float32, packed (nbytes,) uint8), arg PackedShape: x @ W^T (..., rows)
    DEQUANT = auto()     # src (packed (nbytes,) uint8,), arg PackedShape: W as float32 (rows, cols)


class ReduceOp(Enum):
    __hash__ = object.__hash__
    SUM = auto()
    MAX = auto()
    PROD = auto()


UNARY = frozenset({Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.EXP, Ops.LOG, Ops.SIN, Ops.EXP2, Ops.LOG2, Ops.TRUNC,
                   Ops.NOT, Ops.CAST, Ops.BITCAST, Ops.COS, Ops.TANH})
BINARY = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW, Ops.CMPLT,
                    Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.THREEFRY})
TERNARY = frozenset({Ops.WHERE})
ELEMENTWISE = UNARY | BINARY | TERNARY
COMPARISON = frozenset({Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE})
PACKED = frozenset({Ops.QMATMUL, Ops.DEQUANT})
LEAVES = frozenset({Ops.BUFFER, Ops.CONST, Ops.ARANGE, Ops.PARAM})
