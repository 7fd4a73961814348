"""How the native tier calls the C compiler: the flags every kernel library is built with, and whether the
C library's vector math (glibc's libmvec) can be used.

Why apart from backend/c/compiler.py: the flags decide what the rendered C turns into (which loops vectorize, which
calls stay scalar); backend/c/render.py writes its loops for these flags, and a change here recompiles every
kernel once (the flags are part of each library's cache key).

The flags, and what each one buys (measured on SmolLM2's batch-1 decode kernels, Zen 3, GCC 12.2):
- `-O3 -march=native`: the loop vectorizer, at the machine's widest vectors;
- `-fno-tree-slp-vectorize`: GCC 12.2's SLP vectorizer miscompiles a max-reduction of `!x` over a fully
  unrolled 2x2 (or 2x8) uint8 nest: bool min() gave 254 (the mask byte 0xFF, then `^ 1`) instead of 0.
  The loops themselves keep the loop vectorizer (see AT_NEGATIVE_STEPS in backend/c/prelude.py for the one
  pattern where it is wrong too); tests/backend/test_native.py holds both repros;
- `-fno-math-errno`: libm calls without errno writes (sqrtf becomes one instruction);
- `-ffp-contract=off`: no fused multiply-adds, so a kernel's bits do not depend on how the compiler
  contracted its expressions;
- not `-fno-trapping-math`: it lets GCC if-convert a select between two computed values and vectorize
  SiLU-mul (3x faster at decode, 0.2 ms of a 10 ms token), but it made the flagship's jitted training
  step 1.8-2.3x slower (1.4-1.9 -> 2.9-3.8 ms, alternating runs: the fused backward's selects computed
  both sides in every lane), so it stays off until the renderer can ask for it per loop;
- `-fopenmp-simd`: honours `#pragma omp simd` (no OpenMP runtime): backend/c/render.py marks each inner reduce
  loop `reduction(...)`, which allows that loop's partial sums to be reassociated into vector lanes,
  the one reassociation allowed (nothing like -ffast-math elsewhere).

Vector math: with `#pragma omp declare simd` on expf, logf, sinf, cosf (and their double versions),
GCC calls glibc's libmvec (`_ZGVdN8v_expf`: 8 lanes on AVX2) in a vectorized loop instead of libm once
per element. Measured here over each function's range against the correctly rounded value: libmvec's
expf within 3 ulp, logf/sinf/cosf within 2 (libm's scalar ones within 1), far inside the tolerances the
tests hold C kernels to against numpy (whose own SIMD expf is not libm's either). A compiler or C
library without it (probed once: a loop over the declared functions must compile and link with -lmvec)
keeps the scalar calls.
"""
from __future__ import annotations

import functools
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-fno-tree-slp-vectorize", "-fPIC", "-shared", "-fno-math-errno",
         "-ffp-contract=off", "-fopenmp-simd", "-std=c11")
# a kernel whose C source is longer than LARGE_SOURCE characters (a fused backward with dozens of loops)
# is compiled with -O2, in its own compiler call beside the others': GCC 12's -O3 (its loop vectorizer
# above all) took 11.4 s on the CNN flagship's 56 KB fused backward, -O2 2.0 s (which vectorizes too,
# with the cheap cost model), and 60 training steps took the same time either way (1.59-1.80 s -O3,
# 1.74-1.84 s -O2, 2 devices)
LARGE_SOURCE = 16_000
LARGE_FLAGS = ("-O2",) + FLAGS[1:]

# the prelude's declarations of the libm functions that have libmvec variants (glibc 2.22 on), under
# AT_MVEC (backend/c/prelude.py): `omp declare simd` tells the vectorizer a vector variant exists
MVEC_DECLARATIONS = "".join(
    f"#pragma omp declare simd notinbranch\nextern {t} {fn}({t});\n"
    for t, names in (("float", ("expf", "logf", "sinf", "cosf")), ("double", ("exp", "log", "sin", "cos")))
    for fn in names)
MVEC_DEFINES = ("-DAT_MVEC",)
MVEC_LIBS = ("-lmvec",)

_PROBE = """#include <math.h>
{declarations}
float x[64], y[64];
double z[64];
int main(void) {{
  for (int i = 0; i < 64; i++) y[i] = expf(x[i]) + logf(x[i]) + sinf(x[i]) + cosf(x[i]);
  for (int i = 0; i < 64; i++) z[i] = exp(z[i]) + log(z[i]) + sin(z[i]) + cos(z[i]);
  return (int)y[0] + (int)z[0];
}}
"""


@functools.lru_cache(maxsize=None)
def vector_math(cc: str) -> bool:
    """Whether `cc` compiles the prelude's `omp declare simd` libm declarations and links them with
    libmvec (probed once per compiler, a fraction of a second); False keeps the scalar libm calls."""
    with tempfile.TemporaryDirectory(prefix="atensor-mvec-") as tmp:
        source = Path(tmp) / "probe.c"
        source.write_text(_PROBE.format(declarations=MVEC_DECLARATIONS))
        try:
            # an executable, not a shared library: every symbol must resolve at link time
            flags = [f for f in FLAGS if f not in ("-shared", "-fPIC")]
            proc = subprocess.run([cc, *flags, "-o", str(Path(tmp) / "probe"), str(source), *MVEC_LIBS, "-lm"],
                                  capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return False
        return proc.returncode == 0


def defines(cc: str) -> tuple[str, ...]:
    """The -D options for the vector math every kernel library of `cc` is compiled with."""
    return MVEC_DEFINES if vector_math(cc) else ()


def libraries(defines: tuple[str, ...]) -> tuple[str, ...]:
    """The libraries a kernel library compiled with `defines` links (libmvec under AT_MVEC, then libm)."""
    return (*(MVEC_LIBS if MVEC_DEFINES[0] in defines else ()), "-lm")
