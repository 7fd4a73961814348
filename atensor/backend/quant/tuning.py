"""The packed-weight kernels' families in atensor/tune/: which compiled variant each kind of call runs,
chosen by a trial on the model's real shapes at their first use.

Why here, beside the kernels: the C library holds every variant of each family at once (its table,
backend/quant/variants_c.py: ISA path, rows per pass, blocked kernel or sgemm on decoded panels, VNNI
dot products), each with the CPU features it needs, and selects one per family at run time
(backend/quant/kernels.py's `variants` and `select`). This module turns that table into tune Families
(`quant.gemv_f32`, `quant.gemv_q8`, `quant.rows_f32`, `quant.rows_q8`), times the variants with
`kernels.matmul` on the caller's shapes, and selects the winner, so that every QMATMUL kernel, compiled
or eager, runs it from then on. Without a measurement (trials off, their time spent) the family's
portable variant runs: the C's own default is never what a family runs by its name.

When: `prepare(calls)` with the QMATMUL calls about to run (a program's kernels, before they are
compiled: backend/c/native.py; one eager QMATMUL: kernels.run_qmatmul). Each family is chosen once per
process, on every call of that family in the first batch that holds one (a decode step's products of
every weight matrix of the model: its real shapes, summed). The shape class names the formats and
the number of x rows (one; or a prefill's few or many), so a cached choice is reused only for calls
like those it was measured on.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from atensor.backend.quant import kernels, source
from atensor.graph.quant import FORMATS, PackedShape
from atensor.tune import family as tune

# the C table's feature names (__builtin_cpu_supports) as /proc/cpuinfo spells them
_CPUINFO = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avxvnni": "avx_vnni"}
_FAMILY_NOTES = {
    "gemv_f32": "one row of x (batch-1 decode), float32 activations",
    "gemv_q8": "one row of x, activations quantized to Q8_0",
    "rows_f32": "several rows of x (prefill, many streams), float32 activations",
    "rows_q8": "several rows of x, Q8_0 activations",
}
PREFILL_ROWS = 32  # x rows a rows_* trial runs with when the calls seen are all single rows


@dataclass(frozen=True)
class Call:
    """One QMATMUL about to run: its packed weights' shape and its rows of x."""
    shape: PackedShape
    m: int

    @property
    def family(self) -> str:
        """The C table's family of this call (backend/quant/variants_c.py's atq_family_of)."""
        return ("gemv_" if self.m == 1 else "rows_") + ("q8" if self.shape.q8act else "f32")


def random_packed(shape: PackedShape, rng: np.random.Generator) -> np.ndarray:
    """Bytes of a valid packed matrix of `shape` (random weights, every block scale 1/16): a trial's data."""
    raw = rng.integers(0, 256, shape.nbytes, dtype=np.uint8)
    fmt = shape.format
    if fmt.block == 1:  # F16 / BF16: small random values
        values = rng.standard_normal(shape.rows * shape.cols).astype(np.float32)
        halves = values.astype(np.float16).view(np.uint16) if fmt.name == "f16" else (values.view(np.uint32) >> 16).astype(np.uint16)
        return halves.view(np.uint8)
    blocks = raw.reshape(-1, fmt.block_bytes)
    scales = 2 if fmt.name == "q4_1" else 1  # Q4_1 has d and m
    blocks[:, : 2 * scales] = np.tile(np.array([0x00, 0x2C], np.uint8), scales)  # fp16 0.0625
    return raw


def _variants(family: str) -> list:
    return [v for v in kernels.variants() if v.family == family]


def _alternative(family: str, variant) -> tune.Alternative:
    needs = tuple(_CPUINFO.get(n, n) for n in variant.needs)

    def prepare(calls: Sequence[Call]) -> Callable[[], None]:
        rng = np.random.default_rng(0)
        operands = [(rng.standard_normal((c.m, c.shape.cols)).astype(np.float32), random_packed(c.shape, rng), c.shape)
                    for c in calls]
        threads = _threads()

        def run() -> None:
            for x, w, shape in operands:
                kernels.matmul(x, w, shape, path=variant.name, threads=threads)
        return run
    return tune.Alternative(variant.name, needs, prepare, variant.note)


def _threads() -> int:
    from atensor.backend.gemm import blas  # the packed kernels' thread count  # noqa: PLC0415
    return blas.packed_threads()


_built: dict[str, tune.Family] = {}


def family(name: str) -> Optional[tune.Family]:
    """The tune Family of the C table's family `name` (gemv_f32, ...); None without the compiled kernels."""
    if name in _built:
        return _built[name]
    if kernels.library() is None:
        return None
    variants = _variants(name)
    version = hashlib.sha256(source.SOURCE.encode()).hexdigest()[:16]
    fam = tune.register(tune.Family(f"quant.{name}", tuple(_alternative(name, v) for v in variants), "portable",
                                    version, _FAMILY_NOTES.get(name, "")))
    _built[name] = fam
    return fam


def shape_class(calls: Sequence[Call]) -> str:
    """The class of a family's calls: their formats and activations, and the rows of x (1, 2-7, 8-63, 64+)."""
    formats = sorted({c.shape.format.name for c in calls})
    m = max(c.m for c in calls)
    rows = "m1" if m == 1 else "m2-7" if m < 8 else "m8-63" if m < 64 else "m64+"
    return f"{'+'.join(formats)} {rows}"


def _distinct(calls: Iterable[Call]) -> list[Call]:
    return list(dict.fromkeys(calls))


def prepare(calls: Iterable[Call]) -> list[tune.Choice]:
    """Chooses (once per process) and selects the variant of each family these calls need; returns the
    choices made now. Cheap once every family has its choice."""
    by_family: dict[str, list[Call]] = {}
    for call in calls:
        by_family.setdefault(call.family, []).append(call)
    made = []
    for name, group in by_family.items():
        if name in _selected:
            continue
        fam = family(name)
        if fam is None:
            return made
        group = _distinct(group)
        choice = tune.choose(fam, shape_class(group), group)
        kernels.select(name, choice.alternative)
        _selected[name] = choice
        made.append(choice)
    return made


_selected: dict[str, tune.Choice] = {}


def prepare_model(shapes: Sequence[PackedShape], prefill_rows: int = PREFILL_ROWS) -> list[tune.Choice]:
    """Chooses every family a model of these packed weight shapes runs: decode (one row) and prefill
    (`prefill_rows` rows)."""
    return prepare([Call(s, 1) for s in shapes] + [Call(s, prefill_rows) for s in shapes])


# SmolLM2-135M's packed products (the shipped GGUF: q8_0 weights; rows x cols), the example shapes of
# `python -m atensor.tune --measure`
EXAMPLE_SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536))


def measure_examples() -> list[tune.Choice]:
    """The choices of every family on SmolLM2's shapes, q8_0 weights, float32 and Q8 activations."""
    shapes = [PackedShape(FORMATS["q8_0"], r, c, act) for act in ("float32", "q8_0") for r, c in EXAMPLE_SHAPES]
    prepare_model(shapes)
    return [c for c in tune.made() if c.family.startswith("quant.")]


def forget_for_tests() -> None:
    """Forgets this process's selections (tests); the C selection is put back on each family's default."""
    for name in list(_selected):
        kernels.select(name, None)
    _selected.clear()
    _built.clear()
