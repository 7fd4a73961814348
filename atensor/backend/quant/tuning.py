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

When: `prepare(calls)` with the QMATMUL calls about to run: a model's projections at its load
(models/llama.py, `prepare_model`), a batch of kernels before they compile (backend/c/registry.py's
`prepare` calls `prepare_kernels`), one eager QMATMUL
(`run_qmatmul`, the numpy backend's). Each family is chosen once per
process, on every call of that family in the first batch that holds one (a decode step's products of
every weight matrix of the model: its real shapes, summed). The shape class names the formats and
the number of x rows (one; or a prefill's few or many), so a cached choice is reused only for calls
like those it was measured on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from atensor.backend.quant import kernels, source
from atensor.config import settings
from atensor.graph.node import Node, toposort
from atensor.graph.ops import Ops
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
    """One QMATMUL about to run: its packed weights' shape, its rows of x, and how many times a step runs
    it (`count`: a trial runs it that often, so each shape weighs in the time as it does in the model's)."""
    shape: PackedShape
    m: int
    count: int = 1

    def __str__(self) -> str:
        return f"{self.shape.format.name} {self.shape.rows}x{self.shape.cols} m{self.m}" + (
            f" x{self.count}" if self.count > 1 else "")

    @property
    def family(self) -> str:
        """The C table's family of this call (backend/quant/variants_c.py's atq_family_of)."""
        return kernels.family_of(self.shape, self.m)


def _alternative(variant: kernels.Variant) -> tune.Alternative:
    """The tune Alternative of one C variant: timed by running it on sample weights of every call's shape,
    one call each, on one thread (the trial's clock is the thread's CPU time)."""
    needs = tuple(_CPUINFO.get(n, n) for n in variant.needs)

    def prepare(calls: Sequence[Call]) -> Callable[[], None]:
        rng = np.random.default_rng(0)
        operands = [(rng.standard_normal((c.m, c.shape.cols)).astype(np.float32), _weights(c.shape), c.shape,
                     c.count) for c in calls]

        def run() -> None:
            for x, w, shape, count in operands:
                for _ in range(count):
                    kernels.matmul(x, w, shape, variant=variant.name, threads=1)
        return run
    return tune.Alternative(variant.name, needs, prepare, f"rank {variant.rank} in the C table")


_samples: dict[PackedShape, np.ndarray] = {}  # a trial's weights, shared by its alternatives; freed after


def _weights(shape: PackedShape) -> np.ndarray:
    if shape not in _samples:
        _samples[shape] = kernels.sample_weights(shape)
    return _samples[shape]


_built: dict[str, tune.Family] = {}


def families() -> list[tune.Family]:
    """Every matmul family's tune Family (registering them); [] without the compiled kernels."""
    return [f for f in map(family, _MATMUL_FAMILIES) if f is not None]


def family(name: str) -> Optional[tune.Family]:
    """The tune Family of the C table's family `name` (gemv_f32, ...); None without the compiled kernels."""
    if name in _built:
        return _built[name]
    if kernels.library() is None:
        return None
    fam = tune.register(tune.Family(f"quant.{name}", tuple(_alternative(v) for v in kernels.variants(name)),
                                    "portable", _version(), _FAMILY_NOTES.get(name, "")))
    _built[name] = fam
    return fam


def _version() -> str:
    """The families' version: the kernels' C source, and this module's and the trial's own code (how the
    shapes are weighed and timed: a choice measured another way is measured again)."""
    return tune.version_of(source.SOURCE, Path(__file__).read_text(), Path(tune.__file__).read_text())


def shape_class(calls: Sequence[Call]) -> str:
    """The class of a family's calls (the family fixes the activations): their weight formats and the rows
    of x (1, 2-7, 8-63, 64+).

    >>> shape_class([Call(PackedShape(FORMATS["q4_1"], 576, 576), 32), Call(PackedShape(FORMATS["q8_0"], 8, 576), 1)])
    'q4_1+q8_0 m8-63'
    """
    formats = sorted({c.shape.format.name for c in calls})
    m = max(c.m for c in calls)
    rows = "m1" if m == 1 else "m2-7" if m < 8 else "m8-63" if m < 64 else "m64+"
    return f"{'+'.join(formats)} {rows}"


def _distinct(calls: Iterable[Call]) -> list[Call]:
    """One Call per (shape, rows of x), their counts summed, in first-seen order."""
    counts: dict[tuple[PackedShape, int], int] = {}
    for c in calls:
        counts[(c.shape, c.m)] = counts.get((c.shape, c.m), 0) + c.count
    return [Call(shape, m, count) for (shape, m), count in counts.items()]


_selected: dict[str, tune.Choice] = {}
_MATMUL_FAMILIES = ("gemv_f32", "gemv_q8", "rows_f32", "rows_q8")


def prepare(calls: Iterable[Call]) -> list[tune.Choice]:
    """Chooses (once per process) and selects the variant of each family these calls need; returns the
    choices made now. Cheap once every family has its choice."""
    if len(_selected) == len(_MATMUL_FAMILIES) or kernels.library() is None:
        return []
    by_family: dict[str, list[Call]] = {}
    for call in calls:
        by_family.setdefault(call.family, []).append(call)
    made = []
    for name, group in by_family.items():
        if name in _selected:
            continue
        if kernels.is_held(name):  # a caller selected a variant by name: it stays
            continue
        group = _distinct(group)
        try:
            choice = tune.choose(family(name), shape_class(group), group)
        finally:
            _samples.clear()
        kernels.select(name, choice.alternative, held=False)
        _selected[name] = choice
        made.append(choice)
    return made


def run_qmatmul(x: np.ndarray, packed: np.ndarray, shape: PackedShape) -> np.ndarray:
    """A QMATMUL kernel of the numpy backend (backend/numpy/render.py): `kernels.run_qmatmul`, its family's
    variant chosen first (on this call's shape, when nothing chose it before; then a set lookup)."""
    key = (shape.q8act, math.prod(x.shape[:-1]) == 1)
    if key not in _eager_done and settings.native != "0":
        prepare([Call(shape, math.prod(x.shape[:-1]))])
        _eager_done.add(key)
    return kernels.run_qmatmul(x, packed, shape)


_eager_done: set[tuple[bool, bool]] = set()


def prepare_kernels(asts: list[Node]) -> None:
    """`prepare` for the QMATMUL nodes of kernels about to be compiled (backend/c/registry.py's prepare
    calls it): a decode step's program holds every projection of the model, so its
    family is chosen on all of them."""
    if len(_selected) == len(_MATMUL_FAMILIES):
        return
    calls = [Call(n.arg, math.prod(n.shape[:-1])) for n in toposort(asts) if n.op is Ops.QMATMUL]
    if calls:
        prepare(calls)



def prepare_model(shapes: Sequence[PackedShape], last_only: Sequence[PackedShape] = (), layers: int = 1,
                  prefill_rows: int = PREFILL_ROWS) -> list[tune.Choice]:
    """Chooses every family a model runs: `shapes` are one layer's packed projections (run `layers` times
    a step), `last_only` the output projection's (once a step; a prefill runs it on its last row only).
    Its decode is one row of x through each, weighted so (a decode step's mix: SmolLM2's 30 layers read
    4x the bytes of its output projection, which alone would choose a kernel for a 30 MB stream); its
    prefill `prefill_rows` rows through a layer's. Nothing when the kernels run on numpy."""
    if settings.native == "0":
        return []
    return prepare([Call(s, 1, layers) for s in shapes] + [Call(s, 1) for s in last_only]
                   + [Call(s, prefill_rows) for s in shapes])


# SmolLM2-135M's packed products as the shipped GGUF holds them (rows x cols: a layer's q, k and v, o,
# gate and up, down in Q4_1; the tied embedding, the output projection, in Q8_0): the example shapes of
# `python -m atensor.tune --measure`, whose choices are then those the model's load finds cached
EXAMPLE_FORMAT, EXAMPLE_SHAPES = "q4_1", ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576),
                                          (576, 1536))
OUTPUT_FORMAT, OUTPUT_SHAPE = "q8_0", (49152, 576)
EXAMPLE_LAYERS = 30


def measure_examples() -> list[tune.Choice]:
    """The choices of every family on SmolLM2's shapes, float32 and Q8 activations."""
    for activations in ("float32", "q8_0"):
        prepare_model([PackedShape(FORMATS[EXAMPLE_FORMAT], r, c, activations) for r, c in EXAMPLE_SHAPES],
                      [PackedShape(FORMATS[OUTPUT_FORMAT], *OUTPUT_SHAPE, activations)], EXAMPLE_LAYERS)
    return [c for c in tune.made() if c.family.startswith("quant.")]


def forget_for_tests() -> None:
    """Forgets this process's selections (tests); the C selection is put back on each family's default."""
    for name in list(_selected):
        if not kernels.is_held(name):
            kernels.select(name, None)
    _selected.clear()
    _built.clear()
    _eager_done.clear()
