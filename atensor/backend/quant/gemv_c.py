"""The C of the batch-1 (one row of x) packed matmuls on AVX2: four weight rows per pass, for the
default float32 activations and for the Q8 ones (backend/quant/source.py's SOURCE holds it, after backend/quant/q8_c.py's).

Why four rows per pass: one weight row's dot product is a chain of FMAs into two accumulators, two
FMAs per accumulator per block, so a block cannot take less than two FMA latencies (~8 cycles) however
many execution units are free; with four rows in flight there are eight independent chains, the x
block is loaded once for the four, and the decode (the float path's real cost) runs at the units'
throughput. How the block is unpacked matters as much: this
Zen 3 EPYC (AVX2, 2.45 GHz) has two vector shuffle units, and widening 16 nibble bytes with
`pmovzxbd` from a register took six shuffles a block; widening bytes 0-7 and 8-15 straight from
memory and splitting the nibbles with shifts and masks takes two. Measured (bench/quant_dot.py, one
thread, CPU time, SmolLM2's Q4_1 1536x576 in cache): float32 activations 4.9 ns a block before this
file, 2.5-2.6 after; Q8 activations 3.5 before, 1.7-1.9 after, beside ggml's own
`ggml_vec_dot_q4_1_q8_1` at 1.6-2.8 on the same blocks.

Invariant (bit-equality between thread counts and row groupings): a row's result does not depend on
whether it ran in a group of four or alone. `atq_gemv_avx2` runs groups of four from r0 and the rest
alone, and both go through the one always-inlined `atq_rows_f32_avx2` / `atq_rows_q8_avx2` with the
row count a constant, so each row sees the same operations in the same order. The float path's order
is backend/quant/source.py's `atq_dot_row_avx2` (elements 0-7 and 16-23 into one accumulator, 8-15 and 24-31 into
the other): the same sums as before this file existed.

Q8 activations (backend/quant/q8_c.py's numerics): per block the integer dot product by `maddubs` (unsigned
by signed bytes into int16 pairs; no pair overflows: |w| <= 128, |x| <= 127) and `madd` with ones to
eight int32, one FMA of d_w * d_x per block. Q4_0 is Q4_1 with m = -8 d (its nibbles stay unsigned,
`maddubs`' unsigned operand, and the -8 goes to the block-sum term m_w * d_x * s_x, as llama.cpp's
Q4_1 x Q8_1 carries it); Q8_0 weights are signed, so each block takes `sign` twice (|w|, and x with
w's sign), as ggml does.
"""
from __future__ import annotations

GEMV_SOURCE = r"""
#ifdef ATQ_X86
/* each block's load is preceded by a prefetch of the same block of the rows two groups on: the rows of a
   group are read as NR interleaved streams, which the hardware prefetcher follows badly (SmolLM2's Q4_1
   576x1536, rows 960 bytes apart, read from memory: 4.9 -> 2.9 ns a block, float32 activations) */
#define ATQ_PREFETCH_GROUPS 2
#define ATQ_INLINE static inline __attribute__((always_inline))

/* the 32 nibbles of a Q4 block: bytes 0-15 elements 0-15 (low nibbles), 16-31 (high) */
ATQ_INLINE ATQ_AVX2 __m256i atq_nibbles_avx2(const uint8_t *qs) {
  __m256i twice = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));  /* a load: no shuffle */
  __m256i both = _mm256_blend_epi32(twice, _mm256_srli_epi16(twice, 4), 0xF0);  /* high half: high nibbles */
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

/* NR weight rows (rb bytes apart) . one float32 row x: y[0..NR) */
ATQ_INLINE ATQ_AVX2 void atq_rows_f32_avx2(int fmt, const uint8_t *w, int64_t rb, const float *x, int64_t nb,
                                           float *y, const int NR) {
  __m256 acc0[8], acc1[8];  /* NR <= 8 (backend/quant/avx512_c.py runs 8 with its 32 registers) */
  for (int r = 0; r < NR; r++) { acc0[r] = _mm256_setzero_ps(); acc1[r] = _mm256_setzero_ps(); }
  int64_t bytes = atq_row_bytes(fmt, 32);
  const __m256i nib = _mm256_set1_epi32(0x0F);
  for (int64_t b = 0; b < nb; b++) {
    const float *xb = x + 32 * b;
    __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8), x2 = _mm256_loadu_ps(xb + 16),
           x3 = _mm256_loadu_ps(xb + 24);
    for (int r = 0; r < NR; r++) {
      const uint8_t *p = w + r * rb + b * bytes;
      _mm_prefetch((const char *)p + ATQ_PREFETCH_GROUPS * NR * rb, _MM_HINT_T0);  /* never faults */
      __m256 d, v0, v1, v2, v3;
      if (fmt == ATQ_Q8_0) {
        d = _mm256_set1_ps(_cvtsh_ss(atq_u16(p)));
        v0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2)))));
        v1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 10)))));
        v2 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 18)))));
        v3 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 26)))));
      } else {
        /* bytes 0-7 and 8-15 widened to 32 bits (one shuffle each, from memory), then each lane's low
           nibble (elements 0-15) and high nibble (16-31) by shifts and masks, which need no shuffle */
        const uint8_t *qs = p + (fmt == ATQ_Q4_1 ? 4 : 2);
        __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
        __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
        __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(b0, nib));
        __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(b1, nib));
        __m256 q2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4));
        __m256 q3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));
        if (fmt == ATQ_Q4_1) {  /* d*q exact, + m one rounding: the numpy decode's value */
          uint32_t pair;
          memcpy(&pair, p, 4);
          __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)pair));  /* d and m widened at once */
          d = _mm256_broadcastss_ps(dm);
          __m256 m = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
          v0 = _mm256_fmadd_ps(d, q0, m); v1 = _mm256_fmadd_ps(d, q1, m);
          v2 = _mm256_fmadd_ps(d, q2, m); v3 = _mm256_fmadd_ps(d, q3, m);
        } else {  /* Q4_0: d * (q - 8), q - 8 exact in float */
          d = _mm256_set1_ps(_cvtsh_ss(atq_u16(p)));
          __m256 eight = _mm256_set1_ps(8.0f);
          v0 = _mm256_mul_ps(d, _mm256_sub_ps(q0, eight)); v1 = _mm256_mul_ps(d, _mm256_sub_ps(q1, eight));
          v2 = _mm256_mul_ps(d, _mm256_sub_ps(q2, eight)); v3 = _mm256_mul_ps(d, _mm256_sub_ps(q3, eight));
        }
      }
      acc0[r] = _mm256_fmadd_ps(v0, x0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(v1, x1, acc1[r]);
      acc0[r] = _mm256_fmadd_ps(v2, x2, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(v3, x3, acc1[r]);
    }
  }
  for (int r = 0; r < NR; r++) y[r] = atq_hsum256(_mm256_add_ps(acc0[r], acc1[r]));
}

/* NR weight rows . one row of x quantized to Q8 blocks: y[0..NR) */
ATQ_INLINE ATQ_AVX2 void atq_rows_q8_avx2(int fmt, const uint8_t *w, int64_t rb, const atq_xblock *xb, int64_t nb,
                                          float *y, const int NR) {
  __m256 acc[4];
  float extra[4];  /* the Q4 formats' m_w * (d_x * s_x) terms */
  for (int r = 0; r < NR; r++) { acc[r] = _mm256_setzero_ps(); extra[r] = 0.0f; }
  const __m256i ones = _mm256_set1_epi16(1);
  int64_t bytes = atq_row_bytes(fmt, 32);
  for (int64_t b = 0; b < nb; b++) {
    __m256i xq = _mm256_loadu_si256((const __m256i *)xb[b].q);
    float dx = xb[b].d, xs = dx * (float)xb[b].s;
    for (int r = 0; r < NR; r++) {
      const uint8_t *p = w + r * rb + b * bytes;
      _mm_prefetch((const char *)p + ATQ_PREFETCH_GROUPS * NR * rb, _MM_HINT_T0);  /* never faults */
      float dw = _cvtsh_ss(atq_u16(p));
      __m256i pairs;
      if (fmt == ATQ_Q8_0) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)(p + 2));
        pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
      } else {
        pairs = _mm256_maddubs_epi16(atq_nibbles_avx2(p + (fmt == ATQ_Q4_1 ? 4 : 2)), xq);
        float m = fmt == ATQ_Q4_1 ? _cvtsh_ss(atq_u16(p + 2)) : -8.0f * dw;
        extra[r] = fmaf(m, xs, extra[r]);
      }
      __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));  /* exact: |sum| < 2^24 */
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), sums, acc[r]);
    }
  }
  for (int r = 0; r < NR; r++) y[r] = atq_hsum256(acc[r]) + extra[r];
}

/* y[r0..r1) = W[r0..r1) . x for one row of x (q8: x is its Q8 blocks): groups of four rows from r0,
   then the rest one at a time, each row through the same inlined code (the invariant above); the
   format a constant in each instance, so the block loop holds no branch on it */
#define ATQ_GEMV_FORMAT(FMT, G)                                                                        \
  static ATQ_AVX2 void atq_gemv_avx2_##FMT(int q8, const uint8_t *w, const void *x, float *y, int64_t cols, \
                                           int64_t r0, int64_t r1) {                                   \
    int64_t rb = atq_row_bytes(FMT, cols), nb = cols / 32, r = r0;                                     \
    if (q8) {                                                                                          \
      const atq_xblock *xq = (const atq_xblock *)x;                                                    \
      for (; r + G <= r1; r += G) atq_rows_q8_avx2(FMT, w + r * rb, rb, xq, nb, y + r, G);             \
      for (; r < r1; r++) atq_rows_q8_avx2(FMT, w + r * rb, rb, xq, nb, y + r, 1);                     \
    } else {                                                                                           \
      for (; r + G <= r1; r += G) atq_rows_f32_avx2(FMT, w + r * rb, rb, (const float *)x, nb, y + r, G); \
      for (; r < r1; r++) atq_rows_f32_avx2(FMT, w + r * rb, rb, (const float *)x, nb, y + r, 1);      \
    }                                                                                                  \
  }
ATQ_GEMV_FORMAT(ATQ_Q4_0, 4)
ATQ_GEMV_FORMAT(ATQ_Q4_1, 4)
ATQ_GEMV_FORMAT(ATQ_Q8_0, 1)  /* one row: SmolLM2's 30 MB Q8_0 output projection streams from memory,
                                  and four interleaved row streams took it 2x longer (3.4 -> 6.6 ms) */
static ATQ_AVX2 void atq_gemv_avx2(int fmt, int q8, const uint8_t *w, const void *x, float *y, int64_t cols,
                                   int64_t r0, int64_t r1) {  /* fmt: Q4_0, Q4_1 or Q8_0 */
  if (fmt == ATQ_Q4_0) atq_gemv_avx2_ATQ_Q4_0(q8, w, x, y, cols, r0, r1);
  else if (fmt == ATQ_Q4_1) atq_gemv_avx2_ATQ_Q4_1(q8, w, x, y, cols, r0, r1);
  else atq_gemv_avx2_ATQ_Q8_0(q8, w, x, y, cols, r0, r1);
}
#endif
"""
