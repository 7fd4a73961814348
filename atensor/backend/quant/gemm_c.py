"""The C of the blocked packed matmul for batched rows of x on AVX2 (prefill, many decode streams):
backend/quant/source.py's SOURCE holds it, after backend/quant/gemv_c.py's.

Why a kernel of its own: with 2 to 64 rows of x the work per weight is an FMA per row, so the decode
(one per weight, whatever the row count) must be paid once and the FMAs must run at the units' rate.
Before this file the rows went through BLAS: panels of weight rows decoded to float32 and multiplied by
sgemm. OpenBLAS packs both operands of every call again, and at 16 rows (16 decode streams of SmolLM2)
that ran at 27-49 GFLOPS a thread, well under what two FMA units give (~78 at 2.45 GHz). Here:

- ATQ_GEMM_W (4) weight rows are decoded together into an L1 scratch (the exact float32 values of
  the numpy decode, as every path gives: backend/quant/source.py), with the decode of backend/quant/gemv_c.py (bytes
  widened from memory, nibbles split by shifts and masks: no shuffle beyond the widening);
- a micro-tile of those 4 weight rows by ATQ_GEMM_X (2) rows of x keeps 8 accumulators, the 2 x
  vectors and one weight vector in registers: per 8 columns 6 loads feed 8 FMAs, so the FMA units,
  not the loads, set the pace, and 8 independent chains cover the FMA latency (4 cycles, 2 a cycle).
  Measured (one thread, thread CPU time, best of 40 calls, SmolLM2's Q4_1 1536x576, 16 rows): 79
  GFLOPS, against 74 for a 4x3 tile (12 accumulators, a 1-row tile left over at 16 rows); a 4x2 tile
  also divides the row counts the engine uses (4, 8, 16, 64). Against sgemm's panels, both in one
  process, calls interleaved, median (bench/quant_batched.py --baseline, load 6): 49-75 GFLOPS on
  SmolLM2's shapes at 16 rows against 27-49, a 16-row decode step's matmuls 77 ms against 123;
- the rows of x run in passes of at most ATQ_GEMM_XBYTES (L2-resident): a pass reads the rows of x
  from L2 once per 4 weight rows; with more rows than a pass holds (a long prefill on long rows) the
  weight rows are decoded once per pass.

Invariant (a row's result does not depend on its batch): each (weight row, row of x) pair has its own
accumulator, fed the products of columns 0-7, 8-15, ... in order, and summed across its lanes by
`atq_hsum256` at the end; the tile it ran in (4x2 or a remainder), the pass, the thread's chunk and the
number of rows beside it change nothing. So a stream's logits are the same bit for bit whether it
decodes in a batch of 2 rows or of 16 (tests/nn/test_packed.py). Batch-1 (one row of x) is
backend/quant/gemv_c.py's kernel, whose sums are grouped differently (two accumulators a row): a row alone
and the same row batched agree to rounding, not bit for bit.

Rows longer than ATQ_GEMM_COLS, or not a multiple of 32, stay on backend/quant/source.py's scratch-row path. The
AVX-512 path runs this AVX2 code (this machine has no AVX-512 to measure a wider one on).
"""
from __future__ import annotations

GEMM_SOURCE = r"""
#ifdef ATQ_X86
#define ATQ_GEMM_W 4                /* weight rows decoded together into the scratch */
#define ATQ_GEMM_X 2                /* rows of x per micro-tile: 4 x 2 accumulators, 2 x vectors, 1 weight vector */
#define ATQ_GEMM_COLS 4096          /* the longest row taken: the scratch is 4 decoded rows, 64 KiB */
#define ATQ_GEMM_XBYTES (192 << 10) /* bytes of x per pass over the weight rows (in L2) */

/* one row of Q4_0/Q4_1/Q8_0 blocks (nb of them) decoded to float32: the values of backend/quant/gemv_c.py's
   decode (d * q exact, Q4_1's + m one rounding) */
ATQ_INLINE ATQ_AVX2 void atq_gemm_decode_avx2(int fmt, const uint8_t *w, float *out, int64_t nb) {
  const __m256i nib = _mm256_set1_epi32(0x0F);
  int64_t bytes = atq_row_bytes(fmt, 32);
  for (int64_t b = 0; b < nb; b++, out += 32) {
    const uint8_t *p = w + b * bytes;
    __m256 v0, v1, v2, v3;
    if (fmt == ATQ_Q8_0) {
      __m256 d = _mm256_set1_ps(_cvtsh_ss(atq_u16(p)));
      v0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2)))));
      v1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 10)))));
      v2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 18)))));
      v3 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 26)))));
    } else {
      const uint8_t *qs = p + (fmt == ATQ_Q4_1 ? 4 : 2);
      __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
      __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
      __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(b0, nib)), q1 = _mm256_cvtepi32_ps(_mm256_and_si256(b1, nib));
      __m256 q2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)), q3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));
      if (fmt == ATQ_Q4_1) {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(atq_u16(p))), m = _mm256_set1_ps(_cvtsh_ss(atq_u16(p + 2)));
        v0 = _mm256_fmadd_ps(d, q0, m); v1 = _mm256_fmadd_ps(d, q1, m);
        v2 = _mm256_fmadd_ps(d, q2, m); v3 = _mm256_fmadd_ps(d, q3, m);
      } else {
        __m256 d = _mm256_set1_ps(_cvtsh_ss(atq_u16(p))), eight = _mm256_set1_ps(8.0f);
        v0 = _mm256_mul_ps(d, _mm256_sub_ps(q0, eight)); v1 = _mm256_mul_ps(d, _mm256_sub_ps(q1, eight));
        v2 = _mm256_mul_ps(d, _mm256_sub_ps(q2, eight)); v3 = _mm256_mul_ps(d, _mm256_sub_ps(q3, eight));
      }
    }
    _mm256_store_ps(out, v0); _mm256_store_ps(out + 8, v1);
    _mm256_store_ps(out + 16, v2); _mm256_store_ps(out + 24, v3);
  }
}

/* holds a loaded vector in a register: GCC 12 otherwise folds the load into every FMA that uses it,
   and the repeated loads (16 for 8 FMAs in a 4x2 tile) set the pace instead of the FMAs (measured:
   31-38 GFLOPS with the folded loads, 45-62 without, same shapes, a loaded machine) */
#define ATQ_IN_REGISTER(v) __asm__("" : "+x"(v))

/* y[j * ldy + i] = dot(w row i, x row j) for i < NW, j < NX over n columns (a multiple of 8): the
   invariant's order, one accumulator per pair */
ATQ_INLINE ATQ_AVX2 void atq_gemm_tile_avx2(const float *w, int64_t n, const float *x, int64_t ldx, float *y,
                                            int64_t ldy, const int NW, const int NX) {
  __m256 acc[ATQ_GEMM_X][ATQ_GEMM_W];
  for (int j = 0; j < NX; j++)
    for (int i = 0; i < NW; i++) acc[j][i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += 8) {
    __m256 xv[ATQ_GEMM_X];
    for (int j = 0; j < NX; j++) {
      xv[j] = _mm256_loadu_ps(x + j * ldx + k);
      ATQ_IN_REGISTER(xv[j]);
    }
    for (int i = 0; i < NW; i++) {
      __m256 wv = _mm256_load_ps(w + i * n + k);
      ATQ_IN_REGISTER(wv);
      for (int j = 0; j < NX; j++) acc[j][i] = _mm256_fmadd_ps(wv, xv[j], acc[j][i]);
    }
  }
  for (int j = 0; j < NX; j++)
    for (int i = 0; i < NW; i++) y[j * ldy + i] = atq_hsum256(acc[j][i]);
}

/* NW decoded weight rows (the scratch) against rows [i0, i1) of x: tiles of ATQ_GEMM_X rows, then the rest */
ATQ_INLINE ATQ_AVX2 void atq_gemm_rows_avx2(const float *scratch, int64_t cols, const float *x, int64_t i0,
                                            int64_t i1, float *y, int64_t ldy, const int NW) {
  int64_t i = i0;
  for (; i + ATQ_GEMM_X <= i1; i += ATQ_GEMM_X)
    atq_gemm_tile_avx2(scratch, cols, x + i * cols, cols, y + i * ldy, ldy, NW, ATQ_GEMM_X);
  if (i < i1) atq_gemm_tile_avx2(scratch, cols, x + i * cols, cols, y + i * ldy, ldy, NW, 1);  /* ATQ_GEMM_X == 2 */
}

static uint64_t atq_gemm_runs;  /* calls of the blocked kernel (racy counts: the tests see that it ran) */
uint64_t atq_gemm_count(void) { return __atomic_load_n(&atq_gemm_runs, __ATOMIC_RELAXED); }

/* y (m, rows) = x (m, cols) . W^T for weight rows [r0, r1); false (nothing done) for a row it does not take;
   `scratch`: ATQ_SCRATCH floats, 64-byte aligned (the caller's, backend/quant/source.py's: one 64 KiB array on a
   thread's stack, as before this kernel) */
_Static_assert(ATQ_GEMM_W * ATQ_GEMM_COLS <= ATQ_SCRATCH, "the decoded weight rows fit the caller's scratch");
static ATQ_AVX2 int atq_gemm_avx2(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols,
                                  int64_t rows, int64_t r0, int64_t r1, float *scratch) {
  if (cols % 32 != 0 || cols > ATQ_GEMM_COLS) return 0;
  __atomic_store_n(&atq_gemm_runs, atq_gemm_count() + 1, __ATOMIC_RELAXED);
  int64_t rb = atq_row_bytes(fmt, cols), nb = cols / 32;
  int64_t pass = ATQ_GEMM_XBYTES / (cols * (int64_t)sizeof(float)) / ATQ_GEMM_X * ATQ_GEMM_X;
  if (pass < ATQ_GEMM_X) pass = ATQ_GEMM_X;
  for (int64_t i0 = 0; i0 < m; i0 += pass) {
    int64_t i1 = i0 + pass < m ? i0 + pass : m;
    for (int64_t r = r0; r < r1; r += ATQ_GEMM_W) {
      int nw = r1 - r < ATQ_GEMM_W ? (int)(r1 - r) : ATQ_GEMM_W;
      for (int t = 0; t < nw; t++) {
        if (fmt <= ATQ_Q8_0) atq_gemm_decode_avx2(fmt, w + (r + t) * rb, scratch + t * cols, nb);
        else atq_decode_row_avx2(fmt, w + (r + t) * rb, scratch + t * cols, cols);  /* F16, BF16 */
      }
      if (nw == 4) atq_gemm_rows_avx2(scratch, cols, x, i0, i1, y + r, rows, 4);
      else if (nw == 3) atq_gemm_rows_avx2(scratch, cols, x, i0, i1, y + r, rows, 3);
      else if (nw == 2) atq_gemm_rows_avx2(scratch, cols, x, i0, i1, y + r, rows, 2);
      else atq_gemm_rows_avx2(scratch, cols, x, i0, i1, y + r, rows, 1);
    }
  }
  return 1;
}
#else
uint64_t atq_gemm_count(void) { return 0; }
#endif
"""
