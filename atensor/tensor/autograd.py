"""Autograd on the Tensor: `requires_grad`, `backward()`, `.grad`, `gradient()`, and the training
and no-grad modes, with tinygrad's names and semantics.

Gradients are lazy graph like everything else (graph/gradient.py builds them from the forward's
nodes), so `loss.backward()` runs nothing: one `await Tensor.realize(*params, *grads, loss)` later
runs the forward, the backward and an optimizer's update as one task graph. A training loop's
backward is built rule by rule once per forward structure; later steps remake its nodes from that
record (graph/gradient_cache.py), the same nodes a fresh build gives.

Which tensors get a `.grad`: every live tensor with `requires_grad=True` that the loss depends on.
Those tensors are kept in a weak set (setting `requires_grad` adds a tensor to it), so `backward()`
finds them without a tape. A tensor with storage is differentiated through its buffer, so every
view of it that the loss used (a transpose inside matmul, a slice) contributes to its gradient.

Build the whole step before realizing it: realizing the loss first replaces its graph by the buffer
that holds it (that is what realize means), and a buffer has no gradient.
"""
from __future__ import annotations

import contextvars
import weakref
from contextlib import ContextDecorator
from typing import Any, Callable, Optional, Self

from atensor.config import training_mode
from atensor.graph import gradient_cache, multi
from atensor.graph.gradient import combine_shards
from atensor.graph.node import GraphError, Node, toposort
from atensor.graph.ops import Ops, ReduceOp


# tensors with requires_grad=True, by id: a WeakSet would compare tensors with ==, which is lazy
_requiring_grad: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def graphs_needed() -> bool:
    """True when a realized tensor should keep the graph that computed it for a later `backward()`:
    some live tensor requires a gradient and gradients are on. Otherwise keeping graphs would only
    keep memory (and the cyclic collector's work) alive."""
    return len(_requiring_grad) > 0 and not grad_disabled()


# Training mode and no_grad are per context (contextvars): two trio tasks, one training and one
# evaluating, each see their own mode; a task starts with the mode of the task that started it.
_training = training_mode  # kept in config.py, so that `Context(TRAINING=1)` sets it
_no_grad: contextvars.ContextVar[bool] = contextvars.ContextVar("atensor_no_grad", default=False)
_no_grad_stack: contextvars.ContextVar[tuple[bool, ...]] = contextvars.ContextVar("atensor_no_grad_stack",
                                                                                  default=())


class _GradMode:
    """`Tensor.no_grad`: true while gradients are off in this context. Use it as `with Tensor.no_grad:`
    (or `Tensor.no_grad()`, or as a decorator). Results computed inside are detached: no gradient
    flows through them later. Setting `Tensor.no_grad = True` (tinygrad's style) also works."""

    @property
    def enabled(self) -> bool:
        return _no_grad.get()

    def __bool__(self) -> bool:
        return _no_grad.get()

    def __enter__(self) -> _GradMode:
        _no_grad_stack.set(_no_grad_stack.get() + (_no_grad.get(),))
        _no_grad.set(True)
        return self

    def __exit__(self, *exc: Any) -> None:
        stack = _no_grad_stack.get()
        _no_grad.set(stack[-1])
        _no_grad_stack.set(stack[:-1])

    def __call__(self, fn: Optional[Callable] = None) -> Any:
        if fn is None:
            return self
        return ContextDecorator.__call__(self, fn)  # type: ignore[arg-type]

    def _recreate_cm(self) -> _GradMode:
        return self

    def __repr__(self) -> str:
        return f"<Tensor.no_grad {'on' if self else 'off'}>"


_GRAD_MODE = _GradMode()


class ModeMeta(type):
    """Tensor's metaclass: `Tensor.training` and `Tensor.no_grad` read and assign the current
    context's modes, so `Tensor.training = True` (tinygrad's style) stays per task."""

    @property
    def training(cls) -> bool:
        return _training.get()

    @training.setter
    def training(cls, value: bool) -> None:
        _training.set(bool(value))

    @property
    def no_grad(cls) -> _GradMode:
        return _GRAD_MODE

    @no_grad.setter
    def no_grad(cls, value: Any) -> None:
        _no_grad.set(bool(value))


def grad_disabled() -> bool:
    """True inside `Tensor.no_grad` (or while `Tensor.test()` is active), in this context."""
    return _no_grad.get()


def stop_gradient(node: Node, keep_storage: bool = True) -> Node:
    """`node` with gradients stopped. A view of storage is kept as it is when `keep_storage` (so
    assigning through it still writes the storage); anything else is wrapped in `DETACH`."""
    if node.op is Ops.DETACH:
        return node
    if keep_storage and node.base().op in (Ops.BUFFER, Ops.ASSIGN):
        return node
    return Node.make(Ops.DETACH, node.dtype, (node,))


def _storage_key(node: Node) -> Optional[Any]:
    """The buffer identity under views and assigns, or None for a computed node."""
    node = node.base()
    while node.op is Ops.ASSIGN:
        node = node.src[0]
    return node.arg[0] if node.op is Ops.BUFFER else None


def _gradient_key(node: Node, in_graph: dict[Node, None], newest: dict[Any, Node]) -> Optional[Node]:
    """The node to differentiate with respect to for a tensor whose node is `node`: its base when
    it is a view (views fold into the loss's views, so the tensor's own view may not be in the
    graph), or a newer or older version of the same storage that the loss used."""
    key = node.base() if node.op is Ops.VIEW else node
    if key in in_graph:
        return key
    if node in in_graph:
        return node
    spec = _storage_key(key)
    return newest.get(spec) if spec is not None else None


def _through_view(grad: Node, node: Node, key: Node) -> Node:
    """The gradient of `node` from the gradient of `key`: the views between `node` and its base,
    applied to the base's gradient."""
    if key is node:
        return grad
    views = []
    while node.op is Ops.VIEW:
        views.append(node.arg)
        node = node.src[0]
    for view in reversed(views):
        grad = grad.view(view)
    return grad


def _gradients(root: Node, seed: Node, nodes: list[Node], used: Optional[list[bool]] = None) -> list[Optional[Node]]:
    """The gradient of `root` for each of `nodes` (None where `root` does not depend on it through
    float ops). A multi-device node is differentiated shard by shard and its gradient laid out like it.
    `used`, when given, gets per node whether `root`'s graph contains it at all (a node used only
    through comparisons has gradient zero, not none)."""
    order = toposort([root])
    in_graph = {n: i for i, n in enumerate(order)}  # each node's position (the backward's cache key)
    newest: dict[Any, Node] = {}
    for n in in_graph:
        if n.op in (Ops.BUFFER, Ops.ASSIGN):
            newest[_storage_key(n)] = n
    shards = [n.src if n.op is Ops.MULTI else (n,) for n in nodes]
    keys = [[_gradient_key(s, in_graph, newest) for s in parts] for parts in shards]
    leaves = frozenset(k for n, ks in zip(nodes, keys) if n.op is Ops.MULTI and n.arg[0] is None
                       for k in ks if k is not None)
    # compute_gradient, or its record for this forward's structure (graph/gradient_cache.py)
    grads = gradient_cache.gradients(order, in_graph, root, seed, {k for ks in keys for k in ks if k is not None},
                                     leaves)
    if used is not None:
        used.extend(any(k is not None for k in ks) for ks in keys)
    out: list[Optional[Node]] = []
    summed: dict[tuple[Node, ...], Node] = {}  # a replicated storage's gradient, allreduced once
    for node, parts, ks in zip(nodes, shards, keys):
        if node.op is Ops.MULTI and node.arg[0] is None and all(k is not None and k in grads for k in ks) \
                and all(k.shape == ks[0].shape for k in ks):
            # replicated: the sum over the devices of the storage's gradient, then each target's own view
            # of it. Fused parameters are views of one flat buffer, so the flat tensor and every
            # parameter share one allreduce (one per target before: 7 for the flagship's MLP). The same
            # values: an elementwise sum, sliced, is the slice summed. (Replicas keyed differently, a
            # lazy copy beside a view of its source, take the rule below.)
            key = tuple(ks)
            total = summed.get(key)
            if total is None:
                total = summed[key] = multi.allreduce([grads[k] for k in ks], ReduceOp.SUM)
            out.append(Node.make(Ops.MULTI, node.dtype, tuple([_through_view(g, s, k) for g, s, k in
                                                               zip(total.src, parts, ks)]), (None, None)))
            continue
        found = [None if k is None or k not in grads else _through_view(grads[k], s, k)
                 for s, k in zip(parts, ks)]
        if all(g is None for g in found):
            out.append(None)
        else:
            out.append(combine_shards(node, found) if node.op is Ops.MULTI else found[0])
    return out


class AutogradOps:
    """Tensor methods and modes for gradients (mixed into Tensor)."""
    __slots__ = ()

    class train(ContextDecorator):
        """`with Tensor.train():` turns on training mode (dropout drops, batchnorm uses batch
        statistics and updates its running ones); `Tensor.train(False)` turns it off."""

        def __init__(self, mode: bool = True):
            self.mode = mode

        def __enter__(self) -> None:
            self.prev = _training.get()
            _training.set(self.mode)

        def __exit__(self, *exc: Any) -> None:
            _training.set(self.prev)

    class test(ContextDecorator):
        """`with Tensor.test():` evaluation: training mode off and gradients off."""

        def __init__(self, mode: bool = True):
            self.mode = mode

        def __enter__(self) -> None:
            self.prev = (_training.get(), _no_grad.get())
            if self.mode:
                _training.set(False)
                _no_grad.set(True)

        def __exit__(self, *exc: Any) -> None:
            _training.set(self.prev[0])
            _no_grad.set(self.prev[1])

    # ---- requires_grad -------------------------------------------------------------------------
    @property
    def requires_grad(self) -> Optional[bool]:
        """True: `backward()` gives this tensor a `.grad`. None (the default) is upgraded to True by
        an optimizer it is given to; False keeps it out of both."""
        return self._requires_grad  # type: ignore[attr-defined]

    @requires_grad.setter
    def requires_grad(self, value: Optional[bool]) -> None:
        old = getattr(self, "_requires_grad", None)
        self._requires_grad = value  # type: ignore[attr-defined]
        if value:
            _requiring_grad[id(self)] = self
        elif old:
            _requiring_grad.pop(id(self), None)

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        """Sets `requires_grad` in place and returns this tensor."""
        self.requires_grad = requires_grad
        return self  # type: ignore[return-value]

    # ---- gradients -----------------------------------------------------------------------------
    def gradient(self, *targets: Self, gradient: Optional[Self] = None,
                 materialize_grads: bool = False) -> list[Self]:
        """The gradients of this tensor with respect to `targets`, as lazy tensors (nothing runs).
        A target used only where no gradient flows (a comparison) gets zeros; one this tensor does not
        use at all raises, or gets zeros with `materialize_grads`.

        >>> x = Tensor([1.0, 2.0, 3.0])
        >>> (x * x).sum().gradient(x)[0].tolist()
        [2.0, 4.0, 6.0]
        """
        cls = type(self)  # Tensor, without importing it back (tensor/tensor.py imports this module)
        if grad_disabled():
            raise RuntimeError("gradient() inside Tensor.no_grad: leave the no_grad block first")
        used: list[bool] = []
        grads = _gradients(self._graph(), self._seed(gradient), [t.node for t in targets], used)
        out: list[Self] = []
        for t, grad, in_graph in zip(targets, grads, used):
            if grad is None:
                # used without a float path (only compared, say) or empty: the gradient is zero, as PyTorch's
                if not (materialize_grads or in_graph or t.numel() == 0):
                    raise GraphError(f"{t!r} is not used (through float ops) by the tensor being "
                                     f"differentiated; pass materialize_grads=True for zeros")
                out.append(t.zeros_like())
            else:
                out.append(cls(grad))  # type: ignore[call-arg]
        return out

    def backward(self, gradient: Optional[Self] = None) -> Self:
        """Adds to `.grad` of every tensor with `requires_grad=True` that this one depends on the
        gradient of this tensor with respect to it (lazily). A non-scalar needs `gradient`.

        >>> w = Tensor([1.0, 2.0], requires_grad=True)
        >>> (w * 3).sum().backward()  # returns the loss it was called on
        <Tensor shape=() dtype=float32 device=CPU:0>
        >>> w.grad.tolist()
        [3.0, 3.0]
        """
        cls = type(self)
        if grad_disabled():
            raise RuntimeError("backward() inside Tensor.no_grad: leave the no_grad block first")
        targets = [t for t in list(_requiring_grad.values()) if t is not self]
        graph = self._graph()
        grads = _gradients(graph, self._seed(gradient), [t.node for t in targets])
        for t, grad in zip(targets, grads):
            if grad is not None:
                t.grad = cls(grad) if t.grad is None else t.grad + cls(grad)  # type: ignore[call-arg]
        self._keep_value(graph)
        return self  # type: ignore[return-value]

    def _keep_value(self, graph: Node) -> None:
        """Gives a computed loss its own storage, filled lazily (a pending assign, like `clone()`), so
        `loss.backward(); opt.step(); loss.item()` reads the loss as it was before the step, as eager
        code would. Why this works: the step overwrites the parameters the loss reads, and a realize
        that overwrites a version a pending assign reads realizes that assign along, first
        (`sched.versions._flush_along`); the loss costs one more output of the step's task graph, not a
        copy of the parameters. A plain lazy value (not differentiated) still raises StaleReadError
        when read after its inputs were overwritten. `_ctx` keeps the graph for a later backward()."""
        node = self.node  # type: ignore[attr-defined]
        if node.op is Ops.MULTI or node.base().op in (Ops.BUFFER, Ops.ASSIGN):
            return  # sharded, or already storage (realized, or kept by an earlier backward)
        self._node = self.clone().node  # type: ignore[attr-defined]
        self._ctx = graph  # type: ignore[attr-defined]

    def _graph(self) -> Node:
        """The graph to differentiate: this tensor's node, or, once it was realized into a buffer, the
        graph that computed it (`realize` keeps it), so `print(loss.item()); loss.backward()` works
        (the gradient graph then recomputes what it needs of the forward)."""
        node = self.node  # type: ignore[attr-defined]
        computed = self._ctx  # type: ignore[attr-defined]
        parts = node.src if node.op is Ops.MULTI else (node,)
        if computed is not None and all(p.base().op is Ops.BUFFER for p in parts):
            return computed
        base = node.base()
        if computed is not None and base.op is Ops.ASSIGN and base.src[1] is computed:
            return computed  # the storage `_keep_value` gave it, not yet filled
        return node

    def _seed(self, gradient: Optional[Self]) -> Node:
        node = self.node  # type: ignore[attr-defined]
        if gradient is None:
            if node.size != 1:
                raise GraphError(f"backward() of a tensor of shape {node.shape} needs `gradient` (only a "
                                 f"tensor with one element has an implicit gradient of 1)")
            return Node.const(1.0, node.dtype, node.device, node.shape)
        if tuple(gradient.shape) != tuple(node.shape):
            raise GraphError(f"gradient of shape {gradient.shape} for a tensor of shape {node.shape}")
        return gradient.cast(node.dtype).node
