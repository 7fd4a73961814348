"""`atensor.jit`: capture a step function's task graphs once, then replay them on new inputs.

Why: a training step or a server's forward pass builds the same graph on every call. Building it
(forward, backward and optimizer in Python), scheduling it and looking it up in the schedule cache
costs milliseconds of Python per call, often more than the kernels themselves. A jitted function
runs normally on its first call (which may differ: lazy initial values get realized); the second
call is *captured*: every realize it issues records the TaskGraph it ran; the third runs normally
again and must build the same graphs (verified). From the fourth call on the function is not called
at all: the captured graphs are submitted again, with the new arguments' buffers in place of the
captured ones. What tinygrad's TinyJit does, with these rules:

- Arguments: tensors (at any depth of tuples, lists and dicts) are the inputs; a lazy one (a batch
  sharded over devices, say) is computed by the replay from the buffers it reads; any other argument
  must be hashable and is part of the key. A new key (other shapes, dtypes, devices, lazy structure
  of an input, other plain arguments, training mode or no_grad) is captured afresh, up to
  `max_programs` keys.
- Bound `Variable` arguments (`start_pos.bind(7)`, at any depth) are keyed by the unbound variable,
  not the value: the call is captured once, and a replay runs the captured kernels with the new
  values (their `var_vals`), so a KV-cache decode step is one program for every position. A replay
  that changes the values first waits for the program's previous replay (its kernels read them).
- State: buffers that existed before the call (parameters, optimizer state, constants) are the
  captured ones: updates by `assign` land in them on every replay, exactly as in the function.
  The assigns a call issues are realized by the call, with its results, whether a result reads
  them or not (a KV-cache write at a bound `Variable` slot that no result reads is still a write).
  A value an earlier call realized (its result, still held, is the same interned `x * 2`) is not
  read back while capturing but computed again (handle.Recording), so a replay computes from its
  inputs, and what earlier results are still alive never changes the captured graphs.
- Results: the function returns tensors (or tuples/lists/dicts of them, or None); they are realized
  by the call. Buffers the call made for its results are fresh on every replay, so results of
  earlier calls keep their values. Tensors the function leaves elsewhere (`.grad`, attributes)
  belong to the captured call.
- Random numbers (`rand`, `randn`, `randint`, `dropout`, ...) drawn inside the function are drawn
  again on every replay, from the generator's counter at that time (tensor/random.py): a replay draws
  the numbers an eager run of the same calls would, without a capture per call.
- What is replayed is what was realized: Python side effects, non-tensor return values and
  `await`s of other things run only while capturing. A function whose graph differs from call to
  call (Python numbers that change, say) cannot be replayed: the verifying call detects it and
  `JitError` says so.
- A replay is ordered like any realize: after work already issued, before work issued later. Lazy
  assigns still pending on the buffers a replay touches (a learning-rate schedule's new rate, say)
  are realized first, as a separate realize, so they take effect as they would without the jit.
"""
from __future__ import annotations

import collections
import functools
import inspect
import warnings
from typing import Any, Callable, Generator, Optional

from atensor.config import settings
from atensor.graph.node import BufferSpec, Node, toposort
from atensor.graph.symbolic import Variable
from atensor.graph.ops import Ops
from atensor.backend.c import registry
from atensor.hcq.device import Device
from atensor.engine.program import CapturedProgram
from atensor.jit.captured import CallProgram, program_of_call
from atensor.jit.direct import DirectReplay, LastCall, pending_for
from atensor.jit.callkey import (_graph_of, _input_key, _is_stored, _leaves, difference,
                                 only_plain_values_differ, program_key)
from atensor.hcq import loop
from atensor.engine.dispatch import Recording, dispatcher, recording
from atensor.engine.handle import RealizeHandle, planned_so_far
from atensor.engine.realize import in_flight
from atensor.profiler import collector
from atensor.ledger import versions
from atensor.graph.taskgraph import Kernel
from atensor.tensor.tensor import Tensor
from atensor.tensor.autograd import grad_disabled


# replays of at most this many tasks are planned on the calling (event loop) thread: ~15-20 us a task,
# so at most a few ms of loop time
INLINE_MAX_REPLAY_TASKS = 200


class JitError(RuntimeError):
    """A jitted function cannot be replayed (its graph changes between calls, or its results are
    not tensors); the message says which and what to do."""


class JitWarning(UserWarning):
    """A jitted function runs without replaying (said once per function, with the reason)."""


# ---- arguments and results as flat lists of tensors -------------------------------------------------
def _flatten(value: Any, tensors: list[Tensor], values: Optional[dict[Variable, int]] = None) -> Any:
    """A hashable description of `value` with each tensor replaced by its index in `tensors`; with
    `values`, each bound Variable is described unbound and its value goes to `values`."""
    if isinstance(value, Tensor):
        tensors.append(value)
        return ("T", len(tensors) - 1)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_flatten(v, tensors, values) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _flatten(v, tensors, values)) for k, v in value.items()))
    if values is not None and isinstance(value, Variable) and value.value is not None:
        var, values[var] = value.unbind()  # keyed by the variable, not its value
        return ("Var", var)
    try:
        hash(value)
    except TypeError:
        raise JitError(f"atensor.jit: an argument of type {type(value).__name__} is neither a Tensor nor "
                       f"hashable; pass data as Tensors (Tensor(array)), other values as numbers, strings or "
                       f"tuples") from None
    return ("V", value)


@functools.lru_cache(maxsize=64)
def _tensors_only(count: int) -> Any:
    """What `_flatten((args, {}), ...)` gives when `args` are `count` tensors."""
    return ("tuple", (("tuple", tuple(("T", i) for i in range(count))), ("dict", ())))


def _unflatten(shape: Any, tensors: list[Tensor]) -> Any:
    kind, body = shape
    if kind == "T":
        return tensors[body]
    if kind in ("V", "Var"):
        return body
    if kind == "dict":
        return {k: _unflatten(v, tensors) for k, v in body}
    items = [_unflatten(v, tensors) for v in body]
    return tuple(items) if kind == "tuple" else items


class _InThread:
    """A blocking call as a step the drivers wait on: awaited, it runs in a worker thread (the event
    loop stays free); waited on by the blocking driver, it runs on the caller's thread."""

    def __init__(self, fn: Callable[[], Any]):
        self.fn = fn

    def __await__(self) -> Generator[Any, None, Any]:
        return loop.run_sync(self.fn).__await__()

    def wait(self) -> Any:
        return self.fn()


def _native_candidates(records: list[CapturedProgram]) -> list[tuple[Node, str]]:
    """The CPU kernels of a captured program not compiled yet, when jit kernels are compiled."""
    if settings.native != "jit":
        return []
    found = []
    for record in records:
        for task in record.tasks:
            work = task.work
            if isinstance(work, Kernel) and registry.lookup(work.ast) is None \
                    and Device.get(work.device).kind == "CPU":
                found.append((work.ast, work.name))
    return found


def _flush_pending(accessed: Optional[frozenset[BufferSpec]] = None,
                   written: frozenset[BufferSpec] = frozenset()) -> Optional[RealizeHandle]:
    """Realizes the lazy assigns still pending (all of them, or those on a buffer in `accessed` or
    reading one in `written`); None when there are none."""
    heads = versions.pending_heads()
    if accessed is not None:
        heads = [h for h in heads
                 if versions.storage_of(h) in accessed or not written.isdisjoint(versions.specs_read(h))]
    if not heads:
        return None
    tensors = [Tensor(h) for h in heads]
    return tensors[0]._dispatch(tuple(tensors[1:]))


# ---- the decorator ----------------------------------------------------------------------------------------
_WAIT, _CALL, _DONE = "wait", "call", "done"  # what the steps of a call ask their driver (Jit._steps)


def _advance(steps: Generator[tuple[str, Any], Any, Any], value: Any,
             error: Optional[BaseException]) -> tuple[str, Any]:
    """The next request of `steps` after sending it `value` (or throwing `error` into it); (_DONE,
    result) once it has returned."""
    try:
        return steps.send(value) if error is None else steps.throw(error)
    except StopIteration as done:
        return _DONE, done.value


class Jit:
    """A jitted function; see the module docstring. For an `async def`, `await step(*args)` returns the
    function's result with every tensor realized; a plain `def` (as with tinygrad's TinyJit) is called
    as `step(*args)` outside an event loop and blocks until its results are realized."""

    def __init__(self, fn: Callable[..., Any], max_programs: int = 32, compile: str = "wait"):
        if compile not in ("wait", "background"):
            raise ValueError(f"atensor.jit: compile={compile!r}; use 'wait' (the third call compiles the "
                             f"captured kernels to C before it returns) or 'background' (replays run the "
                             f"numpy kernels until the C ones are ready)")
        self.fn = fn
        self.max_programs = max_programs
        self.compile = compile
        self.is_async = inspect.iscoroutinefunction(fn)
        self._programs: collections.OrderedDict[tuple, CallProgram] = collections.OrderedDict()
        self._calls: collections.OrderedDict[tuple, int] = collections.OrderedDict()  # per key, LRU
        self._capturing: set[tuple] = set()
        self.stats = {"calls": 0, "replays": 0, "captures": 0}
        self._warned_plain = False  # the "never replayed" JitWarning is said once
        self._last: Optional[LastCall] = None  # the last call, when its program replays directly (direct.py)
        self._name = getattr(fn, "__name__", "the function")
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:  # a jitted method binds like a function
        return self if obj is None else functools.partial(self.__call__, obj)

    def reset(self) -> None:
        """Forgets every captured program (the next calls capture again)."""
        self._programs.clear()
        self._calls.clear()
        self._last = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_async:
            return self._drive_async(args, kwargs)
        lib = loop.running_library()
        if lib is not None:
            raise RuntimeError(f"atensor.jit: {self._name} is a plain function, and calling it would block "
                               f"the running {lib} event loop until its results are realized; jit an "
                               f"`async def` instead and await it")
        return self._drive_sync(args, kwargs)

    async def call_async(self, *args: Any, **kwargs: Any) -> Any:
        """Awaits a call of a plain `def` on the running trio or asyncio loop: the function (which only
        builds graphs) is called on the loop's thread while capturing, and every realize, replay and
        compile is awaited, never blocked on. The calls share their captured programs with the blocking
        ones (`step(x)` in a script, `await step.call_async(x)` in a server: one capture)."""
        if self.is_async:
            return await self._drive_async(args, kwargs)
        return await self._drive_async(args, kwargs, plain=True)

    async def _drive_async(self, args: tuple, kwargs: dict, plain: bool = False) -> Any:
        if not kwargs and not collector._active:  # the common replay, without the steps' generator
            found = self._replay_now(args)
            if found is not None:
                if found[0] is None:  # replayed directly: done already, the await is a checkpoint
                    await loop.checkpoint()
                else:
                    await found[0]
                shape = found[1]
                return found[2][shape[1]] if shape[0] == "T" else _unflatten(shape, found[2])
        steps, value, error = self._steps(args, kwargs), None, None
        with collector.host_span(f"jit {self._name}", "call"):  # the call's host time, for the profiler
            while (step := _advance(steps, value, error))[0] is not _DONE:
                value, error = None, None
                try:
                    if step[0] is _WAIT:
                        value = await step[1]
                    else:
                        value = self._call_plain(args, kwargs) if plain else await self.fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the steps (their cleanup runs)
                    error = exc
        return step[1]

    def _drive_sync(self, args: tuple, kwargs: dict) -> Any:
        if not kwargs and not collector._active:  # the common replay (as `_drive_async`)
            found = self._replay_now(args)
            if found is not None:
                if found[0] is not None:  # else replayed directly: done already
                    found[0].wait()
                shape = found[1]
                return found[2][shape[1]] if shape[0] == "T" else _unflatten(shape, found[2])
        steps, value, error = self._steps(args, kwargs), None, None
        while (step := _advance(steps, value, error))[0] is not _DONE:
            value, error = None, None
            try:
                value = step[1].wait() if step[0] is _WAIT else self._call_plain(args, kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the steps (their cleanup runs)
                error = exc
        return step[1]

    def _call_plain(self, args: tuple, kwargs: dict) -> Any:
        value = self.fn(*args, **kwargs)
        if inspect.isawaitable(value) and not isinstance(value, Tensor):  # a Tensor is awaitable too
            if inspect.iscoroutine(value):
                value.close()  # never run: no "never awaited" warning
            raise JitError(f"atensor.jit: {self._name} returned an awaitable; declare it `async def` so that "
                           f"the jit awaits it")
        return value

    def _steps(self, args: tuple, kwargs: dict) -> Generator[tuple[str, Any], Any, Any]:
        """One call, as a generator that yields (_WAIT, realize handle) when it must wait and (_CALL,
        None) when the function must be called (it is sent the function's return value); its return
        value is the call's. The drivers above run it awaiting (async) or blocking (plain)."""
        self.stats["calls"] += 1
        values: dict[Variable, int] = {}
        if not kwargs and all(isinstance(a, Tensor) for a in args):  # the common call: step(x, y)
            tensors, shape = list(args), _tensors_only(len(args))
        else:
            tensors = []
            shape = _flatten((args, kwargs), tensors, values)
        nodes = [t.node for t in tensors]
        if any(in_flight(n) for n in nodes):  # `x.realize()` not yet planned: its buffer, once it is
            barrier = planned_so_far()
            if barrier is not None:
                yield _WAIT, barrier
            nodes = [t.node for t in tensors]
        graphs = [_graph_of(n) for n in nodes]
        key = (shape, tuple([_input_key(g) for g in graphs]), Tensor.training, grad_disabled())
        program = self._programs.get(key)
        if program is not None and program.verified:
            flush = _flush_pending(program.accessed, program.written)
            if flush is not None:  # lazy assigns issued before this call happen before it
                yield _WAIT, flush
                if any(t.node is not n for t, n in zip(tensors, nodes)):  # an input was one of them
                    self.stats["calls"] -= 1
                    return (yield from self._steps(args, kwargs))
            leaves = [leaf for g in graphs for leaf in g if leaf.op is Ops.BUFFER]
            versions.check_versions(leaves)
            if values:
                if program.last is not None and not program.last.done():
                    yield _WAIT, program.last  # its kernels read the values about to change
                program.bind(values)
            handle, results = self._submit_replay(key, program, leaves, values)
            yield _WAIT, handle
            return _unflatten(program.result_shape, results)
        calls = self._calls.pop(key, 0)
        if calls == 0 and self._calls:
            self._warn_if_never_replayed(key, next(reversed(self._calls)))
        self._calls[key] = calls + 1
        while len(self._calls) > 4 * self.max_programs:  # keys seen once or twice are not kept forever
            self._calls.popitem(last=False)
        if calls == 0 or key in self._capturing:
            result, _, _ = yield from self._run(tensors, None)
            return result
        # the recorded graphs must hold only this call's work: lazy assigns issued before it (other
        # than the inputs' own) are realized first, each on its own: one that cannot be realized (it
        # reads an overwritten version, or its kernel fails) is left to raise where its code realizes it
        keep = {n for node in nodes for n in toposort([node]) if n.op is Ops.ASSIGN}
        for head in versions.pending_heads():
            if head not in keep:
                try:
                    yield _WAIT, Tensor(head)._dispatch()
                except Exception:  # noqa: BLE001 - not this call's error; see above
                    pass
        records = Recording(BufferSpec.last_uid() + 1)  # realized values of earlier calls are not read
        inputs = [leaf.arg[0] for n in nodes for leaf in _leaves(n)]
        if program is None:
            self._capturing.add(key)
            try:
                result, outs, result_shape = yield from self._run(tensors, records)
            finally:
                self._capturing.discard(key)
            self._programs[key] = program_of_call(records, inputs, [t.node for t in outs], result_shape)
            self.stats["captures"] += 1
            while len(self._programs) > self.max_programs:
                self._programs.popitem(last=False)
            return result
        result, _, _ = yield from self._run(tensors, records)
        found = program_key(records, inputs)
        if found != program.keys:
            del self._programs[key]
            raise JitError(
                f"atensor.jit: {self._name} ran different programs on two calls with the same arguments, so "
                f"it cannot be replayed: {difference(program.keys, found)}. A value that changes between "
                f"calls (a Python number baked into the graph, a branch, another tensor read from Python "
                f"state) does this: pass such values in as tensors (or bound Variables), or do not jit "
                f"the function")
        program.verified = True
        kernels = _native_candidates(program.records)
        if kernels and self.compile == "background":
            registry.prepare_in_background(kernels)
        elif kernels:  # replays run these compiled (backend/c/registry.py); the compiler runs off the loop
            yield _WAIT, _InThread(functools.partial(registry.prepare, kernels))
        return result

    def _replay_now(self, args: tuple) -> Optional[tuple[Optional[RealizeHandle], Any, list[Tensor]]]:
        """A replay of a call of tensors only, submitted at once: (the handle to await, or None when it
        ran to completion here, the result shape, the result tensors); None when the call needs
        `_steps` (not a verified program's key, an input still in flight, lazy assigns to realize
        first). What `_steps` does for such a call, without its generator and driver. A call shaped like
        the previous one whose program replays directly (jit/direct.py) is checked against it and run
        on this thread, without a key, a job or a handle."""
        last = self._last
        if last is not None:
            inputs = last.inputs_of(args, Tensor.training)  # (None too when the plan changed)
            if inputs is not None:
                found = last.direct.run(inputs)
                if found is not None:
                    stats = self.stats
                    stats["calls"] += 1
                    stats["replays"] += 1
                    return found[1], last.program.result_shape, found[0]
        for a in args:
            if type(a) is not Tensor:
                return None
        nodes = [t.node for t in args]
        graphs = []
        for n in nodes:
            if in_flight(n):
                return None
            graphs.append(_graph_of(n))
        key = (_tensors_only(len(args)), tuple([_input_key(g) for g in graphs]), Tensor.training,
               grad_disabled())
        program = self._programs.get(key)
        if program is None or not program.verified or pending_for(program.accessed, program.written):
            return None  # (`_steps` realizes those assigns first)
        self.stats["calls"] += 1
        leaves = [leaf for g in graphs for leaf in g if leaf.op is Ops.BUFFER]
        versions.check_versions(leaves)
        handle, results = self._submit_replay(key, program, leaves, {})
        self._last = self._last_call(key, program, nodes)
        return handle, program.result_shape, results

    @staticmethod
    def _last_call(key: tuple, program: CallProgram, nodes: list[Node]) -> Optional[LastCall]:
        """The `LastCall` of a call of `nodes` that replayed `program` by the general path, when the
        program replays directly (made once its plan has its record; kept with the program)."""
        direct = program.direct
        if direct is False:
            return None
        if type(direct) is tuple:  # declined for the plan of that `_current`: until it is re-lowered
            if direct is program.records[0]._current:
                return None
            direct = None
        if direct is None or not direct.valid():
            if not DirectReplay.possible(program.records, program.inputs, bool(program.draws),
                                         bool(program.var_vals)):
                program.direct = False
                return None
            owner = program.records[0]
            direct = program.direct = DirectReplay.of(program.records, program.inputs, program.fresh,
                                                      program.results, INLINE_MAX_REPLAY_TASKS)
            if direct is None:
                if owner.lowered() and owner.plan().record is False:  # and too big: never for this plan
                    program.direct = owner._current
                return None
        return LastCall.of(key, program, direct, nodes, Tensor.training)

    def _submit_replay(self, key: tuple, program: CallProgram, leaves: list[Node], values: dict[Variable, int]
                       ) -> tuple[RealizeHandle, list[Tensor]]:
        """Submits a replay of `program` on the buffers of `leaves` (its variables bound already):
        the handle to await and the result tensors."""
        self._programs.move_to_end(key)
        self.stats["replays"] += 1
        job, results, mapping = program.replay([leaf.arg[0] for leaf in leaves], values)
        # a small replay is submitted from this thread (it costs less than the hand-off to the
        # dispatcher and back); a big one would stall the event loop, and so would lowering a plan
        # (the first replay, or the first after kernels were compiled): those go to the dispatcher
        if program.tasks > INLINE_MAX_REPLAY_TASKS or not all(r.lowered() for r in program.records) \
                or not dispatcher.run_inline(job):
            # queued behind other work: its buffers count as in flight until it is planned, so a
            # sync accessor does not read them meanwhile
            job.in_flight.hold_all(program.written_buffers(mapping))
            dispatcher.submit(job)
        handle = RealizeHandle(job, None)
        if values:
            program.last = handle
        return handle, results

    def _warn_if_never_replayed(self, key: tuple, previous: tuple) -> None:
        """Says once why a function whose non-tensor arguments change on every call is never replayed:
        each new value is a new key, run normally (it would be captured on its second call)."""
        differ = only_plain_values_differ(previous, key)
        if differ is None or self._warned_plain:
            return
        self._warned_plain = True
        warnings.warn(JitWarning(
            f"atensor.jit: {self._name} was called with non-tensor arguments {differ[1]!r} after "
            f"{differ[0]!r}; each new value is a new key, which runs normally (captured only when the "
            f"same value comes again), so these calls are not replayed. Pass a value that changes per "
            f"call as a Tensor, or bind it to a Variable"), stacklevel=4)

    def _run(self, tensors: list[Tensor],
             records: Optional[Recording]) -> Generator[tuple[str, Any], Any, tuple]:
        """Steps that call the function and realize its tensor results: (result, result tensors,
        result shape). With `records` (capturing), the schedules of every realize are appended to it,
        and lazy inputs are realized first, so that a replay computes them too."""
        token = recording.set(records) if records is not None else None
        try:
            if records is not None:
                lazy = [t for t in tensors if not _is_stored(t.node)]
                if lazy:
                    yield _WAIT, lazy[0]._dispatch(tuple(lazy[1:]))
            before = set(versions.pending_heads())
            result = yield _CALL, None
            outs: list[Tensor] = []
            result_shape = _flatten(result, outs)
            # the assigns the call issued are realized with its results, so that they are recorded and
            # every replay performs them: a KV-cache write that no result reads is still a write. Which
            # ones are left must not depend on timing: once every realize the call issued is planned,
            # the pending heads are exactly those none of them took along, in the order they were set
            barrier = planned_so_far()
            if barrier is not None:
                yield _WAIT, barrier
            issued = [Tensor(head) for head in versions.pending_heads() if head not in before]
            if outs or issued:
                work = outs + issued
                yield _WAIT, work[0]._dispatch(tuple(work[1:]))
        finally:
            if token is not None:
                recording.reset(token)
        return result, outs, result_shape


def jit(fn: Optional[Callable[..., Any]] = None, *, max_programs: int = 32, compile: str = "wait") -> Any:
    """Decorates a function of tensors so that, after two normal calls, its realizes are replayed
    instead of rebuilt: `@atensor.jit async def step(x, y): ...; return loss` (or a plain `def`, called
    outside an event loop). The captured kernels are compiled to C (ATENSOR_NATIVE): `compile="wait"`
    compiles them during the third call, so every replay runs the same kernels; `"background"` lets
    the third call return at once and replays switch to C when the compiler is done (a server that
    must start fast)."""
    if fn is None:
        return lambda f: Jit(f, max_programs, compile)
    return Jit(fn, max_programs, compile)


TinyJit = Jit  # tinygrad's name, for ported code

__all__ = ["Jit", "JitError", "JitWarning", "TinyJit", "jit"]
