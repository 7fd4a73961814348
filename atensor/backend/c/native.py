"""The native tier of the CPU backend: kernels compiled to machine code with the system C compiler.

`prepare(asts)` renders each kernel with backend/c/render.py, compiles all of them with one `cc` call into a
shared library (kept in a cache directory, keyed by the source, the compiler and the flags, so a
second run loads it at once), and registers each loaded function under its AST. A kernel is compiled
once per code (docs/design.md: kernels compile once per C source): another AST with the same C source (another
device's copy of it) is bound to the loaded function; the few very long kernels get their own
compiler call at -O2, beside the others' (LARGE_SOURCE says why). `lookup(ast)` then
gives the `NativeKernel` that engine/lower.py runs instead of the numpy function: one ctypes call, which
releases the GIL for the whole kernel, so kernels of different CPU devices run at the same time.

When it is used (`settings.native`, ATENSOR_NATIVE):
- "jit" (default): the kernels of `atensor.jit` replays (compiled when the function is captured) and of
  hot eager graphs (engine/program.py); the rest stays on numpy (a one-off kernel would wait longer);
- "all": every kernel, compiled on first use (the test suite runs this way in one job, to hold the
  C kernels to the numpy ones);
- "0": never.
A kernel the renderer does not lower, a machine without a compiler or a compile error leaves the
kernels on numpy; `status()` says which and why.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable, Mapping, Optional

from atensor.graph.node import Node
from atensor.graph.symbolic import Variable
from atensor.backend.gemm import blas
from atensor.backend.c import flags as c_flags
from atensor.backend.c.flags import FLAGS, LARGE_FLAGS, LARGE_SOURCE
from atensor.backend.c.prelude import PRELUDE
from atensor.backend.c.render import Unsupported, render_c, variable_slots
from atensor.backend.quant.source import PACKED_CALL, SOURCE as QUANT_SOURCE
from atensor.profiler import collector
from atensor.profiler.events import HostSpan
from atensor.backend.runner import Runner

_lock = threading.Lock()
_kernels: dict[Node, "NativeKernel"] = {}
_refused: dict[Node, str] = {}
# a loaded kernel by its code (its source without its name): a kernel of another AST with the same code
# (each device's copy of a data-parallel step's kernels differs only in its constants' device) is not
# compiled again but bound to the loaded function. Measured on the CNN flagship over 2 devices: one
# compiler call of 33 kernels took 14.9 s, 113 KB of its 158 KB the same fused backward twice.
_by_code: dict[str, "NativeKernel"] = {}
_libraries: list[ctypes.CDLL] = []  # loaded libraries stay loaded (their functions are registered)
_blas: Optional[tuple[int, int, bool, int, int, int]] = None
_blas_get_threads = 0  # openblas_get_num_threads of that BLAS, or 0
_blas_bound = False
_compiler: Optional[str] = None
_compiler_checked = False
last_error = ""
compiled = 0
epoch = 0  # counts the libraries loaded: a replay plan lowered before the newest one is lowered again
_background: "queue.Queue[list[tuple[Node, str]]]" = queue.Queue()
_background_thread: Optional[threading.Thread] = None


_program_runner: Optional[ctypes._CFuncPtr] = None
_copy_fn: Optional[ctypes._CFuncPtr] = None
TIMELINE_SLOTS = 4096
# the C side of the queues' timelines, for waits between native programs (16 bytes per queue: value,
# futex word, sleepers); a queue gets a slot the first time a program of it waits or publishes
_timelines = (ctypes.c_uint64 * (2 * TIMELINE_SLOTS))()
_slots: dict[object, int] = {}

RUN, WAIT, PUBLISH = 0, 1, 2


def timeline_slot(owner: object) -> Optional[int]:
    """The C timeline slot of `owner` (a queue), None when all are taken (no more programs with waits)."""
    slot = _slots.get(owner)
    if slot is None:
        with _lock:
            slot = _slots.get(owner)
            if slot is None:
                if len(_slots) >= TIMELINE_SLOTS:
                    return None
                slot = _slots[owner] = len(_slots)
    return slot


def program_threads() -> bool:
    """Whether a native program can run a kernel on more BLAS threads (the BLAS's thread setter was
    found): else a program holds one-thread kernels only."""
    return _blas is not None and bool(_blas[5])


def programs_available() -> bool:
    """Whether a library with the program runner is loaded (a native runner implies one is)."""
    return _program_runner is not None


class Program:
    """A queue's run of native work as one foreign call: a list of ops, each running a native runner
    (a `Runner` with a `native` of (function address, argument block)), waiting until a C
    timeline reaches a value, or publishing one. The values are `bases[queue] + offset`, with the bases
    given per submission (`bind`), so one Program serves every replay of a plan. Queues hand work to
    each other through the C timelines without the GIL or a Python wake-up, as GPU queues do through
    semaphores in memory; a CUDA graph's launch of many kernels at once is the same idea."""

    def __init__(self, ops: list[tuple[int, int, int, int]], runs: list):
        """`ops`: (kind, timeline slot, queue, offset) each; `runs[i]` is the runner of a RUN op. A RUN
        op's second field is the BLAS threads of its kernel (`Runner.threads`, or its measured choice:
        `retune`), which the C runner sets for that run only; a measured run's third field is 1, and
        the C runner writes the run's nanoseconds into its fourth."""
        count = len(ops)
        self.count = count
        self.ops = (ctypes.c_int64 * (4 * count))(*[x for op in ops for x in op])
        # (op index, blas.MeasuredThreads) of the runs whose thread count is chosen by their timings
        self.measured = [(i, r.choice) for i, r in enumerate(runs)
                         if r is not None and ops[i][0] == RUN and r.choice is not None]
        for i, r in enumerate(runs):
            if r is not None and ops[i][0] == RUN and r.threads != 1:
                self.ops[4 * i + 1] = r.threads
        for i, _ in self.measured:
            self.ops[4 * i + 2] = 1  # the C runner times it
        self.retune()
        self.fns = (ctypes.c_void_p * count)(*[r.native[0] if r is not None else None for r in runs])
        self.blocks = (ctypes.c_void_p * count)(*[ctypes.addressof(r.native[1]) if r is not None else None
                                                  for r in runs])
        self.runs = [r for r in runs if r is not None]  # their blocks and buffers stay alive with this

    def retune(self) -> None:
        """Before a submission: each measured run's last time (written by the C runner) goes to its
        choice, and the choice's next count into the op. A submission racing a run of the same program
        only blurs a timing or changes a later op's count between 1 and `many` (as MeasuredThreads
        allows)."""
        ops = self.ops
        blas.forget()  # the program sets the count in C (one, or a run op's own)
        for i, choice in self.measured:
            ns = ops[4 * i + 3]
            if ns:
                choice.record(ops[4 * i + 1], ns)
                ops[4 * i + 3] = 0
            ops[4 * i + 1] = choice.pick()

    def bind(self, bases: Optional[ctypes.Array] = None) -> Runner:
        """What a queue runs: the program with this submission's `bases` (c_uint64 per queue)."""
        call, count, ops, fns, blocks = _program_runner, self.count, self.ops, self.fns, self.blocks
        if call is None:  # no library loaded yet: only a program of RUN ops can run, one runner at a time
            fns_each = [run.fn for run in self.runs]

            def run_each() -> None:
                for fn in fns_each:
                    fn()
            return Runner(run_each, keep_alive=self)
        timelines = _timelines
        one_thread = blas.use

        def run_program() -> None:
            one_thread(1)  # its kernels do not set the count; the C runner sets a run op's own (above)
            call(count, ops, fns, blocks, bases, timelines)
        # one foreign call: the queue need not yield the GIL after it; a doorbell posts `ring_args`
        return Runner(run_program, keep_alive=(self, bases), gil_free=True,
                      ring_args=(count, ops, fns, blocks, bases, timelines))


# the doorbell functions of the loaded library (doorbell.py), Linux only: (size, post, next, done)
doorbell_functions: Optional[tuple[int, ctypes._CFuncPtr, ctypes._CFuncPtr, ctypes._CFuncPtr]] = None


def _bind_doorbell(lib: ctypes.CDLL) -> None:
    global doorbell_functions
    if not sys.platform.startswith("linux"):  # elsewhere an idle worker would spin in sched_yield
        return
    size = lib.atensor_ring_size
    size.argtypes, size.restype = [], ctypes.c_longlong
    # `post` is called keeping the GIL (a PYFUNCTYPE, as a PyDLL function is): it never blocks (a
    # store, a counter and at most one futex wake), so releasing the GIL buys nothing and lets the
    # worker it wakes take the GIL first when its program is shorter than the wake syscall. Measured
    # with bench/jit_replay.py on a loaded machine: no difference in alternating rounds beyond the
    # noise (the post's time under load is the futex wake itself, with either binding)
    post_type = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, *[ctypes.c_void_p] * 5)
    post = post_type(ctypes.cast(lib.atensor_ring_post, ctypes.c_void_p).value)
    take = lib.atensor_ring_next
    take.argtypes, take.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    # an atomic load: called keeping the GIL too
    done_type = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_ulonglong)
    done = done_type(ctypes.cast(lib.atensor_ring_done, ctypes.c_void_p).value)
    doorbell_functions = (size(), post, take, done)


def batch(runs: list[Runner]) -> Runner:
    """One callable that runs the native runners `runs` in order, in one foreign call: the queue's
    Python overhead and GIL hand-off once for all of them."""
    return Program([(RUN, 0, 0, 0)] * len(runs), runs).bind()


def native_copy(dst: int, src: int, nbytes: int) -> Optional[Runner]:
    """A runner that copies `nbytes` from address `src` to `dst` in C (so a program can hold it), or
    None before any library is loaded. Its block holds (dst, src, nbytes): slots 0 and 1 are addresses."""
    fn = _copy_fn
    if fn is None:
        return None
    block = (ctypes.c_void_p * 3)(dst, src, nbytes)

    def run_copy() -> None:
        fn(block)
    return Runner(run_copy, native=(ctypes.cast(fn, ctypes.c_void_p).value, block))


_WORD = (1 << 64) - 1


class NativeKernel:
    """A compiled kernel: `fn(block)` takes a ctypes array of the buffers' addresses, followed by the
    values of its `variables` from slot `var_base` on (c_render.variable_slots)."""
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


def compiler() -> Optional[str]:
    """The C compiler's path, or None: $ATENSOR_CC when set ("none" hides every compiler, as on a
    machine without one: kernels stay on numpy, replays keep their Python path; the test suite runs
    part of itself so, tests/engine/test_no_compiler.py), else $CC, cc, gcc or clang."""
    global _compiler, _compiler_checked
    if not _compiler_checked:
        _compiler_checked = True
        chosen = os.environ.get("ATENSOR_CC")
        if chosen is not None:
            _compiler = None if chosen.strip().lower() in ("", "none") else shutil.which(chosen)
            return _compiler
        for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
            if name and shutil.which(name):
                _compiler = shutil.which(name)
                break
    return _compiler


def _bind_blas() -> Optional[tuple[int, int, bool, int, int, int]]:
    """Addresses of the gemm functions of the BLAS numpy uses (found through threadpoolctl), whether
    it takes 64-bit integers, and its gemv functions; None when there is no such BLAS."""
    global _blas, _blas_bound, _blas_get_threads
    if _blas_bound:
        return _blas
    _blas_bound = True
    try:
        from threadpoolctl import ThreadpoolController
        controllers = ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:  # noqa: BLE001 - no threadpoolctl or no BLAS it knows: kernels without gemm
        return None
    for lib in sorted(controllers, key=_numpy_first):
        getter = getattr(lib, "_get_symbol", None)
        if getter is None or getattr(lib, "internal_api", "") != "openblas":
            continue
        found = [getter(name) for name in ("cblas_sgemm", "cblas_dgemm", "cblas_sgemv", "cblas_dgemv")]
        if None not in found:
            s, d, sv, dv = (ctypes.cast(f, ctypes.c_void_p).value for f in found)
            ilp64 = "64_" in os.path.basename(str(getattr(lib, "filepath", "")))
            setter = getter("openblas_set_num_threads")  # for a program's kernels of more threads
            _blas = (s, d, ilp64, sv, dv, ctypes.cast(setter, ctypes.c_void_p).value if setter else 0)
            found_get = getter("openblas_get_num_threads")  # packed kernels' threads (backend/quant/pool_c.py)
            _blas_get_threads = ctypes.cast(found_get, ctypes.c_void_p).value if found_get else 0
            return _blas
    return None


def _numpy_first(lib: object) -> tuple[int, str]:
    """Orders threadpoolctl's BLAS libraries numpy's first, then by path. A process can hold two
    OpenBLAS builds (numpy's ILP64 one and scipy's, once scikit-learn is imported), which threadpoolctl
    lists in no fixed order: taking the first bound the kernels to one or the other from run to run,
    and the library's key (ATENSOR_ILP64 or not) with it, so a warm start of examples/train.py
    compiled its kernels again in about half the runs (measured: 0.6-0.8 s of compiler)."""
    path = str(getattr(lib, "filepath", ""))
    home = os.path.basename(os.path.dirname(path))
    return (0 if home.startswith("numpy") else 1, path)


def cache_dir() -> Path:
    """Where compiled libraries are kept ($ATENSOR_CACHE, else $XDG_CACHE_HOME/atensor, else ~/.cache;
    a temporary directory when that cannot be written)."""
    root = os.environ.get("ATENSOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "atensor")
    path = Path(root) / "native"
    try:
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"atensor-native-{os.getuid() if hasattr(os, 'getuid') else 0}"


def lookup(ast: Node) -> Optional[NativeKernel]:
    """The compiled kernel of `ast`, if one is registered."""
    return _kernels.get(ast)


def prepare(kernels: Iterable[tuple[Node, str]]) -> int:
    """Compiles the (ast, name) kernels not compiled yet, in one compiler call (two at once when some
    are longer than LARGE_SOURCE); returns how many were added (compiled, or bound to a loaded kernel
    of the same code). Blocking (seconds at worst, the GIL released while the compiler runs): call it from a
    worker thread, not the event loop. While profiling, the time is a "compile" host span naming them."""
    if not collector.is_active():
        return _prepare(kernels)
    todo = [(ast, name) for ast, name in kernels if ast not in _kernels and ast not in _refused]
    start = time.perf_counter_ns()
    added = _prepare(todo)
    counts: dict[str, int] = {}
    for ast, name in dict(todo).items():
        if ast in _kernels:
            counts[name] = counts.get(name, 0) + 1
    names = [name if n == 1 else f"{name} (x{n})" for name, n in sorted(counts.items())]
    failed = len({ast for ast, _ in todo if ast in _refused})
    if added or failed:
        background = threading.current_thread() is _background_thread
        collector.record_host(HostSpan(
            f"compile {added} kernels" + (f" ({failed} left on numpy)" if failed else ""), "compile", start,
            time.perf_counter_ns(), "compile (background)" if background else "host", ", ".join(names)))
    return added


def _code(source: str, symbol: str) -> str:
    """A kernel's source without its name: equal for two kernels that compute the same thing on their
    buffers (render_c writes the name in the header line only)."""
    return source.replace(f"void {symbol}(", "void (", 1)


def _prepare(kernels: Iterable[tuple[Node, str]]) -> int:
    global last_error, compiled, epoch
    cc = compiler()
    if cc is None:
        last_error = "no C compiler (cc, gcc or clang) on PATH"
        return 0
    blas = _bind_blas()
    todo: dict[Node, tuple[str, str]] = {}
    same: dict[Node, str] = {}  # an AST whose code is loaded already or compiled in this call: its code
    codes: set[str] = set()
    with _lock:
        for ast, name in kernels:
            if ast in _kernels or ast in _refused or ast in todo or ast in same:
                continue
            symbol = f"k{len(todo)}_{''.join(c if c.isalnum() else '_' for c in name)}"[:120]
            try:
                source = render_c(ast, symbol, blas=blas is not None)
                if PACKED_CALL in source and quant_library() is None:
                    raise Unsupported(f"the packed-weight kernels did not compile: {quant_failure}")
            except Unsupported as why:
                _refused[ast] = str(why)
                continue
            code = _code(source, symbol)
            if code in _by_code or code in codes:
                same[ast] = code
            else:
                codes.add(code)
                todo[ast] = (symbol, source)
        bound = 0
        for ast, code in list(same.items()):
            if code in _by_code:  # loaded earlier: bound now, nothing to compile for it
                _kernels[ast] = _bound(_by_code[code], ast)
                del same[ast]
                bound += 1
        if bound:
            epoch += 1  # new kernels, as a loaded library's
    if not todo:
        return bound
    defines = (("-DATENSOR_ILP64",) if blas is not None and blas[2] else ()) + c_flags.defines(cc)
    groups = [(FLAGS, {a: v for a, v in todo.items() if len(v[1]) <= LARGE_SOURCE}),
              (LARGE_FLAGS, {a: v for a, v in todo.items() if len(v[1]) > LARGE_SOURCE})]
    groups = [(flags, group) for flags, group in groups if group]
    try:
        libraries = _libraries_of(cc, [(flags, PRELUDE + "\n".join(src for _, src in group.values()))
                                       for flags, group in groups], defines)
    except (OSError, subprocess.SubprocessError) as exc:
        last_error = (f"loading a compiled library failed: {exc}" if isinstance(exc, OSError)
                      else f"compile failed: {exc}")
        with _lock:
            for ast in (*todo, *same):
                _refused[ast] = last_error
        return 0
    global _program_runner, _copy_fn
    if _program_runner is None:
        lib = libraries[0]
        copy = lib.atensor_copy
        copy.argtypes, copy.restype = [ctypes.c_void_p], None
        _copy_fn = copy
        runner = lib.atensor_run_program
        runner.argtypes = [ctypes.c_longlong] + [ctypes.c_void_p] * 5
        runner.restype = None
        _bind_doorbell(lib)
        _program_runner = runner
    if any(PACKED_CALL in src for _, src in todo.values()):
        _set_quant(libraries)
    if blas is not None:
        for lib in libraries:
            lib.atensor_set_blas(*(ctypes.c_void_p(blas[i]) for i in (0, 1, 3, 4, 5)))
    with _lock:
        _libraries.extend(libraries)
        for lib, (_, group) in zip(libraries, groups):
            for ast, (symbol, src) in group.items():
                fn = getattr(lib, symbol)
                fn.argtypes, fn.restype = [ctypes.c_void_p], None
                kernel = _kernels[ast] = NativeKernel(symbol, fn, src, *variable_slots(ast))
                _by_code.setdefault(_code(src, symbol), kernel)
        for ast, code in same.items():
            _kernels[ast] = _bound(_by_code[code], ast)
        compiled += len(todo)
        epoch += 1
    return len(todo) + len(same) + bound


def _libraries_of(cc: str, sources: list[tuple[tuple[str, ...], str]], defines: tuple[str, ...]) -> list[ctypes.CDLL]:
    """Each (flags, source) compiled (unless cached) and loaded, the compiler calls at once (one per
    group: the large kernels' call beside the others'). Raises OSError or SubprocessError."""
    paths = []
    for flags, source in sources:
        key = hashlib.sha256("\0".join((source, cc, *flags, *defines, _cpu_key())).encode()).hexdigest()[:32]
        paths.append(cache_dir() / f"{key}.so")
    missing = [(flags, source, path) for (flags, source), path in zip(sources, paths) if not path.exists()]
    errors: list[BaseException] = []

    def build(flags: tuple[str, ...], source: str, path: Path) -> None:
        try:
            _compile(cc, source, path, defines, flags)
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(exc)
    threads = [threading.Thread(target=build, args=job, name="atensor-cc") for job in missing[1:]]
    for t in threads:
        t.start()
    if missing:
        build(*missing[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [ctypes.CDLL(str(path)) for path in paths]


def _bound(kernel: "NativeKernel", ast: Node) -> "NativeKernel":
    """`kernel`'s function for another AST of the same code (its own variables' slots)."""
    return NativeKernel(kernel.name, kernel.fn, kernel.source, *variable_slots(ast))


def prepare_in_background(kernels: list[tuple[Node, str]]) -> None:
    """`prepare(kernels)` on a background thread (one, in order): the caller goes on at once."""
    global _background_thread
    with _lock:
        if _background_thread is None:
            _background_thread = threading.Thread(target=_compile_forever, name="atensor-native-compile",
                                                  daemon=True)
            _background_thread.start()
    _background.put(kernels)


def _compile_forever() -> None:
    global last_error
    while True:
        kernels = _background.get()
        try:
            prepare(kernels)
        except Exception as exc:  # noqa: BLE001 - a renderer bug must not kill the thread: numpy stays
            last_error = f"background compile failed: {type(exc).__name__}: {exc}"
        finally:
            _background.task_done()


def wait_background() -> None:
    """Blocks until every kernel handed to `prepare_in_background` so far is compiled (or refused)."""
    _background.join()


def load_helper(name: str, source: str) -> ctypes.CDLL:
    """A standalone C helper library (not a kernel: its own entry points, no prelude), compiled once per
    machine, compiler, flags and source into `cache_dir()` and loaded. Raises `RuntimeError` without a
    compiler and `subprocess.SubprocessError` when it does not compile; callers fall back to Python."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler ($CC, cc, gcc or clang) on PATH")
    key = hashlib.sha256("\0".join((source, cc, *FLAGS, _cpu_key())).encode()).hexdigest()[:32]
    path = cache_dir() / f"{name}-{key}.so"
    if not path.exists():
        _compile(cc, source, path, ())
    return ctypes.CDLL(str(path))


def program_runner_address() -> int:
    """The address of the loaded `atensor_run_program` (backend/c/prelude.py); 0 before any library is loaded."""
    return 0 if _program_runner is None else ctypes.cast(_program_runner, ctypes.c_void_p).value


quant_failure: Optional[str] = None  # why the packed-weight helper did not load, if it did not
_quant: Optional[ctypes.CDLL] = None
_quant_lock = threading.Lock()  # not `_lock`: _prepare asks for the helper while holding that


def quant_library() -> Optional[ctypes.CDLL]:
    """The packed-weight kernels (backend/quant/source.py) as a helper library, compiled on first use (once
    per machine); None when they cannot be compiled (`quant_failure` says why: QMATMUL stays on numpy)."""
    global _quant, quant_failure
    if _quant is None and quant_failure is None:
        with _quant_lock:
            if _quant is None and quant_failure is None:
                try:
                    lib = load_helper("atensor-quant", QUANT_SOURCE)
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    quant_failure = f"{type(exc).__name__}: {exc}"
                    return None
                blas = _bind_blas()
                if blas is not None:  # many rows of x: decoded panels through sgemm (backend/quant/source.py)
                    lib.atq_set_sgemm(ctypes.c_void_p(blas[0]), ctypes.c_int(int(blas[2])))
                    if blas[5] and _blas_get_threads:  # threads: the kernel's BLAS count (backend/quant/pool_c.py)
                        lib.atq_set_blas_threads(ctypes.c_void_p(_blas_get_threads), ctypes.c_void_p(blas[5]))
                _quant = lib
    return _quant


def _set_quant(libraries: list[ctypes.CDLL]) -> None:
    """Points each library's `at_packed_qmatmul` / `at_packed_dequant` (backend/c/prelude.py) at the helper's kernels."""
    helper = quant_library()
    if helper is None:
        return
    address = lambda fn: ctypes.c_void_p(ctypes.cast(fn, ctypes.c_void_p).value)  # noqa: E731
    for lib in libraries:
        lib.atensor_set_quant(address(helper.atq_matmul), address(helper.atq_dequant))


def _compile(cc: str, source: str, path: Path, defines: tuple[str, ...], flags: tuple[str, ...] = FLAGS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="atensor-cc-") as tmp:
        c_file = Path(tmp) / "kernels.c"
        c_file.write_text(source)
        out = Path(tmp) / "kernels.so"
        libs = c_flags.libraries(defines)
        proc = subprocess.run([cc, *flags, *defines, "-o", str(out), str(c_file), *libs],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 and "-march=native" in flags:  # a compiler that does not know it (arm64 clang)
            portable = tuple(f for f in flags if f != "-march=native")
            proc = subprocess.run([cc, *portable, *defines, "-o", str(out), str(c_file), *libs],
                                  capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise subprocess.SubprocessError(proc.stderr.strip()[-2000:])
        os.replace(out, path)  # atomic: a concurrent process sees the whole library or none


@functools.lru_cache(maxsize=1)
def _cpu_key() -> str:
    """-march=native code is only valid on this kind of CPU: the cache key includes its flags."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def status() -> dict[str, object]:
    """How many kernels are native, how many were refused and the reasons, the last error."""
    reasons: dict[str, int] = {}
    for why in _refused.values():
        reasons[why] = reasons.get(why, 0) + 1
    return {"compiler": compiler(), "native": len(_kernels), "refused": reasons, "last_error": last_error}
