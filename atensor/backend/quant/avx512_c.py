"""The C of the AVX-512 and VNNI packed-matmul variants (backend/quant/source.py's SOURCE holds it after
backend/quant/gemm_c.py's, before backend/quant/variants_c.py's table, which names each of them).

Why variants of their own: the AVX-512 path used to be AVX2's structure at twice the width only where
that was free (one row a pass, no prefetch; its batched rows ran the AVX2 blocked kernel). Which of
these wins is measured, per CPU (atensor/tune/ over `atq_time_variant`): on Zen 4 a 512-bit
instruction takes two 256-bit halves through the same units, so width alone gains little there and
what counts is the instruction count and the registers (32 of them); on Sapphire Rapids the 512-bit
units are full width. So every kernel here is a variant, and none is a default by its name.

Kernels (each with its layout and why):
- `atq_rows_f32_avx512` (gemv_f32 "avx512_r1/2/4/8"): NR weight rows by one float32 row of x, a block
  (32 weights) two 16-lane vectors: bytes 0-15 widened to 32 bits from memory (one shuffle), the low
  nibbles elements 0-15 and the high ones 16-31 by a mask and a shift; the x block loaded once for the
  NR rows; the block of the rows ATQ_PREFETCH_GROUPS groups on prefetched (backend/quant/gemv_c.py: the
  NR interleaved row streams defeat the hardware prefetcher). Sums: lanes of elements 0-15 in one
  accumulator, 16-31 in another, then across lanes: a row's result does not depend on its group (the
  row count a constant of one always-inlined function), so threads and regroupings change no bit.
- `atq_gemv_vl_*` (gemv_f32 "avx2vl_r4", "avx2vl_r8"): AVX2's batch-1 kernel with the EVEX encoding's
  32 registers, 4 or 8 Q4 rows a pass (Q8_0 one, as on AVX2).
- `atq_gemm_avx512` (rows_f32 "avx512_blocked"): backend/quant/gemm_c.py's blocked kernel with 16-lane
  vectors and a 4 x 4 tile (16 accumulators, 4 x vectors and one weight vector: 21 of the 32
  registers): per 16 columns 8 loads feed 16 FMAs, where AVX2's 4 x 2 tile takes 6 loads for 8. The
  same invariant: one accumulator per (weight row, row of x), fed columns in order, so a row's result
  does not depend on the rows beside it, the pass or the thread.
- `atq_rows_q8_<vnni>` and `atq_q8_tile_<vnni>` (gemv_q8 and rows_q8 "avx512vnni", "avxvnni"):
  backend/quant/gemv_c.py's Q8 kernel (NR weight rows by one row of x) and a tile of one weight row by
  four rows of x (batched rows: the block unpacked once for the four), with
  `vpdpbusd`, one instruction for a block's 32 products into 8 int32 lanes (AVX2 takes `maddubs` and
  `madd`, and for signed weights two `sign`s). dpbusd multiplies unsigned bytes by signed ones; the x
  side is signed (Q8), so the weight side must be unsigned: Q4 nibbles are (0..15); Q8_0's signed
  weights are offset by 128 (w ^ 0x80 = w + 128), and Q4_0's are its nibbles (w + 8), and the offset
  times the x block's sum is taken back in the integer accumulator's start (-128 s_x or -8 s_x in
  lane 0, computed once per x block for the NR rows): every block's integer sum is exact, as on every
  path (backend/quant/q8_c.py). Q4_1's m term stays the float m_w * d_x * s_x of the other paths.
  256-bit vectors: a block is 32 bytes, so one block per instruction needs no lane shuffles; the
  EVEX form needs AVX512-VNNI + VL, the VEX form AVX-VNNI (Alder Lake, Sapphire Rapids: this Zen 4
  lacks it, so that variant compiles here and its tests skip). A row's sums are the same in the tile
  as in the gemv: a stream's logits do not depend on the batch it decodes in.
- `atq_split_bf16`, `atq_dot_bf16_split` (gemv_f32 "avx512bf16"): BF16 weights by float32 x with `vdpbf16ps`, which
  multiplies BF16 pairs exactly into float32 sums. To keep float32 activations' results (the exact
  path), x is split once per call into three BF16 parts, x = hi + mid + lo to within 2^-24 of x (each
  part the rounded rest of the previous), and each weight pair is dotted with all three: three
  instructions per 32 weights against the decode's widen, shift and FMA per 16. Other formats run
  "avx512_r4".
"""
from __future__ import annotations

AVX512_SOURCE = r"""
#ifdef ATQ_X86
/* the 32 weights of the Q4_0/Q4_1/Q8_0 block at p as 16-lane vectors of elements 0-15 and 16-31: bytes
   widened to 32 bits from memory (one shuffle), Q4's nibbles split by a mask and a shift; the values of
   every path's decode (d*q exact, Q4_1's + m one rounding) */
ATQ_INLINE ATQ_AVX512 void atq_block512(int fmt, const uint8_t *p, __m512 *v0, __m512 *v1) {
  __m512 d = _mm512_set1_ps(_cvtsh_ss(atq_u16(p)));
  if (fmt == ATQ_Q8_0) {
    *v0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 2)))));
    *v1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 18)))));
    return;
  }
  __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + (fmt == ATQ_Q4_1 ? 4 : 2))));
  __m512i nib = _mm512_set1_epi32(0x0F);
  __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(q, nib)), q1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4));
  if (fmt == ATQ_Q4_1) {
    __m512 m = _mm512_set1_ps(_cvtsh_ss(atq_u16(p + 2)));
    *v0 = _mm512_fmadd_ps(d, q0, m); *v1 = _mm512_fmadd_ps(d, q1, m);
  } else {
    __m512 eight = _mm512_set1_ps(8.0f);
    *v0 = _mm512_mul_ps(d, _mm512_sub_ps(q0, eight)); *v1 = _mm512_mul_ps(d, _mm512_sub_ps(q1, eight));
  }
}

/* ---- float32 activations, batch 1: NR rows a pass ------------------------------------------------- */
ATQ_INLINE ATQ_AVX512 void atq_rows_f32_avx512(int fmt, const uint8_t *w, int64_t rb, const float *x, int64_t nb,
                                               float *y, const int NR) {
  __m512 acc0[8], acc1[8];
  for (int r = 0; r < NR; r++) { acc0[r] = _mm512_setzero_ps(); acc1[r] = _mm512_setzero_ps(); }
  int64_t bytes = atq_row_bytes(fmt, 32);
  for (int64_t b = 0; b < nb; b++) {
    __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
    for (int r = 0; r < NR; r++) {
      const uint8_t *p = w + r * rb + b * bytes;
      _mm_prefetch((const char *)p + ATQ_PREFETCH_GROUPS * NR * rb, _MM_HINT_T0);  /* never faults */
      __m512 v0, v1;
      atq_block512(fmt, p, &v0, &v1);
      acc0[r] = _mm512_fmadd_ps(v0, x0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(v1, x1, acc1[r]);
    }
  }
  for (int r = 0; r < NR; r++) y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[r], acc1[r]));
}

/* groups of NR rows from r0, then the rest one at a time, each through the same inlined code; the
   format a constant of each instance */
#define ATQ_GEMV512_FORMAT(FMT, NR)                                                                     \
  static ATQ_AVX512 void atq_gemv512_##NR##_##FMT(const uint8_t *w, const float *x, float *y, int64_t cols,   \
                                                 int64_t r0, int64_t r1) {                            \
    int64_t rb = atq_row_bytes(FMT, cols), nb = cols / 32, r = r0;                                     \
    for (; r + NR <= r1; r += NR) atq_rows_f32_avx512(FMT, w + r * rb, rb, x, nb, y + r, NR);          \
    for (; r < r1; r++) atq_rows_f32_avx512(FMT, w + r * rb, rb, x, nb, y + r, 1);                     \
  }
/* a gemv_f32 variant: one row of x of a block format; anything else runs the AVX-512 general kernel */
#define ATQ_GEMV512(NR)                                                                                 \
  ATQ_GEMV512_FORMAT(ATQ_Q4_0, NR) ATQ_GEMV512_FORMAT(ATQ_Q4_1, NR) ATQ_GEMV512_FORMAT(ATQ_Q8_0, NR)  \
  static ATQ_AVX512 void atq_gemv_f32_avx512_r##NR(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, \
                                                   int64_t cols, int64_t rows, int64_t r0, int64_t r1) { \
    if (m != 1 || fmt > ATQ_Q8_0) { atq_matmul_rows_avx512(fmt, x, w, y, m, cols, rows, r0, r1); return; } \
    if (fmt == ATQ_Q4_0) atq_gemv512_##NR##_ATQ_Q4_0(w, x, y, cols, r0, r1);                            \
    else if (fmt == ATQ_Q4_1) atq_gemv512_##NR##_ATQ_Q4_1(w, x, y, cols, r0, r1);                       \
    else atq_gemv512_##NR##_ATQ_Q8_0(w, x, y, cols, r0, r1);                                           \
  }
ATQ_GEMV512(1)
ATQ_GEMV512(2)
ATQ_GEMV512(4)
ATQ_GEMV512(8)

/* AVX2's batch-1 kernel (backend/quant/gemv_c.py: 8 lanes, its decode and sums, bit for bit) compiled for
   AVX-512VL, whose EVEX encoding has 32 vector registers: NR rows a pass without spills up to 8 (AVX2's 16
   registers hold four rows' accumulators); on Zen 4 the 512-bit variants above lost to AVX2's 256 bits */
#define ATQ_GEMV_VL_FORMAT(FMT, NR)                                                                     \
  static ATQ_AVX512 void atq_gemv_vl_##NR##_##FMT(const uint8_t *w, const float *x, float *y, int64_t cols,   \
                                                 int64_t r0, int64_t r1) {                            \
    int64_t rb = atq_row_bytes(FMT, cols), nb = cols / 32, r = r0;                                     \
    for (; r + NR <= r1; r += NR) atq_rows_f32_avx2(FMT, w + r * rb, rb, x, nb, y + r, NR);            \
    for (; r < r1; r++) atq_rows_f32_avx2(FMT, w + r * rb, rb, x, nb, y + r, 1);                       \
  }
ATQ_GEMV_VL_FORMAT(ATQ_Q8_0, 1)  /* Q8_0 one row a pass, as on AVX2 (its 30 MB output projection streams) */
#define ATQ_GEMV_VL(NR)                                                                                 \
  ATQ_GEMV_VL_FORMAT(ATQ_Q4_0, NR) ATQ_GEMV_VL_FORMAT(ATQ_Q4_1, NR)                                   \
  static ATQ_AVX512 void atq_gemv_f32_avx2vl_r##NR(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, \
                                                   int64_t cols, int64_t rows, int64_t r0, int64_t r1) { \
    if (m != 1 || fmt > ATQ_Q8_0) { atq_matmul_rows_avx512(fmt, x, w, y, m, cols, rows, r0, r1); return; } \
    if (fmt == ATQ_Q4_0) atq_gemv_vl_##NR##_ATQ_Q4_0(w, x, y, cols, r0, r1);                            \
    else if (fmt == ATQ_Q4_1) atq_gemv_vl_##NR##_ATQ_Q4_1(w, x, y, cols, r0, r1);                       \
    else atq_gemv_vl_1_ATQ_Q8_0(w, x, y, cols, r0, r1);                                                \
  }
ATQ_GEMV_VL(4)
ATQ_GEMV_VL(8)

/* ---- float32 activations, batched rows: the blocked kernel, 4 x 4 tiles of 16 lanes ------------------ */
#define ATQ_GEMM512_W 4  /* weight rows decoded together */
#define ATQ_GEMM512_X 4  /* rows of x per tile */
#define ATQ_IN_REGISTER512(v) __asm__("" : "+v"(v))  /* backend/quant/gemm_c.py's ATQ_IN_REGISTER, any of 32 */

/* one row of nb blocks decoded to float32, the values of every path's decode */
ATQ_INLINE ATQ_AVX512 void atq_gemm_decode_avx512(int fmt, const uint8_t *w, float *out, int64_t nb) {
  int64_t bytes = atq_row_bytes(fmt, 32);
  for (int64_t b = 0; b < nb; b++, out += 32) {
    const uint8_t *p = w + b * bytes;
    __m512 v0, v1;
    atq_block512(fmt, p, &v0, &v1);
    _mm512_store_ps(out, v0); _mm512_store_ps(out + 16, v1);
  }
}

/* y[j * ldy + i] = dot(w row i, x row j), i < NW, j < NX, over n columns (a multiple of 16) */
ATQ_INLINE ATQ_AVX512 void atq_gemm_tile_avx512(const float *w, int64_t n, const float *x, int64_t ldx, float *y,
                                                int64_t ldy, const int NW, const int NX) {
  __m512 acc[ATQ_GEMM512_X][ATQ_GEMM512_W];
  for (int j = 0; j < NX; j++)
    for (int i = 0; i < NW; i++) acc[j][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += 16) {
    __m512 xv[ATQ_GEMM512_X];
    for (int j = 0; j < NX; j++) { xv[j] = _mm512_loadu_ps(x + j * ldx + k); ATQ_IN_REGISTER512(xv[j]); }
    for (int i = 0; i < NW; i++) {
      __m512 wv = _mm512_load_ps(w + i * n + k);
      ATQ_IN_REGISTER512(wv);
      for (int j = 0; j < NX; j++) acc[j][i] = _mm512_fmadd_ps(wv, xv[j], acc[j][i]);
    }
  }
  for (int j = 0; j < NX; j++)
    for (int i = 0; i < NW; i++) y[j * ldy + i] = _mm512_reduce_add_ps(acc[j][i]);
}

/* NW decoded weight rows against rows [i0, i1) of x: tiles of 4 rows, then one of the 1-3 left */
ATQ_INLINE ATQ_AVX512 void atq_gemm_rows_avx512(const float *scratch, int64_t cols, const float *x, int64_t i0,
                                                int64_t i1, float *y, int64_t ldy, const int NW) {
  int64_t i = i0;
  for (; i + ATQ_GEMM512_X <= i1; i += ATQ_GEMM512_X)
    atq_gemm_tile_avx512(scratch, cols, x + i * cols, cols, y + i * ldy, ldy, NW, ATQ_GEMM512_X);
  const float *xi = x + i * cols;
  float *yi = y + i * ldy;
  if (i1 - i == 3) atq_gemm_tile_avx512(scratch, cols, xi, cols, yi, ldy, NW, 3);
  else if (i1 - i == 2) atq_gemm_tile_avx512(scratch, cols, xi, cols, yi, ldy, NW, 2);
  else if (i1 - i == 1) atq_gemm_tile_avx512(scratch, cols, xi, cols, yi, ldy, NW, 1);
}

/* y (m, rows) = x (m, cols) . W^T for weight rows [r0, r1), the block formats on rows of at most
   ATQ_GEMM_COLS columns (a multiple of 32); false (nothing done) otherwise. `scratch`: ATQ_SCRATCH
   floats, 64-byte aligned */
_Static_assert(ATQ_GEMM512_W * ATQ_GEMM_COLS <= ATQ_SCRATCH, "the decoded weight rows fit the caller's scratch");
static ATQ_AVX512 int atq_gemm_avx512(int fmt, const float *x, const uint8_t *w, float *y, int64_t m, int64_t cols,
                                      int64_t rows, int64_t r0, int64_t r1, float *scratch) {
  if (cols % 32 != 0 || cols > ATQ_GEMM_COLS) return 0;
  __atomic_store_n(&atq_gemm_runs, atq_gemm_count() + 1, __ATOMIC_RELAXED);  /* backend/quant/gemm_c.py's count */
  int64_t rb = atq_row_bytes(fmt, cols), nb = cols / 32;
  int64_t pass = ATQ_GEMM_XBYTES / (cols * (int64_t)sizeof(float)) / ATQ_GEMM512_X * ATQ_GEMM512_X;
  if (pass < ATQ_GEMM512_X) pass = ATQ_GEMM512_X;
  for (int64_t i0 = 0; i0 < m; i0 += pass) {
    int64_t i1 = i0 + pass < m ? i0 + pass : m;
    for (int64_t r = r0; r < r1; r += ATQ_GEMM512_W) {
      int nw = r1 - r < ATQ_GEMM512_W ? (int)(r1 - r) : ATQ_GEMM512_W;
      for (int t = 0; t < nw; t++) {
        if (fmt <= ATQ_Q8_0) atq_gemm_decode_avx512(fmt, w + (r + t) * rb, scratch + t * cols, nb);
        else atq_decode_row_avx512(fmt, w + (r + t) * rb, scratch + t * cols, cols);  /* F16, BF16 */
      }
      if (nw == 4) atq_gemm_rows_avx512(scratch, cols, x, i0, i1, y + r, rows, 4);
      else if (nw == 3) atq_gemm_rows_avx512(scratch, cols, x, i0, i1, y + r, rows, 3);
      else if (nw == 2) atq_gemm_rows_avx512(scratch, cols, x, i0, i1, y + r, rows, 2);
      else atq_gemm_rows_avx512(scratch, cols, x, i0, i1, y + r, rows, 1);
    }
  }
  return 1;
}
/* the rows_f32 variant: several rows of x through the blocked kernel where it takes them, else the
   AVX-512 general kernel (one row of x: its gemv) */
static ATQ_AVX512 void atq_rows_f32_avx512_blocked(int fmt, const float *x, const uint8_t *w, float *y, int64_t m,
                                                   int64_t cols, int64_t rows, int64_t r0, int64_t r1) {
  float scratch[ATQ_SCRATCH] __attribute__((aligned(64)));
  if (m > 1 && atq_gemm_avx512(fmt, x, w, y, m, cols, rows, r0, r1, scratch)) return;
  atq_matmul_rows_avx512(fmt, x, w, y, m, cols, rows, r0, r1);
}

/* ---- BF16 weights by float32 x: vdpbf16ps on x split in three BF16 parts ----------------------------- */
#define ATQ_BF16_ATTR __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
/* x (n floats, n a multiple of 32) -> parts[3][n] BF16 pairs: x = hi + mid + lo to within 2^-24 |x| */
static ATQ_BF16_ATTR void atq_split_bf16(const float *x, __m512bh *parts, int64_t n) {
  for (int64_t j = 0; j < n; j += 32) {
    __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + 16);
    for (int k = 0; k < 3; k++) {
      __m512bh h = _mm512_cvtne2ps_pbh(b, a);  /* 32 BF16: a's 16, then b's 16 */
      parts[k * (n / 32) + j / 32] = h;
      __m512i wide = (__m512i)h;  /* back to float32: each BF16 shifted up 16 bits */
      __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(wide)), 16));
      __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(wide, 1)), 16));
      a = _mm512_sub_ps(a, ha); b = _mm512_sub_ps(b, hb);  /* exact: the rest of a rounding */
    }
  }
}
/* one BF16 row (cols values, 2 bytes each) . the split x: lane i of vdpbf16ps takes elements 2i and 2i+1
   of both operands, and a part holds x's 32 values of a block in order (cvtne2ps(b, a): a's 16, then
   b's), so the weights go in as they are stored */
static ATQ_BF16_ATTR float atq_dot_bf16_split(const uint8_t *w, const __m512bh *parts, int64_t nb) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    __m512bh wv = (__m512bh)_mm512_loadu_si512((const void *)(w + 64 * b));  /* 32 BF16 weights, in order */
    acc0 = _mm512_dpbf16_ps(acc0, wv, parts[b]);
    acc1 = _mm512_dpbf16_ps(acc1, wv, parts[nb + b]);
    acc2 = _mm512_dpbf16_ps(acc2, wv, parts[2 * nb + b]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc2, acc1), acc0));
}
static ATQ_BF16_ATTR void atq_gemv_f32_avx512bf16(int fmt, const float *x, const uint8_t *w, float *y, int64_t m,
                                                  int64_t cols, int64_t rows, int64_t r0, int64_t r1) {
  if (fmt != ATQ_BF16 || m != 1 || cols % 32 != 0 || cols > ATQ_SCRATCH) {
    atq_gemv_f32_avx512_r4(fmt, x, w, y, m, cols, rows, r0, r1);
    return;
  }
  __m512bh parts[3 * ATQ_SCRATCH / 32];  /* 96 KiB at most, on the thread's stack */
  atq_split_bf16(x, parts, cols);
  for (int64_t r = r0; r < r1; r++) y[r] = atq_dot_bf16_split(w + r * cols * 2, parts, cols / 32);
}

/* ---- Q8 activations, batch 1: vpdpbusd ------------------------------------------------------------ */
/* NR weight rows . one row of x quantized to Q8 blocks; DPBUSD(acc, unsigned bytes, signed bytes) */
#define ATQ_Q8_VNNI(NAME, ATTR, DPBUSD)                                                                 \
  ATQ_INLINE ATTR void atq_rows_q8_##NAME(int fmt, const uint8_t *w, int64_t rb, const atq_xblock *xb, int64_t nb, \
                                          float *y, const int NR) {                                    \
    __m256 acc[8];                                                                                     \
    float extra[8];  /* Q4_1's m_w * (d_x * s_x) terms */                                              \
    for (int r = 0; r < NR; r++) { acc[r] = _mm256_setzero_ps(); extra[r] = 0.0f; }                    \
    const int offset = fmt == ATQ_Q8_0 ? 128 : fmt == ATQ_Q4_0 ? 8 : 0;  /* unsigned w = w + offset */ \
    const __m256i flip = _mm256_set1_epi8((char)0x80);                                                 \
    int64_t bytes = atq_row_bytes(fmt, 32);                                                            \
    for (int64_t b = 0; b < nb; b++) {                                                                 \
      __m256i xq = _mm256_loadu_si256((const __m256i *)xb[b].q);                                       \
      __m256i start = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-offset * xb[b].s));  /* lane 0 */      \
      float dx = xb[b].d, xs = dx * (float)xb[b].s;                                                    \
      for (int r = 0; r < NR; r++) {                                                                   \
        const uint8_t *p = w + r * rb + b * bytes;                                                     \
        _mm_prefetch((const char *)p + ATQ_PREFETCH_GROUPS * NR * rb, _MM_HINT_T0);                    \
        float dw = _cvtsh_ss(atq_u16(p));                                                              \
        __m256i u = fmt == ATQ_Q8_0 ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), flip) \
                                    : atq_nibbles_avx2(p + (fmt == ATQ_Q4_1 ? 4 : 2));                \
        __m256 sums = _mm256_cvtepi32_ps(DPBUSD(start, u, xq));  /* exact: |sum| < 2^24 */             \
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), sums, acc[r]);                               \
        if (fmt == ATQ_Q4_1) extra[r] = fmaf(_cvtsh_ss(atq_u16(p + 2)), xs, extra[r]);                 \
      }                                                                                                \
    }                                                                                                  \
    for (int r = 0; r < NR; r++) y[r] = atq_hsum256(acc[r]) + extra[r];                                \
  }                                                                                                    \
  ATQ_Q8_VNNI_FORMAT(NAME, ATTR, ATQ_Q4_0) ATQ_Q8_VNNI_FORMAT(NAME, ATTR, ATQ_Q4_1)                    \
  ATQ_Q8_VNNI_FORMAT(NAME, ATTR, ATQ_Q8_0)                                                             \
  /* one weight row . NX rows of x (ld blocks apart): each block unpacked once for the NX rows, each    \
     row's products and sums those of the gemv above (a row alone and batched agree bit for bit) */    \
  ATQ_INLINE ATTR void atq_q8_tile_##NAME(int fmt, const uint8_t *w, const atq_xblock *xb, int64_t ld, int64_t nb, \
                                          float *out, int64_t ldo, const int NX) {                     \
    __m256 acc[4];                                                                                     \
    float extra[4];                                                                                    \
    for (int j = 0; j < NX; j++) { acc[j] = _mm256_setzero_ps(); extra[j] = 0.0f; }                    \
    const int offset = fmt == ATQ_Q8_0 ? 128 : fmt == ATQ_Q4_0 ? 8 : 0;                                \
    const __m256i flip = _mm256_set1_epi8((char)0x80);                                                 \
    int64_t bytes = atq_row_bytes(fmt, 32);                                                            \
    for (int64_t b = 0; b < nb; b++) {                                                                 \
      const uint8_t *p = w + b * bytes;                                                                \
      float dw = _cvtsh_ss(atq_u16(p)), m = fmt == ATQ_Q4_1 ? _cvtsh_ss(atq_u16(p + 2)) : 0.0f;         \
      __m256i u = fmt == ATQ_Q8_0 ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), flip) \
                                  : atq_nibbles_avx2(p + (fmt == ATQ_Q4_1 ? 4 : 2));                  \
      for (int j = 0; j < NX; j++) {                                                                   \
        const atq_xblock *x = xb + j * ld + b;                                                         \
        __m256i start = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-offset * x->s));                     \
        __m256 sums = _mm256_cvtepi32_ps(DPBUSD(start, u, _mm256_loadu_si256((const __m256i *)x->q))); \
        acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x->d), sums, acc[j]);                             \
        if (fmt == ATQ_Q4_1) extra[j] = fmaf(m, x->d * (float)x->s, extra[j]);                          \
      }                                                                                                \
    }                                                                                                  \
    for (int j = 0; j < NX; j++) out[j * ldo] = atq_hsum256(acc[j]) + extra[j];                        \
  }                                                                                                    \
  /* the gemv_q8 and rows_q8 variant: one row of x (its Q8 blocks) NR weight rows a pass; several rows  \
     of x four at a time against each weight row */                                                   \
  static ATTR void atq_q8_##NAME(int fmt, const float *x, const uint8_t *w, float *y, int64_t m,     \
                                      int64_t cols, int64_t rows, int64_t r0, int64_t r1) {             \
    const atq_xblock *xq = (const atq_xblock *)(const void *)x;                                        \
    if (m != 1) {                                                                                      \
      int64_t nb = cols / 32, rb = atq_row_bytes(fmt, cols);                                           \
      for (int64_t r = r0; r < r1; r++) {                                                              \
        int64_t i = 0;                                                                                 \
        for (; i + 4 <= m; i += 4) atq_q8_tile_##NAME(fmt, w + r * rb, xq + i * nb, nb, nb, y + i * rows + r, rows, 4); \
        for (; i < m; i++) atq_q8_tile_##NAME(fmt, w + r * rb, xq + i * nb, nb, nb, y + i * rows + r, rows, 1); \
      }                                                                                                \
      return;                                                                                          \
    }                                                                                                  \
    if (fmt == ATQ_Q4_0) atq_gemv_q8_##NAME##_ATQ_Q4_0(w, xq, y, cols, r0, r1);                         \
    else if (fmt == ATQ_Q4_1) atq_gemv_q8_##NAME##_ATQ_Q4_1(w, xq, y, cols, r0, r1);                    \
    else atq_gemv_q8_##NAME##_ATQ_Q8_0(w, xq, y, cols, r0, r1);                                        \
  }
/* four rows a pass (AVX2's measured grouping), Q8_0 one (its 30 MB output projection streams) */
#define ATQ_Q8_VNNI_FORMAT(NAME, ATTR, FMT)                                                             \
  static ATTR void atq_gemv_q8_##NAME##_##FMT(const uint8_t *w, const atq_xblock *xq, float *y, int64_t cols, \
                                              int64_t r0, int64_t r1) {                                \
    int64_t rb = atq_row_bytes(FMT, cols), nb = cols / 32, r = r0;                                     \
    const int G = FMT == ATQ_Q8_0 ? 1 : 4;                                                             \
    if (G == 4) for (; r + 4 <= r1; r += 4) atq_rows_q8_##NAME(FMT, w + r * rb, rb, xq, nb, y + r, 4); \
    for (; r < r1; r++) atq_rows_q8_##NAME(FMT, w + r * rb, rb, xq, nb, y + r, 1);                     \
  }
#define ATQ_VNNI512_ATTR __attribute__((target("avx512vnni,avx512vl,avx512f,avx512bw,avx2,fma,f16c")))
#define ATQ_VNNI256_ATTR __attribute__((target("avxvnni,avx2,fma,f16c")))
ATQ_Q8_VNNI(avx512vnni, ATQ_VNNI512_ATTR, _mm256_dpbusd_epi32)
ATQ_Q8_VNNI(avxvnni, ATQ_VNNI256_ATTR, _mm256_dpbusd_avx_epi32)
#endif
"""
