"""The user's `Tensor`: builds graph nodes, and realizes them through sched/ and hcq/.

Names and semantics follow tinygrad's Tensor (and PyTorch's where tinygrad follows it), with one
addition: a tensor is awaitable. `t.realize(*more)` dispatches all given tensors as one task graph at
once and returns `t`, as tinygrad's does; `await t` waits for its pending work, so
`await t.realize(a, b)` waits for all three. A realize that is never awaited still runs, so ported
code never silently does nothing. Inside a running event loop (trio or asyncio) the sync accessors
(`numpy`, `tolist`, `item`, `wait`) refuse to block on unrealized data and name the await to use
instead; in a plain script they block until it is done.

Storage: a tensor made from data, or realized, is a view of a buffer. Such a tensor is *live*: it
always shows the buffer's newest version, so a write through any alias (`t[1:3] = v`,
`t.detach().assign(...)`) is seen by every view of that buffer, as in eager code. A computed tensor
instead captures the versions of its inputs when it is built.
"""
from __future__ import annotations

import math
from typing import Any, Generator, Optional, Union

import numpy as np

from atensor import core
from atensor.config import settings
from atensor.dtype import DType, dtypes, to_dtype
from atensor.graph.node import BufferSpec, GraphError, Node
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.hcq.buffer import Buffer
from atensor.hcq.device import Device, canonical
from atensor.hcq.loop import running_library
from atensor.engine.realize import Storage, _follow_storage, _storage_base, realize as realize_captured
from atensor.engine.handle import NotRealizedError, RealizeHandle
from atensor.engine.dispatch import reaper
from atensor.backend.numpy.render import _view
from atensor.ledger import versions
from atensor.porting import missing_attribute
from atensor.tensor.autograd import AutogradOps, ModeMeta, _no_grad, graphs_needed, stop_gradient
from atensor.tensor.activations import ActivationOps
from atensor.tensor.base import TensorBase
from atensor.tensor.contract import ContractOps
from atensor.tensor.create import CreationOps
from atensor.tensor.elementwise import ElementwiseOps
from atensor.tensor.indexing import IndexOps, check_assign_dtype
from atensor.tensor.movement import MovementOps
from atensor.tensor.multi import MultiOps
from atensor.tensor.nn import NNOps
from atensor.tensor.reduce import ReduceOps
from atensor.tensor.select import SelectOps
from atensor.tensor.windows import WindowOps

Scalar = Union[int, float, bool]
_VIEW = Ops.VIEW
# what a tensor's node (under at most one view) can be when it has storage to follow, or is sharded
_FOLLOWED = frozenset({Ops.BUFFER, Ops.ASSIGN, Ops.VIEW, Ops.MULTI})
_new_object = object.__new__



def _capture(tensors: tuple[Tensor, ...], keep_graphs: bool) -> list[tuple[Tensor, Node]]:
    """Each tensor of a realize with its node as it is now (`Tensor.node`); with `keep_graphs`, the graph
    that computes it is noted on it (`_ctx`), so backward() still works after realizing. Runs on the
    caller's thread (the event loop's) once per tensor: in C when the core is compiled."""
    captured: list[tuple[Tensor, Node]] = []
    for t in tensors:
        node = t.node
        if keep_graphs and (node.op is Ops.MULTI or node.base().op is not Ops.BUFFER):
            t._ctx = node
        captured.append((t, node))
    return captured


python_capture = _capture  # the specification, whichever runs (tests/core/ compares the two)
if core.ccore is not None:  # the loop in C (atensor/core/walk.c), the property's general case in Python
    _capture = core.ccore.capture  # noqa: F811

class Tensor(CreationOps, ElementwiseOps, ActivationOps, ReduceOps, MovementOps, IndexOps, SelectOps,
             ContractOps, WindowOps, NNOps, AutogradOps, MultiOps, TensorBase, metaclass=ModeMeta):
    """A lazy n-dimensional array on one device. See the module docstring for realize semantics.

    >>> (Tensor([1, 2, 3]) + 1).tolist()
    [2, 3, 4]
    """
    # "__dict__": a user may attach attributes to a tensor, as to a PyTorch tensor
    __slots__ = ("_node", "_requires_grad", "grad", "_ctx", "_swap", "_pending", "__weakref__", "__dict__")

    def __init__(self, data: Any, device: Optional[str] = None, dtype: Any = None,
                 requires_grad: Optional[bool] = None):
        self._requires_grad, self.grad, self._ctx = None, None, None  # the slot first: the setter reads it
        self._swap: Optional[Storage] = None  # the storage a realize fixed for it (engine/realize.py)
        self._pending: Optional[RealizeHandle] = None  # the last realize of this tensor not yet waited for
        if requires_grad is not None:
            self.requires_grad = requires_grad
        if type(data) is Node and device is None and dtype is None:  # every op's result, a replay's
            self._node = data
            return
        dev = canonical(device or settings.default_device)
        dt = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, Node):
            self._node = data
            return
        if isinstance(data, Tensor):
            self._node = data.node if dt is None else data.cast(dt).node
            return
        if isinstance(data, (bool, int, float)):
            array = np.array(data, dtype=(dt or dtypes.from_py(data)).np)
        elif isinstance(data, (list, tuple)):
            array = np.array(data, dtype=(dt or dtypes.from_py(data)).np)
        elif isinstance(data, (np.ndarray, np.generic)):
            array = np.asarray(data, dtype=dt.np if dt is not None else None)  # copied below, once
        else:
            raise TypeError(f"cannot make a Tensor from {type(data).__name__}; give a list, a numpy array, "
                            f"a Python scalar or a Tensor")
        if isinstance(dev, tuple):  # data for several devices: made on the first, replicated to all
            self._node = Tensor(array, device=dev[0], dtype=dt).to(dev).node
            return
        atype = dt or dtypes.from_numpy(array.dtype)
        spec = BufferSpec(dev, array.size, atype)
        if dev.startswith("CL"):  # device memory, the values written into it
            Device.get(dev).allocate(spec, array)
        else:
            buf = Device.get(dev).allocate(spec)  # the device's pooled memory: no fresh pages per batch
            if dev.startswith("CPU"):
                np.copyto(buf.memory.reshape(array.shape), array)
        node = spec.node(0)
        # the contiguous view of the array's shape: what node.reshape(shape) gives, without its general path
        self._node = node if array.shape == node.shape else \
            Node.make(Ops.VIEW, atype, (node,), View.create(array.shape))

    # ---- the graph node, kept pointing at the newest version of its storage ----------------------
    @property
    def node(self) -> Node:
        """This tensor's graph node; a view of storage follows the storage's newest version."""
        swap = self._swap
        if swap is not None:  # this tensor was realized: its storage was fixed then, held from now on
            self._swap = None
            if self._node is swap.lazy:
                self._node = swap.node()
        node = self._node
        base = node.src[0] if node.op is _VIEW else node
        if base.op not in _FOLLOWED:  # the common case: a computed value, no storage to follow
            return node
        if node.op is Ops.MULTI:  # a sharded tensor: each shard follows its own storage
            new = Node.make(Ops.MULTI, node.dtype, tuple(_follow_storage(s) for s in node.src), node.arg)
            if new is not node:
                self._node = new
            return new
        new = _follow_storage(node)
        if new is not node:
            self._node = new
            if swap is not None and swap.reaped:  # its realize committed: the big lazy graph is dead
                reaper.bury([node])
        return new

    @property
    def shape(self) -> tuple[int, ...]:
        return self._node.shape

    @property
    def dtype(self) -> DType:
        return self._node.dtype

    @property
    def device(self) -> str:
        return self._node.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<Tensor shape={self.shape} dtype={self.dtype.name} device={self.device}>"

    def _new(self, node: Node) -> Tensor:
        """The tensor of an op's result `node` (what `Tensor(node)` makes, without __init__'s checks)."""
        if _no_grad.get():
            node = stop_gradient(node)
        made = _new_object(Tensor)
        made._node, made._requires_grad, made.grad, made._ctx, made._swap, made._pending = \
            node, None, None, None, None, None
        return made

    # ---- realize -------------------------------------------------------------------------------
    def realize(self, *more: Tensor) -> Tensor:
        """Dispatches the work that computes this tensor (and `more`) as one task graph at once and
        returns this tensor. `await t.realize(a, b)` waits for all three; a realize that is never
        awaited still runs (the sync accessors wait for it)."""
        self._dispatch(more)
        return self

    def _dispatch(self, more: tuple[Tensor, ...] = ()) -> RealizeHandle:
        """`realize` itself: submits the job and notes its handle on every tensor it realizes."""
        tensors = (self, *more)
        handle = realize_captured(_capture(tensors, graphs_needed()), None)
        for t in tensors:
            t._pending = handle
        return handle

    def __await__(self) -> Generator[Any, None, Tensor]:
        """`await t`: waits (from trio or asyncio) for everything pending on this tensor and returns it:
        its last realize, and writes into it issued after that realize (which are realized now). A
        tensor never realized is realized first. A failed realize raises here, naming the task."""
        return self._wait_async().__await__()

    async def _wait_async(self) -> Tensor:
        handle = self._pending
        if handle is None and not self._is_ready_single():
            handle = self._dispatch()
        while handle is not None:
            try:
                await handle
            finally:  # done, failed (its error is raised here) or cancelled (the work still runs)
                if self._pending is handle and handle.done():
                    self._pending = None
            handle = self._dispatch() if self._has_unissued_work() else None
        buf = self._stored_buffer()
        if buf is not None and not buf.ready():  # `_writes_in_flight`, with the buffer kept for the next check
            await self._dispatch()
            buf = None
        if buf is None:
            self._raise_write_failure()  # a value a failed task wrote raises again on every await
        else:
            _raise_failure_of(buf)
        return self

    def _stored_buffer(self) -> Optional[Buffer]:
        """The runtime buffer of this tensor's storage when its node is a buffer or one view of one (the
        case `_writes_in_flight` sees), else None."""
        node = self.node
        if node.op is _VIEW:
            node = node.src[0]
        return Buffer.of(node.arg[0]) if node.op is Ops.BUFFER else None

    def _writes_in_flight(self) -> bool:
        """True when writes into this single-device tensor's buffer are still dispatched or running
        after its own realizes are done: a view of it realized on its own (`t[0:2].realize()`) writes
        it through a realize that is not this tensor's. A realize of this stored tensor, dispatched
        after that one, waits for its writes (the dispatcher plans in issue order). A sharded tensor's
        node is a MULTI, never a buffer: its shards' writes are waited for by their own realizes."""
        node = self._node  # current: the caller read `node` since (`_has_unissued_work`)
        if node.op is Ops.VIEW:
            node = node.src[0]
        return node.op is Ops.BUFFER and not Buffer.of(node.arg[0]).ready()

    def _has_unissued_work(self) -> bool:
        """True when this tensor's value still needs a realize: it is computed, or a write into its
        storage (an assign, `t[i] = v`) is pending, issued after the realize awaited last."""
        node = self.node
        for part in node.src if node.op is Ops.MULTI else (node,):
            base = _storage_base(part)
            if base is None or base.op is Ops.ASSIGN:
                return True
        return False

    def _raise_write_failure(self) -> None:
        """Raises when this tensor's buffer was last written by a task that failed."""
        base = _storage_base(self.node)
        if base is None or base.op is not Ops.BUFFER:
            return
        _raise_failure_of(Buffer.of(base.arg[0]))

    def wait(self, timeout: Optional[float] = None) -> Tensor:
        """Blocks until everything pending on this tensor is done (its last realize, and writes into it
        issued since, realized now) and returns it: the plain-script counterpart of `await t` (inside a running event loop it raises NotRealizedError instead of blocking)."""
        if self._pending is None and self._is_ready_single():
            return self
        handle = self._pending
        # inside a loop a realize is awaited, never waited for, even one already done: whether it is
        # done by now depends on its size (a tiny one runs while it is planned) and on timing
        self._refuse_in_loop("wait")
        if handle is None:
            handle = self._dispatch()
        while handle is not None:  # as `await t`: later writes into it are realized too
            try:
                handle.wait(timeout)
            finally:
                if self._pending is handle and handle.done():
                    self._pending = None
            handle = self._dispatch() if self._has_unissued_work() else None
        if self._writes_in_flight():  # issued through another tensor's realize (a view's), still queued
            self._dispatch().wait(timeout)
        return self

    def _is_ready_single(self) -> bool:
        """True when this is a view of a buffer with no pending writes (a sharded tensor: never)."""
        base = _storage_base(self.node)
        return base is not None and base.op is Ops.BUFFER and Buffer.of(base.arg[0]).ready()

    def _refuse_in_loop(self, accessor: str) -> None:
        """Raises NotRealizedError when called on a thread that runs an event loop (blocking would stall it)."""
        lib = running_library()
        if lib is not None:
            raise NotRealizedError(
                f"Tensor.{accessor}() inside a running {lib} event loop on a tensor that is not realized; "
                f"`await t.realize()` (or `await t`) first, then t.{accessor}(), so the event loop is never "
                f"blocked")

    def _ensure_ready(self, accessor: str) -> Buffer:
        """The buffer behind this tensor, realized and with no pending writes, or an error that names
        the await to use (inside an event loop) / a blocking realize (outside one)."""
        node = self.node
        base = _storage_base(node)
        buf = Buffer.of(base.arg[0]) if base is not None and base.op is Ops.BUFFER else None
        if buf is None or not buf.ready():
            self._refuse_in_loop(accessor)
            handle = self._pending
            if handle is not None:  # a realize dispatched earlier: its errors are this read's, once
                try:
                    handle.wait()
                finally:
                    if self._pending is handle:
                        self._pending = None
            if not self._is_ready_single():
                try:
                    self._dispatch().wait()
                finally:
                    self._pending = None
            node = self.node
            base = _storage_base(node)
            buf = Buffer.of(base.arg[0])
        self._raise_write_failure()
        return buf

    def numpy(self) -> np.ndarray:
        """The values as a new numpy array (realizes synchronously outside an event loop)."""
        if isinstance(self.device, tuple):
            return self._multi_numpy()
        buf = self._ensure_ready("numpy")
        if buf.device.startswith("NULL"):
            raise RuntimeError(f"{self.device} holds no data (NULL devices run nothing); use a CPU device")
        return np.array(_read(self.node, buf))

    def tolist(self) -> Any:
        """The values as nested Python lists (a scalar for a 0-d tensor)."""
        return self.numpy().tolist()

    def item(self) -> Scalar:
        """The single value of a tensor with one element."""
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with exactly one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def data(self) -> np.ndarray:
        return self.numpy()

    # ---- storage -------------------------------------------------------------------------------
    def contiguous(self) -> Tensor:
        """Asks for a contiguous layout when the value is computed (not kept after the realize)."""
        return self._new(Node.make(Ops.CONTIGUOUS, self.dtype, (self.node,)))

    def contiguous_backward(self) -> Tensor:
        """tinygrad's hint that the gradient flowing back through this point be materialized contiguously
        (so a later backward kernel reads it once instead of recomputing it). The value and the gradient
        are this tensor's own; atensor's scheduler decides which gradients it materializes by itself, so
        here it is the identity, kept for ported code.

        >>> Tensor([1.0, 2.0]).contiguous_backward().tolist()
        [1.0, 2.0]
        """
        return self

    def __getattr__(self, name: str) -> Any:
        """Only reached for names the Tensor lacks: tinygrad's get an error naming docs/porting.md. (Also
        reached when a property raised AttributeError: that error is raised again, not hidden.)"""
        if hasattr(type(self), name):
            return object.__getattribute__(self, name)
        raise missing_attribute("Tensor", name)

    def clone(self, device: Optional[str] = None) -> Tensor:
        """Independent storage, filled lazily, that persists; `clone(device)` also moves it."""
        src = self.to(device) if device is not None else self
        if isinstance(src.device, tuple):
            return src._clone_shards()
        node = src.node
        spec = BufferSpec(node.device, node.size, node.dtype)
        view = View.create((node.size,)).reshape(node.shape)
        root = Node.make(Ops.ASSIGN, node.dtype, (spec.node(0), node), view)
        versions.set_head(spec, root)
        return self._new(root.view(view))

    def detach(self) -> Tensor:
        """The same value without gradient tracking. A view of storage stays one (assigning through it
        writes the storage), unless this tensor requires grad: then it is a detached value."""
        return Tensor(stop_gradient(self.node, keep_storage=not self.requires_grad))

    def to(self, device: Union[str, Device]) -> Tensor:
        """This tensor on `device`: a lazy copy on the copy queue, or `self` when already there."""
        if isinstance(device, (tuple, list)) or isinstance(self.device, tuple):
            return self._to_devices(device)
        dev = canonical(device)
        if dev == self.device:
            return self
        return self._new(Node.make(Ops.COPY, self.dtype, (self.node,), dev))

    def assign(self, value: Any) -> Tensor:
        """Writes `value` into this tensor's storage when realized (deferred, in program order). A tensor
        without storage gets new storage."""
        check_assign_dtype(self.dtype, value)
        if isinstance(self.device, tuple):
            return self._assign_shards(value)
        value = value if isinstance(value, Tensor) else Tensor.full(self.shape, value, dtype=self.dtype,
                                                                       device=self.device)
        if value.device != self.device:
            raise GraphError(f"assign: value on {value.device} into a tensor on {self.device}; "
                             f"move it with .to('{self.device}') first")
        if value.shape != self.shape:
            value = value._broadcast_to(self.shape)
        if value.dtype != self.dtype:
            value = value.cast(self.dtype)
        node = self.node
        base = _storage_base(node)
        if base is None:
            self._node = value.clone().node
            return self
        view = _single_view(node, base)
        new = Node.make(Ops.ASSIGN, self.dtype, (base, value.node), view)
        versions.set_head(versions.storage_of(base), new)
        self._node = new.view(view)
        return self


def _raise_failure_of(buf: Buffer) -> None:
    """Raises when `buf` was last written by a task that failed."""
    err = buf.write_failure()
    if err is not None:
        raise RuntimeError(f"this tensor's buffer was written by a task that failed: {err}") from err


def _single_view(node: Node, base: Node) -> View:
    """The one View from `base` (flat storage) to `node`, or an error when the views do not compose."""
    if node is base:
        return View.create(base.shape)
    if node.op is Ops.VIEW and node.src[0] is base:
        return node.arg
    raise GraphError("cannot assign through this view (a reshape of a permuted or padded view has no single "
                     "strided layout); assign to the base tensor instead")


def _read(node: Node, buf: Buffer) -> np.ndarray:
    if node.op is Ops.BUFFER:
        return buf.numpy()
    if node.op is Ops.VIEW:
        return _view(_read(node.src[0], buf), node.arg.evaluate())  # at the bound values, if symbolic
    raise RuntimeError(f"unexpected node {node.op} under a realized tensor")
