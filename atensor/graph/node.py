"""`Node`: one immutable, interned vertex of the lazy graph.

Two nodes built from the same op, dtype, sources and argument are the same Python object, so
structural equality is identity: a kernel's AST can key a compile cache, a common subexpression is
computed once, and rewrite rules compare nodes with `is`. The table of nodes holds them weakly; a
node lives as long as a tensor or another node refers to it.

Shape, dtype and device are inferred when a node is made, and an invalid combination raises there,
naming the op and the operands, long before anything is scheduled.
"""
from __future__ import annotations

import functools
import math
import threading
import weakref
from typing import Any

from atensor import core
from atensor.dtype import DType, dtypes
from atensor.graph.ops import BINARY, COMPARISON, ELEMENTWISE, Ops, ReduceOp, UNARY
from atensor.graph.symbolic import hi_of
from atensor.graph.moveplan import ON_BASE, ON_SELF, SELF, MoveError, MovePlan, check_move, move_plan, view_plan
from atensor.graph.view import Shape, View, contiguous_view, max_size, symbolic_shape


_uid_lock = threading.Lock()


class _MultiRules:
    """How nodes over sharded (MULTI) sources are made: graph/multi.py's `push`, `view`, `movement`
    and `infer`, handed here by graph/__init__.py (`register_multi`) before any graph module is used,
    so that this module does not import graph/multi.py back (the import order does not matter)."""
    push: Any
    view: Any
    movement: Any
    infer: Any

    def __getattr__(self, name: str) -> Any:
        raise GraphError("sharded (MULTI) nodes need atensor.graph.multi: import it (import atensor does)")


multi_rules = _MultiRules()


def register_multi(push: Any, view: Any, movement: Any, infer: Any) -> None:
    """graph/multi.py's rules for MULTI nodes (see `_MultiRules`)."""
    multi_rules.push, multi_rules.view, multi_rules.movement, multi_rules.infer = push, view, movement, infer


class _LedgerHooks:
    """What graph/ asks of the storage ledger (atensor/ledger/), which registers it when imported
    (`register_ledger`), so that graph/ does not import it back: `set_head(spec, node)` makes a lazy
    ASSIGN a new buffer's newest version (graph/multi.py's `assemble`). `import atensor` imports it."""
    set_head: Any

    def __getattr__(self, name: str) -> Any:
        raise GraphError("this needs the storage ledger: import atensor (or atensor.ledger) first")


ledger_hooks = _LedgerHooks()


def register_ledger(set_head: Any) -> None:
    """atensor/ledger/'s hooks (see `_LedgerHooks`)."""
    ledger_hooks.set_head = set_head


def _frozen(self: Any, name: str, value: Any = None) -> None:
    raise AttributeError(f"{type(self).__name__}.{name} cannot be set: graph objects are immutable; what "
                         f"changes about storage (versions, pending heads, runtime buffers, realized "
                         f"values) lives in atensor/ledger/")


class BufferSpec:
    """A buffer's identity in the graph: `uid` is unique for the process; `size` is in elements.

    Immutable: what changes about a buffer (its version, pending head and runtime buffer) is the
    storage ledger's (atensor/ledger/), keyed by `uid`."""
    __slots__ = ("uid", "device", "size", "dtype", "__weakref__")
    _next_uid = 0  # the last uid handed out; under _uid_lock (specs are made on several threads)
    uid: int
    device: str
    size: int
    dtype: DType

    def __new__(cls, device: str, size: int, dtype: DType) -> BufferSpec:
        with _uid_lock:
            BufferSpec._next_uid = uid = BufferSpec._next_uid + 1
        # filled with plain slot stores, then made a BufferSpec (as `Node.make` does: see _NewNode);
        # the schedule cache makes one per temporary buffer of every cached realize
        spec = object.__new__(_NewSpec)
        spec.uid, spec.device, spec.size, spec.dtype = uid, device, size, dtype
        _set_class(spec, "__class__", BufferSpec)
        return spec

    __setattr__ = _frozen
    __delattr__ = _frozen

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def node(self, version: int) -> Node:
        """The BUFFER node of this buffer's version `version` (0: what it holds when made; the current
        version is the ledger's, `atensor.ledger.current(spec)`)."""
        return Node.make(Ops.BUFFER, self.dtype, (), (self, version))

    def __repr__(self) -> str:
        return f"buf{self.uid}@{self.device}[{self.size}]"

    @staticmethod
    def last_uid() -> int:
        """The uid of the newest spec made so far: specs made later have larger uids."""
        return BufferSpec._next_uid


class GraphError(ValueError, RuntimeError):
    """An op was given operands it cannot combine (shapes, dtypes or devices). A ValueError (a bad value)
    and a RuntimeError (an invalid operation), so code ported from tinygrad or PyTorch catches it."""


# the node table: key -> weak reference to the node; an entry goes when its node dies
_interned: dict[tuple, weakref.ref] = {}
_intern_lock = threading.Lock()
_ref, _partial = weakref.ref, functools.partial


def _forget(key: tuple, ref: weakref.ref, table: dict[tuple, weakref.ref] = _interned) -> None:
    """A node died: its entry goes. (The callback is a `partial` holding the key, not a KeyedRef, whose
    making costs two Python-level calls: a new node is made for every op a Tensor records. The table
    is bound as a default: a node dying at interpreter exit, after this module's globals are cleared,
    still finds it.)"""
    if table.get(key) is ref:  # a newer node with the same key may have replaced it
        del table[key]


def _publish(key: tuple, node: Any) -> Node:
    """`node` (a filled _NewNode) made a Node and interned under `key`, or the node another thread (the
    dispatcher, a model builder) interned under it meanwhile: one node per key stays the invariant."""
    _set_class(node, "__class__", Node)
    with _intern_lock:
        ref = _interned.get(key)
        found = ref() if ref is not None else None
        if found is None:
            found = node
            _interned[key] = _ref(node, _partial(_forget, key))
    return found


def _known(key: tuple, shape: Shape, device: str) -> Node:
    """The interned node of `key` = (op, dtype, src, arg), made with a shape and device the caller knows
    (no `_infer`) when none lives."""
    ref = _interned.get(key)
    if ref is not None:
        found = ref()
        if found is not None:
            return found
    node = object.__new__(_NewNode)
    node.op, node.dtype, node.src, node.arg = key
    node.shape, node.device = shape, device
    return _publish(key, node)


class Node:
    """An immutable graph vertex. Build with `Node.make`; never mutate.

    Nodes are interned, so identity is equality: hash and == are object identity (C-level, which
    matters: every graph pass hashes nodes). Attributes are read-only outside this module: a node's
    realized value is the storage ledger's (atensor/ledger/), not the node's."""
    __slots__ = ("op", "dtype", "src", "arg", "shape", "device", "__weakref__")
    op: Ops
    dtype: DType
    src: tuple[Node, ...]
    arg: Any
    shape: Shape
    device: str

    @staticmethod
    def make(op: Ops, dtype: DType, src: tuple[Node, ...] = (), arg: Any = None) -> Node:
        """The interned node for (op, dtype, src, arg); shape and device are inferred and checked."""
        key = (op, dtype, src, arg)
        ref = _interned.get(key)
        if ref is not None:
            found = ref()
            if found is not None:
                return found
        # the common elementwise case, inferred here: sources of one shape, device (and dtype, where the
        # op needs one), none sharded; anything else takes the general rules (`_make_general`), which raise
        rule = _SAME_SHAPE.get(op)
        if rule is not None:
            first = src[0]
            shape, device, dtype0 = first.shape, first.device, first.dtype
            for s in src:
                if s.op is _MULTI or (s.shape is not shape and s.shape != shape) \
                        or (s.device is not device and s.device != device) \
                        or (rule == 1 and s.dtype is not dtype0):  # (equal device names need not be one str)
                    rule = None
                    break
            if rule == 2 and dtype0 is not dtypes.bool:
                rule = None
        if rule is None:
            return _make_general(op, dtype, src, arg, key)
        node = object.__new__(_NewNode)  # filled with plain slot stores, then made a Node (see _NewNode)
        node.op, node.dtype, node.src, node.arg, node.shape, node.device = op, dtype, src, arg, shape, device
        return _publish(key, node)

    @staticmethod
    def make_like(template: Node, src: tuple[Node, ...], arg: Any) -> Node:
        """The interned node of `template`'s op and dtype on `src` with `arg`, taking the template's
        shape and device instead of inferring them: for rebuilding a graph whose sources have the
        same shapes and devices as the template's (jit replays: other buffers, same layout)."""
        return _known((template.op, template.dtype, src, arg), template.shape, template.device)

    @staticmethod
    def make_view(src: Node, view: View) -> Node:
        """The interned VIEW node of `src` through `view`, which graph/moveplan.py has checked against
        `src`'s shape (it reads inside it): made without `_infer`. `src` is never MULTI."""
        return _known((_VIEW, src.dtype, (src,), view), view.shape, src.device)

    __setattr__ = _frozen
    __delattr__ = _frozen

    def __repr__(self) -> str:
        return f"Node({self.op.name}, {self.dtype.name}, shape={self.shape}, arg={self.arg!r}, src={len(self.src)})"

    def __reduce__(self):
        return (Node.make, (self.op, self.dtype, self.src, self.arg))

    @property
    def size(self) -> int:
        """Elements; a symbolic dim (graph/view.py) counted at its maximum, as its buffer holds it."""
        shape = self.shape
        return math.prod(shape) if not symbolic_shape(shape) else max_size(shape)

    # ---- convenience constructors used by Tensor and by rewrite rules -------------------------
    @staticmethod
    def const(value: Any, dtype: DType, device: str, shape: Shape = ()) -> Node:
        """A constant of `dtype`, broadcast to `shape` through a stride-0 view."""
        if value == 0:  # -0.0 equals 0.0: keep it apart in the cache and the interning (signed_zero)
            value = signed_zero(value)
        try:
            return _const_node(value, dtype, device, tuple(shape))
        except TypeError:  # an unhashable device spec: build it uncached
            return _const_node.__wrapped__(value, dtype, device, tuple(shape))

    def alu(self, op: Ops, *others: Node, dtype: DType | None = None) -> Node:
        """An elementwise op on this node and `others` (same shapes, same device)."""
        if dtype is None:
            dtype = dtypes.bool if op in COMPARISON else (others[-1].dtype if op is Ops.WHERE else self.dtype)
        return Node.make(op, dtype, (self, *others))

    def cast(self, dtype: DType) -> Node:
        return self if dtype == self.dtype else Node.make(Ops.CAST, dtype, (self,))

    def reduce(self, op: ReduceOp, axes: tuple[int, ...]) -> Node:
        axes = tuple(sorted(set(axes)))
        return self if not axes else Node.make(Ops.REDUCE, self.dtype, (self,), (op, axes))

    def view(self, view: View) -> Node:
        """This node seen through `view`; folds into an existing view when one View can say both."""
        op = self.op
        if op is Ops.MULTI:
            return multi_rules.view(self, view)
        if view.shape == self.shape and view is contiguous_view(self.shape):  # the identity: the common case
            return self
        own, base_shape = (self.arg, self.src[0].shape) if op is _VIEW else (None, None)
        try:
            plan = view_plan(own, self.shape, base_shape, view)
        except MoveError as exc:
            raise GraphError(str(exc)) from None
        except TypeError:  # an unhashable part (a list in a view): decided without the cache
            plan = view_plan.__wrapped__(own, self.shape, base_shape, view)
        return self._planned(plan)

    def _planned(self, plan: MovePlan) -> Node:
        """The node `plan` (graph/moveplan.py) says a movement or view of this node gives."""
        kind = plan.kind
        if kind == ON_SELF:
            return Node.make_view(self, plan.view)
        if kind == ON_BASE:
            return Node.make_view(self.src[0], plan.view)
        return self if kind == SELF else self.src[0]

    def _movement(self, name: str, arg: Any) -> Node:
        """The movement op `name` with `arg` (a tuple), checked: graph/moveplan.py decides what it gives,
        once per layout."""
        op = self.op
        if op is Ops.MULTI:  # each shard moves; bounds follow (graph/multi.py)
            try:
                if check_move(self.shape, name, arg):
                    return self
            except MoveError as exc:
                raise GraphError(str(exc)) from None
            return multi_rules.movement(self, name, arg)
        own, base_shape = (self.arg, self.src[0].shape) if op is _VIEW else (None, None)
        try:
            plan = move_plan(own, self.shape, base_shape, name, arg)
        except MoveError as exc:
            raise GraphError(str(exc)) from None
        except TypeError:  # an unhashable argument (lists inside it): decided without the cache
            try:
                plan = move_plan.__wrapped__(own, self.shape, base_shape, name, arg)
            except MoveError as exc:
                raise GraphError(str(exc)) from None
        return self._planned(plan)

    def reshape(self, shape: Shape) -> Node:
        return self._movement("reshape", tuple(shape))

    def permute(self, order: tuple[int, ...]) -> Node:
        return self._movement("permute", tuple(order))

    def expand(self, shape: Shape) -> Node:
        return self._movement("expand", tuple(shape))

    def pad(self, arg: tuple[tuple[int, int], ...]) -> Node:
        return self._movement("pad", tuple(arg))

    def shrink(self, arg: tuple[tuple[int, int], ...]) -> Node:
        return self._movement("shrink", tuple(arg))

    def stride(self, steps: tuple[int, ...]) -> Node:
        return self._movement("stride", tuple(steps))

    def flip(self, axes: tuple[bool, ...]) -> Node:
        return self._movement("flip", tuple(axes))

    # ---- traversal ------------------------------------------------------------------------------
    def toposort(self, stop: Any = None) -> list[Node]:
        """Every node this one depends on, sources before users, iteratively (deep chains are fine).
        `stop(node)` true means: include the node but not what is behind it."""
        return toposort([self], stop)

    def base(self) -> Node:
        """The node under any views."""
        node = self
        while node.op is Ops.VIEW:
            node = node.src[0]
        return node


def _make_general(op: Ops, dtype: DType, src: tuple[Node, ...], arg: Any, key: tuple) -> Node:
    """`Node.make` of a node no live one has the key of and the common elementwise rule does not cover:
    pushed through MULTI sources, or inferred by the general rules (`_infer`, which raise)."""
    # pushed through MULTI (graph/multi.py); a leaf other than CONST and ARANGE never is
    if op is not _MULTI and (src or op is Ops.CONST or op is Ops.ARANGE) and _on_multi(op, src, arg):
        found = multi_rules.push(op, dtype, src, arg)
        _interned[key] = _ref(found, _partial(_forget, key))
        return found
    node = object.__new__(_NewNode)
    node.op, node.dtype, node.src, node.arg = op, dtype, src, arg
    node.shape, node.device = _infer(op, dtype, src, arg)
    return _publish(key, node)


class _NewSpec(BufferSpec):
    """A buffer spec being filled in by `BufferSpec.__new__` (see `_NewNode`)."""
    __slots__ = ()
    __setattr__ = object.__setattr__  # type: ignore[assignment]


class _NewNode(Node):
    """A node being filled in by `Node.make`: plain slot stores (the interpreter's fast path), then it
    becomes a `Node` (`__class__` set once), whose `__setattr__` refuses writes. Half the cost of six
    descriptor calls; a new node is made for every op a Tensor records."""
    __slots__ = ()
    __setattr__ = object.__setattr__  # type: ignore[assignment]


_set_class = object.__setattr__
_MULTI, _VIEW = Ops.MULTI, Ops.VIEW
# elementwise ops `Node.make` infers inline (`_infer`'s rules for them, the common case only): 0 no rule
# on dtypes, 1 every source of the first's dtype (binary ops), 2 a bool first source (WHERE's condition)
_SAME_SHAPE: dict[Ops, int] = {**{op: 0 for op in UNARY}, **{op: 1 for op in BINARY}, Ops.THREEFRY: 0,
                               Ops.POW: 0, Ops.WHERE: 2, Ops.CONTIGUOUS: 0, Ops.DETACH: 0}


def toposort(roots: list[Node], stop: Any = None) -> list[Node]:
    """All nodes reachable from `roots`, each after its sources, in depth-first post-order (sources in
    order). Iterative, so 10^5-deep chains work. `stop(node)` true means: include the node but not
    what is behind it.

    A node is pushed when first met and emitted when met again on top of the stack, after all that
    was pushed above it (its sources) has been emitted; duplicate entries of emitted nodes are skipped.
    This avoids an iterator object per node: every graph pass starts here."""
    order: list[Node] = []
    expanded: set[Node] = set()
    emitted: set[Node] = set()
    for root in roots:
        if root in emitted:
            continue
        stack = [root]
        while stack:
            node = stack[-1]
            if node in expanded:
                stack.pop()
                if node not in emitted:
                    emitted.add(node)
                    order.append(node)
                continue
            expanded.add(node)
            if stop is not None and stop(node):
                continue
            src = node.src
            for i in range(len(src) - 1, -1, -1):
                child = src[i]
                if child not in expanded:
                    stack.append(child)
    return order


@functools.lru_cache(maxsize=4096, typed=True)
def _const_node(value: Any, dtype: DType, device: str, shape: Shape) -> Node:
    value = _cast_scalar(value, dtype)
    node = Node.make(Ops.CONST, dtype, (), (value, device))
    return node.view(View.create(()).reshape((1,) * len(shape)).expand(shape)) if shape else node


# `Node.const` of a hashable device and a tuple shape, without its wrapper (tensor/elementwise.py's fast path)
cached_const = _const_node


class NegativeZero(float):
    """-0.0 as a constant's value. A float -0.0 compares and hashes equal to 0.0, so a node interned, a
    constant cached or a graph keyed for one would be handed back for the other (`x * -0.0` computed as
    `x * 0.0`). This subclass equals only itself; it is still the float -0.0 to arithmetic, numpy and
    the renderers (`float(v)`, `repr`)."""
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is NegativeZero

    def __ne__(self, other: object) -> bool:
        return type(other) is not NegativeZero

    def __hash__(self) -> int:
        return 0x2D30  # any constant other than hash(0.0) == 0


NEGATIVE_ZERO = NegativeZero(-0.0)


def signed_zero(value: Any) -> Any:
    """`value`, with a floating -0.0 (of any float type) replaced by NEGATIVE_ZERO; call it on values
    that compare equal to 0."""
    if type(value) is not int and type(value) is not bool and math.copysign(1.0, float(value)) < 0:
        return NEGATIVE_ZERO
    return value


def _cast_scalar(value: Any, dtype: DType) -> Any:
    if dtype == dtypes.bool:
        return bool(value)
    if dtypes.is_int(dtype):
        if isinstance(value, float) and not math.isfinite(value):
            raise GraphError(f"cannot make an integer constant of {value}")
        return int(value)
    value = float(value)
    return signed_zero(value) if value == 0.0 else value


def _on_multi(op: Ops, src: tuple[Node, ...], arg: Any) -> bool:
    """True when a node would have a MULTI source or be a leaf made on a tuple of devices."""
    for s in src:
        if s.op is Ops.MULTI:
            return True
    return (op is Ops.CONST or op is Ops.ARANGE) and type(arg[-1]) is tuple


def _packed_shape(op: Ops, dtype: DType, src: tuple[Node, ...], arg: Any) -> tuple[Shape, str]:
    """QMATMUL (x (..., cols) float32, packed bytes) -> (..., rows); DEQUANT (packed bytes,) -> (rows, cols)."""
    packed = src[-1]
    if packed.dtype != dtypes.uint8 or packed.shape != (arg.nbytes,):
        raise GraphError(f"{op.name}: the packed {arg.format.name} source of a ({arg.rows}, {arg.cols}) matrix "
                         f"is ({arg.nbytes},) uint8, got {packed.shape} {packed.dtype.name}")
    if dtype != dtypes.float32:
        raise GraphError(f"{op.name} computes float32, not {dtype.name}")
    if op is Ops.DEQUANT:
        return (arg.rows, arg.cols), packed.device
    x = src[0]
    if x.dtype != dtypes.float32 or not x.shape or x.shape[-1] != arg.cols:
        raise GraphError(f"QMATMUL: x must be float32 (..., {arg.cols}), got {x.shape} {x.dtype.name}")
    if x.device != packed.device and "kernel" not in (x.device, packed.device):
        raise GraphError(f"QMATMUL of x on {x.device} with weights on {packed.device}: move x with "
                         f".to('{packed.device}') first")
    return x.shape[:-1] + (arg.rows,), packed.device


def _infer(op: Ops, dtype: DType, src: tuple[Node, ...], arg: Any) -> tuple[Shape, str]:
    """Shape and device of a new node; raises GraphError naming the op and operands when invalid."""
    if op is Ops.MULTI or op is Ops.ALLREDUCE:
        return multi_rules.infer(op, src, arg)
    if op is Ops.BUFFER:
        return (arg[0].size,), arg[0].device
    if op is Ops.CONST:
        return (), arg[1]
    if op is Ops.ARANGE:
        return (arg[2],), arg[3]
    if op is Ops.PARAM:
        return (arg[1],), "kernel"
    if op is Ops.VIEW:
        if arg.mask is None and arg.size and src[0].size < hi_of(arg.index_range()[1]) + 1:
            raise GraphError(f"view {arg} reads past the end of its source of shape {src[0].shape}")
        return arg.shape, src[0].device
    if op is Ops.COPY:
        return src[0].shape, arg
    if op is Ops.REDUCE:
        _, axes = arg
        shape = src[0].shape
        if any(not 0 <= a < len(shape) for a in axes):
            raise GraphError(f"reduce: axes {axes} out of range for shape {shape}")
        return tuple(1 if i in axes else s for i, s in enumerate(shape)), src[0].device
    if op is Ops.STORE:
        return src[1].shape, src[1].device
    if op in (Ops.GATHER, Ops.SCATTER):
        if len(src[0].shape) != 1 or src[1].dtype.kind not in "iu":
            raise GraphError(f"{op.name} needs a flat source and an integer index, got shape {src[0].shape} "
                             f"and index dtype {src[1].dtype.name}")
        if op is Ops.SCATTER and (src[2].shape != src[1].shape or src[2].dtype != src[0].dtype
                                  or arg not in ("set", "sum", "max", "prod")):
            raise GraphError(f"SCATTER: values {src[2].shape} {src[2].dtype.name} must match index {src[1].shape} "
                             f"and base dtype {src[0].dtype.name}; reduce {arg!r} must be set, sum, max or prod")
        if any(s.device != src[0].device and "kernel" not in (s.device, src[0].device) for s in src):
            raise GraphError(f"{op.name} on tensors of different devices: move them with .to(device) first")
        return (src[1].shape if op is Ops.GATHER else src[0].shape), src[0].device
    if op is Ops.QMATMUL or op is Ops.DEQUANT:
        return _packed_shape(op, dtype, src, arg)
    if op is Ops.ASSIGN:
        storage, value = src
        if storage.op not in (Ops.BUFFER, Ops.ASSIGN):
            raise GraphError("assign target has no storage: assign into a tensor made from data or realized")
        if value.shape != arg.shape:
            raise GraphError(f"assign: value of shape {value.shape} does not fit target of shape {arg.shape}")
        if value.device != storage.device:
            raise GraphError(f"assign: value on {value.device} into a buffer on {storage.device}; "
                             f"move it with .to('{storage.device}') first")
        if arg.mask is not None:
            raise GraphError("assign through a padded view is not possible: padding has no storage")
        return storage.shape, storage.device
    if op in ELEMENTWISE or op in (Ops.CONTIGUOUS, Ops.DETACH):
        first = src[0]
        for other in src[1:]:
            if other.shape != first.shape:
                shapes = " and ".join(str(s.shape) for s in src)
                raise GraphError(f"shape mismatch in {op.name}: {shapes}")
            if other.device != first.device and "kernel" not in (other.device, first.device):
                devices = " and ".join(s.device for s in src)
                raise GraphError(f"{op.name} on tensors of different devices ({devices}): move one with "
                                 f".to(device) first")
        if op in BINARY and op not in (Ops.THREEFRY,) and op is not Ops.POW:
            dtype0 = first.dtype
            if any(s.dtype is not dtype0 and s.dtype != dtype0 for s in src):
                raise GraphError(f"dtype mismatch in {op.name}: {[s.dtype.name for s in src]}; cast first")
        if op is Ops.WHERE and src[0].dtype != dtypes.bool:
            raise GraphError(f"WHERE needs a bool condition, got {src[0].dtype.name}")
        if op in UNARY or op in BINARY or op in (Ops.WHERE, Ops.CONTIGUOUS, Ops.DETACH):
            return first.shape, first.device
    raise GraphError(f"no shape rule for {op}")


def _install_compiled_core(ccore: Any) -> None:
    """Runs this module's hot paths in atensor/core/node.c: `Node.make` (its common elementwise rule and
    `_infer`'s BUFFER and valid-ASSIGN rules; `_make_general` stays Python, for the rest and the errors), `_known`, `_publish`, `BufferSpec.__new__` and `last_uid`. They
    share `_interned` and `_intern_lock` with the Python functions above, which stay the specification
    (tests/core/ compares the two)."""
    global _known, _publish
    ccore.configure(Node, _NewNode, BufferSpec, _interned, _intern_lock, _SAME_SHAPE, _MULTI, Ops.BUFFER,
                    Ops.ASSIGN, dtypes.bool, _make_general, BufferSpec._next_uid)
    Node.make = ccore.make  # (a builtin function: no binding, like a staticmethod)
    _known, _publish = ccore.known, ccore.publish
    BufferSpec.__new__ = ccore.new_spec
    BufferSpec.last_uid = ccore.last_uid


# the Python functions above, kept for tests/core/'s comparisons (whichever core runs)
python_core = {"make": Node.__dict__["make"].__func__, "known": _known, "publish": _publish,
               "new_spec": BufferSpec.__dict__["__new__"], "last_uid": BufferSpec.__dict__["last_uid"].__func__}
if core.ccore is not None:
    _install_compiled_core(core.ccore)
