"""The native tier's kernel registry: kernels compiled to machine code with the system C compiler,
registered under their ASTs.

`prepare(asts)` renders each kernel with backend/c/render.py, compiles all of them with one `cc` call into
a shared library (cached on disk by backend/c/library.py, so a second run loads it at once), and registers
each loaded function under its AST. A kernel is compiled once per code (docs/design.md: kernels compile
once per C source): another AST with the same C source (another device's copy of it) is bound to the
loaded function; the few very long kernels get their own compiler call at -O2, beside the others'
(LARGE_SOURCE says why). `lookup(ast)` then gives the `NativeKernel` that engine/lower.py runs instead
of the numpy function: one ctypes call, which releases the GIL for the whole kernel, so kernels of
different CPU devices run at the same time. How they are run many at once is backend/c/programs.py's.

When it is used (`settings.native`, ATENSOR_NATIVE):
- "jit" (default): the kernels of `atensor.jit` replays (compiled when the function is captured) and of
  hot eager graphs (engine/program.py); the rest stays on numpy (a one-off kernel would wait longer);
- "all": every kernel, compiled on first use (the test suite runs this way in one job, to hold the
  C kernels to the numpy ones);
- "0": never.
A kernel the renderer does not lower, a machine without a compiler or a compile error leaves the
kernels on numpy; `status()` says which and why (`FAILURES`).
"""
from __future__ import annotations

import ctypes
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from atensor.backend.c import compiler, library
from atensor.backend.c import flags as c_flags
from atensor.backend.c.prelude import PRELUDE
from atensor.backend.c.programs import RUNTIME
from atensor.backend.c.render import Unsupported, render_c, variable_slots
from atensor.backend.gemm import openblas
from atensor.backend.quant import kernels as quant_kernels
from atensor.backend.quant import tuning as quant_tuning
from atensor.backend.quant.source import PACKED_CALL
from atensor.graph.node import Node
from atensor.graph.symbolic import Variable
from atensor.profiler import collector
from atensor.profiler.events import HostSpan

_WORD = (1 << 64) - 1


class NativeKernel:
    """A compiled kernel: `fn(block)` takes a ctypes array of the buffers' addresses, followed by the
    values of its `variables` from slot `var_base` on (render.variable_slots)."""
    __slots__ = ("name", "fn", "source", "address", "var_base", "variables")

    def __init__(self, name: str, fn: ctypes._CFuncPtr, source: str, var_base: int = 0,
                 variables: tuple[Variable, ...] = ()):
        self.name, self.fn, self.source = name, fn, source
        self.address: int = ctypes.cast(fn, ctypes.c_void_p).value  # what a batch calls
        self.var_base, self.variables = var_base, variables

    def pointers(self, addresses: list[int], var_vals: Optional[Mapping[Variable, int]] = None) -> ctypes.Array:
        """The argument block for buffers at these addresses and the variables' values in `var_vals`
        (built once per runner; `bind_values` rewrites the values)."""
        size = max(len(addresses), self.var_base + len(self.variables), 1)
        block = (ctypes.c_void_p * size)(*addresses)
        if self.variables:
            self.bind_values(block, var_vals or {})
        return block

    def bind_values(self, block: ctypes.Array, var_vals: Mapping[Variable, int]) -> None:
        """Writes the variables' current values (keyed by the unbound variable) into `block`; only
        while no command running `block` is in flight."""
        base = self.var_base
        for j, var in enumerate(self.variables):
            value = var_vals.get(var)
            if value is None:
                raise ValueError(f"kernel {self.name} needs a value for variable {var.name!r}; bind it "
                                 f"with {var.name}.bind(value)")
            block[base + j] = value & _WORD  # read back as int64_t: a negative value survives


@dataclass
class Registry:
    """The compiled kernels by AST, and by code: a kernel of another AST with the same code (each
    device's copy of a data-parallel step's kernels differs only in its constants' device) is not
    compiled again but bound to the loaded function. Measured on the CNN flagship over 2 devices: one
    compiler call of 33 kernels took 14.9 s, 113 KB of its 158 KB the same fused backward twice.

    `epoch` counts the library loads (and bindings) that added kernels: a replay plan lowered before
    the newest one is lowered again (engine/layout.py, engine/program.py, jit/direct.py read it).
    `compiled` counts the kernels compiled.

    Lock: `lock`, held to write any field (compiles run on the background thread and on callers'
    threads); reads take none (one dict lookup under the GIL). Lifetime: the process; a kernel once
    registered stays (its library is never unloaded)."""
    kernels: dict[Node, NativeKernel] = field(default_factory=dict)
    by_code: dict[str, NativeKernel] = field(default_factory=dict)
    epoch: int = 0
    compiled: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Failures:
    """Why kernels stay on numpy: the refused ASTs with the reason (the renderer does not lower them,
    or their compile failed), and the last compile or load error.

    Lock: the registry's (written in `_prepare` beside it); `last_error` is one assignment. Lifetime:
    the process; a refused kernel is not tried again."""
    refused: dict[Node, str] = field(default_factory=dict)
    last_error: str = ""


@dataclass
class Background:
    """The background compiles: kernel lists handed to `prepare_in_background`, compiled in order on one
    daemon thread, started on first use.

    Lock: the registry's, held to start the thread. Lifetime: the thread lives as long as the process."""
    todo: "queue.Queue[list[tuple[Node, str]]]" = field(default_factory=queue.Queue)
    thread: Optional[threading.Thread] = None
    last_turn_ns: int = 0  # when `give_turn` last gave the thread a turn (one assignment, no lock)


REGISTRY = Registry()
FAILURES = Failures()
BACKGROUND = Background()


def lookup(ast: Node) -> Optional[NativeKernel]:
    """The compiled kernel of `ast`, if one is registered."""
    return REGISTRY.kernels.get(ast)


def prepare(kernels: Iterable[tuple[Node, str]]) -> int:
    """Compiles the (ast, name) kernels not compiled yet, in one compiler call (two at once when some
    are longer than LARGE_SOURCE); returns how many were added (compiled, or bound to a loaded kernel
    of the same code). Blocking (seconds at worst, the GIL released while the compiler runs): call it from a
    worker thread, not the event loop. While profiling, the time is a "compile" host span naming them."""
    kernels = list(kernels)
    quant_tuning.prepare_kernels([ast for ast, _ in kernels])  # the packed kernels' variants, chosen first
    if not collector.is_active():
        return _prepare(kernels)
    known, refused = REGISTRY.kernels, FAILURES.refused
    todo = [(ast, name) for ast, name in kernels if ast not in known and ast not in refused]
    start = time.perf_counter_ns()
    added = _prepare(todo)
    counts: dict[str, int] = {}
    for ast, name in dict(todo).items():
        if ast in known:
            counts[name] = counts.get(name, 0) + 1
    names = [name if n == 1 else f"{name} (x{n})" for name, n in sorted(counts.items())]
    failed = len({ast for ast, _ in todo if ast in refused})
    if added or failed:
        background = threading.current_thread() is BACKGROUND.thread
        collector.record_host(HostSpan(
            f"compile {added} kernels" + (f" ({failed} left on numpy)" if failed else ""), "compile", start,
            time.perf_counter_ns(), "compile (background)" if background else "host", ", ".join(names)))
    return added


def _code(source: str, symbol: str) -> str:
    """A kernel's source without its name: equal for two kernels that compute the same thing on their
    buffers (render_c writes the name in the header line only)."""
    return source.replace(f"void {symbol}(", "void (", 1)


def _prepare(kernels: Iterable[tuple[Node, str]]) -> int:
    reg, failures = REGISTRY, FAILURES
    cc = compiler.path()
    if cc is None:
        failures.last_error = "no C compiler (cc, gcc or clang) on PATH"
        return 0
    blas = openblas.functions()
    todo: dict[Node, tuple[str, str]] = {}
    same: dict[Node, str] = {}  # an AST whose code is loaded already or compiled in this call: its code
    codes: set[str] = set()
    with reg.lock:
        for ast, name in kernels:
            if ast in reg.kernels or ast in failures.refused or ast in todo or ast in same:
                continue
            symbol = f"k{len(todo)}_{''.join(c if c.isalnum() else '_' for c in name)}"[:120]
            try:
                source = render_c(ast, symbol, blas=blas is not None)
                if PACKED_CALL in source and quant_kernels.library() is None:
                    raise Unsupported(f"the packed-weight kernels did not compile: {quant_kernels.failure()}")
            except Unsupported as why:
                failures.refused[ast] = str(why)
                continue
            code = _code(source, symbol)
            if code in reg.by_code or code in codes:
                same[ast] = code
            else:
                codes.add(code)
                todo[ast] = (symbol, source)
        bound = 0
        for ast, code in list(same.items()):
            if code in reg.by_code:  # loaded earlier: bound now, nothing to compile for it
                reg.kernels[ast] = _bound(reg.by_code[code], ast)
                del same[ast]
                bound += 1
        if bound:
            reg.epoch += 1  # new kernels, as a loaded library's
    if not todo:
        return bound
    defines = (("-DATENSOR_ILP64",) if blas is not None and blas.ilp64 else ()) + library.kernel_defines(cc)
    large = c_flags.LARGE_SOURCE
    groups = [(c_flags.FLAGS, {a: v for a, v in todo.items() if len(v[1]) <= large}),
              (c_flags.LARGE_FLAGS, {a: v for a, v in todo.items() if len(v[1]) > large})]
    groups = [(flags, group) for flags, group in groups if group]
    try:
        libraries = library.build(cc, [(flags, PRELUDE + "\n".join(src for _, src in group.values()))
                                       for flags, group in groups], defines)
    except (OSError, subprocess.SubprocessError) as exc:
        error = (f"loading a compiled library failed: {exc}" if isinstance(exc, OSError)
                 else f"compile failed: {exc}")
        failures.last_error = error
        with reg.lock:
            for ast in (*todo, *same):
                failures.refused[ast] = error
        return 0
    with reg.lock:
        RUNTIME.bind(libraries[0])
    if any(PACKED_CALL in src for _, src in todo.values()):
        quant_kernels.point(libraries)
    if blas is not None:
        for lib in libraries:
            lib.atensor_set_blas(*(ctypes.c_void_p(a) for a in (blas.sgemm, blas.dgemm, blas.sgemv, blas.dgemv,
                                                                  blas.set_threads)))
    library.LOADED.keep(libraries)
    with reg.lock:
        for lib, (_, group) in zip(libraries, groups):
            for ast, (symbol, src) in group.items():
                fn = getattr(lib, symbol)
                fn.argtypes, fn.restype = [ctypes.c_void_p], None
                kernel = reg.kernels[ast] = NativeKernel(symbol, fn, src, *variable_slots(ast))
                reg.by_code.setdefault(_code(src, symbol), kernel)
        for ast, code in same.items():
            reg.kernels[ast] = _bound(reg.by_code[code], ast)
        reg.compiled += len(todo)
        reg.epoch += 1
    return len(todo) + len(same) + bound


def _bound(kernel: NativeKernel, ast: Node) -> NativeKernel:
    """`kernel`'s function for another AST of the same code (its own variables' slots)."""
    return NativeKernel(kernel.name, kernel.fn, kernel.source, *variable_slots(ast))


def prepare_in_background(kernels: list[tuple[Node, str]]) -> None:
    """`prepare(kernels)` on a background thread (one, in order): the caller goes on at once."""
    with REGISTRY.lock:
        if BACKGROUND.thread is None:
            BACKGROUND.thread = threading.Thread(target=_compile_forever, name="atensor-native-compile",
                                                 daemon=True)
            BACKGROUND.thread.start()
    BACKGROUND.todo.put(kernels)


def _compile_forever() -> None:
    todo = BACKGROUND.todo
    while True:
        kernels = todo.get()
        try:
            prepare(kernels)
        except Exception as exc:  # noqa: BLE001 - a renderer bug must not kill the thread: numpy stays
            FAILURES.last_error = f"background compile failed: {type(exc).__name__}: {exc}"
        finally:
            todo.task_done()


# A turn `give_turn` gives the compile thread: how long the caller sleeps (the GIL free), and how often.
# The waiter is the event loop's thread, so a turn is at most gilshare.py's 0.5 ms (the longest the
# loop is meant to wait for the GIL); every 2 ms leaves the compile thread a quarter of the time.
TURN_NS = 500_000
TURN_EVERY_NS = 2_000_000


def give_turn() -> None:
    """Lets the background compile thread run for a turn, when it has work and its last turn was
    TURN_EVERY_NS ago: the caller sleeps TURN_NS with the GIL free. For a thread that waits for
    background kernels while it holds the GIL in a loop (engine/program.py: a hot template's hits
    while its twin's kernels compile).

    Why: CPython hands the GIL to a waiting thread by force only when the holder has not let go of it
    for a whole switch interval; a loop that lets go for an instant now and then (an epoll of the event
    loop, a contended lock) wakes the waiter each time, takes the GIL back before the waiter runs, and
    so restarts the waiter's interval. A tight loop of awaited eager round trips kept the compile
    thread waiting for the GIL (in the library cache's file calls, threadpoolctl's /proc/self/maps
    read) until the loop ended: in fresh processes on 2 cores (AMD EPYC Zen 5), 11 of 22 loops of
    3000 round trips never saw the hot template's twin (load 1.6-2); with the turns, every loop had it
    after 9-68 (52 loops, load 2-6; tests/engine/test_compile_turn.py). A sleep lets the waiter take the
    GIL and run as long as the caller sleeps; the caller takes it back at the compile thread's next
    release or switch interval. Rejected: a shorter switch interval (each release restarts the waiter's
    wait, however short the interval); a sleep much shorter than the waiter's wake-up on a loaded
    machine (tens of microseconds) gives it nothing."""
    if not BACKGROUND.todo.unfinished_tasks:
        return
    now = time.perf_counter_ns()
    if now - BACKGROUND.last_turn_ns < TURN_EVERY_NS:
        return
    BACKGROUND.last_turn_ns = now
    time.sleep(TURN_NS * 1e-9)


def wait_background() -> None:
    """Blocks until every kernel handed to `prepare_in_background` so far is compiled (or refused)."""
    BACKGROUND.todo.join()


def status() -> dict[str, object]:
    """How many kernels are native, how many were refused and the reasons, the last error."""
    reasons: dict[str, int] = {}
    for why in FAILURES.refused.values():
        reasons[why] = reasons.get(why, 0) + 1
    return {"compiler": compiler.path(), "native": len(REGISTRY.kernels), "refused": reasons,
            "last_error": FAILURES.last_error}
