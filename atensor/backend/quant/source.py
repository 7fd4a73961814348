"""The C of the packed-weight kernels (backend/quant/kernels.py compiles and binds it): block dot products
and block decodes for each format of graph/quant.py, in a portable version and AVX2 and AVX-512
versions.

Numerics (the invariant of graph/quant.py): every path decodes a weight to the float32 value the
numpy decode gives (d and m widened from fp16 exactly; `d * q` exact; Q4_1's `+ m` one rounding, as
an fma of an exact product is) and multiplies it by the float32 activation, summing in float32. The
paths differ only in the order of the sums (lanes), so the SIMD and portable paths agree to rounding.

Paths: each function exists as `_portable`, `_avx2` and `_avx512` (GCC/Clang `target` attributes, so
one compile holds all of them on x86, and the portable code builds on any CPU); wider kernels of one
job are variants of their own (rows per pass, VNNI). backend/quant/variants_c.py's table names every
variant by family with the CPU features it needs, checked at run time; the entry points of
backend/quant/pool_c.py run each family's selected variant (by default the supported one measured
best, until atensor/tune/ chooses) on the kernel's threads (rows of W split over them). The tests
call every variant the running CPU has through `atq_matmul_run`, on one thread and on two.

Batched rows: on AVX2 (and AVX-512) `atq_matmul` with two rows of x or more (a prefill, 16 decode
streams) runs the blocked kernel of backend/quant/gemm_c.py (`atq_blocked_<path>`; rows up to ATQ_GEMM_COLS
columns). The portable path, and longer rows, decode each weight row once into an L1-resident scratch
row and multiply it with every row of x, four at a time; from ATQ_GEMM_ROWS rows on they decode
panels of weight rows (128 KiB, in L2) and multiply each panel with all rows of x in BLAS's sgemm (set
by backend/quant/kernels.py; called on one BLAS thread from each of the kernel's threads, backend/quant/pool_c.py). Every way
each weight block is read from memory once for all rows. One row of x (batch-1 decode) takes the fused
decode-and-dot in registers, where a scratch row's store and load would cost more than the decode.

`render_packed` is a QMATMUL or DEQUANT kernel's own C (backend/c/render.py calls it): one call through the
prelude's `at_packed_qmatmul` / `at_packed_dequant` pointers, which backend/quant/kernels.py sets to this library's
`atq_matmul` / `atq_dequant` (each call runs its family's selected variant).
"""
from __future__ import annotations

import math

from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.graph.view import View
from atensor.backend.quant.pool_c import POOL_SOURCE
from atensor.backend.quant.gemv_c import GEMV_SOURCE
from atensor.backend.quant.gemm_c import GEMM_SOURCE
from atensor.backend.quant.q8_c import Q8_SOURCE
from atensor.backend.quant.variants_c import VARIANTS_SOURCE
from atensor.backend.quant.avx512_c import AVX512_SOURCE

PACKED_CALL = "at_packed_"  # + "qmatmul(" / "dequant(": the prelude's pointers to the packed-weight kernels


class NotPacked(Exception):
    """The kernel's operands are not plain buffers; backend/c/render.py leaves it on numpy."""


def render_packed(ast: Node, name: str, params: list[tuple[int, str]]) -> str:
    """C of `void name(void **bufs)` for a STORE of a QMATMUL or DEQUANT: one call of the packed-weight
    kernel from its operands' buffers into the store target (contiguous, as every point's buffer is).
    `params` are (index, C type) of the kernel's buffers. Raises NotPacked for an operand that is not
    a contiguous run of a buffer."""
    target, value = ast.src

    def place(n: Node) -> str:
        view, param = (n.arg, n.src[0]) if n.op is Ops.VIEW else (View.create(n.shape), n)
        if param.op is not Ops.PARAM or not view.contiguous or view.mask is not None or view.variables():
            raise NotPacked(f"a {value.op.name} operand that is not a contiguous buffer")
        return f"b{param.arg[0]}" + (f" + {view.offset}" if view.offset else "")
    packed, out = value.arg, place(target)
    if value.op is Ops.QMATMUL:
        call = (f"{PACKED_CALL}qmatmul({packed.kernel_code}, {place(value.src[0])}, {place(value.src[1])}, {out}, "
                f"{math.prod(value.shape[:-1])}, {packed.cols}, {packed.rows});")
    else:
        call = f"{PACKED_CALL}dequant({packed.format.code}, {place(value.src[0])}, {out}, {packed.rows}, {packed.cols});"
    lines = [f"void {name}(void **bufs) {{"]
    lines += [f"  {ctype} *restrict b{index} = ({ctype} *)bufs[{index}];" for index, ctype in params]
    return "\n".join(lines + [f"  {call}", "}"]) + "\n"


SOURCE = r"""
#define _POSIX_C_SOURCE 200809L  /* clock_gettime, pthreads (backend/quant/pool_c.py) under -std=c11 */
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { ATQ_Q4_0 = 0, ATQ_Q4_1 = 1, ATQ_Q8_0 = 2, ATQ_F16 = 3, ATQ_BF16 = 4 };
#define ATQ_BLOCK 32
#define ATQ_SCRATCH 16384   /* the longest row decoded into the scratch row; longer rows go row by row */

/* one block layout per format (ggml-common.h), its size asserted */
typedef struct { uint16_t d; uint8_t qs[16]; } atq_block_q4_0;
typedef struct { uint16_t d; uint16_t m; uint8_t qs[16]; } atq_block_q4_1;
typedef struct { uint16_t d; int8_t qs[32]; } atq_block_q8_0;
_Static_assert(sizeof(atq_block_q4_0) == 18, "q4_0 block is 18 bytes");
_Static_assert(sizeof(atq_block_q4_1) == 20, "q4_1 block is 20 bytes");
_Static_assert(sizeof(atq_block_q8_0) == 34, "q8_0 block is 34 bytes");

static inline int64_t atq_row_bytes(int fmt, int64_t cols) {
  switch (fmt) {
    case ATQ_Q4_0: return cols / 32 * 18;
    case ATQ_Q4_1: return cols / 32 * 20;
    case ATQ_Q8_0: return cols / 32 * 34;
    default: return cols * 2;
  }
}

/* IEEE half -> float, exact (subnormals included), without F16C */
static inline float atq_half(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0x1F) bits = sign | 0x7F800000 | (mant << 13);
  else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
  else if (mant == 0) bits = sign;
  else {  /* subnormal: normalize */
    int e = -1;
    do { mant <<= 1; e++; } while (!(mant & 0x400));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3FF) << 13);
  }
  float f; memcpy(&f, &bits, 4); return f;
}
static inline uint16_t atq_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline float atq_bf16(uint16_t b) { uint32_t bits = (uint32_t)b << 16; float f; memcpy(&f, &bits, 4); return f; }

/* ---- portable: decode a row, dot a row ---------------------------------------------------------- */
static void atq_decode_row_portable(int fmt, const uint8_t *w, float *out, int64_t cols) {
  if (fmt == ATQ_F16) { for (int64_t j = 0; j < cols; j++) out[j] = atq_half(atq_u16(w + 2 * j)); return; }
  if (fmt == ATQ_BF16) { for (int64_t j = 0; j < cols; j++) out[j] = atq_bf16(atq_u16(w + 2 * j)); return; }
  for (int64_t b = 0; b < cols / 32; b++, out += 32) {
    if (fmt == ATQ_Q4_0) {
      const atq_block_q4_0 *blk = (const atq_block_q4_0 *)(w + b * 18);
      float d = atq_half(blk->d);
      for (int j = 0; j < 16; j++) {
        out[j] = d * (float)((blk->qs[j] & 0x0F) - 8);
        out[j + 16] = d * (float)((blk->qs[j] >> 4) - 8);
      }
    } else if (fmt == ATQ_Q4_1) {
      const atq_block_q4_1 *blk = (const atq_block_q4_1 *)(w + b * 20);
      float d = atq_half(blk->d), m = atq_half(blk->m);
      for (int j = 0; j < 16; j++) {
        out[j] = d * (float)(blk->qs[j] & 0x0F) + m;
        out[j + 16] = d * (float)(blk->qs[j] >> 4) + m;
      }
    } else {
      const atq_block_q8_0 *blk = (const atq_block_q8_0 *)(w + b * 34);
      float d = atq_half(blk->d);
      for (int j = 0; j < 32; j++) out[j] = d * (float)blk->qs[j];
    }
  }
}

static float atq_dot_row_portable(int fmt, const uint8_t *w, const float *x, int64_t cols) {
  float block[ATQ_BLOCK], acc[8] = {0};
  int64_t step = (fmt == ATQ_F16 || fmt == ATQ_BF16) ? 1 : 32, bytes = atq_row_bytes(fmt, step);
  if (step == 1) {
    float sum = 0.0f;
    for (int64_t j = 0; j < cols; j++)
      sum += (fmt == ATQ_F16 ? atq_half(atq_u16(w + 2 * j)) : atq_bf16(atq_u16(w + 2 * j))) * x[j];
    return sum;
  }
  for (int64_t b = 0; b < cols / 32; b++) {
    atq_decode_row_portable(fmt, w + b * bytes, block, 32);
    for (int j = 0; j < 32; j++) acc[j & 7] += block[j] * x[b * 32 + j];
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static float atq_dot_dense_portable(const float *a, const float *b, int64_t n) {
  float acc[8] = {0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; l++) acc[l] += a[j + l] * b[j + l];
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; j < n; j++) sum += a[j] * b[j];
  return sum;
}

/* ATQ_PORTABLE_ONLY: the build of a CPU without x86 vectors (ARM, ...), checked on x86 by the tests */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ATQ_PORTABLE_ONLY)
#define ATQ_X86 1
#define ATQ_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ATQ_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

/* ---- AVX2: 8 lanes; a block is 4 vectors ----------------------------------------------------------- */
static inline ATQ_AVX2 float atq_hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
static inline ATQ_AVX2 float atq_half_f16c(uint16_t h) { return _cvtsh_ss(h); }

/* the 32 weights of block b as 4 vectors of 8 (elements 0-7, 8-15, 16-23, 24-31) */
static inline ATQ_AVX2 void atq_block_avx2(int fmt, const uint8_t *p, __m256 v[4]) {
  if (fmt == ATQ_Q8_0) {
    __m256 d = _mm256_set1_ps(atq_half_f16c(atq_u16(p)));
    for (int i = 0; i < 4; i++) {
      __m128i q = _mm_loadl_epi64((const __m128i *)(p + 2 + 8 * i));
      v[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
    }
    return;
  }
  const uint8_t *qs = p + (fmt == ATQ_Q4_1 ? 4 : 2);
  __m128i bytes = _mm_loadu_si128((const __m128i *)qs);
  __m128i mask = _mm_set1_epi8(0x0F);
  __m128i lo = _mm_and_si128(bytes, mask), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
  __m256i q[4] = {_mm256_cvtepu8_epi32(lo), _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                  _mm256_cvtepu8_epi32(hi), _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))};
  __m256 d = _mm256_set1_ps(atq_half_f16c(atq_u16(p)));
  if (fmt == ATQ_Q4_1) {
    __m256 m = _mm256_set1_ps(atq_half_f16c(atq_u16(p + 2)));
    for (int i = 0; i < 4; i++) v[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q[i]), m);  /* d*q exact: one rounding */
  } else {
    __m256i eight = _mm256_set1_epi32(8);
    for (int i = 0; i < 4; i++) v[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q[i], eight)));
  }
}

static inline ATQ_AVX2 __m256 atq_load8_avx2(int fmt, const uint8_t *p) {  /* 8 halves or bfloats */
  __m128i h = _mm_loadu_si128((const __m128i *)p);
  if (fmt == ATQ_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static ATQ_AVX2 void atq_decode_row_avx2(int fmt, const uint8_t *w, float *out, int64_t cols) {
  if (fmt == ATQ_F16 || fmt == ATQ_BF16) {
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) _mm256_storeu_ps(out + j, atq_load8_avx2(fmt, w + 2 * j));
    for (; j < cols; j++) out[j] = fmt == ATQ_F16 ? atq_half(atq_u16(w + 2 * j)) : atq_bf16(atq_u16(w + 2 * j));
    return;
  }
  int64_t bytes = atq_row_bytes(fmt, 32);
  __m256 v[4];
  for (int64_t b = 0; b < cols / 32; b++) {
    atq_block_avx2(fmt, w + b * bytes, v);
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(out + 32 * b + 8 * i, v[i]);
  }
}

static ATQ_AVX2 float atq_dot_row_avx2(int fmt, const uint8_t *w, const float *x, int64_t cols) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  if (fmt == ATQ_F16 || fmt == ATQ_BF16) {
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) {
      acc0 = _mm256_fmadd_ps(atq_load8_avx2(fmt, w + 2 * j), _mm256_loadu_ps(x + j), acc0);
      acc1 = _mm256_fmadd_ps(atq_load8_avx2(fmt, w + 2 * j + 16), _mm256_loadu_ps(x + j + 8), acc1);
    }
    float sum = atq_hsum256(_mm256_add_ps(acc0, acc1));
    for (; j < cols; j++) sum += (fmt == ATQ_F16 ? atq_half(atq_u16(w + 2 * j)) : atq_bf16(atq_u16(w + 2 * j))) * x[j];
    return sum;
  }
  int64_t bytes = atq_row_bytes(fmt, 32);
  __m256 v[4];
  for (int64_t b = 0; b < cols / 32; b++) {
    atq_block_avx2(fmt, w + b * bytes, v);
    const float *xb = x + 32 * b;
    acc0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xb), acc0);
    acc1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xb + 8), acc1);
    acc0 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xb + 16), acc0);
    acc1 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xb + 24), acc1);
  }
  return atq_hsum256(_mm256_add_ps(acc0, acc1));
}

static ATQ_AVX2 float atq_dot_dense_avx2(const float *a, const float *b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), acc1);
  }
  float sum = atq_hsum256(_mm256_add_ps(acc0, acc1));
  for (; j < n; j++) sum += a[j] * b[j];
  return sum;
}

/* four rows of x against one decoded row: the weight vector is loaded once for the four */
static ATQ_AVX2 void atq_dot4_avx2(const float *w, const float *x, int64_t ldx, int64_t n, float *out, int64_t ldo) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 wv = _mm256_loadu_ps(w + j);
    for (int r = 0; r < 4; r++) acc[r] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + r * ldx + j), acc[r]);
  }
  for (int r = 0; r < 4; r++) {
    float sum = atq_hsum256(acc[r]);
    for (int64_t t = j; t < n; t++) sum += w[t] * x[r * ldx + t];
    out[r * ldo] = sum;
  }
}

/* ---- AVX-512: 16 lanes; a block is 2 vectors -------------------------------------------------------- */
static inline ATQ_AVX512 void atq_block_avx512(int fmt, const uint8_t *p, __m512 v[2]) {
  __m512 d = _mm512_set1_ps(_cvtsh_ss(atq_u16(p)));
  if (fmt == ATQ_Q8_0) {
    for (int i = 0; i < 2; i++) {
      __m128i q = _mm_loadu_si128((const __m128i *)(p + 2 + 16 * i));
      v[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
    return;
  }
  const uint8_t *qs = p + (fmt == ATQ_Q4_1 ? 4 : 2);
  __m128i bytes = _mm_loadu_si128((const __m128i *)qs);
  __m128i mask = _mm_set1_epi8(0x0F);
  __m512i q[2] = {_mm512_cvtepu8_epi32(_mm_and_si128(bytes, mask)),
                  _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask))};
  if (fmt == ATQ_Q4_1) {
    __m512 m = _mm512_set1_ps(_cvtsh_ss(atq_u16(p + 2)));
    for (int i = 0; i < 2; i++) v[i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(q[i]), m);
  } else {
    __m512i eight = _mm512_set1_epi32(8);
    for (int i = 0; i < 2; i++) v[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(q[i], eight)));
  }
}

static inline ATQ_AVX512 __m512 atq_load16_avx512(int fmt, const uint8_t *p) {
  __m256i h = _mm256_loadu_si256((const __m256i *)p);
  if (fmt == ATQ_F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static ATQ_AVX512 void atq_decode_row_avx512(int fmt, const uint8_t *w, float *out, int64_t cols) {
  if (fmt == ATQ_F16 || fmt == ATQ_BF16) {
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) _mm512_storeu_ps(out + j, atq_load16_avx512(fmt, w + 2 * j));
    for (; j < cols; j++) out[j] = fmt == ATQ_F16 ? atq_half(atq_u16(w + 2 * j)) : atq_bf16(atq_u16(w + 2 * j));
    return;
  }
  int64_t bytes = atq_row_bytes(fmt, 32);
  __m512 v[2];
  for (int64_t b = 0; b < cols / 32; b++) {
    atq_block_avx512(fmt, w + b * bytes, v);
    _mm512_storeu_ps(out + 32 * b, v[0]);
    _mm512_storeu_ps(out + 32 * b + 16, v[1]);
  }
}

static ATQ_AVX512 float atq_dot_row_avx512(int fmt, const uint8_t *w, const float *x, int64_t cols) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  if (fmt == ATQ_F16 || fmt == ATQ_BF16) {
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) acc0 = _mm512_fmadd_ps(atq_load16_avx512(fmt, w + 2 * j), _mm512_loadu_ps(x + j), acc0);
    float sum = _mm512_reduce_add_ps(acc0);
    for (; j < cols; j++) sum += (fmt == ATQ_F16 ? atq_half(atq_u16(w + 2 * j)) : atq_bf16(atq_u16(w + 2 * j))) * x[j];
    return sum;
  }
  int64_t bytes = atq_row_bytes(fmt, 32);
  __m512 v[2];
  for (int64_t b = 0; b < cols / 32; b++) {
    atq_block_avx512(fmt, w + b * bytes, v);
    acc0 = _mm512_fmadd_ps(v[0], _mm512_loadu_ps(x + 32 * b), acc0);
    acc1 = _mm512_fmadd_ps(v[1], _mm512_loadu_ps(x + 32 * b + 16), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

static ATQ_AVX512 void atq_dot4_avx512(const float *w, const float *x, int64_t ldx, int64_t n, float *out, int64_t ldo) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m512 wv = _mm512_loadu_ps(w + j);
    for (int r = 0; r < 4; r++) acc[r] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * ldx + j), acc[r]);
  }
  for (int r = 0; r < 4; r++) {
    float sum = _mm512_reduce_add_ps(acc[r]);
    for (int64_t t = j; t < n; t++) sum += w[t] * x[r * ldx + t];
    out[r * ldo] = sum;
  }
}
static ATQ_AVX512 float atq_dot_dense_avx512(const float *a, const float *b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), acc);
  float sum = _mm512_reduce_add_ps(acc);
  for (; j < n; j++) sum += a[j] * b[j];
  return sum;
}
#endif

static void atq_dot4_portable(const float *w, const float *x, int64_t ldx, int64_t n, float *out, int64_t ldo) {
  for (int r = 0; r < 4; r++) out[r * ldo] = atq_dot_dense_portable(w, x + r * ldx, n);
}

/* BLAS's sgemm (numpy's OpenBLAS; backend/quant/kernels.py sets it when it loads this library), for many rows of x:
   a panel of weight rows is decoded into a scratch block, which sgemm multiplies with every row of x */
typedef void (*atq_sgemm32_t)(int, int, int, int, int, int, float, const float *, int, const float *, int,
                              float, float *, int);
typedef void (*atq_sgemm64_t)(int, int, int, long long, long long, long long, float, const float *, long long,
                              const float *, long long, float, float *, long long);
static void *atq_sgemm;
static int atq_sgemm_ilp64;
void atq_set_sgemm(void *fn, int ilp64) { atq_sgemm = fn; atq_sgemm_ilp64 = ilp64; }
#define ATQ_GEMM_ROWS 8        /* from this many rows of x on, decoded panels go to sgemm */
#define ATQ_PANEL_FLOATS 32768 /* a panel's decoded weights: 128 KiB, in L2 */
static inline int64_t atq_panel_rows(int64_t cols) {  /* weight rows per decoded panel */
  return ATQ_PANEL_FLOATS / cols < 4 ? 4 : ATQ_PANEL_FLOATS / cols;
}
static void atq_gemm_panel(const float *x, const float *panel, float *y, int64_t m, int64_t n, int64_t cols,
                           int64_t ldy) {  /* y[:, 0:n] = x (m, cols) . panel (n, cols)^T */
  if (atq_sgemm_ilp64)
    ((atq_sgemm64_t)atq_sgemm)(101, 111, 112, m, n, cols, 1.0f, x, cols, panel, cols, 0.0f, y, ldy);
  else
    ((atq_sgemm32_t)atq_sgemm)(101, 111, 112, (int)m, (int)n, (int)cols, 1.0f, x, (int)cols, panel, (int)cols, 0.0f,
                               y, (int)ldy);
}

/* ---- the kernels, one per path ----------------------------------------------------------------------
   y (m, rows) = x (m, cols) . W^T, W packed (rows, cols); rows [r0, r1) only (a thread's share).
   One row of x: decode and dot in registers. A few rows: each weight row decoded once into scratch,
   then dotted with the rows of x four at a time. Many rows (with sgemm): panels of weight rows decoded
   once each, multiplied by sgemm. Every path reads each weight block from memory once. */
/* one row of x (batch-1 decode): rows [r0, r1) of y; AVX2 runs four weight rows per pass (backend/quant/gemv_c.py) */
static void atq_gemv_f32_portable(int fmt, const float *x, const uint8_t *w, float *y, int64_t cols, int64_t r0,
                              int64_t r1) {
  int64_t rb = atq_row_bytes(fmt, cols);
  for (int64_t r = r0; r < r1; r++) y[r] = atq_dot_row_portable(fmt, w + r * rb, x, cols);
}
#ifdef ATQ_X86
static ATQ_AVX2 void atq_gemv_avx2(int fmt, int q8, const uint8_t *w, const void *x, float *y, int64_t cols,
                                   int64_t r0, int64_t r1);  /* backend/quant/gemv_c.py */
static ATQ_AVX2 void atq_gemv_f32_avx2(int fmt, const float *x, const uint8_t *w, float *y, int64_t cols, int64_t r0,
                                       int64_t r1) {
  if (fmt <= ATQ_Q8_0) { atq_gemv_avx2(fmt, 0, w, x, y, cols, r0, r1); return; }
  int64_t rb = atq_row_bytes(fmt, cols);
  for (int64_t r = r0; r < r1; r++) y[r] = atq_dot_row_avx2(fmt, w + r * rb, x, cols);
}
static ATQ_AVX2 int atq_gemm_avx2(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols,
                                  int64_t rows, int64_t r0, int64_t r1, float *scratch);  /* backend/quant/gemm_c.py */
static ATQ_AVX2 int atq_blocked_avx2(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols,
                                     int64_t rows, int64_t r0, int64_t r1, float *scratch) {
  return atq_gemm_avx2(fmt, x, w, y, m, cols, rows, r0, r1, scratch);
}
static ATQ_AVX512 int atq_blocked_avx512(int fmt, const float *x, const uint8_t *w, float *y, int64_t m,
                                         int64_t cols, int64_t rows, int64_t r0, int64_t r1, float *scratch) {
  return atq_gemm_avx2(fmt, x, w, y, m, cols, rows, r0, r1, scratch);  /* AVX-512 runs the AVX2 kernel */
}
static ATQ_AVX512 void atq_gemv_f32_avx512(int fmt, const float *x, const uint8_t *w, float *y, int64_t cols, int64_t r0,
                                       int64_t r1) {
  int64_t rb = atq_row_bytes(fmt, cols);
  for (int64_t r = r0; r < r1; r++) y[r] = atq_dot_row_avx512(fmt, w + r * rb, x, cols);
}
#endif

/* several rows of x: the blocked kernel where the path has one (backend/quant/gemm_c.py); 0 = not taken here */
static inline int atq_blocked_portable(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols,
                                       int64_t rows, int64_t r0, int64_t r1, float *scratch) {
  (void)fmt; (void)x; (void)w; (void)y; (void)m; (void)cols; (void)rows; (void)r0; (void)r1; (void)scratch;
  return 0;
}

#define ATQ_MATMUL(PATH, ATTR)                                                                          \
  static ATTR void atq_matmul_rows_##PATH(int fmt, const float *x, const uint8_t *w, float *y, int64_t m,  \
                                          int64_t cols, int64_t rows, int64_t r0, int64_t r1) {         \
    int64_t rb = atq_row_bytes(fmt, cols);                                                              \
    if (m == 1) { atq_gemv_f32_##PATH(fmt, x, w, y, cols, r0, r1); return; }                                \
    float scratch[ATQ_SCRATCH] __attribute__((aligned(64)));                                             \
    if (atq_blocked_##PATH(fmt, x, w, y, m, cols, rows, r0, r1, scratch)) return;                         \
    if (cols > ATQ_SCRATCH) {                                                                           \
      for (int64_t i = 0; i < m; i++)                                                                   \
        for (int64_t r = r0; r < r1; r++) y[i * rows + r] = atq_dot_row_##PATH(fmt, w + r * rb, x + i * cols, cols); \
      return;                                                                                           \
    }                                                                                                   \
    if (m >= ATQ_GEMM_ROWS && atq_sgemm != NULL) {                                                      \
      int64_t per = atq_panel_rows(cols);                                                               \
      float *panel = (float *)malloc(sizeof(float) * per * cols);                                       \
      if (panel != NULL) {                                                                              \
        for (int64_t r = r0; r < r1; r += per) {                                                        \
          int64_t n = r1 - r < per ? r1 - r : per;                                                      \
          for (int64_t j = 0; j < n; j++) atq_decode_row_##PATH(fmt, w + (r + j) * rb, panel + j * cols, cols); \
          atq_gemm_panel(x, panel, y + r, m, n, cols, rows);                                             \
        }                                                                                               \
        free(panel);                                                                                    \
        return;                                                                                         \
      }                                                                                                 \
    }                                                                                                   \
    for (int64_t r = r0; r < r1; r++) {                                                                 \
      atq_decode_row_##PATH(fmt, w + r * rb, scratch, cols);                                            \
      int64_t i = 0;                                                                                    \
      for (; i + 4 <= m; i += 4) atq_dot4_##PATH(scratch, x + i * cols, cols, cols, y + i * rows + r, rows); \
      for (; i < m; i++) y[i * rows + r] = atq_dot_dense_##PATH(scratch, x + i * cols, cols);           \
    }                                                                                                   \
  }                                                                                                     \
  void atq_dequant_##PATH(int fmt, const uint8_t *w, float *out, int64_t rows, int64_t cols) {           \
    int64_t rb = atq_row_bytes(fmt, cols);                                                              \
    for (int64_t r = 0; r < rows; r++) atq_decode_row_##PATH(fmt, w + r * rb, out + r * cols, cols);    \
  }

ATQ_MATMUL(portable, )
#ifdef ATQ_X86
ATQ_MATMUL(avx2, ATQ_AVX2)
ATQ_MATMUL(avx512, ATQ_AVX512)
#endif

"""
SOURCE += Q8_SOURCE  # the optional Q8-activation kernels (llama.cpp's numerics)
SOURCE += GEMV_SOURCE  # batch-1 AVX2 kernels, four weight rows per pass
SOURCE += GEMM_SOURCE  # many rows of x on AVX2: the blocked kernel
SOURCE += AVX512_SOURCE  # AVX-512 and VNNI variants: rows per pass, blocked 4x4, vpdpbusd, vdpbf16ps
SOURCE += VARIANTS_SOURCE  # the table of variants by family, the CPU's features, the selection
SOURCE += POOL_SOURCE  # the thread pool and the entry points (atq_matmul, atq_dequant, atq_matmul_run)
