"""Allreduce lowered into TaskGraph tasks: naive or ring, chosen by a small cost model.

Why tasks and not one opaque "allreduce" call: the steps of a collective are copies and reduce
kernels like any others. As tasks with byte ranges they get their dependency edges from the same
RAW/WAR/WAW rule as everything else, the race checker proves them, the plan (engine/plan.py) puts each on a
device's copy or compute queue, and the profiler shows every step (their `kind` is "allreduce").
Chunks of a buffer are disjoint byte ranges, so the copy of chunk i+1 (copy queue) has no edge to
the reduce of chunk i (compute queue) and the two overlap: that is the whole pipelining mechanism.

The algorithms, for n devices each holding a partial of B bytes (`inputs`), each wanting the
reduced value (`outputs`, a separate buffer: the inputs are never written):

- naive: every device copies its partial to one root (the first into the root's output, the others
  into a staging buffer there), one kernel reduces all n, and the root copies the result to every
  other device. 2n - 1 tasks, so the least latency, but the root's copy queue moves (n - 1) B alone
  and its one kernel reads n B.
- ring: the B bytes are cut into n segments and each segment into k chunks. Reduce-scatter: in step
  s (0..n-2) device r sends its running sum of segment (r - s) mod n to device r + 1, which adds
  its own input to it in place (`out = in + out`); after n - 1 steps device r holds the full
  reduction of segment (r + 1) mod n. All-gather: n - 1 more steps pass the finished segments
  around the ring. Every device sends and receives 2 (n - 1) / n B in total, all devices at once:
  bandwidth-optimal, but 3 n (n - 1) k tasks.

The cost model (`CostModel`) prices both in seconds from four measured numbers: the per-task
latency `alpha` (dispatch, signal wait and wake-up, and the Python each queue worker runs per
command: on CPU devices it holds the GIL, so tasks pay it one after another whatever the queue), a
copy's bandwidth, a reduce kernel's bandwidth, and the number of cores that run queues at the same
time. A task-heavy algorithm pays alpha per task; a bandwidth-heavy one pays bytes over bandwidth,
divided by the parallelism it can use. So naive wins for small buffers and for two devices with
little data, ring for large buffers; the chunk count k is chosen by the same model (more chunks:
more overlap between copy and compute, but alpha per chunk). Alternatives rejected: tinygrad's
fixed thresholds (RING=1 and 256k elements) encode one machine; NCCL's tuner is the same idea with
more algorithms (tree, NVLS) than two queues per device make worth having.

Across processes (`processes=True`, atensor/dist/): hierarchical, as NCCL and Horovod do it. The
process's partials are reduced among its devices first, by the same two algorithms, then the
reduced bytes go through one MPI allreduce across processes (a `NetAllReduce` task on a device's
`net` queue, which waits on the producers' signals like any other task), then back to the devices:
- naive: gather and reduce on the root, the root's `net` queue allreduces the whole buffer in place,
  the root broadcasts. With one device per process it is a single net task, input to output.
- ring: the reduce-scatter leaves device q with segment q + 1 reduced over the process; each device's
  `net` queue allreduces its own segment, chunk by chunk, in place (every device has its own
  communicator, so the n segments cross processes at the same time), and the all-gather starts on a
  chunk as soon as its net task is done.
The cost model picks between them on the local part, as for an allreduce within one process. A mean
is divided once, by the net task, by the number of partials in the whole world.

Mean is a sum whose last reduce step (ring) or only reduce (naive) also multiplies by 1/n; max
and prod use the same steps with another binary op.

Buckets (`Planner`): the allreduces of one realize that agree on devices, dtype, op and algorithm
(one per gradient of a model, say) run as one allreduce over a bucket buffer per device, so a
hundred small gradients cost one naive allreduce instead of a hundred. The partials' kernels write
straight into the input bucket, and the results are read from the output bucket, so bucketing adds
no copies.

What bounds the bandwidth on CPU devices: all "devices" share one memory system, so a ring step's
copy and reduce compete for the same DRAM bandwidth as every other device's, and with 2 cores no
more than two streams run at once. Per device a ring moves 2 (n - 1) / n B through copies and
reduces (n - 1) / n B (reading twice what it writes), so busbw stays well below what a single
memcpy reaches; on GPUs, where each link has its own bandwidth, the same task graph is link-bound.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Optional

from atensor.dtype import DType, dtypes
from atensor.graph.node import BufferSpec, GraphError, Node
from atensor.graph.ops import Ops, ReduceOp
from atensor.graph.view import View
from atensor.graph.taskgraph import Access, Copy, Kernel, NetAllReduce, TaskGraph

ALLREDUCE_KIND = "allreduce"  # the `kind` of every allreduce step: the profiler colours them apart
_BINARY = {ReduceOp.SUM: Ops.ADD, ReduceOp.MAX: Ops.MAX, ReduceOp.PROD: Ops.MUL}
Location = tuple[BufferSpec, int]  # a buffer and an element offset into it


@dataclass(frozen=True)
class AllReduceStep:
    """Where a task sits in its collective: algorithm, phase ("gather", "reduce", "broadcast" for
    naive; "reduce-scatter", "all-gather" for ring), step and chunk."""
    algorithm: str
    phase: str
    step: int = 0
    chunk: int = 0


@dataclass(eq=False)
class AllReduceCopy(Copy):
    """A copy that is one step of an allreduce."""
    kind: str = ALLREDUCE_KIND
    step: Optional[AllReduceStep] = None


@dataclass(eq=False)
class AllReduceKernel(Kernel):
    """A reduce kernel that is one step of an allreduce."""
    kind: str = ALLREDUCE_KIND
    step: Optional[AllReduceStep] = None


@dataclass(frozen=True)
class Plan:
    """The cost model's choice: algorithm, chunks per ring segment, and its predicted seconds."""
    algorithm: str
    chunks: int
    seconds: float


@dataclass(frozen=True)
class CostModel:
    """Predicted seconds of naive and ring allreduce (see the module comment for the reasoning).

    Defaults were measured on the 2-core development machine with numpy kernels (bench/allreduce.py
    and forced algorithms at 4 KiB..4 MiB): a task costs about 100 us of serialized host time (a
    2-device naive allreduce of 4 KiB, 3 tasks, takes 0.5 ms; a 4-device ring, 36 tasks, 3.9 ms);
    one copy stream moves about 4 GB/s and one reduce stream writes about 2.5 GB/s (it reads twice
    what it writes). The crossovers this gives (ring from about 0.7 MiB on 2 devices, 3 MiB on 4)
    match the measured ones within the noise of a shared machine."""
    alpha: float = 100e-6
    copy_bps: float = 4e9
    reduce_bps: float = 2.5e9
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    chunk_choices: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    def naive(self, n: int, nbytes: int, receivers: int) -> float:
        """Gather n-1 partials through the root's copy queue, one n-input reduce, broadcast to the
        other `receivers` at most `cores` at a time."""
        if n == 1:
            return self.alpha + nbytes / self.copy_bps
        gather = (n - 1) * (self.alpha + nbytes / self.copy_bps)
        reduce = self.alpha + (n - 1) * nbytes / self.reduce_bps
        others = max(0, receivers - 1)
        broadcast = others * self.alpha + math.ceil(others / self.cores) * nbytes / self.copy_bps
        return gather + reduce + broadcast

    def ring(self, n: int, nbytes: int, chunks: int) -> float:
        """All devices work at once (up to `cores` streams): each of the 2 (n-1) steps moves B/n per
        device; the pipeline needs one extra chunk per step to fill; every task costs alpha."""
        if n == 1:
            return self.naive(1, nbytes, 1)
        work = (n - 1) * (2 * nbytes / self.copy_bps + nbytes / self.reduce_bps)
        streams = min(self.cores, 2 * n)
        fill = 2 * (n - 1) * (nbytes / (n * chunks)) / self.copy_bps
        tasks = 3 * n * (n - 1) * chunks
        return work / streams + fill + tasks * self.alpha

    def choose(self, n: int, nbytes: int, receivers: Optional[int] = None, algorithm: str = "auto") -> Plan:
        """The cheapest plan; `algorithm` forces one ("naive"/"ring"), keeping the best chunk count."""
        receivers = n if receivers is None else receivers
        rings = [Plan("ring", k, self.ring(n, nbytes, k)) for k in self.chunk_choices
                 if nbytes // max(1, n * k) >= 1 or k == 1]
        ring = min(rings, key=lambda p: p.seconds)
        naive = Plan("naive", 1, self.naive(n, nbytes, receivers))
        if algorithm == "ring":
            return ring
        if algorithm == "naive":
            return naive
        if receivers < n:  # a reduce to a few devices: the ring would finish every device's copy
            return naive
        return ring if ring.seconds < naive.seconds else naive


MODEL = CostModel()


def lower(graph: TaskGraph, op: ReduceOp, mean: bool, dtype: DType, devices: tuple[str, ...],
          inputs: list[Location], outputs: list[Optional[Location]], size: int, algorithm: str = "auto",
          model: Optional[CostModel] = None, processes: bool = False) -> Plan:
    """Adds the tasks of one allreduce of `size` elements to `graph`. `inputs[i]` is device i's partial
    and `outputs[j]` where device j's result goes (None: device j does not need it). `processes`: over
    every process's partials too (hierarchical, see the module comment). Returns the plan."""
    n = len(devices)
    if mean and not dtypes.is_float(dtype):
        raise GraphError(f"allreduce mean needs a float dtype, got {dtype.name}")
    needed = [j for j, o in enumerate(outputs) if o is not None]
    if not needed or size == 0:
        return Plan("naive", 1, 0.0)
    plan = (model or MODEL).choose(n, size * dtype.itemsize, len(needed), algorithm)
    if plan.algorithm == "ring" and n > 1:
        outs = [o if o is not None else (BufferSpec(devices[j], size, dtype), 0)
                for j, o in enumerate(outputs)]
        _ring(graph, op, mean, dtype, devices, inputs, outs, size, plan.chunks, processes)
    else:
        plan = Plan("naive", 1, plan.seconds) if plan.algorithm != "naive" else plan
        _naive(graph, op, mean, dtype, devices, inputs, outputs, size, processes)
    return plan


# ---- the two algorithms -------------------------------------------------------------------------
def _naive(graph: TaskGraph, op: ReduceOp, mean: bool, dtype: DType, devices: tuple[str, ...],
           inputs: list[Location], outputs: list[Optional[Location]], size: int,
           processes: bool = False) -> None:
    n = len(devices)
    root = next(j for j, o in enumerate(outputs) if o is not None)
    out = outputs[root]
    assert out is not None
    if processes and n == 1:  # nothing to reduce here: one net task, from the partial to the result
        _net(graph, op, mean, 1, inputs[0], out, size, AllReduceStep("naive", "net"))
        return
    parts: list[Location] = [inputs[root]]
    # the first partial to arrive is received into the root's output itself (the kernel then reduces
    # in place, as ring steps do); only the others need a staging buffer on the root
    stage = BufferSpec(devices[root], size * (n - 2), dtype) if n > 2 else None
    for slot, i in enumerate(i for i in range(n) if i != root):
        where = out if slot == 0 else (stage, (slot - 1) * size)
        _copy(graph, inputs[i], where, size, AllReduceStep("naive", "gather", slot))
        parts.append(where)
    _reduce(graph, op, 1.0 / n if mean and not processes else None, dtype, devices[root], out, parts, size,
            AllReduceStep("naive", "reduce"))
    if processes:  # the process's sum, across processes, in place on the root
        _net(graph, op, mean, n, out, out, size, AllReduceStep("naive", "net"))
    for j, dst in enumerate(outputs):
        if dst is not None and j != root:
            _copy(graph, out, dst, size, AllReduceStep("naive", "broadcast", j))


def _ring(graph: TaskGraph, op: ReduceOp, mean: bool, dtype: DType, devices: tuple[str, ...],
          inputs: list[Location], outputs: list[Location], size: int, chunks: int,
          processes: bool = False) -> None:
    n = len(devices)
    segments = _split(0, size, n)
    pieces = [_split(b, e, chunks) for b, e in segments]  # per segment: its chunks, as element ranges

    def at(loc: Location, start: int) -> Location:
        return loc[0], loc[1] + start

    for step in range(n - 1):  # reduce-scatter
        for c in range(chunks):
            for r in range(n):
                q = (r + 1) % n
                b, e = pieces[(r - step) % n][c]
                if e == b:
                    continue
                sent = inputs[r] if step == 0 else outputs[r]
                where = AllReduceStep("ring", "reduce-scatter", step, c)
                _copy(graph, at(sent, b), at(outputs[q], b), e - b, where)
                scale = 1.0 / n if mean and step == n - 2 and not processes else None
                _reduce(graph, op, scale, dtype, devices[q], at(outputs[q], b),
                        [at(inputs[q], b), at(outputs[q], b)], e - b, where)
    if processes:  # device q holds segment q + 1 reduced over the process: across processes, in place
        for c in range(chunks):
            for q in range(n):
                b, e = pieces[(q + 1) % n][c]
                if e > b:
                    _net(graph, op, mean, n, at(outputs[q], b), at(outputs[q], b), e - b,
                         AllReduceStep("ring", "net", 0, c))
    for step in range(n - 1):  # all-gather
        for c in range(chunks):
            for r in range(n):
                q = (r + 1) % n
                b, e = pieces[(r + 1 - step) % n][c]
                if e > b:
                    _copy(graph, at(outputs[r], b), at(outputs[q], b), e - b,
                          AllReduceStep("ring", "all-gather", step, c))


def _split(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) cut into `parts` ranges as even as possible (some may be empty)."""
    base, extra = divmod(end - start, parts)
    out, at = [], start
    for i in range(parts):
        nxt = at + base + (1 if i < extra else 0)
        out.append((at, nxt))
        at = nxt
    return out


# ---- tasks ----------------------------------------------------------------------------------------
def _copy(graph: TaskGraph, src: Location, dst: Location, size: int, where: AllReduceStep) -> None:
    (s, so), (d, do) = src, dst
    item = s.dtype.itemsize
    nbytes = size * item
    name = f"allreduce_{where.algorithm}_{where.phase}_s{where.step}_c{where.chunk}_{s.device}_to_{d.device}"
    work = AllReduceCopy(s, d, so * item, do * item, nbytes, name=name, step=where)
    graph.add(work, [Access(s, "r", so * item, so * item + nbytes),
                     Access(d, "w", do * item, do * item + nbytes)])


def _net(graph: TaskGraph, op: ReduceOp, mean: bool, local_parts: int, src: Location, dst: Location,
         size: int, where: AllReduceStep) -> None:
    """One NetAllReduce on the `net` queue of `dst`'s device (in place when src is dst)."""
    (s, so), (d, do) = src, dst
    item = s.dtype.itemsize
    name = f"allreduce_{where.algorithm}_net_{op.name.lower()}_c{where.chunk}_{d.device}"
    work = NetAllReduce(s, d, so, do, size, op, mean, local_parts, name=name)
    graph.add(work, [Access(s, "r", so * item, (so + size) * item),
                     Access(d, "w", do * item, (do + size) * item)])


def _reduce(graph: TaskGraph, op: ReduceOp, scale: Optional[float], dtype: DType, device: str, out: Location,
            parts: list[Location], size: int, where: AllReduceStep) -> None:
    """One kernel on `device`: out = parts[0] op parts[1] op ... (times `scale`)."""
    params: dict[BufferSpec, Node] = {}

    def load(loc: Location) -> Node:
        spec, offset = loc
        if spec not in params:
            params[spec] = Node.make(Ops.PARAM, spec.dtype, (), (len(params), spec.size))
        return params[spec].view(_window(offset, size))

    target = load(out)
    body = load(parts[0])
    for part in parts[1:]:
        body = body.alu(_BINARY[op], load(part))
    if scale is not None:
        body = body.alu(Ops.MUL, Node.const(scale, dtype, device, (size,)))
    ast = Node.make(Ops.STORE, dtype, (target, body))
    item = dtype.itemsize
    accesses = [Access(spec, "r", off * item, (off + size) * item) for spec, off in parts]
    accesses.append(Access(out[0], "w", out[1] * item, (out[1] + size) * item))
    name = f"allreduce_{where.algorithm}_{where.phase}_{op.name.lower()}_s{where.step}_c{where.chunk}"
    specs = tuple(sorted(params, key=lambda s: params[s].arg[0]))
    graph.add(AllReduceKernel(ast, specs, device, name, flops=size * len(parts), step=where), accesses)


def _window(offset: int, size: int) -> View:
    plain = View.create((size,))
    return View(plain.shape, plain.strides, offset, None)


# ---- from ALLREDUCE nodes to collectives and buckets (used by schedule._Builder) -------------------
@dataclass(eq=False)
class Collective:
    """The ALLREDUCE nodes of one realize that share their partials: one collective."""
    partials: tuple[Node, ...]
    arg: object  # the members' AllReduceArg, index aside
    members: dict[int, Node] = field(default_factory=dict)
    outputs: list[Optional[Location]] = field(default_factory=list)
    done: bool = False

    @property
    def size(self) -> int:
        return self.partials[0].size


class Planner:
    """Groups a schedule's ALLREDUCE nodes into collectives, and collectives that could run as one
    into buckets (same devices, dtype, op and algorithm: say, one per gradient of a model).

    A bucket of several collectives gets one input and one output buffer per device, with each
    collective at its own offset: the kernels that compute the partials write straight into the
    input bucket (`location`), the readers of the results read from the output bucket, and the
    allreduce runs once over the whole bucket, its chunks crossing collective boundaries. A lone
    collective whose result is only stored into a fresh realize output writes that output directly
    (`writes_directly`). Lowering waits (`defer`) until a point that reads a result is about to be
    built (`flush_before`), so every collective whose partials are ready by then shares the bucket.
    """

    def __init__(self, order: list[Node], points: set[Node], users: dict[Node, list[Node]],
                 bucket_bytes: int = 25 << 20):
        self.collectives: dict[tuple, Collective] = {}
        self.of: dict[Node, Collective] = {}
        for node in order:
            if node.op is Ops.ALLREDUCE:
                arg = node.arg
                key = (node.src, arg.op, arg.algorithm, arg.mean, arg.processes)
                coll = self.collectives.get(key)
                if coll is None:
                    coll = self.collectives[key] = Collective(node.src, key[1:])
                coll.members[arg.index] = node
                self.of[node] = coll
        self.locations: dict[Node, Location] = {}
        self.direct: set[Node] = set()
        self.pending: set[Node] = set()
        # buckets by (devices, dtype, op), each capped at `bucket_bytes` and filled in the order the
        # collectives' partials are computed: a bucket whose collectives are all ready is lowered at
        # once (`defer`), so its copies run while the kernels of later partials (the backward of earlier
        # layers) still compute, as DDP overlaps its gradient buckets
        open_buckets: dict[tuple, list[Collective]] = {}
        self.buckets: list[list[Collective]] = []
        for coll in self.collectives.values():
            first = coll.partials[0]
            devices = tuple(p.device for p in coll.partials)
            key = (devices, first.dtype) + coll.arg
            bucket = open_buckets.get(key)
            if bucket is not None and \
                    (sum(c.size for c in bucket) + coll.size) * first.dtype.itemsize > bucket_bytes:
                bucket = None
            if bucket is None:
                bucket = open_buckets[key] = []
                self.buckets.append(bucket)
            bucket.append(coll)
        self.bucket_of = {coll: bucket for bucket in self.buckets for coll in bucket}
        for bucket in self.buckets:
            self._place(bucket, points, users)

    def _place(self, bucket: list[Collective], points: set[Node], users: dict[Node, list[Node]]) -> None:
        """Gives each collective of `bucket` its input and output locations. The collectives whose
        partials this schedule computes (none placed elsewhere) share the bucket's buffers, when
        there are two or more of them; every other one is placed alone: its partials are buffers of
        their own already (realized inputs, stored values), so it is an allreduce of its own either
        way, and its result is better written where it is stored than copied there from a bucket."""
        claimed: set[Node] = set()
        shared: list[Collective] = []
        for coll in bucket:
            if all(p in points and p.op not in (Ops.ASSIGN, Ops.ALLREDUCE) and p not in self.locations
                   and p not in claimed for p in coll.partials):
                shared.append(coll)
                claimed.update(coll.partials)
        if len(shared) < 2:
            shared = []
        if shared:
            n = len(shared[0].partials)
            dtype = shared[0].partials[0].dtype
            total = sum(c.size for c in shared)
            devices = [p.device for p in shared[0].partials]
            ins = [BufferSpec(d, total, dtype) for d in devices]
            outs = [BufferSpec(d, total, dtype) for d in devices]
            offset = 0
            for coll in shared:
                for i, p in enumerate(coll.partials):
                    self.locations[p] = (ins[i], offset)
                coll.outputs = [(outs[j], offset) if j in coll.members else None for j in range(n)]
                offset += coll.size
        for coll in bucket:
            if coll not in shared:
                self._place_alone(coll, users)

    def _place_alone(self, coll: Collective, users: dict[Node, list[Node]]) -> None:
        """A collective's outputs when it shares no bucket: each member's store target when it is
        only stored (a realize output, an assign), else a buffer of its own."""
        dtype = coll.partials[0].dtype
        coll.outputs = []
        for j in range(len(coll.partials)):
            member = coll.members.get(j)
            if member is None:
                coll.outputs.append(None)
                continue
            target = _direct_target(member, users)
            if target is not None:
                self.direct.add(target)
                coll.outputs.append((storage_spec(target), target.arg.offset))
            else:
                coll.outputs.append((BufferSpec(member.device, member.size, dtype), 0))

    @staticmethod
    def reorder(ordered: list[Node], deps: dict[Node, set[Node]]) -> list[Node]:
        """`ordered` (a topological order of the points) re-sorted by how many allreduces lie below
        each point, stably: every point that needs no collective result comes before every point
        that does, so all collectives whose partials are ready are lowered together (one bucket).
        Still topological: a point's level is at least each of its dependencies'."""
        level: dict[Node, int] = {}
        for p in ordered:
            level[p] = max((level[d] + (d.op is Ops.ALLREDUCE) for d in deps[p]), default=0)
        rank = {p: i for i, p in enumerate(ordered)}
        return sorted(ordered, key=lambda p: (level[p], rank[p]))

    def location(self, point: Node) -> Optional[Location]:
        """Where a partial's kernel should write it (a slice of an input bucket), if planned."""
        return self.locations.get(point)

    def defer(self, node: Node, builder: object = None) -> Location:
        """Notes an ALLREDUCE point as built later; returns where its result will be. When that makes
        every collective of its bucket ready, and the bucket is not the only one, the bucket is
        lowered now (`builder` given), so it overlaps the work still to come."""
        self.pending.add(node)
        coll = self.of[node]
        out = coll.outputs[node.arg.index]
        assert out is not None
        bucket = self.bucket_of[coll]
        if builder is not None and len(self.buckets) > 1 and not coll.done:
            ready = {self.of[m] for m in self.pending}
            if all(c in ready or c.done for c in bucket):
                self._lower_bucket(bucket, ready, builder)
        return out

    def _lower_bucket(self, bucket: list[Collective], ready: set[Collective], builder: object) -> None:
        run: list[tuple[Collective, list[Location]]] = []
        for coll in bucket:
            if coll not in ready or coll.done:
                continue
            coll.done = True
            inputs = [builder.location_of(p) for p in coll.partials]  # type: ignore[attr-defined]
            if run and not _continues(run[-1], coll, inputs):
                _lower_run(builder.graph, run)  # type: ignore[attr-defined]
                run = []
            run.append((coll, inputs))
        if run:
            _lower_run(builder.graph, run)  # type: ignore[attr-defined]

    def writes_directly(self, point: Node) -> bool:
        """True for a realize output that an allreduce writes itself (nothing left to build)."""
        return point in self.direct

    def flush_before(self, deps: set[Node], builder: object) -> None:
        """Lowers the deferred collectives if the point about to be built depends on one."""
        if self.pending and not self.pending.isdisjoint(deps):
            self.flush(builder)

    def flush(self, builder: object) -> None:
        """Lowers every deferred collective, bucket by bucket, as few allreduces as possible."""
        if not self.pending:
            return
        ready = {self.of[m] for m in self.pending}
        self.pending.clear()
        for bucket in self.buckets:
            self._lower_bucket(bucket, ready, builder)


def _continues(last: tuple[Collective, list[Location]], coll: Collective, inputs: list[Location]) -> bool:
    """True when `coll` sits right after `last` in every input and output buffer."""
    prev, prev_inputs = last
    for a, b in zip(prev_inputs + prev.outputs, inputs + coll.outputs):
        if (a is None) != (b is None):
            return False
        if a is not None and (a[0] is not b[0] or a[1] + prev.size != b[1]):  # type: ignore[index]
            return False
    return True


def _lower_run(graph: TaskGraph, run: list[tuple[Collective, list[Location]]]) -> None:
    first, inputs = run[0]
    op, algorithm, mean, processes = first.arg  # type: ignore[misc]
    devices = tuple(p.device for p in first.partials)
    size = sum(c.size for c, _ in run)
    lower(graph, op, mean, first.partials[0].dtype, devices, inputs, first.outputs, size, algorithm,
          processes=processes)


def storage_spec(assign: Node) -> BufferSpec:
    return assign.src[0].arg[0]


def _direct_target(member: Node, users: dict[Node, list[Node]]) -> Optional[Node]:
    """The ASSIGN that only stores `member` (or a plain reshape of it) into a buffer whose old version
    nothing else in the graph reads, if any (a realize output, an `out.assign(allreduce)`)."""
    user = users.get(member, [])
    if len(user) != 1:
        return None
    node = user[0]
    if node.op is Ops.VIEW:
        if not (node.arg.contiguous and node.arg.offset == 0 and node.arg.size == member.size):
            return None
        user = users.get(node, [])
        if len(user) != 1:
            return None
        node = user[0]
    if node.op is not Ops.ASSIGN or node.src[0].op is not Ops.BUFFER or len(users.get(node.src[0], [])) != 1:
        return None
    if not (node.arg.contiguous and type(node.arg.offset) is int) or node.src[1].base() is not member:
        return None
    return node  # nothing else in the graph reads the buffer's old version: writing it early is safe
